//! Reconcile paths against an in-memory API server (tower-test mock service): the objects each
//! controller leaves behind, its status and events. Table reconciles talk to a real tablet
//! server (in-process, real RocksDB) through the table admin API.

mod fake_api;

use std::sync::Arc;
use std::time::Duration;

use basalt_operator::admin::GrpcTableAdmin;
use basalt_operator::build::OperatorConfig;
use basalt_operator::controller::{self, Context, app_profile, cluster, instance, table};
use basalt_operator::crd::{AppProfile, Cluster, Instance, Table};
use basalt_operator::metrics::Metrics;
use fake_api::FakeApi;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use serde_json::{Value, json};

const NS: &str = "shop";

fn crd_path(plural: &str, name: &str) -> String {
    format!("/apis/basalt.dev/v1alpha1/namespaces/{NS}/{plural}/{name}")
}
fn sts_path(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{NS}/statefulsets/{name}")
}
fn core_path(plural: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/{plural}/{name}")
}
fn pdb_path(name: &str) -> String {
    format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{name}")
}

fn ctx(api: &FakeApi, pdb_supported: bool) -> Arc<Context> {
    controller::context(
        api.client(),
        OperatorConfig {
            tablet_server_image: "registry.example/basalt-tablet-server:test".into(),
            ssd_storage_class: "fast-ssd".into(),
            hdd_storage_class: "slow-hdd".into(),
            ..OperatorConfig::default()
        },
        Arc::new(Metrics::new()),
        Duration::from_secs(10),
        pdb_supported,
        None,
        Some(pki()),
    )
}

/// The operator's CA and certificate, as `basalt-operator run` loads them (its Secret aside):
/// the Production instances of these tests are secured.
fn pki() -> Arc<basalt_operator::controller::pki::OperatorPki> {
    let now = std::time::SystemTime::now();
    let ca = basalt_operator::lifecycle::certificates::new_ca("test CA", now).unwrap();
    let dir = tempfile::tempdir().unwrap().keep();
    Arc::new(basalt_operator::controller::pki::OperatorPki::new(ca, dir, now).unwrap())
}

fn get<K: serde::de::DeserializeOwned>(api: &FakeApi, path: &str) -> K {
    serde_json::from_value(api.get(path).unwrap_or_else(|| panic!("{path} missing"))).unwrap()
}

fn condition<'a>(obj: &'a Value, type_: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {}", obj["status"]))
}

/// A Production instance: secured (TLS) by default.
fn seed_instance(api: &FakeApi, name: &str, protected: bool) {
    api.create(
        &crd_path("instances", name),
        json!({
            "apiVersion": "basalt.dev/v1alpha1", "kind": "Instance",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"displayName": "Orders", "deletionProtection": protected},
        }),
    );
}

/// A Production instance with TLS off: its servers (real ones, below) take plaintext.
fn seed_plaintext_instance(api: &FakeApi, name: &str) {
    api.create(
        &crd_path("instances", name),
        json!({
            "apiVersion": "basalt.dev/v1alpha1", "kind": "Instance",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"displayName": "Orders", "security": {"tls": "Disabled"}},
        }),
    );
}

