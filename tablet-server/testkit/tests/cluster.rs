//! The kit itself: a cluster of two servers starts, the filter drops, partitions and heals a
//! dialer's calls to a server, and a server restarts on its data directory.

use std::time::{Duration, Instant};

use basalt_control::v1::GetServerStatusRequest;
use basalt_testkit::{MASTER, TestCluster};
use basalt_transport::Verdict;

/// Whether server `i` answers a status call through the master's dialer within `timeout`.
async fn status(cluster: &TestCluster, i: usize, timeout: Duration) -> Result<(), tonic::Code> {
    let dialer = cluster.dialer(MASTER);
    let mut client = basalt_control::client(&dialer, cluster.address(i), timeout).unwrap();
    client
        .get_server_status(GetServerStatusRequest {})
        .await
        .map(|_| ())
        .map_err(|s| s.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_starts_its_calls_are_filtered_and_a_server_restarts() {
    let mut cluster = TestCluster::start(2).await;
    let (s0, s1) = (
        cluster.store_id(0).to_string(),
        cluster.store_id(1).to_string(),
    );
    assert_ne!(s0, s1);
    let (registered, _) = cluster.meta().servers(Some("c1")).await.unwrap();
    assert_eq!(registered.len(), 2);
    assert_eq!(status(&cluster, 1, Duration::from_secs(2)).await, Ok(()));

    // Dropped: the established connection is reset and the next call fails fast.
    cluster.set(MASTER, 1, Verdict::Drop);
    let started = Instant::now();
    assert_eq!(
        status(&cluster, 1, Duration::from_secs(2)).await,
        Err(tonic::Code::Unavailable)
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // Other servers are not affected.
    assert_eq!(status(&cluster, 0, Duration::from_secs(2)).await, Ok(()));

    // Partitioned: calls hang until their deadline.
    cluster.set(MASTER, 1, Verdict::BlackHole);
    let started = Instant::now();
    assert!(status(&cluster, 1, Duration::from_secs(1)).await.is_err());
    assert!(started.elapsed() >= Duration::from_secs(1));

    // Delayed, then healed.
    cluster.set(MASTER, 1, Verdict::Delay(Duration::from_millis(200)));
    let started = Instant::now();
    let mut delayed = status(&cluster, 1, Duration::from_secs(5)).await;
    // The channel may still be reconnecting after the partition: one retry.
    if delayed.is_err() {
        delayed = status(&cluster, 1, Duration::from_secs(5)).await;
    }
    assert_eq!(delayed, Ok(()));
    assert!(started.elapsed() >= Duration::from_millis(200));
    cluster.heal();
    assert_eq!(status(&cluster, 1, Duration::from_secs(5)).await, Ok(()));

    // A restart keeps the store (its id) and the address.
    cluster.restart(1).await;
    assert_eq!(cluster.store_id(1), s1);
    assert_eq!(status(&cluster, 1, Duration::from_secs(5)).await, Ok(()));

    // A killed server's registration stays until its lease expires; a stopped one's goes.
    cluster.stop(0).await;
    let (registered, _) = cluster.meta().servers(Some("c1")).await.unwrap();
    assert!(registered.iter().all(|r| r.record.store_id != s0));
    cluster.start_server(0).await;
    assert_eq!(cluster.store_id(0), s0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_are_replicas_from_the_start_and_can_be_partitioned() {
    let cluster = TestCluster::start_clusters(&[("a", 1), ("b", 2)]).await;
    assert_eq!(cluster.clusters(), ["a", "b"]);
    assert_eq!(cluster.servers_of("a"), [0]);
    assert_eq!(cluster.servers_of("b"), [1, 2]);
    assert_eq!(
        (cluster.name(0), cluster.name(1), cluster.name(2)),
        ("a-0", "b-0", "b-1")
    );
    assert_eq!(cluster.cluster_of(2), "b");
    // Both clusters have their numbers (declared before their servers started: a first).
    let numbers = cluster.meta().cluster_numbers().await.unwrap();
    assert_eq!(
        numbers.into_iter().collect::<Vec<_>>(),
        [("a".to_string(), 1), ("b".to_string(), 2)]
    );
    for (name, servers) in [("a", 1), ("b", 2)] {
        let (registered, _) = cluster.meta().servers(Some(name)).await.unwrap();
        assert_eq!(registered.len(), servers, "cluster {name}");
    }

    // Calls of a server of a to servers of b are dropped, and b's to a; within b, and the
    // master's, they pass.
    let from = |name: &str, to: usize| {
        let dialer = cluster.dialer(name);
        let address = cluster.address(to).to_string();
        async move {
            let mut client =
                basalt_control::client(&dialer, &address, Duration::from_secs(1)).unwrap();
            client
                .get_server_status(GetServerStatusRequest {})
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        }
    };
    cluster.set_between("a", "b", Verdict::Drop);
    cluster.set_between("b", "a", Verdict::Drop);
    assert_eq!(from("a-0", 1).await, Err(tonic::Code::Unavailable));
    assert_eq!(from("a-0", 2).await, Err(tonic::Code::Unavailable));
    assert_eq!(from("b-1", 0).await, Err(tonic::Code::Unavailable));
    assert_eq!(from("b-0", 2).await, Ok(()));
    assert_eq!(from(MASTER, 0).await, Ok(()));
    cluster.heal_clusters("a", "b");
    assert_eq!(from("a-0", 1).await, Ok(()));
    // Calls into b from the other clusters are delayed; within b they are not.
    cluster.delay_into("b", Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(from("a-0", 2).await, Ok(()));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(from("b-1", 1).await, Ok(()));
    assert!(started.elapsed() < Duration::from_millis(300));
    cluster.heal();
    // A partition: calls hang until their deadline.
    cluster.partition_clusters("a", "b");
    assert!(from("b-0", 0).await.is_err());
    cluster.heal();
    assert_eq!(from("b-0", 0).await, Ok(()));
}
