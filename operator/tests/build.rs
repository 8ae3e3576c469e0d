//! The pure builders on YAML fixtures, compared with checked-in snapshots of the generated
//! objects (`tests/snapshots/`). `UPDATE_SNAPSHOTS=1 cargo test --release -p basalt-operator --test build`
//! rewrites them; review the diff like any code change.

use std::path::{Path, PathBuf};

use basalt_operator::build::{self, OperatorConfig};
use basalt_operator::crd::{Cluster, Instance};

fn dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(sub)
}

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> Vec<T> {
    let text = std::fs::read_to_string(dir("fixtures").join(name)).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| T::deserialize(d).unwrap())
        .collect()
}

fn snapshot(name: &str, objects: &[serde_json::Value]) {
    let mut text = String::new();
    for o in objects {
        text.push_str("---\n");
        text.push_str(&serde_norway::to_string(o).unwrap());
    }
    let path = dir("snapshots").join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing snapshot {}: run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    if expected != text {
        let first = expected
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(text.lines().count()));
        panic!(
            "{name} differs from the snapshot at line {}:\n  snapshot: {:?}\n  built:    {:?}\n(UPDATE_SNAPSHOTS=1 rewrites it)",
            first + 1,
            expected.lines().nth(first),
            text.lines().nth(first)
        );
    }
}

fn config() -> OperatorConfig {
    OperatorConfig {
        tablet_server_image: "registry.example/basalt-tablet-server:0.1.0".into(),
        ssd_storage_class: "fast-ssd".into(),
        hdd_storage_class: "slow-hdd".into(),
        etcd_image: "registry.example/etcd:3.5.21-0".into(),
        etcd_storage_class: None,
        network_policy_operator_namespace: Some("basalt-system".into()),
        token_reviewer_cluster_role: Some("basalt-operator-token-reviewer".into()),
    }
}

fn cluster_snapshot(fixture_name: &str, current: Option<i32>, snap: &str) {
    let cluster: Cluster = fixture(fixture_name).remove(0);
    // The clusters' Instance (orders-prod, Production): three etcd members.
    let instance: Instance = fixture("instance.yaml").remove(0);
    // The replica count validation decides when no server is kept for a drain: the requested
    // one.
    let replicas = build::desired_serve_nodes(&cluster, current, None);
    let objects = build::cluster_objects(&cluster, &instance, &config(), replicas);
    snapshot(
        snap,
        &[
            serde_json::to_value(&objects.statefulset).unwrap(),
            serde_json::to_value(&objects.headless_service).unwrap(),
            serde_json::to_value(&objects.pod_disruption_budget).unwrap(),
        ],
    );
}

#[test]
fn ssd_cluster_in_one_zone() {
    cluster_snapshot("cluster-ssd-zonal.yaml", None, "cluster-ssd-zonal.yaml");
}

#[test]
fn hdd_cluster_with_autoscaling_and_pod_overrides() {
    // An autoscaled cluster currently at 7 nodes is brought within [2, 5].
    cluster_snapshot(
        "cluster-hdd-autoscaling.yaml",
        Some(7),
        "cluster-hdd-autoscaling.yaml",
    );
    let cluster: Cluster = fixture("cluster-hdd-autoscaling.yaml").remove(0);
    assert_eq!(build::desired_serve_nodes(&cluster, Some(7), None), 5);
    assert_eq!(build::desired_serve_nodes(&cluster, Some(3), None), 3);
    assert_eq!(build::desired_serve_nodes(&cluster, None, None), 2);
    // The autoscaler's decision wins over the current count, within the bounds.
    assert_eq!(build::desired_serve_nodes(&cluster, Some(3), Some(4)), 4);
    assert_eq!(build::desired_serve_nodes(&cluster, Some(3), Some(9)), 5);
    assert_eq!(build::desired_serve_nodes(&cluster, None, Some(1)), 2);
}

#[test]
fn instance_service_config_map_and_metadata_store() {
    let instance: Instance = fixture("instance.yaml").remove(0);
    let objects = build::instance_objects(&instance, &config(), 3);
    snapshot(
        "instance.yaml",
        &[
            serde_json::to_value(&objects.service).unwrap(),
            serde_json::to_value(&objects.config_map).unwrap(),
        ],
    );
    let store = objects
        .metadata_store
        .expect("the operator runs the instance's etcd");
    snapshot(
        "instance-metadata-store.yaml",
        &[
            serde_json::to_value(&store.statefulset).unwrap(),
            serde_json::to_value(&store.service).unwrap(),
            serde_json::to_value(&store.pod_disruption_budget).unwrap(),
            serde_json::to_value(store.network_policy.as_ref().expect("asked for")).unwrap(),
        ],
    );
}
