//! A real etcd for the tests (Debian's `/usr/bin/etcd`): one process per test, on free ports
//! in a temporary directory, killed on drop. Shared by the test crates that need one
//! (`mod etcd;`).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use basalt_meta::{Keys, Meta};
use tokio::time::Instant;

/// An etcd process on free ports in a temporary directory, killed on drop.
pub struct Etcd {
    dir: tempfile::TempDir,
    port: u16,
    peer: u16,
    child: Option<Child>,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    /// Chooses its ports; [`Etcd::spawn`] starts it.
    pub fn new() -> Etcd {
        Etcd {
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            peer: free_port(),
            child: None,
        }
    }

    pub async fn start() -> Etcd {
        let mut etcd = Etcd::new();
        etcd.spawn().await;
        etcd
    }

    pub async fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let (client, peer) = (self.url(), format!("http://127.0.0.1:{}", self.peer));
        self.child = Some(
            Command::new("/usr/bin/etcd")
                .arg(format!(
                    "--data-dir={}",
                    self.dir.path().join("data").display()
                ))
                .arg(format!("--listen-client-urls={client}"))
                .arg(format!("--advertise-client-urls={client}"))
                .arg(format!("--listen-peer-urls={peer}"))
                .arg(format!("--initial-advertise-peer-urls={peer}"))
                .arg(format!("--initial-cluster=default={peer}"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .expect("/usr/bin/etcd starts"),
        );
        let endpoints = self.endpoints();
        eventually(Duration::from_secs(20), "etcd answers", || {
            let endpoints = endpoints.clone();
            async move {
                match Meta::connect(&endpoints, Keys::new("x", "y")).await {
                    Ok(meta) => meta.tables().await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
    }

    pub fn endpoints(&self) -> basalt_meta::EtcdEndpoints {
        basalt_meta::EtcdEndpoints::plaintext(&[self.url()]).unwrap()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `check` holds, at most `limit` (then panics, naming `what`).
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
