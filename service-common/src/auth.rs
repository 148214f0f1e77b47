//! Bearer tokens: the admin routes' guard ([`AdminAuth`], the one place their token is checked) and
//! the service credential that every data route of the allocator and the inference server requires
//! ([`ServiceTokens`], [`protect`]), so that only the control service and the operator's tools, not
//! anyone who reaches a port, can place, release or predict.

use crate::problem::problem;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use domain::ProblemKind;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// The routes that answer without a credential: the liveness and readiness probes (orchestrators
/// and the control service's health checks call them with no secret), the Prometheus scrape (the
/// scraper has none, and the figures are aggregates without VM or tenant ids) and the API document
/// (public knowledge).
pub const OPEN_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics", "/openapi.json"];

/// The token of `Authorization: Bearer <token>`; the scheme is case-insensitive (RFC 9110 s11.1).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Compares in constant time for equal lengths, so a token cannot be guessed byte by byte from
/// response times.
fn same_secret(given: &str, expected: &str) -> bool {
    given.len() == expected.len() && given.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// 401 with `WWW-Authenticate: Bearer` and a problem body.
fn unauthorized(detail: &str) -> Response {
    let mut response = problem(ProblemKind::Unauthorized, detail);
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Checks `Authorization: Bearer <token>`: 403 without a configured token (the admin routes are
/// closed), 401 with `WWW-Authenticate: Bearer` unless the request carries it.
fn require_bearer(headers: &HeaderMap, token: Option<&str>) -> Result<(), Response> {
    let Some(expected) = token.filter(|t| !t.is_empty()) else {
        return Err(problem(ProblemKind::AdminDisabled, "no admin token is configured for this service"));
    };
    if bearer_token(headers).is_some_and(|given| same_secret(given, expected)) {
        Ok(())
    } else {
        Err(unauthorized("a valid bearer token is required"))
    }
}

/// Router states that hold a service's admin token (`None`: its admin routes are off).
pub trait HasAdminToken {
    fn admin_token(&self) -> Option<&str>;
}

/// The guard of an admin route: a handler that takes it as an argument runs only for a request
/// with `Authorization: Bearer <admin token>`; any other gets 401 (403 while no admin token is
/// configured) before the handler runs and before the body is read. Its answers are documented by
/// [`crate::openapi::AdminRefusals`].
#[derive(Debug, Clone, Copy)]
pub struct AdminAuth;

impl<S: HasAdminToken + Sync> FromRequestParts<S> for AdminAuth {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        require_bearer(&parts.headers, state.admin_token()).map(|()| AdminAuth)
    }
}

/// The bearer tokens a service's data routes accept. Empty: **open**, every caller is let through
/// (the library default, for tests and loopback demos; the service logs a WARN at every start,
/// [`ServiceTokens::warn_if_open`]).
#[derive(Clone, Debug, Default)]
pub struct ServiceTokens {
    accepted: Arc<[Box<str>]>,
}

impl ServiceTokens {
    /// Open: no credential needed.
    pub fn open() -> Self {
        ServiceTokens::default()
    }

    /// The data routes require `service_token`; while it is being rotated, `previous` is accepted
    /// as well, and the `admin` token always is (its holder may do more than any service already).
    /// Without a service token the routes are open, whatever the other two are: an admin token
    /// alone must not close routes that the control service calls without one.
    pub fn new(service_token: Option<&str>, previous: Option<&str>, admin: Option<&str>) -> Self {
        let Some(service_token) = service_token.filter(|t| !t.is_empty()) else {
            return ServiceTokens::open();
        };
        let accepted: Vec<Box<str>> = [Some(service_token), previous, admin]
            .into_iter()
            .flatten()
            .filter(|token| !token.is_empty())
            .map(Box::from)
            .collect();
        ServiceTokens { accepted: accepted.into() }
    }

    pub fn is_open(&self) -> bool {
        self.accepted.is_empty()
    }

    /// Whether `headers` carry an accepted token. Every accepted token is compared (no early
    /// exit), so the time taken does not say which one matched.
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        if self.is_open() {
            return true;
        }
        let Some(given) = bearer_token(headers) else { return false };
        self.accepted.iter().fold(false, |matched, expected| matched | same_secret(given, expected))
    }

    /// Logs the open mode at every start, so that open data routes are never a silent default in
    /// production; `service` names the binary, `setting` the variable that closes them.
    pub fn warn_if_open(&self, service: &str, setting: &str) {
        if self.is_open() {
            tracing::warn!(
                "OPEN DATA ROUTES: no service token is configured, so every route of this {service} but the \
                 probes answers anyone who reaches its port, and the control service's API keys can be walked \
                 around. For loopback demos only: set `service_token` (or {setting}) and give the same token to \
                 the control service (docs/operations.md, \"Service credentials\")"
            );
        } else {
            tracing::info!(accepted_tokens = self.accepted.len(), "data routes require the service token");
        }
    }
}

/// A service about to answer anyone beyond this machine: routes open to every caller on an address
/// other hosts reach, without the operator saying so.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to listen on {listen} with routes open to anyone: {closed_by}, or listen on a loopback address \
     (127.0.0.1); to serve every caller who reaches the port anyway, pass --insecure-open (the config's \
     `insecure_open = true`)"
)]
pub struct OpenBeyondLoopback {
    pub listen: SocketAddr,
    /// What closes the routes, e.g. "set `service_token` or ALLOCATOR_SERVICE_TOKEN".
    pub closed_by: &'static str,
}

