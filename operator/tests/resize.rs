//! The lifecycle's resize step (`lifecycle::scale::resize`), the same on both runtimes, against
//! a real etcd: the requested count is in etcd before the runtime is asked to run anything, a
//! scale-in runs every server until the lifecycle lets them go, and a count etcd does not take
//! changes nothing.

mod etcd;

use std::sync::Mutex;

use basalt_master::NodeRuntime;
use basalt_meta::{Keys, Meta};
use basalt_operator::lifecycle::records::Replica;
use basalt_operator::lifecycle::scale::{ResizeError, resize, size};

use etcd::{Endpoints, Etcd};

/// A runtime that records each count it is asked to run, with what etcd held for the
/// cluster at that moment.
struct Recording {
    meta: Meta,
    asked: Mutex<Vec<(u32, Option<u32>)>>,
}

impl NodeRuntime for Recording {
    type Error = std::io::Error;

    async fn set_servers(&self, cluster: &str, servers: u32) -> Result<(), Self::Error> {
        let held = self.meta.serve_nodes(cluster).await.ok().flatten();
        self.asked.lock().unwrap().push((servers, held));
        Ok(())
    }

    async fn restart(&self, _: &str, _: u32) -> Result<(), Self::Error> {
        Ok(())
    }
}

async fn connect(etcd: &Etcd) -> Meta {
    Meta::connect(&etcd.endpoints(), Keys::new("shop", "orders"))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_scale_out_is_recorded_before_any_server_starts() {
    let etcd = Etcd::start().await;
    let meta = connect(&etcd).await;
    meta.set_serve_nodes("c1", 3).await.unwrap();
    let nodes = Recording {
        meta: connect(&etcd).await,
        asked: Mutex::new(vec![]),
    };
    let decided = size(5, Some(3), None, false);
    let replicas = [
        Replica {
            cluster: "c1".into(),
            peer_endpoint: Some("gw-c1:8086".into()),
        },
        Replica::named("c2"),
    ];
    resize(
        &nodes,
        Some(&meta),
        "c1",
        &replicas,
        None,
        &decided,
        Some(3),
        Some(Some(3)),
    )
    .await
    .unwrap();
    // The runtime was asked for 5 once etcd held 5: the master never sees a new server above
    // the recorded count (it would drain it).
    assert_eq!(*nodes.asked.lock().unwrap(), vec![(5, Some(5))]);
    // Every cluster of the instance is a replica (numbered) before a server starts, and keeps
    // its number.
    let numbers = meta.cluster_numbers().await.unwrap();
    assert_eq!(
        numbers.into_iter().collect::<Vec<_>>(),
        vec![("c1".to_string(), 1), ("c2".to_string(), 2)]
    );
    assert_eq!(meta.cluster_number("c2").await.unwrap(), 2);
    // And reached where its spec says.
    assert_eq!(
        meta.peer_endpoints().await.unwrap(),
        [("c1".to_string(), "gw-c1:8086".to_string())].into()
    );
    // c2 leaves the instance (no server of it registered): released at the next resize; c3
    // joins and takes a number no cluster ever had (versions of c2's writes keep theirs).
    let replicas = [
        Replica::named("c1"),
        Replica {
            cluster: "c3".into(),
            peer_endpoint: Some("gw-c3:8086".into()),
        },
    ];
    resize(
        &nodes,
        Some(&meta),
        "c1",
        &replicas,
        None,
        &decided,
        Some(5),
        Some(Some(5)),
    )
    .await
    .unwrap();
    let numbers = meta.cluster_numbers().await.unwrap();
    assert_eq!(
        numbers.into_iter().collect::<Vec<_>>(),
        vec![("c1".to_string(), 1), ("c3".to_string(), 3)]
    );
    // c1's endpoint left its spec: it is reached at its servers again.
    assert_eq!(
        meta.peer_endpoints().await.unwrap(),
        [("c3".to_string(), "gw-c3:8086".to_string())].into()
    );
}

#[tokio::test]
async fn a_scale_in_is_recorded_and_every_server_keeps_running_until_it_may_stop() {
    let etcd = Etcd::start().await;
    let meta = connect(&etcd).await;
    meta.set_serve_nodes("c1", 4).await.unwrap();
    let nodes = Recording {
        meta: connect(&etcd).await,
        asked: Mutex::new(vec![]),
    };
    // Etcd not read yet for the tablet map: nothing may stop.
    let decided = size(2, Some(4), None, false);
    assert_eq!(decided.servers, 4);
    resize(
        &nodes,
        Some(&meta),
        "c1",
        &[],
        None,
        &decided,
        Some(4),
        Some(Some(4)),
    )
    .await
    .unwrap();
    assert_eq!(*nodes.asked.lock().unwrap(), vec![(4, Some(2))]);
    assert_eq!(meta.serve_nodes("c1").await.unwrap(), Some(2));
}

#[tokio::test]
async fn a_count_etcd_does_not_take_changes_no_server() {
    let mut etcd = Etcd::start().await;
    let meta = connect(&etcd).await;
    let nodes = Recording {
        meta: connect(&etcd).await,
        asked: Mutex::new(vec![]),
    };
    etcd.kill();
    let decided = size(5, Some(3), None, false);
    let error = resize(
        &nodes,
        Some(&meta),
        "c1",
        &[],
        None,
        &decided,
        Some(3),
        Some(Some(3)),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ResizeError::Record(_)), "{error}");
    assert!(error.to_string().contains("serveNodes 5"), "{error}");
    // Asked to keep the 3 it runs, not to start 2 the master would drain at once.
    assert_eq!(
        nodes
            .asked
            .lock()
            .unwrap()
            .iter()
            .map(|a| a.0)
            .collect::<Vec<_>>(),
        vec![3]
    );
}

