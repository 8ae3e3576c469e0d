//! The fail points of a tablet move, shared by the two sides that run one: the master's move
//! driver and the tablet servers' `TabletMove` service. Tests set them through `FAILPOINTS`
//! (docs/cluster.md lists them).

use std::time::Duration;

/// A fail point of a move: with the action `return(<ms>)` it holds the move that long without
/// blocking a runtime thread (the process keeps serving everything else); other actions behave
/// as the `fail` crate says.
pub async fn hold(name: &str) {
    let held = fail::eval(name, |arg| {
        arg.and_then(|a| a.parse::<u64>().ok()).unwrap_or(0)
    });
    if let Some(ms) = held {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
