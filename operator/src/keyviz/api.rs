//! The Key Visualizer's page and JSON API (`docs/key-visualizer.md`):
//!
//! * `GET /keyviz`: the page (one self-contained HTML file: no external resources);
//! * `GET /api/keyviz/instances`: the instances;
//! * `GET /api/keyviz/tables?instance=NS/NAME`: an instance's tables (ids);
//! * `GET /api/keyviz/heatmap?instance=NS/NAME&table=T&metric=M&start=S&end=E&buckets=N`: the
//!   matrix of metric M (`ops` by default) over the window [S, E) (Unix seconds; the last 6
//!   hours by default) in at most N key buckets (1,000 by default), with the hottest ranges
//!   and the tablets and servers that hold them now.
//!
//! Everything is read from the instance's etcd, so every operator replica answers, leader of
//! the instance's master or not. Paths are absolute and unprefixed, so the page works through
//! `kubectl port-forward`. The operator serves them on their own port
//! (`--key-visualizer-listen`, the pod's loopback by default: the keys are the users' data);
//! the local runtime on its control port (127.0.0.1).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use basalt_meta::keys::hex;
use basalt_meta::{Meta, table_id};
use basalt_model::keyviz::{self, Metric};
use bytes::Bytes;
use serde_json::{Value, json};

use super::collector::Histories;
use super::{InstanceKey, Sources};

/// The page.
pub const PAGE: &str = include_str!("page.html");
/// The default window: Bigtable's and TiDB's default view, the last 6 hours.
pub const DEFAULT_WINDOW_SECS: i64 = 6 * 3600;
/// The default number of key buckets: Bigtable's 1,000.
pub const DEFAULT_BUCKETS: usize = 1000;
/// Most buckets a request may ask for.
pub const MAX_BUCKETS: usize = 4000;
/// How many hottest ranges are listed.
pub const HOTTEST: usize = 10;

/// The routes, over the instances of `sources`.
pub fn router(sources: Arc<Sources>) -> Router {
    Router::new()
        .route("/keyviz", get(page))
        .route("/keyviz/", get(page))
        .route("/api/keyviz/instances", get(instances))
        .route("/api/keyviz/tables", get(tables))
        .route("/api/keyviz/heatmap", get(heatmap))
        .with_state(sources)
}

/// Serves the routes until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, sources: Arc<Sources>) {
    if let Err(e) = axum::serve(listener, router(sources)).await {
        tracing::error!(error = %e, "the Key Visualizer's server stopped");
    }
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}

/// A JSON answer.
fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        value.to_string(),
    )
        .into_response()
}

fn ok(value: Value) -> Response {
    json_response(StatusCode::OK, &value)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(status, &json!({ "error": message.into() }))
}

async fn instances(State(sources): State<Arc<Sources>>) -> Response {
    let list: Vec<Value> = sources
        .instances()
        .into_iter()
        .map(|(namespace, name)| json!({ "namespace": namespace, "name": name }))
        .collect();
    ok(json!({ "instances": list }))
}

/// The query's parameters, percent-decoded.
fn params(query: Option<String>) -> HashMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let hex_digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match (
                    hex_digit(bytes[i + 1]),
                    bytes.get(i + 2).and_then(|b| hex_digit(*b)),
                ) {
                    (Some(hi), Some(lo)) => {
                        out.push(hi * 16 + lo);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The instance a request names (`instance=NS/NAME`) and its etcd, or the error response.
async fn instance_meta(
    sources: &Sources,
    params: &HashMap<String, String>,
) -> Result<(InstanceKey, Meta), Response> {
    let Some(instance) = params.get("instance") else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "name the instance: instance=NAMESPACE/NAME",
        ));
    };
    let Some((namespace, name)) = instance.split_once('/') else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("instance {instance:?} is not NAMESPACE/NAME"),
        ));
    };
    let key = (namespace.to_string(), name.to_string());
    match sources.meta(&key).await {
        None => Err(error(
            StatusCode::NOT_FOUND,
            format!("no instance {namespace}/{name}"),
        )),
        Some(Err(e)) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the metadata store of {namespace}/{name} does not answer: {e:#}"),
        )),
        Some(Ok(meta)) => Ok((key, meta)),
    }
}

async fn tables(State(sources): State<Arc<Sources>>, RawQuery(query): RawQuery) -> Response {
    let params = params(query);
    let (_, meta) = match instance_meta(&sources, &params).await {
        Ok(m) => m,
        Err(response) => return response,
    };
    match meta.tables().await {
        Ok((tables, _)) => {
            let ids: Vec<&str> = tables.iter().map(|t| table_id(&t.schema.name)).collect();
            ok(json!({ "tables": ids }))
        }
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the tables cannot be read: {e}"),
        ),
    }
}

/// A key for the page: printable, and exact in hex.
fn key_json(prefix: &str, key: &[u8], into: &mut serde_json::Map<String, Value>) {
    into.insert(prefix.to_string(), Value::String(keyviz::printable(key)));
    into.insert(format!("{prefix}_hex"), Value::String(hex(key)));
}

fn range_json(start: &[u8], end: &[u8]) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    key_json("start", start, &mut m);
    key_json("end", end, &mut m);
    m
}

