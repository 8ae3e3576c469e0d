//! Authentication: who sends a request. A layer in front of every service (data, table and
//! instance admin, control) finds the caller's principal — an IAM member string such as
//! `user:alice@example.com` — and puts it in the request's extensions as a [`Principal`], or
//! answers UNAUTHENTICATED. The services authorize by it (see [`crate::access`]).
//!
//! Credentials, in this order:
//! 1. a bearer token: `authorization: Bearer <token>` (the Python, Java, Go and Node clients'
//!    OAuth credentials) or `x-goog-iam-authorization-token: <token>` (what `cbt -auth-token`
//!    sends), looked up in the token file (`--auth-token-file`: one `<token> <member>` per
//!    line, `#` comments; read again when it changes);
//!    and, with `--token-review`, tokens the file does not list are asked of the Kubernetes
//!    API server ([`crate::token_review`]: ServiceAccount tokens);
//! 2. the client's certificate (mutual TLS, `--tls-client-ca`): the principal is `user:` and
//!    the certificate's first e-mail address (subjectAltName), else its subject's common name,
//!    else its first DNS name.
//!
//! Authentication is on when the server has a token file, token review or a client CA; otherwise every
//! request passes without a principal and nothing is checked (the embedded default, plaintext
//! on 127.0.0.1, as the Bigtable emulator). Messages never repeat a token.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use crate::token_review::TokenReviewer;
use basalt_model::iam;
use basalt_transport::ConnInfo;
use basalt_transport::tls::file_stamp;
use parking_lot::Mutex;
use tonic::codegen::Service;
use tonic::codegen::http::{HeaderMap, Request, Response};
use tower_layer::Layer;

/// Who sent a request, once authenticated (in the request's extensions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The IAM member string: `user:alice@example.com`.
    pub member: String,
    /// The members of the groups the caller belongs to, as its authenticator says
    /// (`group:system:serviceaccounts:shop` from a TokenReview); a grant to one reaches it.
    pub groups: Vec<String>,
    /// A Basalt process (another tablet server, the master, the operator): its certificate
    /// names the same principal as this server's own certificate, or one of
    /// `--internal-principal`. Forwarded requests and the control protocol are theirs.
    pub internal: bool,
}

impl Principal {
    /// Its IAM members: its own, then its groups' (what a policy's binding may name).
    pub fn members(&self) -> Vec<&str> {
        std::iter::once(self.member.as_str())
            .chain(self.groups.iter().map(String::as_str))
            .collect()
    }
}

/// The paths of Basalt's own protocol (`basalt.control.v1`: control, tablet moves,
/// replication): only [`Principal::internal`] callers may use them.
pub const INTERNAL_PATHS: &str = "/basalt.";

/// The header of a token `cbt -auth-token` sends.
pub const CBT_TOKEN: &str = "x-goog-iam-authorization-token";

/// When a file last changed and its size (None: it cannot be read).
type Stamp = Option<(SystemTime, u64)>;
/// Token → member.
type Tokens = HashMap<String, String>;

/// Bearer tokens from a file, read again when it changes.
pub struct TokenFile {
    path: PathBuf,
    /// The file's stamp when read, the tokens, and when the stamp was last compared.
    state: Mutex<(Stamp, Arc<Tokens>, Instant)>,
}

/// How often the token file's stamp is compared (a `stat`), at most: a new token works, and a
/// removed one stops working, within it.
pub const TOKEN_FILE_RECHECK: Duration = Duration::from_millis(250);

impl TokenFile {
    /// Reads `path` now; an error says which line is wrong.
    pub fn load(path: &Path) -> Result<TokenFile, String> {
        let (stamp, tokens) = read_tokens(path)?;
        Ok(TokenFile {
            path: path.to_path_buf(),
            state: Mutex::new((stamp, Arc::new(tokens), Instant::now())),
        })
    }

    /// The member a token stands for (the file read again first if it changed; a file that
    /// no longer parses keeps the previous tokens, and says so in the log).
    pub fn member(&self, token: &str) -> Option<String> {
        let mut state = self.state.lock();
        if state.2.elapsed() < TOKEN_FILE_RECHECK {
            return state.1.get(token).cloned();
        }
        state.2 = Instant::now();
        let now = file_stamp(&self.path);
        if now != state.0 {
            match read_tokens(&self.path) {
                Ok((stamp, tokens)) => {
                    tracing::info!(file = %self.path.display(), tokens = tokens.len(), "token file reloaded");
                    state.0 = stamp;
                    state.1 = Arc::new(tokens);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the token file changed but does not parse; keeping the previous tokens");
                    state.0 = now;
                }
            }
        }
        state.1.get(token).cloned()
    }
}

