//! Work that must leave the CPU to requests: a backup's scan, chunking and hashing run on a
//! thread of their own at the lowest CPU priority (nice 19, as RocksDB lowers its compaction
//! threads), so that when the cores are busy the kernel runs the request threads first and the
//! backup takes what is left. A thread of its own, not one of tokio's blocking pool: an
//! unprivileged process cannot raise a thread's priority back, and the pool reuses threads.

use std::future::Future;

/// The lowest priority a thread can have (the highest nice value).
const LOWEST: i32 = 19;

/// Runs `f` on a new thread named `name` at the lowest CPU priority; the future resolves to
/// its result (an error if it panicked).
pub fn spawn<T, F>(name: &str, f: F) -> impl Future<Output = Result<T, String>> + use<T, F>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            lower_priority();
            let _ = tx.send(f());
        });
    let name = name.to_string();
    async move {
        spawned.map_err(|e| format!("cannot start thread {name}: {e}"))?;
        rx.await
            .map_err(|_| format!("thread {name} stopped before it finished (it panicked)"))
    }
}

/// Lowers the calling thread's CPU priority (on Linux, `setpriority` of a thread id applies to
/// that thread alone). A failure only costs the requests some latency: logged, not fatal.
fn lower_priority() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), LOWEST) {
        tracing::debug!(error = %e, "cannot lower a background thread's CPU priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_at_the_lowest_priority_and_returns_its_result() {
        let (value, nice) = spawn("bg-test", || {
            let nice = rustix::process::getpriority_process(Some(rustix::thread::gettid()));
            (42, nice.unwrap())
        })
        .await
        .unwrap();
        assert_eq!((value, nice), (42, LOWEST));
        // The caller's own thread is not lowered.
        let mine = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        assert!(mine < LOWEST, "{mine}");
        let err = spawn("bg-panics", || -> u32 { panic!("boom") })
            .await
            .unwrap_err();
        assert!(err.contains("bg-panics"), "{err}");
    }
}
