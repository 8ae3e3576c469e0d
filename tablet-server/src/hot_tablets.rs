//! `ListHotTablets` of Bigtable's instance admin API, answered from the Key Visualizer's
//! history (`docs/key-visualizer.md`): the tablets of a cluster that took most of their
//! server's requests, minute by minute ([`basalt_model::keyviz::hot_tablets`]).
//!
//! Bigtable ranks hot tablets by the share of their node's CPU they used; Basalt counts requests
//! per key range, not CPU, so `node_cpu_usage_percent` is the tablet's share of its server's
//! operations (reads and writes) in that time — the same ranking when requests cost alike. A
//! tablet is hot when it took at least half of its server's operations and at least one per
//! second. Tablets are today's (the cluster's tablet map now) and so are their servers.
//! Only cluster servers answer (the history is gathered by the instance's master).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use basalt_control::keyviz as codec;
use basalt_meta::Meta;
use basalt_model::keyviz::{self, Column, TabletRange};
use basalt_model::schema::parse_instance_name;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use prost_types::Timestamp;
use tonic::Status;

use crate::proto_time::timestamp;

/// The default window: the last 24 hours (Bigtable's).
const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The longest window: 48 hours (Bigtable's).
const MAX_WINDOW: Duration = Duration::from_secs(48 * 3600);
/// A hot tablet took at least this share of its server's operations…
const MIN_SHARE: f64 = 0.5;
/// … and at least this many per minute.
const MIN_OPS_PER_MINUTE: f64 = 60.0;
/// Results per page when the request does not say.
const DEFAULT_PAGE: usize = 100;

fn seconds(t: &Timestamp) -> i64 {
    t.seconds
}

/// The cluster a `parent` names: `projects/P/instances/I/clusters/C` → (instance name, C).
pub fn parse_parent(parent: &str) -> Result<(&str, &str), Status> {
    let bad = || {
        Status::invalid_argument(format!(
            "invalid cluster name {parent:?}: expected projects/<project>/instances/<instance>/clusters/<cluster>"
        ))
    };
    let (instance, cluster) = parent.split_once("/clusters/").ok_or_else(bad)?;
    parse_instance_name(instance).map_err(|_| bad())?;
    if cluster.is_empty() || cluster.contains('/') {
        return Err(bad());
    }
    Ok((instance, cluster))
}

/// The hot tablets of the cluster `request.parent` names.
pub async fn list(
    meta: &Meta,
    request: admin::ListHotTabletsRequest,
) -> Result<admin::ListHotTabletsResponse, Status> {
    let (instance, cluster) = parse_parent(&request.parent)?;
    if request.page_size < 0 {
        return Err(Status::invalid_argument(format!(
            "page_size {} is negative",
            request.page_size
        )));
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let end = request.end_time.as_ref().map(seconds).unwrap_or(now);
    let start = request
        .start_time
        .as_ref()
        .map(seconds)
        .unwrap_or(end - DEFAULT_WINDOW.as_secs() as i64);
    if start >= end {
        return Err(Status::invalid_argument(format!(
            "start_time ({start}) must be before end_time ({end})"
        )));
    }
    if end - start > MAX_WINDOW.as_secs() as i64 {
        return Err(Status::invalid_argument(format!(
            "the time range is {} hours; at most 48 hours may be asked",
            (end - start) / 3600
        )));
    }
    let offset: usize = match request.page_token.as_str() {
        "" => 0,
        t => t
            .parse()
            .map_err(|_| Status::invalid_argument(format!("invalid page_token {t:?}")))?,
    };
    let unavailable = |e: basalt_model::Error| Status::unavailable(e.to_string());
    let clusters = meta.clusters().await.map_err(unavailable)?;
    if !clusters.iter().any(|c| c == cluster) {
        return Err(Status::not_found(format!(
            "cluster {cluster} not found in instance {instance}"
        )));
    }
    let (map, _) = meta.tablets(cluster).await.map_err(unavailable)?;
    let (servers, _) = meta.servers(Some(cluster)).await.map_err(unavailable)?;
    let names: BTreeMap<&str, &str> = servers
        .iter()
        .map(|s| (s.record.store_id.as_str(), s.record.name.as_str()))
        .collect();
    let tables: Vec<String> = map.tables().map(str::to_string).collect();
    let mut tablets = Vec::new();
    for table in &tables {
        for t in map.tablets(table) {
            tablets.push(TabletRange {
                table: table.clone(),
                start: t.range.start.clone(),
                end: t.range.end.clone().unwrap_or_default(),
                server: names
                    .get(t.owner.as_str())
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| t.owner.clone()),
            });
        }
    }
    let (start_minute, end_minute) = (start.div_euclid(60), (end - 1).div_euclid(60) + 1);
    let histories = meta
        .keyviz_histories(None, codec::decode)
        .await
        .map_err(unavailable)?;
    let columns: BTreeMap<String, Vec<&Column>> = histories
        .iter()
        .filter(|(t, _)| tables.contains(t))
        .map(|(t, h)| (t.clone(), h.window(start_minute, end_minute)))
        .collect();
    let hot = keyviz::hot_tablets(&tablets, &columns, MIN_SHARE, MIN_OPS_PER_MINUTE);
    let page = match request.page_size {
        0 => DEFAULT_PAGE,
        n => n as usize,
    };
    let next = offset.saturating_add(page);
    let hot_tablets = hot
        .iter()
        .skip(offset)
        .take(page)
        .map(|h| {
            let t = &tablets[h.tablet];
            admin::HotTablet {
                name: format!(
                    "{}/hotTablets/{}-{}-{}",
                    request.parent,
                    t.table.replace('.', "_"),
                    h.start_minute,
                    h.tablet
                ),
                table_name: format!("{instance}/tables/{}", t.table),
                start_time: Some(timestamp(h.start_minute * 60 * 1_000_000)),
                end_time: Some(timestamp(
                    (h.start_minute + i64::from(h.minutes)) * 60 * 1_000_000,
                )),
                start_key: keyviz::printable(&t.start),
                end_key: keyviz::printable(&t.end),
                node_cpu_usage_percent: (h.share * 100.0) as f32,
            }
        })
        .collect();
    Ok(admin::ListHotTabletsResponse {
        hot_tablets,
        next_page_token: if next < hot.len() {
            next.to_string()
        } else {
            String::new()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_names_a_cluster_of_an_instance() {
        assert_eq!(
            parse_parent("projects/p/instances/i/clusters/c1").unwrap(),
            ("projects/p/instances/i", "c1")
        );
        for bad in [
            "projects/p/instances/i",
            "projects/p/instances/i/clusters/",
            "projects/p/clusters/c",
            "projects/p/instances/i/clusters/c/x",
        ] {
            let e = parse_parent(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(e.message().contains(bad), "{}", e.message());
        }
    }
}
