//! The master's election: one leader per instance, whose **term** (the create revision of its
//! leader key) fences every change it makes to the tablet map.

use std::time::Duration;

use basalt_model::Result;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::client::{Meta, unavailable};
use crate::registration::{Renewal, lease_ttl, renew_once};
use crate::term::Term;

/// Leadership won by [`Meta::campaign`]. Lost when its lease cannot be renewed. Dropping it
/// stops renewing: the lease expires after its TTL, as when a master crashes, and another
/// candidate is elected then; [`Leadership::resign`] gives the role up at once.
pub struct Leadership {
    pub term: Term,
    lease: i64,
    lost: watch::Receiver<bool>,
    keeper: JoinHandle<()>,
    meta: Meta,
}

impl Leadership {
    /// Resolves when the leadership is lost (its lease expired or could not be renewed).
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Gives the leadership up now.
    pub async fn resign(self) {
        self.keeper.abort();
        let _ = self.meta.client().lease_revoke(self.lease).await;
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl Meta {
    /// Waits until this candidate leads the instance (another leader's lease must expire or be
    /// revoked first). `ttl`: how long a leader that stops renewing keeps the role.
    pub async fn campaign(&self, identity: &str, ttl: Duration) -> Result<Leadership> {
        let mut client = self.client();
        let ttl = lease_ttl(ttl).max(Duration::from_secs(2));
        let lease = client
            .lease_grant(ttl.as_secs() as i64, None)
            .await
            .map_err(unavailable)?
            .id();
        let (lost_tx, lost) = watch::channel(false);
        // Aborted if this future is dropped before it is elected (a cancelled campaign must
        // not keep its lease alive forever).
        let mut keeper = AbortOnDrop(Some(tokio::spawn(keep_alive(
            self.client(),
            lease,
            ttl,
            lost_tx,
        ))));
        // A campaign waits for the current leader to go, which may take longer than any
        // request timeout: it runs on a connection without one.
        let mut waiting = match self.waiting_client().await {
            Ok(waiting) => waiting,
            Err(e) => {
                drop(keeper);
                let _ = client.lease_revoke(lease).await;
                return Err(e);
            }
        };
        let mut resp = match waiting
            .campaign(self.keys().master(), identity, lease)
            .await
        {
            Ok(resp) => resp,
            Err(e) => {
                drop(keeper);
                let _ = client.lease_revoke(lease).await;
                return Err(unavailable(e));
            }
        };
        let leader = resp.take_leader().ok_or_else(|| {
            basalt_model::Error::Internal("etcd campaign returned no leader key".into())
        })?;
        let term = Term {
            revision: leader.rev(),
            key: leader.key().to_vec(),
        };
        info!(identity, term = term.revision, "elected master");
        Ok(Leadership {
            term,
            lease,
            lost,
            keeper: keeper.0.take().expect("the keeper runs until elected"),
            meta: self.clone(),
        })
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(Option<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Renews `lease` every third of its TTL; reports it lost when etcd says it expired or no
/// renewal succeeded for a whole TTL.
async fn keep_alive(
    mut client: etcd_client::Client,
    lease: i64,
    ttl: Duration,
    lost: watch::Sender<bool>,
) {
    let period = ttl / 3;
    let mut last_ok = tokio::time::Instant::now();
    loop {
        let sent = tokio::time::Instant::now();
        match renew_once(&mut client, lease, period).await {
            Renewal::Renewed => last_ok = sent,
            Renewal::Expired => {
                warn!(lease, "the master's lease expired");
                let _ = lost.send(true);
                return;
            }
            Renewal::Failed(e) if last_ok.elapsed() >= ttl => {
                warn!(
                    lease,
                    error = %e,
                    "the master's lease could not be renewed for a whole TTL"
                );
                let _ = lost.send(true);
                return;
            }
            Renewal::Failed(e) => warn!(lease, error = %e, "the master's lease renewal failed"),
        }
        tokio::time::sleep(period).await;
    }
}
