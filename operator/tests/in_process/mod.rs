//! What the tests on the in-process test cluster of `basalt-testkit` share (`partition.rs`,
//! `replication_faults.rs`): table `t`, a client channel, and the operator's master with short
//! timings.

use std::time::Duration;

use basalt_operator::master::{MasterConfig, MasterTiming, run_with};
use basalt_testkit::{INSTANCE, NAMESPACE, TestCluster};
use bytes::Bytes;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use tonic::transport::Channel;

pub const TABLE: &str = "t";

pub fn table_name() -> String {
    format!("{}/tables/{TABLE}", basalt_testkit::instance_name())
}

/// A plain channel to a server's gRPC port (the test is a client, not a peer: unfiltered).
pub async fn channel(address: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

pub fn admin_client(
    channel: Channel,
) -> admin::bigtable_table_admin_client::BigtableTableAdminClient<Channel> {
    admin::bigtable_table_admin_client::BigtableTableAdminClient::new(channel)
}

/// Table `t` with family `cf`, split at "m": tablets [, m) and [m, ) (in every cluster).
pub async fn create_table(address: &str) {
    admin_client(channel(address).await)
        .create_table(admin::CreateTableRequest {
            parent: basalt_testkit::instance_name(),
            table_id: TABLE.into(),
            table: Some(admin::Table {
                column_families: [("cf".to_string(), admin::ColumnFamily::default())].into(),
                ..admin::Table::default()
            }),
            initial_splits: vec![admin::create_table_request::Split {
                key: Bytes::from_static(b"m"),
            }],
        })
        .await
        .unwrap();
}

/// The operator's master of the test instance, running on its own task with timings for
/// servers on the kit's short leases, until [`Master::stop`].
pub struct Master {
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Master {
    pub fn start(cluster: &TestCluster) -> Master {
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_with(
            MasterConfig {
                security: basalt_transport::Security::Plaintext,
                etcd_security: basalt_transport::Security::Plaintext,
                etcd_endpoints: cluster.etcd_urls(),
                namespace: NAMESPACE.into(),
                instance: INSTANCE.into(),
                identity: "m-0".into(),
                prometheus_url: None,
            },
            MasterTiming {
                servers: basalt_testkit::LEASE,
                margin: Duration::from_secs(3),
                master_ttl: Duration::from_secs(2),
                interval: Duration::from_millis(200),
                max_backoff: Duration::from_millis(500),
                ..MasterTiming::default()
            },
            async {
                let _ = stopped.await;
            },
        ));
        Master { shutdown, task }
    }

    /// Steps down (resigns) and ends.
    pub async fn stop(self) {
        let _ = self.shutdown.send(());
        self.task.await.unwrap().unwrap();
    }
}
