//! `local status`: `local.json` printed for people, with what each server says of itself over
//! the control protocol (`GetServerStatus` through [`GrpcTabletControl`], the master's own
//! client): whether it is ready and how many tablets it serves; a scale-in under way with its
//! progress; and, for an instance of several clusters, how far behind each is of each other
//! ([`crate::lifecycle::replication`], from etcd).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use basalt_master::{ServerState as MasterServerState, TabletControl};

use super::process::probe_once;
use super::state::{self, LocalState};
use crate::lifecycle::replication::{self, Replication};
use crate::tablet_servers::GrpcTabletControl;

/// What one server said (or why it said nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Answered { ready: bool, tablets: usize },
    Silent(String),
}

/// Asks every server of `local` for its status, all at once.
pub async fn observe(local: &LocalState) -> Vec<Observed> {
    let plaintext =
        GrpcTabletControl::new(basalt_control::Dialer::default(), Duration::from_secs(2));
    // The servers of a secured instance are asked with the runtime's own certificate.
    let secured = local.tls.as_ref().and_then(|tls| {
        let security = super::security::client_security(&tls.ca, &tls.operator, None).ok()?;
        Some(GrpcTabletControl::new(
            basalt_control::Dialer::new(security),
            Duration::from_secs(2),
        ))
    });
    let calls = local.servers().map(|(instance, _, server)| {
        let tls = local
            .instances
            .get(instance)
            .is_some_and(|i| i.security.is_some());
        let control = match (&secured, tls) {
            (Some(secured), true) => Some(secured),
            (_, true) => None,
            (_, false) => Some(&plaintext),
        };
        async move {
            let Some(control) = control else {
                return Observed::Silent(
                    "the runtime's certificate is not in local.json: cannot ask a TLS server"
                        .into(),
                );
            };
            let asked = MasterServerState {
                id: server.name.clone(),
                address: server.grpc.clone(),
                ordinal: server
                    .name
                    .rsplit('-')
                    .next()
                    .and_then(|o| o.parse().ok())
                    .unwrap_or(0),
                ready: false,
                stored_bytes: 0,
                capacity_bytes: None,
            };
            match control.report(&asked).await {
                Ok(report) => Observed::Answered {
                    ready: report.state.ready,
                    tablets: report.tablets.len(),
                },
                Err(error) => Observed::Silent(error.to_string()),
            }
        }
    });
    futures::future::join_all(calls).await
}

/// How `local status` reaches the runtime's etcd: with its certificate when etcd's URL is
/// `https://` (else, or without the material, plaintext: a TLS etcd then refuses it).
pub fn etcd_security(local: &LocalState) -> basalt_meta::Security {
    let tls_url = basalt_transport::split_url(&local.etcd)
        .is_some_and(|(scheme, _)| scheme != basalt_meta::Security::Plaintext.scheme());
    match (&local.tls, tls_url) {
        (Some(tls), true) => super::security::client_security(&tls.ca, &tls.operator, None)
            .unwrap_or(basalt_meta::Security::Plaintext),
        _ => basalt_meta::Security::Plaintext,
    }
}

/// Replication between the clusters of each instance of `local` with several, as etcd says
/// (instances whose etcd did not answer are left out).
pub async fn observe_replication(
    local: &LocalState,
) -> std::collections::BTreeMap<String, Replication> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(endpoints) =
        basalt_meta::endpoints(std::slice::from_ref(&local.etcd), &etcd_security(local))
    else {
        return out;
    };
    for (name, instance) in &local.instances {
        let read = async {
            let keys = basalt_meta::Keys::new(&instance.namespace, name);
            let meta = basalt_meta::Meta::connect(&endpoints, keys).await?;
            let mut observed = replication::observe(&meta).await?;
            let declared: Vec<String> = instance.clusters.keys().cloned().collect();
            replication::observe_leaving(&meta, &declared, &mut observed).await?;
            Ok::<_, basalt_master::model::Error>(observed)
        };
        if let Ok(Ok(observed)) = tokio::time::timeout(Duration::from_secs(3), read).await
            && !observed.pairs.is_empty()
        {
            out.insert(name.clone(), observed);
        }
    }
    out
}