fn read_tokens(path: &Path) -> Result<(Stamp, Tokens), String> {
    let stamp = file_stamp(path);
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let tokens = parse_tokens(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((stamp, tokens))
}

/// A token file's lines: `<token> <member>`; blank lines and `#` comments skipped. Pure.
pub fn parse_tokens(text: &str) -> Result<HashMap<String, String>, String> {
    let mut tokens = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(token), Some(member), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!(
                "line {}: expected `<token> <member>` (two words), e.g. `s3cr3t user:alice@example.com`",
                i + 1
            ));
        };
        if !iam::valid_member(member) || member.starts_with("all") {
            return Err(format!(
                "line {}: {member:?} is not a principal (user:NAME, serviceAccount:NAME, group:NAME or domain:NAME)",
                i + 1
            ));
        }
        if tokens
            .insert(token.to_string(), member.to_string())
            .is_some()
        {
            return Err(format!("line {}: the token is listed twice", i + 1));
        }
    }
    Ok(tokens)
}

/// The principal a client certificate (DER) names (see the module's docs); None when it
/// names none. Pure.
pub fn certificate_principal(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let sans: Vec<GeneralName<'_>> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|ext| ext.value.general_names.clone())
        .unwrap_or_default();
    let email = sans.iter().find_map(|n| match n {
        GeneralName::RFC822Name(e) => Some(e.to_string()),
        _ => None,
    });
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    let dns = sans.iter().find_map(|n| match n {
        GeneralName::DNSName(d) => Some(d.to_string()),
        _ => None,
    });
    email
        .or(cn)
        .or(dns)
        .filter(|n| !n.is_empty() && !n.contains(char::is_whitespace))
        .map(|n| format!("user:{n}"))
}

/// How this server authenticates (see the module's docs).
pub struct Authenticator {
    tokens: Option<TokenFile>,
    /// `--token-review`: tokens the file does not list, asked of the Kubernetes API server.
    reviewer: Option<Arc<TokenReviewer>>,
    client_certificates: bool,
    /// Principals of Basalt's own processes.
    internal: Vec<String>,
}

impl Authenticator {
    /// `tokens`: the token file, if any; `client_certificates`: whether clients present
    /// certificates (a client CA); `internal`: the principals of Basalt's own processes.
    pub fn new(
        tokens: Option<TokenFile>,
        client_certificates: bool,
        internal: Vec<String>,
    ) -> Self {
        Authenticator {
            tokens,
            reviewer: None,
            client_certificates,
            internal,
        }
    }

    /// Also asks the Kubernetes API server of tokens the token file does not list.
    pub fn with_token_review(mut self, reviewer: Arc<TokenReviewer>) -> Self {
        self.reviewer = Some(reviewer);
        self
    }

    /// Whether requests must be authenticated.
    pub fn enabled(&self) -> bool {
        self.tokens.is_some() || self.reviewer.is_some() || self.client_certificates
    }

    /// The caller of a request with these headers over this connection (Ok(None) when
    /// authentication is off), or the token to ask the Kubernetes API server about
    /// ([`Self::review`]).
    fn identify(&self, headers: &HeaderMap, conn: Option<&ConnInfo>) -> Identified {
        if !self.enabled() {
            return Identified::Known(Ok(None));
        }
        let member = match token(headers) {
            Some(token) => {
                match (
                    self.tokens.as_ref().and_then(|t| t.member(token)),
                    &self.reviewer,
                    &self.tokens,
                ) {
                    (Some(member), _, _) => member,
                    (None, Some(_), _) => return Identified::Review(token.to_string()),
                    (None, None, Some(_)) => {
                        return Identified::Known(Err(tonic::Status::unauthenticated(
                            "the bearer token is not one this server knows (expired, revoked or mistyped)",
                        )));
                    }
                    (None, None, None) => {
                        return Identified::Known(Err(tonic::Status::unauthenticated(
                            "this server takes no bearer tokens (it has no --auth-token-file): authenticate with a client certificate",
                        )));
                    }
                }
            }
            None => {
                let leaf = conn
                    .and_then(|c| c.peer_certificates.as_ref())
                    .and_then(|chain| chain.first());
                match leaf.map(|cert| certificate_principal(cert.as_ref())) {
                    Some(Some(member)) => member,
                    Some(None) => {
                        return Identified::Known(Err(tonic::Status::unauthenticated(
                            "the client certificate names no principal (no e-mail address, common name or DNS name)",
                        )));
                    }
                    None => {
                        return Identified::Known(Err(tonic::Status::unauthenticated(
                            "the request carries no credentials: send a bearer token (authorization: Bearer <token>) or present a client certificate",
                        )));
                    }
                }
            }
        };
        Identified::Known(Ok(Some(self.principal(member, Vec::new()))))
    }

