//! Kubernetes ServiceAccount tokens (and any other token the cluster's API server accepts)
//! as bearer tokens: `--token-review` asks the API server who a token stands for with a
//! `TokenReview` (authentication.k8s.io/v1), as the API server's own webhook authenticators
//! and kube-rbac-proxy do, and caches the answer.
//!
//! The server reaches the API server the way kube-rs finds it: `KUBECONFIG`, then the pod's
//! in-cluster ServiceAccount (so the pod mounts its token, and its ServiceAccount may create
//! `tokenreviews`: the operator binds it to the chart's token-reviewer ClusterRole).
//!
//! A Kubernetes user becomes an IAM member by [`kubernetes_member`]:
//! `system:serviceaccount:<namespace>:<name>` → `serviceAccount:system:serviceaccount:<namespace>:<name>`
//! (the name `kubectl auth whoami` prints), any other user `user:<username>`; each of the
//! user's groups (`system:serviceaccounts:<namespace>`, `system:authenticated`, an OIDC
//! group…) becomes `group:<name>` ([`kubernetes_group`]), so that a policy may grant to a
//! whole namespace's ServiceAccounts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;

/// How long an accepted token is believed without asking again (kube-apiserver's webhook
/// token authenticator caches 2 minutes; a revoked ServiceAccount token stops working here
/// within this).
pub const ACCEPTED_FOR: Duration = Duration::from_secs(60);
/// How long a refused token is refused without asking again (a burst of bad requests costs
/// the API server one review per token and this period).
pub const REFUSED_FOR: Duration = Duration::from_secs(10);
/// The most answers cached; past it, expired ones go first, then all.
pub const CACHE_ENTRIES: usize = 10_000;

/// The IAM member of a Kubernetes username (None: one that cannot be a member). Pure.
pub fn kubernetes_member(username: &str) -> Option<String> {
    if username.is_empty() || username.chars().any(char::is_whitespace) {
        return None;
    }
    if username.starts_with("system:serviceaccount:") {
        Some(format!("serviceAccount:{username}"))
    } else {
        Some(format!("user:{username}"))
    }
}

/// The IAM member of a Kubernetes group a user belongs to, `group:<name>` (None: one that
/// cannot be a member). Pure.
pub fn kubernetes_group(group: &str) -> Option<String> {
    if group.is_empty() || group.chars().any(char::is_whitespace) {
        return None;
    }
    Some(format!("group:{group}"))
}

/// Who a token stands for: its member, and the members of its groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reviewed {
    pub member: String,
    pub groups: Vec<String>,
}

/// What the API server said of a token: who, or why not (no secret in it).
type Answer = Result<Reviewed, String>;

/// Reviews tokens with the API server, with a cache of answers.
pub struct TokenReviewer {
    api: Api<TokenReview>,
    audiences: Vec<String>,
    cache: Mutex<HashMap<String, (Answer, Instant)>>,
}

impl TokenReviewer {
    /// A reviewer through the client kube-rs infers (`KUBECONFIG`, else in-cluster);
    /// `audiences`: the audiences a token must be meant for (empty: the API server's own).
    pub async fn connect(audiences: Vec<String>) -> Result<Arc<TokenReviewer>, String> {
        let client = kube::Client::try_default().await.map_err(|e| {
            format!(
                "--token-review needs the Kubernetes API server (KUBECONFIG or the pod's ServiceAccount): {e}"
            )
        })?;
        Ok(Arc::new(TokenReviewer {
            api: Api::all(client),
            audiences,
            cache: Mutex::new(HashMap::new()),
        }))
    }

    /// Who `token` stands for: Ok(Some) accepted, Ok(None) refused by the API server
    /// (unknown, expired, or not for our audiences), Err when it could not be asked (the
    /// message names the API server's error, never the token).
    pub async fn review_token(&self, token: &str) -> Result<Option<Reviewed>, String> {
        if let Some(answer) = self.cached(token) {
            return Ok(answer.ok());
        }
        let answer = self.review(token).await?;
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_ENTRIES {
            let now = Instant::now();
            cache.retain(|_, (answer, at)| now < *at + ttl(answer));
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(token.to_string(), (answer.clone(), Instant::now()));
        if let Err(reason) = &answer {
            tracing::debug!(reason = %reason, "the API server refused a bearer token");
        }
        Ok(answer.ok())
    }

    fn cached(&self, token: &str) -> Option<Answer> {
        let cache = self.cache.lock();
        let (answer, at) = cache.get(token)?;
        (at.elapsed() < ttl(answer)).then(|| answer.clone())
    }

    async fn review(&self, token: &str) -> Result<Answer, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..Default::default()
        };
        let reviewed = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("the Kubernetes API server did not review the token: {e}"))?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(Err(status
                .error
                .unwrap_or_else(|| "not authenticated".into())));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        // A group that cannot be a member is left out: it grants nothing anyway.
        let groups = user
            .groups
            .unwrap_or_default()
            .iter()
            .filter_map(|g| kubernetes_group(g))
            .collect();
        Ok(kubernetes_member(&username)
            .map(|member| Reviewed { member, groups })
            .ok_or_else(|| format!("the username {username:?} cannot be an IAM member")))
    }
}

fn ttl(answer: &Answer) -> Duration {
    if answer.is_ok() {
        ACCEPTED_FOR
    } else {
        REFUSED_FOR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_users_become_members() {
        assert_eq!(
            kubernetes_member("system:serviceaccount:shop:checkout").as_deref(),
            Some("serviceAccount:system:serviceaccount:shop:checkout")
        );
        assert_eq!(
            kubernetes_member("alice@example.com").as_deref(),
            Some("user:alice@example.com")
        );
        assert_eq!(kubernetes_member(""), None);
        assert_eq!(kubernetes_member("two words"), None);
        assert_eq!(
            kubernetes_group("system:serviceaccounts:shop").as_deref(),
            Some("group:system:serviceaccounts:shop")
        );
        assert_eq!(kubernetes_group(""), None);
        assert_eq!(kubernetes_group("a group"), None);
        for member in [
            kubernetes_member("system:serviceaccount:shop:checkout").unwrap(),
            kubernetes_member("alice@example.com").unwrap(),
            kubernetes_group("system:serviceaccounts:shop").unwrap(),
        ] {
            assert!(basalt_model::iam::valid_member(&member), "{member}");
        }
    }
}
