//! A tablet server's registration: its record bound to an etcd lease, renewed in the
//! background, and the **serving deadline** that follows from it.
//!
//! The serving rule (`../shared/DISTRIBUTED.md`): a server serves its tablets only while its
//! own clock is before *last successful keep-alive + lease TTL + grace*. The keep-alive's time
//! is taken when it is sent, so the deadline is never later than etcd's own expiry plus the
//! grace. The master gives a tablet away without its owner only after the owner's lease
//! expired plus a margin larger than the grace: by then the owner has stopped serving on its
//! own. A short etcd outage (shorter than TTL + grace) stops nothing.
//!
//! A server that cannot renew (etcd unreachable, or its disk stalled: `can_renew` false)
//! lets the deadline pass. When etcd says the lease expired, the server registers again
//! under a new lease (same store id: its tablets are still its own).

use std::sync::Arc;
use std::time::Duration;

use basalt_model::Result;
use etcd_client::{Client, PutOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::client::{Meta, unavailable};
use crate::records::ServerRecord;

/// The timing of a registration.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTiming {
    /// The lease's TTL.
    pub ttl: Duration,
    /// How long past the lease's TTL (counted from the last successful keep-alive) the server
    /// still serves. The master's margin before declaring a server lost must exceed it.
    pub grace: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            ttl: Duration::from_secs(10),
            grace: Duration::from_secs(5),
        }
    }
}

/// What the registration knows of its lease right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// The lease the registration is bound to (0: not registered yet).
    pub lease: i64,
    /// Serve only before this instant (None: never registered).
    pub serving_until: Option<Instant>,
}

impl Liveness {
    /// May the server serve now?
    pub fn serving(&self, now: Instant) -> bool {
        self.serving_until.is_some_and(|until| now < until)
    }

    /// Time left before the deadline (zero when past it).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.serving_until
            .map(|until| until.saturating_duration_since(now))
            .unwrap_or_default()
    }
}

/// A running registration; dropping it stops renewing (the lease then expires).
pub struct Registration {
    liveness: watch::Receiver<Liveness>,
    task: JoinHandle<()>,
    meta: Meta,
}

impl Registration {
    pub fn liveness(&self) -> Liveness {
        *self.liveness.borrow()
    }

    /// A receiver that sees every change of the liveness.
    pub fn subscribe(&self) -> watch::Receiver<Liveness> {
        self.liveness.clone()
    }

    /// Deletes the registration now (a clean shutdown).
    pub async fn unregister(self) {
        self.task.abort();
        let lease = self.liveness.borrow().lease;
        if lease != 0 {
            let _ = self.meta.client().lease_revoke(lease).await;
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Meta {
    /// Registers `record` in `cluster` under a lease and keeps renewing it while `can_renew()`
    /// holds. Returns once the first registration is written.
    pub async fn register(
        &self,
        cluster: &str,
        record: ServerRecord,
        timing: LeaseTiming,
        can_renew: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Result<Registration> {
        let key = self.keys().server(cluster, &record.store_id);
        let value = serde_json::to_vec(&record).expect("a server record always encodes");
        let sent = Instant::now();
        let lease = put_registered(self, &key, &value, timing).await?;
        let (tx, liveness) = watch::channel(Liveness {
            lease,
            serving_until: Some(sent + lease_ttl(timing.ttl) + timing.grace),
        });
        info!(key, lease, "registered");
        let task = tokio::spawn(renew(self.clone(), key, value, timing, can_renew, tx));
        Ok(Registration {
            liveness,
            task,
            meta: self.clone(),
        })
    }
}

async fn put_registered(meta: &Meta, key: &str, value: &[u8], timing: LeaseTiming) -> Result<i64> {
    let mut client = meta.client();
    let lease = client
        .lease_grant(lease_ttl(timing.ttl).as_secs() as i64, None)
        .await
        .map_err(unavailable)?
        .id();
    client
        .put(key, value, Some(PutOptions::new().with_lease(lease)))
        .await
        .map_err(unavailable)?;
    Ok(lease)
}

/// The TTL of the lease granted for `ttl`: etcd counts whole seconds, so the fraction is
/// dropped (a deadline computed from `ttl` itself could fall after etcd's expiry).
pub(crate) fn lease_ttl(ttl: Duration) -> Duration {
    Duration::from_secs(ttl.as_secs().max(1))
}

/// What one keep-alive of a lease found.
#[derive(Debug)]
pub(crate) enum Renewal {
    /// etcd renewed the lease (for its whole TTL, counted from when it got the request).
    Renewed,
    /// etcd no longer knows the lease: it expired (or was revoked) and its keys are gone.
    Expired,
    /// No answer within `limit`, or an error: the lease's state is unknown.
    Failed(String),
}

/// Sends one keep-alive for `lease` and waits at most `limit` for etcd's answer.
///
/// etcd-client's `lease_keep_alive` itself sends a first keep-alive and reports a lease etcd
/// does not know (an answer with TTL 0) as an error "lease not found": that error means the
/// lease expired, every other error only that etcd could not be reached.
pub(crate) async fn renew_once(client: &mut Client, lease: i64, limit: Duration) -> Renewal {
    match tokio::time::timeout(limit, client.lease_keep_alive(lease)).await {
        Ok(Ok(_)) => Renewal::Renewed,
        Ok(Err(etcd_client::Error::LeaseKeepAliveError(e))) if e.contains("not found") => {
            Renewal::Expired
        }
        Ok(Err(e)) => Renewal::Failed(e.to_string()),
        Err(_) => Renewal::Failed(format!("no answer within {limit:?}")),
    }
}

async fn renew(
    meta: Meta,
    key: String,
    value: Vec<u8>,
    timing: LeaseTiming,
    can_renew: Arc<dyn Fn() -> bool + Send + Sync>,
    liveness: watch::Sender<Liveness>,
) {
    let ttl = lease_ttl(timing.ttl);
    let period = ttl / 3;
    let mut client = meta.client();
    loop {
        tokio::time::sleep(period).await;
        if !can_renew() {
            warn!(
                key,
                "not renewing the lease: this server cannot serve safely (its disk has not synced recently)"
            );
            continue;
        }
        let lease = liveness.borrow().lease;
        // Taken before the request: etcd's expiry is at least this plus the TTL, so the
        // deadline below is never later than etcd's expiry plus the grace.
        let sent = Instant::now();
        match renew_once(&mut client, lease, period).await {
            Renewal::Renewed => {
                liveness.send_modify(|l| l.serving_until = Some(sent + ttl + timing.grace));
            }
            Renewal::Expired => {
                warn!(key, lease, "the lease expired; registering again");
                match put_registered(&meta, &key, &value, timing).await {
                    Ok(lease) => {
                        info!(key, lease, "registered again");
                        liveness.send_modify(|l| {
                            l.lease = lease;
                            l.serving_until = Some(sent + ttl + timing.grace);
                        });
                    }
                    Err(e) => warn!(key, error = %e, "cannot register again yet"),
                }
            }
            Renewal::Failed(e) => {
                warn!(key, lease, error = %e, "lease renewal failed (etcd unreachable?)")
            }
        }
    }
}