/// The report, from `local.json`, whether the runtime and etcd are alive, what each server
/// said (in [`LocalState::servers`] order) and the replication of each instance. Pure.
pub fn render(
    data_dir: &Path,
    local: &LocalState,
    runtime_alive: bool,
    etcd_healthy: bool,
    observed: &[Observed],
    replicated: &std::collections::BTreeMap<String, Replication>,
) -> String {
    let mut out = String::new();
    let runtime = match (local.pid, runtime_alive) {
        (Some(pid), true) => format!("running (pid {pid})"),
        (Some(pid), false) => format!("not running (pid {pid} is gone: it did not stop cleanly)"),
        (None, _) => "stopped".to_string(),
    };
    let _ = writeln!(out, "runtime on {}: {runtime}", data_dir.display());
    let _ = writeln!(
        out,
        "etcd {}: {}",
        local.etcd,
        if etcd_healthy {
            "healthy"
        } else {
            "not answering"
        }
    );
    if let Some(control) = &local.control {
        let _ = writeln!(out, "control {control}");
        let _ = writeln!(
            out,
            "key visualizer {}/keyviz",
            basalt_transport::Security::Plaintext.url(control)
        );
    }
    let mut observed = observed.iter();
    for (name, instance) in &local.instances {
        let _ = writeln!(
            out,
            "\ninstance {name} (namespace {}): BIGTABLE_EMULATOR_HOST={}  {}",
            instance.namespace, instance.endpoint, instance.resource_name
        );
        for (cluster, c) in &instance.clusters {
            let _ = writeln!(out, "  cluster {cluster}: serveNodes {}", c.serve_nodes);
            if let Some(r) = &c.removing {
                let _ = writeln!(out, "    removing ({}): {}", r.reason, r.message);
            }
            if let Some(a) = &c.autoscaler {
                let _ = writeln!(out, "    {}", describe_autoscaler(a));
            }
            if let Some(s) = &c.scale_in {
                let _ = writeln!(
                    out,
                    "    scale-in from {} to {}: {} tablet(s) left to move off {}{}",
                    s.from,
                    s.to,
                    s.remaining_tablets,
                    if s.draining.is_empty() {
                        "-".to_string()
                    } else {
                        s.draining.join(", ")
                    },
                    if s.stopped.is_empty() {
                        String::new()
                    } else {
                        format!("; stopped {}", s.stopped.join(", "))
                    }
                );
                if let Some(why) = &s.blocked {
                    let _ = writeln!(out, "    blocked: {why}");
                }
            }
            let _ = writeln!(
                out,
                "    {:<24} {:<21} {:<21} {:>8} {:>8}  {:<5} {:>7}",
                "SERVER", "GRPC", "HTTP", "PID", "RESTARTS", "READY", "TABLETS"
            );
            for server in &c.servers {
                let pid = server.pid.map_or("-".to_string(), |p| p.to_string());
                let (ready, tablets, note) = match observed.next() {
                    Some(Observed::Answered { ready, tablets }) => (
                        if *ready { "yes" } else { "no" }.to_string(),
                        tablets.to_string(),
                        String::new(),
                    ),
                    Some(Observed::Silent(why)) => ("-".into(), "-".into(), format!("  ({why})")),
                    None => ("-".into(), "-".into(), String::new()),
                };
                let draining = c
                    .scale_in
                    .as_ref()
                    .is_some_and(|s| s.draining.contains(&server.name));
                let note = if draining {
                    format!("  draining{note}")
                } else {
                    note
                };
                let _ = writeln!(
                    out,
                    "    {:<24} {:<21} {:<21} {:>8} {:>8}  {:<5} {:>7}{note}",
                    server.name, server.grpc, server.http, pid, server.restarts, ready, tablets
                );
            }
        }
        if let Some(observed) = replicated.get(name) {
            let _ = writeln!(out, "  replication:");
            for s in &observed.seeding {
                let _ = writeln!(out, "    {}", s.describe());
            }
            for p in &observed.pairs {
                let state = if p.pending_entries == 0 {
                    "caught up".to_string()
                } else {
                    format!(
                        "{} write(s) waiting, the oldest for {:.1} s",
                        p.pending_entries, p.max_delay_seconds
                    )
                };
                let _ = writeln!(out, "    {} → {}: {state}", p.source, p.destination);
            }
            for why in &observed.leaving {
                let _ = writeln!(out, "    left the manifests, still a replica: {why}");
            }
        }
        if !instance.tables.is_empty() {
            let _ = writeln!(out, "  tables:");
            for (table, status) in &instance.tables {
                let _ = writeln!(out, "    {table}: {status}");
            }
        }
        if !instance.backups.is_empty() {
            let _ = writeln!(out, "  backups:");
            for (what, status) in &instance.backups {
                let _ = writeln!(out, "    {what}: {status}");
            }
        }
        if !instance.app_profiles.is_empty() {
            let ids: Vec<&str> = instance.app_profiles.keys().map(String::as_str).collect();
            let _ = writeln!(out, "  app profiles: {}", ids.join(", "));
        }
    }
    out
}

