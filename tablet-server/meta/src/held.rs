//! Keys held under a lease of their own, kept alive while a piece of work runs ([`Held`],
//! [`Meta::hold`]), and keys that expire by themselves ([`Meta::put_expiring`]): backups,
//! copies and restores in flight, and collections of a backup location's chunks.

use std::time::Duration;

use basalt_model::Result;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::client::{Meta, unavailable};
use crate::registration::{Renewal, lease_ttl, renew_once};

/// Keys written together under one lease of their own, kept alive in the background until
/// [`Held::release`]: a backup, copy or restore in flight, or a collection of a backup
/// location's unheld chunks. Dropped without being released, or in a process that dies, its
/// keys go when the lease expires.
pub struct Held {
    lease: i64,
    /// Until when etcd surely keeps the lease (the last renewal's send time plus the TTL);
    /// None once it expired or could not be renewed for a whole TTL.
    valid_until: watch::Receiver<Option<Instant>>,
    keeper: JoinHandle<()>,
    client: Client,
}

impl Held {
    /// The lease the keys are bound to.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Are the keys surely still in etcd for `margin` more? False once the lease may have
    /// expired: the last renewal was sent too long ago (or etcd said it expired).
    pub fn holds(&self, margin: Duration) -> bool {
        self.valid_until
            .borrow()
            .is_some_and(|until| Instant::now() + margin < until)
    }

    /// Resolves once [`Held::holds`]`(margin)` turns false.
    pub async fn lapsed(&self, margin: Duration) {
        let mut valid_until = self.valid_until.clone();
        loop {
            let Some(until) = *valid_until.borrow_and_update() else {
                return;
            };
            let Some(deadline) = until.checked_sub(margin) else {
                return;
            };
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                changed = valid_until.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Deletes the keys now (revokes their lease).
    pub async fn release(self) {
        self.keeper.abort();
        if let Err(e) = self.client.clone().lease_revoke(self.lease).await {
            warn!(lease = self.lease, error = %e, "revoking a lease failed; its keys go when it expires");
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Renews `lease` every third of its TTL, publishing until when etcd surely keeps it.
async fn keep_held(
    mut client: Client,
    lease: i64,
    ttl: Duration,
    valid_until: watch::Sender<Option<Instant>>,
) {
    let period = ttl / 3;
    loop {
        tokio::time::sleep(period).await;
        let sent = Instant::now();
        match renew_once(&mut client, lease, period).await {
            Renewal::Renewed => {
                let _ = valid_until.send(Some(sent + ttl));
            }
            Renewal::Expired => {
                warn!(lease, "a held lease expired");
                let _ = valid_until.send(None);
                return;
            }
            Renewal::Failed(e) => {
                let lapsed = valid_until
                    .borrow()
                    .is_none_or(|until| Instant::now() >= until);
                warn!(lease, error = %e, lapsed, "renewing a held lease failed");
                if lapsed {
                    let _ = valid_until.send(None);
                    return;
                }
            }
        }
    }
}

impl Meta {
    /// Writes every `(key, value)` of `puts` under a new lease of `ttl` kept alive until the
    /// returned [`Held`] is released — in one transaction, if no key of `absent` exists and no
    /// key exists under any prefix of `empty`. Otherwise nothing is written and the answer is
    /// the key found in the way (an exact key of `absent`, or a key under a prefix of `empty`).
    pub async fn hold(
        &self,
        puts: &[(String, Vec<u8>)],
        absent: &[String],
        empty: &[String],
        ttl: Duration,
    ) -> Result<std::result::Result<Held, String>> {
        let ttl = lease_ttl(ttl);
        let mut client = self.client();
        let granted = Instant::now();
        let lease = client
            .lease_grant(ttl.as_secs() as i64, None)
            .await
            .map_err(unavailable)?
            .id();
        let when: Vec<Compare> =
            absent
                .iter()
                .map(|k| Compare::create_revision(k.as_str(), CompareOp::Equal, 0))
                // A comparison over a range holds when it holds for every key in it: none there.
                .chain(empty.iter().map(|p| {
                    Compare::create_revision(p.as_str(), CompareOp::Equal, 0).with_prefix()
                }))
                .collect();
        let then: Vec<TxnOp> = puts
            .iter()
            .map(|(k, v)| {
                TxnOp::put(
                    k.as_str(),
                    v.clone(),
                    Some(etcd_client::PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        let written = match self.txn(Txn::new().when(when).and_then(then)).await {
            Ok(resp) => resp.succeeded(),
            Err(e) => {
                let _ = client.lease_revoke(lease).await;
                return Err(e);
            }
        };
        if !written {
            let _ = client.lease_revoke(lease).await;
            for k in absent {
                if self.value(k).await?.is_some() {
                    return Ok(Err(k.clone()));
                }
            }
            for p in empty {
                if let Some((k, _)) = self.values_under(p).await?.into_iter().next() {
                    return Ok(Err(k));
                }
            }
            // Gone since the transaction: name the first thing that was in the way.
            return Ok(Err(absent
                .first()
                .or(empty.first())
                .cloned()
                .unwrap_or_default()));
        }
        let (tx, valid_until) = watch::channel(Some(granted + ttl));
        let keeper = tokio::spawn(keep_held(self.client(), lease, ttl, tx));
        Ok(Ok(Held {
            lease,
            valid_until,
            keeper,
            client,
        }))
    }

    /// Puts `value` at `key`, with no lease: it stays until deleted.
    pub async fn put_value(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.client()
            .put(key, value, None)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Deletes `key` if it still holds `value` (one transaction). True if it did.
    pub async fn delete_if_value(&self, key: &str, value: &[u8]) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, value)])
            .and_then([TxnOp::delete(key, None)]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Puts `value` at `key` under a new lease of `ttl` that is not renewed: the key goes by
    /// itself after `ttl` (a finished backup operation kept for the other servers to answer).
    pub async fn put_expiring(&self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<()> {
        let mut client = self.client();
        let lease = client
            .lease_grant(lease_ttl(ttl).as_secs() as i64, None)
            .await
            .map_err(unavailable)?
            .id();
        client
            .put(
                key,
                value,
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
