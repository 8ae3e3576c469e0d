//! The master's election: one leader per instance, whose **term** (the create revision of its
//! leader key) fences every change it makes to the tablet map.

use std::time::Duration;

use basalt_model::Result;
use etcd_client::{Compare, CompareOp};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::client::{Meta, unavailable};

/// A leader's term: its transactions succeed only while its leader key still exists with
/// this create revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub revision: i64,
    pub key: Vec<u8>,
}

impl Term {
    /// The comparison every transaction of this leader carries.
    pub fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.revision)
    }
}

/// Leadership won by [`Meta::campaign`]. Lost when its lease cannot be renewed; dropping it
/// resigns (revokes the lease).
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
        let lease = client
            .lease_grant(ttl.as_secs().max(2) as i64, None)
            .await
            .map_err(unavailable)?
            .id();
        let (lost_tx, lost) = watch::channel(false);
        let keeper = tokio::spawn(keep_alive(self.client(), lease, ttl, lost_tx));
        let mut resp = match client.campaign(self.keys().master(), identity, lease).await {
            Ok(resp) => resp,
            Err(e) => {
                keeper.abort();
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
            keeper,
            meta: self.clone(),
        })
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
        let renewed = async {
            let (mut keeper, mut stream) = client.lease_keep_alive(lease).await.ok()?;
            keeper.keep_alive().await.ok()?;
            let resp = tokio::time::timeout(period, stream.message())
                .await
                .ok()?
                .ok()??;
            Some(resp.ttl())
        }
        .await;
        match renewed {
            Some(ttl_left) if ttl_left > 0 => last_ok = tokio::time::Instant::now(),
            Some(_) => {
                warn!(lease, "the master's lease expired");
                let _ = lost.send(true);
                return;
            }
            None if last_ok.elapsed() >= ttl => {
                warn!(
                    lease,
                    "the master's lease could not be renewed for a whole TTL"
                );
                let _ = lost.send(true);
                return;
            }
            None => {}
        }
        tokio::time::sleep(period).await;
    }
}