/// Secure by default: open routes (`open`: no service token, or the control service without API
/// keys) are served on loopback only, unless `insecure_open` says otherwise, since on any other
/// address whoever reaches the port may place, release or predict. An unspecified address
/// (0.0.0.0, ::) counts as beyond loopback: it listens on every interface.
pub fn refuse_open_beyond_loopback(
    listen: SocketAddr,
    open: bool,
    insecure_open: bool,
    closed_by: &'static str,
) -> Result<(), OpenBeyondLoopback> {
    if !open || insecure_open || listen.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    Err(OpenBeyondLoopback { listen, closed_by })
}

/// The middleware of [`protect`]: [`OPEN_PATHS`] pass, every other request needs an accepted
/// token, else 401 before any handler (or body read) runs, so nothing changes.
async fn require_service_token(State(tokens): State<ServiceTokens>, request: Request, next: Next) -> Response {
    if OPEN_PATHS.contains(&request.uri().path()) || tokens.accepts(request.headers()) {
        return next.run(request).await;
    }
    let reason = if bearer_token(request.headers()).is_some() { "wrong" } else { "missing" };
    metrics::counter!("service_token_refusals_total", "reason" => reason).increment(1);
    unauthorized(match reason {
        "wrong" => "the bearer token is not this service's service token",
        _ => "this route requires the service token: `Authorization: Bearer <service token>`",
    })
}

/// `router` with every route but [`OPEN_PATHS`] behind `tokens`, the unknown routes and wrong
/// methods included (a caller without the token learns nothing about the routes). Call it after
/// the routes and fallbacks are added: a layer wraps only what the router holds.
pub fn protect(router: Router, tokens: ServiceTokens) -> Router {
    router.layer(axum::middleware::from_fn_with_state(tokens, require_service_token))
}

/// Why a token could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("reading the token file `{path}` named by {variable}: {source}")]
    Unreadable { variable: String, path: PathBuf, source: std::io::Error },
    #[error("the token file `{path}` named by {variable} is empty")]
    Empty { variable: String, path: PathBuf },
}