    fn principal(&self, member: String, groups: Vec<String>) -> Principal {
        let internal = self.internal.contains(&member);
        Principal {
            member,
            groups,
            internal,
        }
    }

    /// The principal the Kubernetes API server says `token` stands for.
    async fn review(&self, token: &str) -> Result<Principal, tonic::Status> {
        let Some(reviewer) = &self.reviewer else {
            return Err(tonic::Status::internal("no token reviewer"));
        };
        match reviewer.review_token(token).await {
            Ok(Some(who)) => Ok(self.principal(who.member, who.groups)),
            Ok(None) => Err(tonic::Status::unauthenticated(
                "the bearer token is not one this server knows, nor one the Kubernetes API server accepts (expired, revoked, meant for another audience or mistyped)",
            )),
            Err(e) => Err(tonic::Status::unavailable(e)),
        }
    }
}

/// What [`Authenticator::identify`] found.
enum Identified {
    Known(Result<Option<Principal>, tonic::Status>),
    /// A bearer token to ask the Kubernetes API server about.
    Review(String),
}

/// The bearer token of a request, if it sends one.
fn token(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer ") {
            return Some(v[7..].trim());
        }
    }
    headers
        .get(CBT_TOKEN)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The layer (see the module).
#[derive(Clone)]
pub struct Authenticate(pub Arc<Authenticator>);

