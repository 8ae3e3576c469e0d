//! A real etcd for the tests of every crate (Debian's `/usr/bin/etcd`, the `etcd-server`
//! package): one process on free 127.0.0.1 ports in a temporary directory. It can be paused
//! (SIGSTOP: the process is there, nothing answers), resumed, killed and started again on the
//! same data directory and ports; it is killed on drop. Its log stays in the directory and is
//! printed when a wait for it fails.
//!
//! It knows no Basalt type: a test makes its `basalt_meta::EtcdEndpoints` from [`Etcd::url`].

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use basalt_transport::Security;
use tokio::time::Instant;

/// Debian's etcd.
pub const ETCD: &str = "/usr/bin/etcd";

/// How long a start waits for etcd to report itself healthy.
pub const START_LIMIT: Duration = Duration::from_secs(20);

/// An etcd process (or, before [`Etcd::spawn`], its ports and directory).
pub struct Etcd {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Default for Etcd {
    fn default() -> Self {
        Etcd::new()
    }
}

impl Etcd {
    /// Its ports and directory, not started: [`Etcd::spawn`] starts it (a test of a client
    /// that starts before etcd).
    pub fn new() -> Etcd {
        Etcd {
            dir: tempfile::tempdir().expect("a temporary directory"),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        }
    }

    /// Starts etcd and waits until it reports itself healthy. Its ports are free when chosen
    /// but may be taken before etcd binds them (another test's process): then it starts again
    /// on other ports.
    pub async fn start() -> Etcd {
        for _ in 0..4 {
            let mut etcd = Etcd::new();
            match etcd.try_spawn(START_LIMIT).await {
                Ok(()) => return etcd,
                Err(log) if log.contains("address already in use") => continue,
                Err(log) => panic!("etcd not healthy after {START_LIMIT:?}; its log:\n{log}"),
            }
        }
        let mut etcd = Etcd::new();
        etcd.spawn().await;
        etcd
    }

    /// Its client URL.
    pub fn url(&self) -> String {
        Security::Plaintext.url(&format!("127.0.0.1:{}", self.client_port))
    }

    /// Its client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// What etcd logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Starts the process (again) on its data directory and ports, and waits until it is
    /// healthy.
    pub async fn spawn(&mut self) {
        if let Err(log) = self.try_spawn(START_LIMIT).await {
            panic!("etcd not healthy after {START_LIMIT:?}; its log:\n{log}");
        }
    }

    /// [`Etcd::spawn`], or its log when it exited or was not healthy within `limit`.
    async fn try_spawn(&mut self, limit: Duration) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("etcd's log file");
        let client = self.url();
        let peer = Security::Plaintext.url(&format!("127.0.0.1:{}", self.peer_port));
        let child = Command::new(ETCD)
            .arg("--name=test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log file"))
            .stderr(log)
            .spawn()
            .expect("/usr/bin/etcd starts (Debian's etcd-server)");
        self.child = Some(child);
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let port = self.client_port;
            if tokio::task::spawn_blocking(move || health(port))
                .await
                .unwrap_or(false)
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return Err(self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(self.log())
    }

    /// Waits until etcd answers `/health` with `"health":"true"`; panics with its log after
    /// `limit`.
    pub async fn wait_healthy(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let port = self.client_port;
            let healthy = tokio::task::spawn_blocking(move || health(port))
                .await
                .unwrap_or(false);
            if healthy {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd not healthy after {limit:?}; its log:\n{}", self.log());
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("etcd is running").id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Pauses etcd: its sockets stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Kills etcd (SIGKILL) and waits for the process to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills etcd and starts it again on the same data directory and ports.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // SIGKILL ends a paused process too.
        self.kill();
    }
}

/// One `GET /health` over plain HTTP/1.0.
fn health(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// Polls `check` every 50 ms until it holds; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