fn seed_cluster(api: &FakeApi, name: &str, spec: Value) {
    api.create(
        &crd_path("clusters", name),
        json!({
            "apiVersion": "basalt.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }),
    );
}

async fn reconcile_cluster(api: &FakeApi, ctx: &Arc<Context>, name: &str) {
    let c: Cluster = get(api, &crd_path("clusters", name));
    cluster::reconcile(Arc::new(c), ctx.clone()).await.unwrap();
}

async fn reconcile_instance(api: &FakeApi, ctx: &Arc<Context>, name: &str) {
    let i: Instance = get(api, &crd_path("instances", name));
    instance::reconcile(Arc::new(i), ctx.clone()).await.unwrap();
}

#[tokio::test]
async fn cluster_becomes_a_statefulset_services_and_a_pdb_and_scales() {
    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_instance(&api, "orders-prod", false);
    seed_cluster(
        &api,
        "orders-c1",
        json!({"instanceRef": "orders-prod", "serveNodes": 3, "storageType": "SSD", "location": "europe-west1-b", "storageSize": "100Gi"}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;

    let sts = api
        .get(&sts_path("orders-c1"))
        .expect("StatefulSet created");
    assert_eq!(sts["spec"]["replicas"], 3);
    assert_eq!(sts["spec"]["serviceName"], "orders-c1-nodes");
    assert_eq!(sts["metadata"]["ownerReferences"][0]["kind"], "Cluster");
    assert_eq!(sts["metadata"]["ownerReferences"][0]["controller"], true);
    let claim = &sts["spec"]["volumeClaimTemplates"][0]["spec"];
    assert_eq!(claim["storageClassName"], "fast-ssd");
    assert_eq!(claim["resources"]["requests"]["storage"], "100Gi");
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"][0],
        "europe-west1-b"
    );
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.example/basalt-tablet-server:test"
    );
    assert!(api.get(&core_path("services", "orders-c1-nodes")).is_some());
    assert_eq!(
        api.get(&pdb_path("orders-c1")).expect("PDB created")["spec"]["maxUnavailable"],
        1
    );

    // No pod ready yet: the status says so.
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert_eq!(condition(&c, "Ready")["status"], "False");
    assert_eq!(
        c["status"]["selector"],
        "app.kubernetes.io/component=tablet-server,app.kubernetes.io/name=basalt,basalt.dev/cluster=orders-c1"
    );
    assert!(
        api.events()
            .iter()
            .any(|(r, n)| r == "Created" && n.contains("3 tablet server"))
    );

    // The StatefulSet controller brings the pods up.
    let generation = api.get(&sts_path("orders-c1")).unwrap()["metadata"]["generation"].clone();
    api.set_status(
        &sts_path("orders-c1"),
        json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "observedGeneration": generation}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert_eq!(condition(&c, "Ready")["status"], "True");
    assert_eq!(condition(&c, "Ready")["reason"], "AllNodesReady");
    assert_eq!(condition(&c, "Progressing")["status"], "False");
    assert_eq!(c["status"]["readyNodes"], 3);
    assert_eq!(c["status"]["serveNodes"], 3);
    // The servers run in cluster mode against the instance's etcd.
    let args = api.get(&sts_path("orders-c1")).unwrap()["spec"]["template"]["spec"]["containers"]
        [0]["args"]
        .clone();
    assert_eq!(args[0], "--cluster=orders-c1");
    // Secured (Production): etcd over TLS, the server's TLS flags and its Secret mounted.
    assert_eq!(
        args[1],
        "--etcd=https://orders-prod-meta-0.orders-prod-meta.shop.svc:2379,https://orders-prod-meta-1.orders-prod-meta.shop.svc:2379,https://orders-prod-meta-2.orders-prod-meta.shop.svc:2379"
    );
    assert!(
        args.as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--tls-server-name")
    );
    let pod = &api.get(&sts_path("orders-c1")).unwrap()["spec"]["template"]["spec"];
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "orders-prod-server-tls")
    );
    assert!(conditions_of(&c).iter().all(|t| t != "SingleDatabase"));

    // kubectl scale: spec.serveNodes changes through the scale subresource.
    api.update_spec(&crd_path("clusters", "orders-c1"), json!({"serveNodes": 5}));
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    assert_eq!(
        api.get(&sts_path("orders-c1")).unwrap()["spec"]["replicas"],
        5
    );
    assert!(
        api.events()
            .iter()
            .any(|(r, n)| r == "Scaled" && n == "scaled from 3 to 5 tablet server(s)")
    );
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert_eq!(condition(&c, "Progressing")["status"], "True");

    // Scale-in: no metadata store answers in this test, so the operator can neither tell the
    // master nor know which servers own tablets; it keeps the five servers and says why.
    api.update_spec(&crd_path("clusters", "orders-c1"), json!({"serveNodes": 2}));
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    assert_eq!(
        api.get(&sts_path("orders-c1")).unwrap()["spec"]["replicas"],
        5
    );
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    let scale_in = condition(&c, "ScaleIn");
    assert_eq!(scale_in["status"], "True");
    assert_eq!(scale_in["reason"], "Draining");
    let message = scale_in["message"].as_str().unwrap();
    assert!(
        message.contains("scaling in from 5 to 2 tablet server(s)")
            && message.contains("keeps 5 for now")
            && message.contains("could not be read"),
        "{message}"
    );
    assert_eq!(
        c["status"]["scaleIn"],
        json!({"fromNodes": 5, "toNodes": 2,
               "drainingNodes": ["orders-c1-2", "orders-c1-3", "orders-c1-4"]})
    );
    assert_eq!(condition(&c, "DrainBlocked")["reason"], "NotKnownYet");
    assert!(api.events().iter().any(|(r, _)| r == "ScaleInStarted"));

    // Raised back: cancelled.
    api.update_spec(&crd_path("clusters", "orders-c1"), json!({"serveNodes": 5}));
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert_eq!(condition(&c, "ScaleIn")["status"], "False");
    assert_eq!(condition(&c, "ScaleIn")["reason"], "Cancelled");
    assert!(c["status"].get("scaleIn").is_none(), "{}", c["status"]);
    assert!(api.events().iter().any(|(r, _)| r == "ScaleInCancelled"));
}