impl<S> Layer<S> for Authenticate {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Authenticated<S> {
        Authenticated {
            inner,
            authenticator: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    authenticator: Arc<Authenticator>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Authenticated<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let conn = request.extensions().get::<ConnInfo>();
        match self.authenticator.identify(request.headers(), conn) {
            Identified::Known(known) => match admit(known, request.uri().path()) {
                Ok(principal) => {
                    if let Some(p) = principal {
                        request.extensions_mut().insert(p);
                    }
                    Box::pin(self.inner.call(request))
                }
                Err(status) => Box::pin(async move { Ok(status.into_http()) }),
            },
            Identified::Review(token) => {
                // The service made ready by poll_ready goes with the request; this one
                // (a clone) waits for the next poll_ready.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let authenticator = self.authenticator.clone();
                Box::pin(async move {
                    let reviewed = authenticator.review(&token).await.map(Some);
                    match admit(reviewed, request.uri().path()) {
                        Ok(principal) => {
                            if let Some(p) = principal {
                                request.extensions_mut().insert(p);
                            }
                            inner.call(request).await
                        }
                        Err(status) => Ok(status.into_http()),
                    }
                })
            }
        }
    }
}

/// Whether an authenticated caller may call `path`: Basalt's own protocol is for its own
/// processes only.
fn admit(
    authenticated: Result<Option<Principal>, tonic::Status>,
    path: &str,
) -> Result<Option<Principal>, tonic::Status> {
    match authenticated {
        Ok(Some(p)) if !p.internal && path.starts_with(INTERNAL_PATHS) => {
            Err(tonic::Status::permission_denied(format!(
                "{path} is Basalt's own protocol: only Basalt's processes may call it, not {}",
                p.member
            )))
        }
        Err(status) => {
            tracing::debug!(path, message = status.message(), "unauthenticated request");
            Err(status)
        }
        ok => ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::http::HeaderValue;

    #[test]
    fn token_files_parse_and_say_which_line_is_wrong() {
        let t = parse_tokens(
            "# readers\nr3ad user:reader@example.com\n\n  adm1n   serviceAccount:ops  \n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t["r3ad"], "user:reader@example.com");
        assert_eq!(t["adm1n"], "serviceAccount:ops");
        assert!(
            parse_tokens("x user:a\ny\n")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(
            parse_tokens("x alice\n")
                .unwrap_err()
                .contains("\"alice\" is not a principal")
        );
        assert!(
            parse_tokens("x allUsers\n")
                .unwrap_err()
                .contains("not a principal")
        );
        assert!(
            parse_tokens("x user:a\nx user:b\n")
                .unwrap_err()
                .contains("twice")
        );
        assert!(
            parse_tokens("x user:a extra\n")
                .unwrap_err()
                .contains("two words")
        );
    }

    #[test]
    fn a_changed_token_file_is_read_again_and_a_broken_one_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "one user:a\n").unwrap();
        let file = TokenFile::load(&path).unwrap();
        assert_eq!(file.member("one").as_deref(), Some("user:a"));
        assert_eq!(file.member("two"), None);
        // A rotation: a new token in, the old one out (a different size is a change even
        // within the file system's mtime granularity).
        std::fs::write(&path, "two user:bb\n").unwrap();
        std::thread::sleep(TOKEN_FILE_RECHECK);
        assert_eq!(file.member("two").as_deref(), Some("user:bb"));
        assert_eq!(file.member("one"), None);
        // Half-written: the previous tokens stay.
        std::fs::write(&path, "three\n").unwrap();
        std::thread::sleep(TOKEN_FILE_RECHECK);
        assert_eq!(file.member("two").as_deref(), Some("user:bb"));
        assert!(TokenFile::load(&path).is_err());
    }

    impl Authenticator {
        fn authenticate(
            &self,
            headers: &HeaderMap,
            conn: Option<&ConnInfo>,
        ) -> Result<Option<Principal>, tonic::Status> {
            match self.identify(headers, conn) {
                Identified::Known(known) => known,
                Identified::Review(_) => panic!("no token review here"),
            }
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn tokens_come_as_bearer_or_as_cbt_sends_them_and_are_never_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(
            &path,
            "s3cr3t user:alice@example.com\nops serviceAccount:basalt-master\n",
        )
        .unwrap();
        let auth = Authenticator::new(
            Some(TokenFile::load(&path).unwrap()),
            false,
            vec!["serviceAccount:basalt-master".into()],
        );
        let alice = auth
            .authenticate(&headers(&[("authorization", "Bearer s3cr3t")]), None)
            .unwrap()
            .unwrap();
        assert_eq!(alice.member, "user:alice@example.com");
        assert!(!alice.internal);
        let cbt = auth
            .authenticate(&headers(&[(CBT_TOKEN, "s3cr3t")]), None)
            .unwrap()
            .unwrap();
        assert_eq!(cbt, alice);
        assert!(
            auth.authenticate(&headers(&[("authorization", "bearer ops")]), None)
                .unwrap()
                .unwrap()
                .internal
        );
        let wrong = auth
            .authenticate(&headers(&[("authorization", "Bearer guessed")]), None)
            .unwrap_err();
        assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
        assert!(!wrong.message().contains("guessed"), "{}", wrong.message());
        let none = auth.authenticate(&HeaderMap::new(), None).unwrap_err();
        assert_eq!(none.code(), tonic::Code::Unauthenticated);
        assert!(none.message().contains("no credentials"));
        // Off: no principal, nothing refused.
        let off = Authenticator::new(None, false, vec![]);
        assert_eq!(off.authenticate(&HeaderMap::new(), None).unwrap(), None);
    }

    #[test]
    fn a_client_certificate_names_its_principal() {
        let mut params = rcgen::CertificateParams::new(vec!["reader.example.com".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "reader");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            certificate_principal(cert.der()).as_deref(),
            Some("user:reader")
        );
        // An e-mail address comes first.
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::Rfc822Name(
            "alice@example.com".try_into().unwrap(),
        )];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            certificate_principal(cert.der()).as_deref(),
            Some("user:alice@example.com")
        );
        // Without a common name: the DNS name.
        let mut params = rcgen::CertificateParams::new(vec!["svc.example".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            certificate_principal(cert.der()).as_deref(),
            Some("user:svc.example")
        );
        assert_eq!(certificate_principal(b"not a certificate"), None);
    }
}
