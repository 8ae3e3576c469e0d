//! One supervised child process (etcd, or a tablet server), as a StatefulSet keeps a pod:
//! started with its command line and its log file, restarted after a back-off when it exits
//! (same command line, hence the same data directory and ports), probed for readiness over
//! HTTP while it runs, and stopped on request with SIGTERM, then SIGKILL after a grace period.
//!
//! At most one process per [`ProcessSpec`] exists at any time: a restart begins only after
//! the previous process was reaped. Children run in their own process group, so a Ctrl-C in
//! the terminal reaches only the runtime, which then stops them in order (servers, then etcd).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::sync::watch;

/// The first restart's delay; it doubles up to [`MAX_BACKOFF`], and starts over once a
/// process ran for [`STABLE_RUN`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
pub const STABLE_RUN: Duration = Duration::from_secs(60);
/// How often readiness is probed while the process runs.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// For logs: `etcd`, `quickstart-c1-0`.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// stdout and stderr are appended to it.
    pub log: PathBuf,
    /// `GET http://addr/path` answers 200 when the process is ready (and, for etcd, says
    /// `"health":"true"`).
    pub ready_probe: Option<(SocketAddr, String)>,
    /// How long a stopping process gets between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Set in its environment, over the runtime's own (which it inherits).
    pub env: Vec<(String, String)>,
}

/// What the supervisor knows of its process, shared with the runtime (local.json, the
/// endpoint's choice of servers).
#[derive(Debug, Default)]
pub struct ProcessState {
    /// The process now; 0 while none runs.
    pid: AtomicU32,
    restarts: AtomicU32,
    ready: AtomicBool,
}

impl ProcessState {
    pub fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::SeqCst)).filter(|p| *p != 0)
    }

    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::SeqCst)
    }

    /// Whether the last probe of the running process succeeded.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

/// The next back-off after a process that ran for `ran` exited, `previous` being the last
/// delay. Pure.
pub fn next_backoff(previous: Duration, ran: Duration) -> Duration {
    if ran >= STABLE_RUN {
        FIRST_BACKOFF
    } else {
        (previous * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF)
    }
}

/// Runs `spec` until `stop` turns true, restarting it whenever it exits. `changed` is called
/// whenever the pid or the restart count changes.
pub async fn supervise(
    spec: ProcessSpec,
    state: Arc<ProcessState>,
    mut stop: watch::Receiver<bool>,
    changed: Arc<dyn Fn() + Send + Sync>,
) {
    let mut backoff = Duration::ZERO;
    loop {
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        let mut child = match spawn(&spec) {
            Ok(child) => child,
            Err(error) => {
                tracing::error!(process = %spec.name, program = %spec.program.display(), %error, "cannot start");
                backoff = next_backoff(backoff, Duration::ZERO);
                if sleep_or_stop(backoff, &mut stop).await {
                    return;
                }
                continue;
            }
        };
        let pid = child.id().unwrap_or(0);
        state.pid.store(pid, Ordering::SeqCst);
        tracing::info!(process = %spec.name, pid, log = %spec.log.display(), "started");
        changed();

        let exited = tokio::select! {
            status = child.wait() => Some(status),
            _ = probe(&spec, &state) => None,
            _ = stop.wait_for(|s| *s) => None,
        };
        state.set_ready(false);
        let Some(status) = exited else {
            terminate(&spec, &mut child).await;
            state.pid.store(0, Ordering::SeqCst);
            changed();
            return;
        };
        state.pid.store(0, Ordering::SeqCst);
        let ran = started.elapsed();
        backoff = next_backoff(backoff, ran);
        let status = describe(status);
        tracing::warn!(process = %spec.name, pid, %status, ran = ?ran, restart_in = ?backoff, "exited; restarting on the same data directory");
        append_log(
            &spec,
            &format!(
                "basalt-operator local: {} (pid {pid}) {status}; restarting in {backoff:?}",
                spec.name
            ),
        );
        changed();
        if sleep_or_stop(backoff, &mut stop).await {
            return;
        }
        state.restarts.fetch_add(1, Ordering::SeqCst);
    }
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => format!("exited with {s}"),
        Err(e) => format!("could not be waited for: {e}"),
    }
}