#[tokio::test]
async fn the_kubernetes_node_runtime_applies_the_replicas_and_restarts_a_server_by_its_pod() {
    use basalt_master::NodeRuntime;
    use basalt_operator::controller::cluster::nodes::StatefulSetNodes;

    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_instance(&api, "orders-prod", false);
    seed_cluster(
        &api,
        "orders-c1",
        json!({"instanceRef": "orders-prod", "serveNodes": 3}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    api.create(
        &core_path("pods", "orders-c1-1"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orders-c1-1", "namespace": NS}}),
    );
    let c: Cluster = get(&api, &crd_path("clusters", "orders-c1"));
    let i: Instance = get(&api, &crd_path("instances", "orders-prod"));
    let built = basalt_operator::build::cluster_objects(&c, &i, &ctx.config, 3).statefulset;
    let nodes = StatefulSetNodes::new(&ctx, "orders-c1", NS, built);

    nodes.set_servers("orders-c1", 5).await.unwrap();
    assert_eq!(
        api.get(&sts_path("orders-c1")).unwrap()["spec"]["replicas"],
        5
    );
    let applied = nodes.applied().expect("the StatefulSet as applied");
    assert_eq!(applied.spec.unwrap().replicas, Some(5));

    nodes.restart("orders-c1", 1).await.unwrap();
    assert!(api.get(&core_path("pods", "orders-c1-1")).is_none());
    // The StatefulSet keeps its replicas: the pod comes back under its name, on its claim.
    assert_eq!(
        api.get(&sts_path("orders-c1")).unwrap()["spec"]["replicas"],
        5
    );

    // Asked for another cluster: refused, nothing applied.
    let error = nodes.set_servers("orders-c2", 1).await.unwrap_err();
    assert!(error.to_string().contains("cluster orders-c2"), "{error}");
    assert!(api.get(&sts_path("orders-c2")).is_none());
}

fn conditions_of(obj: &Value) -> Vec<String> {
    obj["status"]["conditions"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| c["type"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn storage_type_and_location_changes_are_refused_and_nothing_is_touched() {
    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_instance(&api, "orders-prod", false);
    seed_cluster(
        &api,
        "orders-c1",
        json!({"instanceRef": "orders-prod", "serveNodes": 1}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    let before = api.get(&sts_path("orders-c1")).unwrap();
    assert_eq!(
        before["metadata"]["labels"]["basalt.dev/storage-type"],
        "SSD"
    );

    api.update_spec(
        &crd_path("clusters", "orders-c1"),
        json!({"storageType": "HDD", "location": "us-east1-c", "serveNodes": 4, "storageSize": "20Gi"}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    assert_eq!(
        api.get(&sts_path("orders-c1")).unwrap(),
        before,
        "StatefulSet must not change"
    );
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    let degraded = condition(&c, "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "InvalidSpec");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("spec.storageType: is immutable: the cluster runs on Ssd"),
        "{message}"
    );
    assert!(message.contains("spec.location: is immutable"), "{message}");
    assert!(
        message.contains("spec.storageSize: cannot change from 10Gi to 20Gi"),
        "{message}"
    );
    assert_eq!(degraded["observedGeneration"], 2);
    assert!(api.events().iter().any(|(r, _)| r == "InvalidSpec"));
}

#[tokio::test]
async fn old_api_servers_get_no_pdb_and_a_condition_saying_so() {
    let api = FakeApi::default();
    let ctx = ctx(&api, false);
    seed_instance(&api, "orders-prod", false);
    seed_cluster(
        &api,
        "orders-c1",
        json!({"instanceRef": "orders-prod", "serveNodes": 1}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    assert!(api.get(&sts_path("orders-c1")).is_some());
    assert!(api.get(&pdb_path("orders-c1")).is_none());
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert_eq!(condition(&c, "DisruptionBudget")["reason"], "Unsupported");
}

#[tokio::test]
async fn cluster_without_instance_waits_and_volumes_go_only_when_asked() {
    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_cluster(
        &api,
        "orders-c1",
        json!({"instanceRef": "orders-prod", "serveNodes": 1}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    assert!(api.get(&sts_path("orders-c1")).is_none());
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert_eq!(condition(&c, "Ready")["reason"], "InstanceNotFound");

    // Retain (default): no finalizer, deleting the Cluster leaves the claims alone.
    seed_instance(&api, "orders-prod", false);
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-orders-c1-0", "namespace": NS, "labels": {
            "app.kubernetes.io/name": "basalt", "app.kubernetes.io/component": "tablet-server", "basalt.dev/cluster": "orders-c1"}},
    });
    api.create(
        &core_path("persistentvolumeclaims", "data-orders-c1-0"),
        claim.clone(),
    );
    assert!(
        api.get(&crd_path("clusters", "orders-c1")).unwrap()["metadata"]["finalizers"].is_null()
    );

    // Delete: a finalizer appears; deletion removes the claims, then the Cluster goes.
    api.update_spec(
        &crd_path("clusters", "orders-c1"),
        json!({"volumeReclaimPolicy": "Delete"}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert_eq!(
        c["metadata"]["finalizers"],
        json!(["basalt.dev/delete-volumes"])
    );
    api.delete(&crd_path("clusters", "orders-c1"));
    assert!(
        api.get(&crd_path("clusters", "orders-c1")).is_some(),
        "held by the finalizer"
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    assert!(
        api.get(&core_path("persistentvolumeclaims", "data-orders-c1-0"))
            .is_none()
    );
    assert!(api.get(&crd_path("clusters", "orders-c1")).is_none());
}

#[tokio::test]
async fn instance_deletion_is_held_while_protected() {
    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_instance(&api, "orders-prod", true);
    reconcile_instance(&api, &ctx, "orders-prod").await;
    let path = crd_path("instances", "orders-prod");
    assert_eq!(
        api.get(&path).unwrap()["metadata"]["finalizers"],
        json!(["basalt.dev/deletion-protection"])
    );
    reconcile_instance(&api, &ctx, "orders-prod").await;
    let i = api.get(&path).unwrap();
    assert_eq!(i["status"]["endpoint"], "orders-prod.shop.svc:8086");
    assert_eq!(
        i["status"]["resourceName"],
        "projects/shop/instances/orders-prod"
    );
    assert_eq!(condition(&i, "Ready")["reason"], "NoClusters");
    let svc = api
        .get(&core_path("services", "orders-prod"))
        .expect("client Service");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8086);
    // Its metadata store: a three-member etcd (Production), a headless Service, a PDB.
    let store = api
        .get(&sts_path("orders-prod-meta"))
        .expect("etcd StatefulSet");
    assert_eq!(store["spec"]["replicas"], 3);
    assert_eq!(store["metadata"]["ownerReferences"][0]["kind"], "Instance");
    assert!(
        api.get(&core_path("services", "orders-prod-meta"))
            .is_some()
    );
    assert!(api.get(&pdb_path("orders-prod-meta")).is_some());
    assert_eq!(condition(&i, "MetadataStoreReady")["reason"], "NoQuorum");
    assert_eq!(
        i["status"]["metadataStore"]["endpoints"][0],
        "https://orders-prod-meta-0.orders-prod-meta.shop.svc:2379"
    );
    // Secured (Production): its Secrets, issued by the operator's CA, owned by the Instance.
    for name in [
        "orders-prod-server-tls",
        "orders-prod-meta-tls",
        "orders-prod-identity-admin",
    ] {
        let secret = api
            .get(&core_path("secrets", name))
            .unwrap_or_else(|| panic!("Secret {name}"));
        assert_eq!(secret["metadata"]["ownerReferences"][0]["kind"], "Instance");
        assert!(secret["data"]["tls.crt"].is_string(), "{secret}");
    }
    assert!(
        api.state
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|(reason, _)| reason == "CertificateIssued")
    );
    assert!(
        api.events()
            .iter()
            .any(|(r, _)| r == "MetadataStoreCreated")
    );
    assert_eq!(
        svc["spec"]["selector"]["basalt.dev/instance"],
        "orders-prod"
    );

    api.delete(&path);
    reconcile_instance(&api, &ctx, "orders-prod").await;
    let i = api.get(&path).expect("deletion is held");
    assert_eq!(condition(&i, "DeletionBlocked")["status"], "True");
    assert!(api.events().iter().any(|(r, _)| r == "DeletionBlocked"));

    api.update_spec(&path, json!({"deletionProtection": false}));
    reconcile_instance(&api, &ctx, "orders-prod").await;
    assert!(
        api.get(&path).is_none(),
        "deletion completes once protection is off"
    );
}

#[tokio::test]
async fn instance_status_follows_its_clusters_and_app_profiles_stay_out_of_its_config_map() {
    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_instance(&api, "orders-prod", false);
    for name in ["orders-c1", "orders-c2"] {
        seed_cluster(
            &api,
            name,
            json!({"instanceRef": "orders-prod", "serveNodes": 1}),
        );
        reconcile_cluster(&api, &ctx, name).await;
    }
    // Two Clusters: each carries the removal finalizer (its deletion waits for its writes to
    // reach the other); adding it ends a pass, the next runs the pipeline.
    for name in ["orders-c1", "orders-c2"] {
        reconcile_cluster(&api, &ctx, name).await;
        let c = api.get(&crd_path("clusters", name)).unwrap();
        assert_eq!(
            c["metadata"]["finalizers"],
            json!(["basalt.dev/ship-before-removal"])
        );
        reconcile_cluster(&api, &ctx, name).await;
    }
    let generation = api.get(&sts_path("orders-c1")).unwrap()["metadata"]["generation"].clone();
    api.set_status(
        &sts_path("orders-c1"),
        json!({"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": generation}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;

    for (name, routing) in [
        (
            "batch",
            json!({"singleClusterRouting": {"clusterId": "orders-c1", "allowTransactionalWrites": true}}),
        ),
        (
            "ghost",
            json!({"singleClusterRouting": {"clusterId": "orders-c9"}}),
        ),
    ] {
        api.create(
            &crd_path("appprofiles", name),
            json!({"apiVersion": "basalt.dev/v1alpha1", "kind": "AppProfile",
                   "metadata": {"name": name, "namespace": NS},
                   "spec": {"instanceRef": "orders-prod", "routing": routing}}),
        );
        let p: AppProfile = get(&api, &crd_path("appprofiles", name));
        app_profile::reconcile(Arc::new(p), ctx.clone())
            .await
            .unwrap();
    }
    let ghost = api.get(&crd_path("appprofiles", "ghost")).unwrap();
    assert_eq!(condition(&ghost, "Ready")["reason"], "InvalidSpec");
    assert_eq!(
        condition(&ghost, "Ready")["message"],
        "spec.routing.singleClusterRouting.clusterId: instance \"orders-prod\" has no cluster \"orders-c9\" (clusters: orders-c1, orders-c2)"
    );
    let batch = api.get(&crd_path("appprofiles", "batch")).unwrap();
    assert_eq!(condition(&batch, "Ready")["reason"], "Published");

    reconcile_instance(&api, &ctx, "orders-prod").await;
    let i = api.get(&crd_path("instances", "orders-prod")).unwrap();
    assert_eq!(condition(&i, "Ready")["status"], "True");
    assert_eq!(condition(&i, "Ready")["message"], "1/2 clusters ready");
    assert_eq!(condition(&i, "Degraded")["message"], "not ready: orders-c2");
    assert_eq!(i["status"]["clusters"][0]["name"], "orders-c1");
    assert_eq!(i["status"]["clusters"][0]["ready"], true);

    // App profiles are published through the instance's catalog in etcd only; the ConfigMap
    // holds the instance's identity.
    let cm = api
        .get(&core_path("configmaps", "orders-prod-config"))
        .expect("ConfigMap");
    let keys: Vec<&str> = cm["data"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["instance.json"]);
    let identity: Value =
        serde_json::from_str(cm["data"]["instance.json"].as_str().unwrap()).unwrap();
    assert_eq!(identity["instance"], "orders-prod");
}

// ------------------------------------------------------------------- Table, real server

/// A real tablet server on `ip:8086` (a loopback address of its own), stopped on drop.
struct TabletServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
    ip: String,
}

impl TabletServer {
    async fn start(ip: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = basalt_tablet_server::server::Config {
            backup: None,
            data_dir: dir.path().join("data"),
            listen: format!("{ip}:8086").parse().unwrap(),
            http_listen: format!("{ip}:8087").parse().unwrap(),
            cluster_id: "orders-c1".into(),
            tombstone_grace: Duration::from_secs(3600),
            block_cache_bytes: 8 << 20,
            shutdown_timeout: Duration::from_secs(5),
            cpu_allocation_millicores: None,
            identity: Default::default(),
            cluster: None,
            security: basalt_transport::Security::Plaintext,
            filter: None,
            store_slot: None,
            auth: Default::default(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            basalt_tablet_server::server::run(config, async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        // Wait until it accepts connections.
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(format!("{ip}:8086"))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            stop: Some(tx),
            task: Some(task),
            _dir: dir,
            ip: ip.into(),
        }
    }

    async fn table(&self, name: &str) -> Option<admin::Table> {
        use basalt_operator::admin::TableAdmin;
        GrpcTableAdmin::new(Duration::from_secs(5))
            .get_table(&format!("{}:8086", self.ip), name)
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

fn seed_ready_pod(api: &FakeApi, ip: &str) {
    api.create(
        &core_path("pods", "orders-c1-0"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "orders-c1-0", "namespace": NS, "labels": {
                "app.kubernetes.io/name": "basalt", "app.kubernetes.io/component": "tablet-server",
                "basalt.dev/instance": "orders-prod", "basalt.dev/cluster": "orders-c1"}},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
        }),
    );
}

async fn reconcile_table(api: &FakeApi, ctx: &Arc<Context>, name: &str) {
    let t: Table = get(api, &crd_path("tables", name));
    table::reconcile(Arc::new(t), ctx.clone()).await.unwrap();
}

fn family_names(t: &admin::Table) -> Vec<String> {
    let mut names: Vec<String> = t.column_families.keys().cloned().collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_schema_is_applied_through_the_admin_api_and_never_dropped_by_surprise() {
    let server = TabletServer::start("127.0.0.71").await;
    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_plaintext_instance(&api, "orders-prod");
    let path = crd_path("tables", "orders");
    api.create(
        &path,
        json!({
            "apiVersion": "basalt.dev/v1alpha1", "kind": "Table",
            "metadata": {"name": "orders", "namespace": NS},
            "spec": {
                "instanceRef": "orders-prod",
                "columnFamilies": {
                    "details": {"gcRule": {"union": [{"maxNumVersions": 3}, {"maxAge": "30d"}]}},
                    "stats": {"valueType": {"aggregate": "Sum"}},
                },
                "initialSplits": ["m"],
            },
        }),
    );
    // No ready tablet server yet.
    reconcile_table(&api, &ctx, "orders").await;
    assert_eq!(
        condition(&api.get(&path).unwrap(), "Ready")["reason"],
        "InstanceUnavailable"
    );

    seed_ready_pod(&api, "127.0.0.71");
    reconcile_table(&api, &ctx, "orders").await;
    let name = "projects/shop/instances/orders-prod/tables/orders";
    let t = server.table(name).await.expect("table created");
    assert_eq!(family_names(&t), ["details", "stats"]);
    let obj = api.get(&path).unwrap();
    assert_eq!(condition(&obj, "Ready")["status"], "True");
    assert_eq!(obj["status"]["resourceName"], name);
    assert_eq!(
        obj["status"]["columnFamilies"]["details"]["gcRule"],
        json!({"union": [{"maxNumVersions": 3}, {"maxAge": "30d"}]})
    );
    assert_eq!(
        obj["status"]["columnFamilies"]["stats"]["valueType"]["aggregate"],
        "Sum"
    );

    // Change a GC rule, add a family, remove one from the spec (Retain: it stays).
    api.update_spec(
        &path,
        json!({"columnFamilies": {"details": {"gcRule": {"union": null, "maxNumVersions": 1}}, "stats": null, "new": {}}}),
    );
    reconcile_table(&api, &ctx, "orders").await;
    let t = server.table(name).await.unwrap();
    assert_eq!(family_names(&t), ["details", "new", "stats"]);
    assert_eq!(
        t.column_families["details"].gc_rule.as_ref().unwrap().rule,
        Some(admin::gc_rule::Rule::MaxNumVersions(1))
    );
    assert!(api.events().iter().any(
        |(r, n)| r == "ColumnFamiliesModified" && n == "modified column families details, new"
    ));

    // Only an explicit policy drops families.
    api.update_spec(&path, json!({"columnFamilyDeletionPolicy": "Delete"}));
    reconcile_table(&api, &ctx, "orders").await;
    assert_eq!(
        family_names(&server.table(name).await.unwrap()),
        ["details", "new"]
    );

    // A value type cannot change: refused, reported, nothing modified.
    api.update_spec(
        &path,
        json!({"columnFamilies": {"new": {"valueType": {"aggregate": "Max"}}}}),
    );
    reconcile_table(&api, &ctx, "orders").await;
    let obj = api.get(&path).unwrap();
    assert_eq!(condition(&obj, "Ready")["reason"], "ChangeRefused");
    assert!(
        server.table(name).await.unwrap().column_families["new"]
            .value_type
            .is_none()
    );

    // The Cluster of that pod reports the storage its tablet server uses.
    seed_cluster(
        &api,
        "orders-c1",
        json!({"instanceRef": "orders-prod", "serveNodes": 1}),
    );
    reconcile_cluster(&api, &ctx, "orders-c1").await;
    let c = api.get(&crd_path("clusters", "orders-c1")).unwrap();
    assert!(
        c["status"]["storageUsedBytes"]
            .as_i64()
            .is_some_and(|b| b > 0),
        "{}",
        c["status"]
    );
    // One table with one initial split: two tablets.
    assert_eq!(c["status"]["tablets"], 2);

    // Deleting the resource (deletionPolicy Retain) leaves the table.
    api.delete(&path);
    assert!(api.get(&path).is_none());
    assert!(server.table(name).await.is_some());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_with_delete_policy_is_dropped_once_unprotected() {
    let server = TabletServer::start("127.0.0.72").await;
    let api = FakeApi::default();
    let ctx = ctx(&api, true);
    seed_plaintext_instance(&api, "orders-prod");
    seed_ready_pod(&api, "127.0.0.72");
    let path = crd_path("tables", "scratch");
    api.create(
        &path,
        json!({
            "apiVersion": "basalt.dev/v1alpha1", "kind": "Table",
            "metadata": {"name": "scratch", "namespace": NS},
            "spec": {"instanceRef": "orders-prod", "tableId": "scratch_1", "columnFamilies": {"cf": {}},
                     "deletionPolicy": "Delete", "deletionProtection": true},
        }),
    );
    reconcile_table(&api, &ctx, "scratch").await; // adds the finalizer
    assert_eq!(
        api.get(&path).unwrap()["metadata"]["finalizers"],
        json!(["basalt.dev/drop-table"])
    );
    reconcile_table(&api, &ctx, "scratch").await;
    let name = "projects/shop/instances/orders-prod/tables/scratch_1";
    assert!(server.table(name).await.unwrap().deletion_protection);

    api.delete(&path);
    reconcile_table(&api, &ctx, "scratch").await;
    let obj = api.get(&path).expect("held: the table is protected");
    assert_eq!(condition(&obj, "DeletionBlocked")["status"], "True");
    assert!(server.table(name).await.is_some());

    api.update_spec(&path, json!({"deletionProtection": false}));
    reconcile_table(&api, &ctx, "scratch").await;
    assert!(api.get(&path).is_none());
    assert!(server.table(name).await.is_none(), "the table is dropped");
    server.stop().await;
}
