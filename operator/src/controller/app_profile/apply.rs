//! AppProfile, stage 4: the profile's record put into, or removed from, its instance's
//! catalog in etcd (reached as the operator reaches it: [`crate::build::etcd::operator_urls`]).
//! Never an error of the reconcile: what happened is reported ([`Catalog`]) and the status
//! says it.

use std::time::Duration;

use basalt_meta::{AppProfileRecord, Keys, Meta};

/// How long the reconcile waits for the metadata store.
const DEADLINE: Duration = Duration::from_secs(6);

/// Where the profile's record stands in the catalog after this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Catalog {
    /// The record is in the catalog, as the spec says.
    Recorded,
    /// The profile's record(s) are not in the catalog (removed, or never there).
    Removed,
    /// No member of the instance's metadata store has an address yet.
    NoEndpoints,
    /// The metadata store did not answer (in time): why.
    Unreachable(String),
}

/// Puts `record` into the catalog, after removing the record of the profile's `previous` id.
pub async fn put(
    endpoints: &[String],
    keys: Keys,
    record: &AppProfileRecord,
    previous: Option<&str>,
) -> Catalog {
    with_store(endpoints, keys, Catalog::Recorded, |meta| async move {
        if let Some(previous) = previous {
            meta.delete_app_profile(previous).await?;
        }
        meta.put_app_profile(record).await
    })
    .await
}

/// Removes the records of `ids` from the catalog (absent ones are fine).
pub async fn remove(endpoints: &[String], keys: Keys, ids: &[String]) -> Catalog {
    with_store(endpoints, keys, Catalog::Removed, |meta| async move {
        for id in ids {
            meta.delete_app_profile(id).await?;
        }
        Ok(())
    })
    .await
}

async fn with_store<F, Fut>(endpoints: &[String], keys: Keys, done: Catalog, f: F) -> Catalog
where
    F: FnOnce(Meta) -> Fut,
    Fut: Future<Output = Result<(), basalt_master::model::Error>>,
{
    if endpoints.is_empty() {
        return Catalog::NoEndpoints;
    }
    let work = async {
        let endpoints = basalt_meta::endpoints(endpoints, &basalt_meta::Security::Plaintext)?;
        let meta = Meta::connect(&endpoints, keys).await?;
        f(meta).await
    };
    match tokio::time::timeout(DEADLINE, work).await {
        Ok(Ok(())) => done,
        Ok(Err(error)) => {
            tracing::info!(%error, ?endpoints, "the metadata store did not take the app profile");
            Catalog::Unreachable(format!("etcd at {}: {error}", endpoints.join(",")))
        }
        Err(_) => Catalog::Unreachable(format!(
            "etcd at {} did not answer within {DEADLINE:?}",
            endpoints.join(",")
        )),
    }
}