#[tokio::test]
async fn autoscaling_settings_are_recorded_for_the_master_and_deleted_with_autoscaling() {
    let etcd = Etcd::start().await;
    let meta = connect(&etcd).await;
    let nodes = Recording {
        meta: connect(&etcd).await,
        asked: Mutex::new(vec![]),
    };
    let settings = basalt_meta::AutoscalingRecord {
        min_serve_nodes: 1,
        max_serve_nodes: 4,
        cpu_utilization_percent: 50,
        storage_utilization_bytes_per_node: 2560 << 30,
        node_capacity_bytes: Some(10 << 30),
    };
    let decided = size(1, None, None, false);
    resize(
        &nodes,
        Some(&meta),
        "c1",
        &[],
        Some(&settings),
        &decided,
        None,
        Some(None),
    )
    .await
    .unwrap();
    assert_eq!(meta.autoscaling("c1").await.unwrap(), Some(settings));
    // A decision the master wrote goes with the settings when the cluster stops autoscaling.
    let leadership = meta
        .campaign("m", std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let decision = basalt_meta::AutoscalerRecord {
        nodes: 2,
        recommended_nodes: 2,
        wanted_nodes: Some(2),
        dimension: "cpu".into(),
        cpu_utilization: Some(0.9),
        stored_bytes: None,
        sampled_nodes: Some(1),
        cpu_nodes: Some(2),
        storage_nodes: Some(1),
        held_reason: None,
        held_message: None,
        source: "servers".into(),
        source_message: None,
        last_change_unix_ms: Some(1),
    };
    let written = meta.put_autoscaler(&leadership.term, "c1", &decision);
    assert!(written.await.unwrap());
    assert_eq!(meta.autoscaler("c1").await.unwrap().unwrap().nodes, 2);
    let fixed = size(2, Some(1), None, false);
    resize(
        &nodes,
        Some(&meta),
        "c1",
        &[],
        None,
        &fixed,
        Some(1),
        Some(Some(1)),
    )
    .await
    .unwrap();
    assert_eq!(meta.autoscaling("c1").await.unwrap(), None);
    assert_eq!(meta.autoscaler("c1").await.unwrap(), None);
}