async fn heatmap(State(sources): State<Arc<Sources>>, RawQuery(query): RawQuery) -> Response {
    let params = params(query);
    let (key, meta) = match instance_meta(&sources, &params).await {
        Ok(m) => m,
        Err(response) => return response,
    };
    let Some(table) = params.get("table").filter(|t| !t.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "name the table: table=TABLE_ID");
    };
    let metric = match params.get("metric").map(String::as_str) {
        None | Some("") => Metric::Ops,
        Some(m) => match Metric::parse(m) {
            Some(metric) => metric,
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "unknown metric {m:?}: one of {}",
                        Metric::ALL.map(Metric::name).join(", ")
                    ),
                );
            }
        },
    };
    let number = |name: &str| -> Result<Option<i64>, String> {
        match params.get(name).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| format!("{name}={v:?} is not a whole number")),
        }
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (end, start, buckets) = match (number("end"), number("start"), number("buckets")) {
        (Ok(end), Ok(start), Ok(buckets)) => {
            let end = end.unwrap_or(now);
            (
                end,
                start.unwrap_or(end - DEFAULT_WINDOW_SECS),
                buckets.unwrap_or(DEFAULT_BUCKETS as i64),
            )
        }
        (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => {
            return error(StatusCode::BAD_REQUEST, why);
        }
    };
    if start >= end {
        return error(
            StatusCode::BAD_REQUEST,
            format!("the window is empty: start {start} is not before end {end}"),
        );
    }
    if buckets < 1 || buckets as usize > MAX_BUCKETS {
        return error(
            StatusCode::BAD_REQUEST,
            format!("buckets={buckets}: between 1 and {MAX_BUCKETS}"),
        );
    }
    let histories = match Histories::load(&meta, Some(table)).await {
        Ok(h) => h,
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the history cannot be read: {e}"),
            );
        }
    };
    let start_minute = start.div_euclid(60);
    let end_minute = (end - 1).div_euclid(60) + 1;
    let history = histories.tables.get(table.as_str());
    let columns = history
        .map(|h| h.window(start_minute, end_minute))
        .unwrap_or_default();
    let matrix = keyviz::matrix(&columns, metric, buckets as usize);
    let hottest = keyviz::hottest(&matrix, HOTTEST);
    let holders = match holders(&meta, table).await {
        Ok(h) => h,
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the tablet map cannot be read: {e}"),
            );
        }
    };
    let buckets_json: Vec<Value> = matrix
        .bounds
        .windows(2)
        .map(|b| Value::Object(range_json(&b[0], &b[1])))
        .collect();
    let max = matrix
        .values
        .iter()
        .flatten()
        .copied()
        .fold(0.0_f64, f64::max);
    let hottest_json: Vec<Value> = hottest
        .iter()
        .map(|h| {
            let mut m = range_json(&h.start, &h.end);
            m.insert("value".into(), json!(h.value));
            m.insert("share".into(), json!(h.share));
            let tablets: Vec<Value> = holders
                .iter()
                .filter(|t| overlaps(&t.start, &t.end, &h.start, &h.end))
                .map(|t| {
                    let mut m = range_json(&t.start, &t.end);
                    m.insert("cluster".into(), json!(t.cluster));
                    m.insert("server".into(), json!(t.server));
                    Value::Object(m)
                })
                .collect();
            m.insert("tablets".into(), Value::Array(tablets));
            Value::Object(m)
        })
        .collect();
    ok(json!({
        "instance": format!("{}/{}", key.0, key.1),
        "table": table,
        "metric": metric.name(),
        "unit": metric.unit(),
        "start": start,
        "end": end,
        "times": matrix.times.iter().map(|(m, minutes)| json!({"start": m * 60, "minutes": minutes})).collect::<Vec<_>>(),
        "buckets": buckets_json,
        "values": matrix.values,
        "max": max,
        "hottest": hottest_json,
    }))
}

/// A tablet of the table now, in one cluster, with the server that holds it.
struct Holder {
    cluster: String,
    start: Bytes,
    /// Empty: to the table's end.
    end: Bytes,
    server: String,
}

/// Who holds the table's tablets now, in every cluster.
async fn holders(meta: &Meta, table: &str) -> basalt_model::Result<Vec<Holder>> {
    let (servers, _) = meta.servers(None).await?;
    let names: BTreeMap<(String, String), String> = servers
        .into_iter()
        .map(|s| ((s.cluster, s.record.store_id), s.record.name))
        .collect();
    let mut holders = Vec::new();
    for cluster in meta.clusters().await? {
        let (map, _) = meta.tablets(&cluster).await?;
        for tablet in map.tablets(table) {
            let server = names
                .get(&(cluster.clone(), tablet.owner.clone()))
                .cloned()
                .unwrap_or_else(|| tablet.owner.clone());
            holders.push(Holder {
                cluster: cluster.clone(),
                start: tablet.range.start.clone(),
                end: tablet.range.end.clone().unwrap_or_default(),
                server,
            });
        }
    }
    Ok(holders)
}

/// Whether `[a_start, a_end)` and `[b_start, b_end)` share a key (an empty end: no end).
fn overlaps(a_start: &[u8], a_end: &[u8], b_start: &[u8], b_end: &[u8]) -> bool {
    (b_end.is_empty() || a_start < b_end) && (a_end.is_empty() || b_start < a_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_percent_decoded() {
        let p = params(Some(
            "instance=default%2Fdemo&table=events&metric=writes&x=a+b%zz".into(),
        ));
        assert_eq!(p["instance"], "default/demo");
        assert_eq!(p["table"], "events");
        assert_eq!(p["x"], "a b%zz");
        assert!(params(None).is_empty());
    }

    #[test]
    fn ranges_overlap_when_they_share_a_key() {
        assert!(overlaps(b"a", b"c", b"b", b"d"));
        assert!(!overlaps(b"a", b"b", b"b", b"c"));
        assert!(overlaps(b"", b"", b"x", b"y"));
        assert!(overlaps(b"m", b"", b"a", b"n"));
        assert!(!overlaps(b"m", b"", b"a", b"m"));
    }
}