fn spawn(spec: &ProcessSpec) -> std::io::Result<Child> {
    if let Some(dir) = spec.log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    append_log(
        spec,
        &format!(
            "basalt-operator local: starting {} {}",
            spec.program.display(),
            spec.args.join(" ")
        ),
    );
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    Command::new(&spec.program)
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: the terminal's Ctrl-C goes to the runtime only.
        .process_group(0)
        .spawn()
}

fn append_log(spec: &ProcessSpec, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Probes readiness for as long as the process runs (never returns).
async fn probe(spec: &ProcessSpec, state: &ProcessState) {
    let Some((addr, path)) = &spec.ready_probe else {
        state.set_ready(true);
        return std::future::pending().await;
    };
    loop {
        let ready = probe_once(*addr, path).await;
        state.set_ready(ready);
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// One readiness probe: 200, and for etcd's `/health` a healthy answer.
pub async fn probe_once(addr: SocketAddr, path: &str) -> bool {
    match super::http::get(addr, path, Duration::from_secs(1)).await {
        Ok(r) => r.status == 200 && (path != "/health" || etcd_healthy(&r.body)),
        Err(_) => false,
    }
}

/// Whether etcd's `/health` body says healthy (`{"health":"true",...}`).
pub fn etcd_healthy(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("health")
                .and_then(|h| h.as_str())
                .map(|h| h == "true")
        })
        .unwrap_or(false)
}

/// SIGTERM, then SIGKILL after the grace period; reaps the process.
async fn terminate(spec: &ProcessSpec, child: &mut Child) {
    let Some(pid) = child.id() else {
        return;
    };
    tracing::info!(process = %spec.name, pid, "stopping (SIGTERM)");
    signal(pid, "TERM");
    match tokio::time::timeout(spec.grace, child.wait()).await {
        Ok(status) => {
            tracing::info!(process = %spec.name, pid, status = %describe(status), "stopped")
        }
        Err(_) => {
            tracing::warn!(process = %spec.name, pid, grace = ?spec.grace, "did not stop in time: SIGKILL");
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// Sends `SIG<name>` to `pid` with kill(1) (the operator has no libc binding of its own).
pub fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(error) = sent {
        tracing::warn!(pid, %error, "cannot run kill");
    }
}

/// Sleeps `d`; true if `stop` turned true meanwhile.
async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
    *stop.borrow()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap_and_resets_after_a_stable_run() {
        let short = Duration::from_secs(2);
        let mut d = next_backoff(Duration::ZERO, short);
        assert_eq!(d, FIRST_BACKOFF);
        let mut seen = vec![d];
        for _ in 0..7 {
            d = next_backoff(d, short);
            seen.push(d);
        }
        let secs: Vec<u64> = seen.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(next_backoff(MAX_BACKOFF, STABLE_RUN), FIRST_BACKOFF);
    }

    #[test]
    fn etcd_health_bodies() {
        assert!(etcd_healthy(r#"{"health":"true"}"#));
        assert!(etcd_healthy(r#"{"health":"true","reason":""}"#));
        assert!(!etcd_healthy(
            r#"{"health":"false","reason":"RAFT NO LEADER"}"#
        ));
        assert!(!etcd_healthy("not json"));
    }

    #[tokio::test]
    async fn a_process_that_exits_is_restarted_and_a_stop_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ProcessSpec {
            name: "short".into(),
            program: "sh".into(),
            // Exits at once the first time, then stays (until SIGTERM).
            args: vec![
                "-c".into(),
                format!(
                    "if [ -e {0} ]; then exec sleep 600; else touch {0}; exit 3; fi",
                    dir.path().join("ran").display()
                ),
            ],
            log: dir.path().join("logs/short.log"),
            ready_probe: None,
            grace: Duration::from_secs(5),
            env: vec![],
        };
        let state = Arc::new(ProcessState::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(supervise(
            spec.clone(),
            state.clone(),
            stop_rx,
            Arc::new(|| {}),
        ));
        let deadline = Instant::now() + Duration::from_secs(20);
        while state.restarts() < 1 || state.pid().is_none() {
            assert!(Instant::now() < deadline, "no restart");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pid = state.pid().unwrap();
        assert!(state.ready(), "without a probe a running process is ready");
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(state.pid(), None);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        let log = std::fs::read_to_string(&spec.log).unwrap();
        assert!(
            log.contains("exited with exit status: 3; restarting"),
            "{log}"
        );
    }
}
