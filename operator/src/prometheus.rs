//! The autoscaler's metrics source: instant queries to a Prometheus server's HTTP API
//! (`GET <url>/api/v1/query?query=…`) over the tablet servers' own metrics, which carry the
//! labels `basalt_namespace`, `basalt_instance`, `basalt_cluster` and `basalt_server` whatever
//! the scrape configuration. The queries ([`ClusterQueries`]) are documented in
//! `docs/autoscaling.md`.
//!
//! Plain HTTP only for now (a Prometheus in the cluster's network, or a proxy in front of one
//! that needs TLS or tokens).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long one query may take.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// A Prometheus server.
#[derive(Clone)]
pub struct Prometheus {
    /// `scheme://authority` and the path prefix (without a trailing slash).
    base: String,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus")
            .field("url", &self.base)
            .finish()
    }
}

impl Prometheus {
    /// The Prometheus server at `url` (e.g. `http://prometheus.monitoring:9090`, a path prefix
    /// allowed). Errors on a URL that is not plain HTTP.
    pub fn new(url: &str) -> Result<Prometheus, String> {
        let uri: http::Uri = url
            .trim()
            .parse()
            .map_err(|e| format!("the Prometheus URL {url:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(format!(
                "the Prometheus URL {url:?} must be an http URL with a host (TLS to Prometheus is not supported yet)"
            ));
        }
        let base = url.trim().trim_end_matches('/').to_string();
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(QUERY_TIMEOUT));
        Ok(Prometheus {
            base,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// The URL it was made with.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The value of an instant query that aggregates to one number (`sum(…)`, `count(…)`):
    /// None when the result is empty (no series matched).
    pub async fn scalar(&self, query: &str) -> Result<Option<f64>, String> {
        let uri = format!("{}/api/v1/query?query={}", self.base, encode(query));
        let call = async {
            let response = self
                .client
                .get(
                    uri.parse::<http::Uri>()
                        .map_err(|e| format!("bad query URL: {e}"))?,
                )
                .await
                .map_err(|e| format!("Prometheus at {} did not answer: {e}", self.base))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("Prometheus at {}: {e}", self.base))?
                .to_bytes();
            parse_scalar(status.as_u16(), &body)
        };
        tokio::time::timeout(QUERY_TIMEOUT, call)
            .await
            .map_err(|_| {
                format!(
                    "Prometheus at {} did not answer within {QUERY_TIMEOUT:?}",
                    self.base
                )
            })?
            .map_err(|e| format!("{e} (query: {query})"))
    }
}

/// The value of a query's answer (`status`: the HTTP status) when it is a vector of at most one
/// sample or a scalar. Pure.
pub fn parse_scalar(status: u16, body: &[u8]) -> Result<Option<f64>, String> {
    let answer: serde_json::Value = serde_json::from_slice(body).map_err(|_| {
        format!(
            "Prometheus answered HTTP {status} with a body that is not its API's JSON: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )
    })?;
    if answer["status"] != "success" {
        return Err(format!(
            "Prometheus refused the query (HTTP {status}): {} {}",
            answer["errorType"].as_str().unwrap_or(""),
            answer["error"].as_str().unwrap_or("")
        ));
    }
    let data = &answer["data"];
    let value = match data["resultType"].as_str() {
        Some("vector") => {
            let result = data["result"].as_array().cloned().unwrap_or_default();
            match result.as_slice() {
                [] => return Ok(None),
                [one] => one["value"][1].clone(),
                _ => {
                    return Err(format!(
                        "the query answered {} series where one was expected",
                        result.len()
                    ));
                }
            }
        }
        Some("scalar") => data["result"][1].clone(),
        other => return Err(format!("unexpected result type {other:?}")),
    };
    let value: f64 = value
        .as_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("the answer's value is not a number: {value}"))?;
    Ok(value.is_finite().then_some(value))
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters stay).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The PromQL the autoscaler asks for one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterQueries {
    /// CPU seconds per second the cluster's servers use (over the last minute).
    pub cpu_used: String,
    /// The cores allocated to the servers counted in `cpu_used`.
    pub cpu_allocated: String,
    /// How many servers `cpu_used` counts.
    pub nodes: String,
    /// Bytes the cluster stores (SST files and memtables).
    pub stored_bytes: String,
}

impl ClusterQueries {
    pub fn new(namespace: &str, instance: &str, cluster: &str) -> ClusterQueries {
        let sel = format!(
            "basalt_namespace=\"{}\",basalt_instance=\"{}\",basalt_cluster=\"{}\"",
            escape(namespace),
            escape(instance),
            escape(cluster)
        );
        // Only the servers scraped now count: a server that stopped (a scale-in) keeps a rate
        // over the last minute but its allocation goes stale at once; counting its CPU against
        // the others' allocation would make a scale-in look like load. `max by (basalt_server)`:
        // a server scraped by two jobs counts once.
        let live = format!("max by (basalt_server) (basalt_cpu_allocation_cores{{{sel}}})");
        let rate = format!("max by (basalt_server) (rate(process_cpu_seconds_total{{{sel}}}[1m]))");
        let per_server = |metric: &str| format!("sum(max by (basalt_server) ({metric}{{{sel}}}))");
        ClusterQueries {
            cpu_used: format!("sum({rate} and on (basalt_server) {live})"),
            cpu_allocated: format!("sum({live} and on (basalt_server) {rate})"),
            nodes: format!("count({live} and on (basalt_server) {rate})"),
            stored_bytes: format!(
                "{} + {}",
                per_server("basalt_storage_bytes"),
                per_server("basalt_memtable_bytes")
            ),
        }
    }
}

/// A label value inside double quotes.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_one_number_or_none() {
        let ok = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.1,"0.625"]}]}}"#;
        assert_eq!(parse_scalar(200, ok), Ok(Some(0.625)));
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(parse_scalar(200, empty), Ok(None));
        let nan = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}"#;
        assert_eq!(parse_scalar(200, nan), Ok(None));
        let bad = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        assert!(
            parse_scalar(400, bad)
                .unwrap_err()
                .contains("bad_data parse error at char 3")
        );
        assert!(
            parse_scalar(502, b"<html>Bad Gateway</html>")
                .unwrap_err()
                .contains("HTTP 502")
        );
        let two = br#"{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"1"]},{"value":[1,"2"]}]}}"#;
        assert!(parse_scalar(200, two).unwrap_err().contains("2 series"));
    }

    #[test]
    fn queries_select_one_cluster_and_are_encoded() {
        let q = ClusterQueries::new("prod", "orders", "orders-c1");
        assert_eq!(
            q.cpu_used,
            "sum(max by (basalt_server) (rate(process_cpu_seconds_total{basalt_namespace=\"prod\",basalt_instance=\"orders\",basalt_cluster=\"orders-c1\"}[1m])) and on (basalt_server) max by (basalt_server) (basalt_cpu_allocation_cores{basalt_namespace=\"prod\",basalt_instance=\"orders\",basalt_cluster=\"orders-c1\"}))"
        );
        assert!(q.cpu_allocated.contains("and on (basalt_server)"));
        assert!(
            q.nodes
                .starts_with("count(max by (basalt_server) (basalt_cpu_allocation_cores")
        );
        assert_eq!(encode("sum(x{a=\"b\"})"), "sum%28x%7Ba%3D%22b%22%7D%29");
        assert!(Prometheus::new("ftp://p:9090").is_err());
        assert!(Prometheus::new("not a url").is_err());
        assert_eq!(
            Prometheus::new("http://p.monitoring:9090/prom/")
                .unwrap()
                .url(),
            "http://p.monitoring:9090/prom"
        );
    }
}