/// `local status --data-dir DIR`.
/// The autoscaler's decision in one line: the nodes decided, the recommendation, its
/// dimension and inputs, the source of the samples and what holds it back.
pub fn describe_autoscaler(a: &basalt_meta::AutoscalerRecord) -> String {
    let mut line = format!(
        "autoscaler: {} node(s), recommended {} ({})",
        a.nodes, a.recommended_nodes, a.dimension
    );
    if let Some(cpu) = a.cpu_utilization {
        line.push_str(&format!(", CPU {:.0} %", cpu * 100.0));
    }
    if let Some(n) = a.sampled_nodes {
        line.push_str(&format!(" over {n} node(s)"));
    }
    if let (Some(c), Some(s)) = (a.cpu_nodes, a.storage_nodes) {
        line.push_str(&format!(" (CPU wants {c}, storage {s})"));
    }
    line.push_str(&format!("; samples from {}", a.source));
    if let Some(why) = &a.source_message {
        line.push_str(&format!(" ({why})"));
    }
    if let (Some(r), Some(m)) = (&a.held_reason, &a.held_message) {
        line.push_str(&format!("; {r}: {m}"));
    }
    line
}

pub async fn status(data_dir: &Path) -> anyhow::Result<String> {
    let local = state::read(data_dir)?;
    let runtime_alive = local.pid.is_some_and(state::is_runtime);
    // The local runtime's etcd speaks plaintext HTTP on 127.0.0.1; its health is probed there.
    let etcd_healthy = match basalt_transport::split_url(&local.etcd)
        .and_then(|(_, a)| a.parse::<SocketAddr>().ok())
    {
        Some(addr) => probe_once(addr, "/health").await,
        None => false,
    };
    let observed = if runtime_alive {
        observe(&local).await
    } else {
        vec![]
    };
    let replicated = if etcd_healthy {
        observe_replication(&local).await
    } else {
        Default::default()
    };
    Ok(render(
        data_dir,
        &local,
        runtime_alive,
        etcd_healthy,
        &observed,
        &replicated,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::lifecycle::replication::{Pair, Seeding};
    use crate::local::state::{ClusterState, InstanceState, ScaleInState, ServerState};

    #[test]
    fn the_report_lists_every_server_with_what_it_said() {
        let server = |name: &str, pid| ServerState {
            name: name.into(),
            grpc: "127.0.0.1:4001".into(),
            http: "127.0.0.1:4002".into(),
            pid,
            data_dir: "/d".into(),
            restarts: 1,
            tablets: 0,
        };
        let local = LocalState {
            etcd: "http://127.0.0.1:2379".into(),
            etcd_pid: Some(5),
            control: Some("127.0.0.1:4000".into()),
            pid: Some(4),
            instances: BTreeMap::from([(
                "quickstart".to_string(),
                InstanceState {
                    namespace: "default".into(),
                    endpoint: "127.0.0.1:8086".into(),
                    resource_name: "projects/default/instances/quickstart".into(),
                    clusters: BTreeMap::from([(
                        "quickstart-c1".to_string(),
                        ClusterState {
                            serve_nodes: 2,
                            servers: vec![
                                server("quickstart-c1-0", Some(77)),
                                server("quickstart-c1-1", None),
                            ],
                            scale_in: None,
                            removing: None,
                            autoscaler: None,
                        },
                    )]),
                    tables: BTreeMap::from([("greetings".to_string(), "synced".to_string())]),
                    backups: BTreeMap::from([(
                        "BackupSchedule nightly".to_string(),
                        "next at 2026-11-30T03:00:00Z; 2 backup(s), 2 ready".to_string(),
                    )]),
                    app_profiles: BTreeMap::new(),
                    routing: BTreeMap::new(),
                    master: Default::default(),
                    replication: vec![],
                    seeding: vec![],
                    security: None,
                },
            )]),
            tls: None,
        };
        let text = render(
            Path::new("/d"),
            &local,
            true,
            true,
            &[
                Observed::Answered {
                    ready: true,
                    tablets: 3,
                },
                Observed::Silent("connection refused".into()),
            ],
            &BTreeMap::from([(
                "quickstart".to_string(),
                Replication {
                    seeding: vec![Seeding {
                        cluster: "quickstart-c3".into(),
                        source: Some("quickstart-c1".into()),
                        tables_left: 2,
                        rows: 1200,
                        bytes: 3 << 20,
                    }],
                    pairs: vec![
                        Pair {
                            source: "quickstart-c1".into(),
                            destination: "quickstart-c2".into(),
                            max_delay_seconds: 1.3,
                            pending_entries: 4,
                        },
                        Pair {
                            source: "quickstart-c2".into(),
                            destination: "quickstart-c1".into(),
                            max_delay_seconds: 0.0,
                            pending_entries: 0,
                        },
                    ],
                    leaving: vec![
                        "cluster quickstart-c4 holds writes not yet in any other \
                                   cluster: server quickstart-c4-0 has change log entries \
                                   waiting (3 to quickstart-c1)"
                            .into(),
                    ],
                },
            )]),
        );
        assert!(
            text.contains(
                "  replication:\n    quickstart-c3: initializing, copying from quickstart-c1, 2 table(s) left, 1200 entries (3.0 MiB) copied\n    quickstart-c1 → quickstart-c2: 4 write(s) waiting, the oldest for 1.3 s\n    quickstart-c2 → quickstart-c1: caught up\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "    left the manifests, still a replica: cluster quickstart-c4 holds writes not \
                 yet in any other cluster: server quickstart-c4-0 has change log entries waiting \
                 (3 to quickstart-c1)\n"
            ),
            "{text}"
        );
        assert!(
            text.starts_with(
                "runtime on /d: running (pid 4)\netcd http://127.0.0.1:2379: healthy\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("BIGTABLE_EMULATOR_HOST=127.0.0.1:8086"),
            "{text}"
        );
        let rows: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("quickstart-c1-"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0],
            [
                "quickstart-c1-0",
                "127.0.0.1:4001",
                "127.0.0.1:4002",
                "77",
                "1",
                "yes",
                "3"
            ]
        );
        assert_eq!(
            rows[1][..7],
            [
                "quickstart-c1-1",
                "127.0.0.1:4001",
                "127.0.0.1:4002",
                "-",
                "1",
                "-",
                "-"
            ]
        );
        assert!(text.contains("(connection refused)"));
        assert!(text.contains("greetings: synced"));
        assert!(text.contains(
            "  backups:\n    BackupSchedule nightly: next at 2026-11-30T03:00:00Z; 2 backup(s), 2 ready\n"
        ));
        let stopped = render(
            Path::new("/d"),
            &LocalState::default(),
            false,
            false,
            &[],
            &BTreeMap::new(),
        );
        assert!(stopped.starts_with("runtime on /d: stopped\n"), "{stopped}");

        // A scale-in 3 → 1 with one server stopped, one draining and blocked.
        let mut draining = local.clone();
        let cluster = draining
            .instances
            .get_mut("quickstart")
            .unwrap()
            .clusters
            .get_mut("quickstart-c1")
            .unwrap();
        cluster.serve_nodes = 1;
        cluster.scale_in = Some(ScaleInState {
            from: 3,
            to: 1,
            draining: vec!["quickstart-c1-1".into()],
            stopped: vec!["quickstart-c1-2".into()],
            remaining_tablets: 2,
            blocked: Some("cannot drain st-1: it is not ready".into()),
        });
        let text = render(
            Path::new("/d"),
            &draining,
            true,
            true,
            &[],
            &BTreeMap::new(),
        );
        assert!(
            text.contains(
                "  cluster quickstart-c1: serveNodes 1\n    scale-in from 3 to 1: 2 tablet(s) left to move off quickstart-c1-1; stopped quickstart-c1-2\n    blocked: cannot drain st-1: it is not ready\n"
            ),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("quickstart-c1-1"))
            .unwrap();
        assert!(row.ends_with("  draining"), "{row}");
    }
}