/// A token setting with its environment override: `$VARIABLE` when set and not empty, else the
/// first line of the file named by `$VARIABLE_FILE` (for secrets mounted as files, as Docker and
/// Kubernetes do), else `configured`. An empty variable counts as unset, so that a compose file can
/// pass `${VARIABLE:-}` through without hiding the file.
pub fn token_from_env(variable: &str, configured: Option<String>) -> Result<Option<String>, TokenError> {
    if let Some(token) = std::env::var(variable).ok().filter(|t| !t.is_empty()) {
        return Ok(Some(token));
    }
    let file_variable = format!("{variable}_FILE");
    if let Some(path) = std::env::var_os(&file_variable).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        let text = std::fs::read_to_string(&path).map_err(|source| TokenError::Unreadable {
            variable: file_variable.clone(),
            path: path.clone(),
            source,
        })?;
        let token = text.lines().next().unwrap_or_default().trim();
        if token.is_empty() {
            return Err(TokenError::Empty { variable: file_variable, path });
        }
        return Ok(Some(token.to_owned()));
    }
    Ok(configured.filter(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use tower::ServiceExt;

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn the_service_token_its_predecessor_and_the_admin_token_pass() {
        let tokens = ServiceTokens::new(Some("new"), Some("old"), Some("admin"));
        for accepted in ["Bearer new", "bearer old", "BEARER admin"] {
            assert!(tokens.accepts(&headers(Some(accepted))), "{accepted}");
        }
        for refused in [None, Some("Bearer"), Some("Bearer "), Some("Bearer ne"), Some("Basic new"), Some("new")] {
            assert!(!tokens.accepts(&headers(refused)), "{refused:?}");
        }
    }

    #[test]
    fn without_a_service_token_the_routes_are_open_whatever_else_is_set() {
        assert!(ServiceTokens::new(None, Some("old"), Some("admin")).is_open());
        assert!(ServiceTokens::new(Some(""), None, None).is_open());
        assert!(ServiceTokens::open().accepts(&headers(None)));
        // An empty previous or admin token never matches an empty bearer value.
        let tokens = ServiceTokens::new(Some("s"), Some(""), Some(""));
        assert!(!tokens.accepts(&headers(Some("Bearer "))));
    }

    #[test]
    fn open_routes_are_served_beyond_loopback_only_when_asked() {
        let at = |addr: &str| addr.parse::<SocketAddr>().unwrap();
        let closed_by = "set `service_token`";
        for loopback in ["127.0.0.1:8082", "127.1.2.3:1", "[::1]:8082", "[::ffff:127.0.0.1]:8082"] {
            assert!(refuse_open_beyond_loopback(at(loopback), true, false, closed_by).is_ok(), "{loopback}");
        }
        for beyond in ["0.0.0.0:8082", "10.0.0.1:8082", "[::]:8082", "[2001:db8::1]:8082"] {
            let refused = refuse_open_beyond_loopback(at(beyond), true, false, closed_by).unwrap_err();
            let message = refused.to_string();
            assert!(message.contains(beyond) && message.contains(closed_by), "{message}");
            assert!(message.contains("--insecure-open") && message.contains("insecure_open = true"), "{message}");
            // A token closes them; the explicit flag opens them.
            assert!(refuse_open_beyond_loopback(at(beyond), false, false, closed_by).is_ok());
            assert!(refuse_open_beyond_loopback(at(beyond), true, true, closed_by).is_ok());
        }
    }

    async fn must_not_run() -> &'static str {
        unreachable!("the handler must not run without the token")
    }

    #[tokio::test]
    async fn protected_routes_answer_401_before_the_handler_and_probes_stay_open() {
        let app = Router::new()
            .route("/readyz", get(|| async { "ready" }))
            .route("/v1/change", post(must_not_run))
            .fallback(|| async { StatusCode::NOT_FOUND });
        let app = protect(app, ServiceTokens::new(Some("secret"), None, None));
        let call = |method: &str, path: &str, authorization: Option<&str>| {
            let mut request = axum::http::Request::builder().method(method).uri(path);
            if let Some(value) = authorization {
                request = request.header(header::AUTHORIZATION, value);
            }
            app.clone().oneshot(request.body(Body::empty()).unwrap())
        };
        let refused = call("POST", "/v1/change", None).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(refused.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(call("POST", "/v1/change", Some("Bearer wrong")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
        assert_eq!(call("GET", "/no/such/route", None).await.unwrap().status(), StatusCode::UNAUTHORIZED);
        assert_eq!(call("GET", "/readyz", None).await.unwrap().status(), StatusCode::OK);
        assert_eq!(call("GET", "/no/such/route", Some("Bearer secret")).await.unwrap().status(), StatusCode::NOT_FOUND);
    }

    /// A state with an admin token, or none.
    #[derive(Clone)]
    struct Admin(Option<&'static str>);

    impl HasAdminToken for Admin {
        fn admin_token(&self) -> Option<&str> {
            self.0
        }
    }

    #[tokio::test]
    async fn an_admin_route_runs_only_with_the_admin_token_and_refuses_before_reading_the_body() {
        async fn admin_only(_: AdminAuth, body: String) -> String {
            body
        }
        let call = |token: Option<&'static str>, authorization: Option<&str>| {
            let app = Router::new().route("/admin", post(admin_only)).with_state(Admin(token));
            let mut request = axum::http::Request::builder().method("POST").uri("/admin");
            if let Some(value) = authorization {
                request = request.header(header::AUTHORIZATION, value);
            }
            app.oneshot(request.body(Body::from("done")).unwrap())
        };
        let allowed = call(Some("secret"), Some("Bearer secret")).await.unwrap();
        assert_eq!(allowed.status(), StatusCode::OK);
        for authorization in [None, Some("Bearer wrong"), Some("secret")] {
            let refused = call(Some("secret"), authorization).await.unwrap();
            assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{authorization:?}");
            assert_eq!(refused.headers()[header::WWW_AUTHENTICATE], "Bearer");
            assert_eq!(refused.headers()[header::CONTENT_TYPE], domain::PROBLEM_CONTENT_TYPE);
        }
        // No admin token configured: the admin API is off, whatever the request carries.
        for token in [None, Some("")] {
            let off = call(token, Some("Bearer ")).await.unwrap();
            assert_eq!(off.status(), StatusCode::FORBIDDEN, "{token:?}");
            assert!(off.headers().get(header::WWW_AUTHENTICATE).is_none());
        }
    }
}
