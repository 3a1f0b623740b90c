//! API-key authentication (SPEC §6): off unless `SYNAPSE_AUTH_ENABLED=true`.
//!
//! The settings come from `$SYNAPSE_HOME/broker-settings.json` (see [`crate::trust`]), never
//! from the environment of whoever started the broker. Keys (`SYNAPSE_API_KEYS`,
//! comma-separated) are kept only as SHA-256 digests, compared in constant time. A key is sent as `X-API-Key` or `Authorization: Bearer`.
//! Requests over the Unix socket or from loopback pass unless `SYNAPSE_ALLOW_LOCALHOST=false`.
//! Agent cards and `/status` stay open. The dashboard's page key of this start, shown over the
//! user's loopback connection, passes as a key (see [`check`]).

use super::ApiError;
use super::keys::presented_key;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub enabled: bool,
    key_digests: Vec<[u8; 32]>,
    pub allow_localhost: bool,
    /// Other users' processes may call the broker without auth.
    pub allow_other_users: bool,
    /// The dashboard's tokens for `/events?token=` (a browser's `EventSource` cannot send a key).
    pub stream_tokens: Arc<super::dashboard::StreamTokens>,
    /// The dashboard page of this start. Its key, shown over a loopback connection of the
    /// user's, passes authentication as a key does: the page never needs the API key.
    pub page: Arc<super::dashboard::Page>,
    /// Whether the page key passes here: on the broker's own servers, where the page is; not on
    /// an agent's port or socket.
    pub accepts_page_key: bool,
}

use crate::trust::key_digest as digest;

impl AuthConfig {
    /// The configuration of the home's security settings (read once, at start).
    pub fn from_trust(settings: &crate::trust::TrustSettings) -> AuthConfig {
        AuthConfig {
            enabled: settings.auth_enabled,
            key_digests: settings.key_digests(),
            allow_localhost: settings.allow_localhost,
            allow_other_users: settings.allow_other_users,
            stream_tokens: Arc::default(),
            page: Arc::default(),
            accepts_page_key: true,
        }
    }

    /// The same configuration for an agent's own servers, where the page key passes nothing.
    pub fn for_an_agent(&self) -> AuthConfig {
        AuthConfig { accepts_page_key: false, ..self.clone() }
    }

    /// Is `key` one of the configured keys? Constant time in the key's content.
    pub fn accepts(&self, key: &str) -> bool {
        let candidate = digest(key);
        let mut found = 0u8;
        for known in &self.key_digests {
            // Every key is compared, whichever matches: the time says nothing of which one did.
            found |= u8::from(crate::secret::constant_time_eq(known, &candidate));
        }
        found == 1
    }
}

/// Requests that stay open: a GET of agent cards, status and the dashboard's page and assets
/// (which hold no data: the page asks for the key before it reads anything), and the replies of
/// external agents (the reply token they name is their proof, see `http::externals`). Routes
/// are matched whole: `POST /agents/status` is the JSON-RPC endpoint of an agent named
/// `status`, and `POST /agents/X/status` sets an agent's status.
fn is_open_request(method: &axum::http::Method, path: &str) -> bool {
    if path.strip_prefix(super::externals::REPLIES_PATH).is_some_and(|rest| rest.starts_with('/')) {
        return true;
    }
    if method != axum::http::Method::GET && method != axum::http::Method::HEAD {
        return false;
    }
    is_open(path) || super::dashboard::is_asset(path)
}

/// Paths whose GET stays open: agent cards and status, the broker's and one agent's.
fn is_open(path: &str) -> bool {
    // `/agents/<one segment>/...` is that agent's; the rest is the broker's or this agent's own.
    let own = path
        .strip_prefix("/agents/")
        .and_then(|rest| rest.find('/').filter(|&at| at > 0).map(|at| &rest[at..]))
        .unwrap_or(path);
    matches!(own, "/.well-known/agent.json" | "/.well-known/agent-card.json" | "/status") || path == "/broker/health"
}

/// Is the request from a process of another user on this machine, as far as can be told? Over
/// loopback TCP the caller's socket is looked up when the connection is accepted
/// ([`crate::process::loopback_tcp_socket`]); one that cannot be found (the caller reset the
/// connection at once, its request already sent) is not known to be the user's, and counts as
/// another user's. Over the Unix socket (no peer address) the socket's directory is the user's
/// own; a caller from another machine is not "local" and needs a key when auth is on.
fn from_another_user(request: &Request) -> bool {
    match request.extensions().get::<crate::process::TcpSocket>() {
        Some(socket) => socket.uid != crate::private_files::my_uid(),
        None => request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback()),
    }
}

/// Is the request over loopback TCP from a socket of the broker's user?
fn from_the_users_loopback_socket(request: &Request) -> bool {
    request
        .extensions()
        .get::<crate::process::TcpSocket>()
        .is_some_and(|socket| socket.uid == crate::private_files::my_uid())
}

/// The middleware: lets a request through or answers 401.
pub async fn check(State(config): State<Arc<AuthConfig>>, request: Request, next: Next) -> Response {
    let open = is_open_request(request.method(), request.uri().path());
    // A process of another user on this machine (over loopback TCP) is not "local": the broker
    // serves its user. With auth on it needs a key like any remote caller; with auth off it is
    // refused, unless SYNAPSE_ALLOW_OTHER_USERS=true. It may still read the open pages (cards,
    // status), but not post to the open routes: an external agent's reply, up to the body
    // limit, would be read before its token is checked.
    let other_user = from_another_user(&request);
    let reads_only = request.method() == axum::http::Method::GET || request.method() == axum::http::Method::HEAD;
    if open && (reads_only || !other_user || config.enabled || config.allow_other_users) {
        return next.run(request).await;
    }
    if other_user && !config.enabled && !config.allow_other_users {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "this broker serves its own user only: the request comes from a process of another user, or from one whose connection could not be traced to its user (turn on auth with API keys, or start the broker with 'SYNAPSE_ALLOW_OTHER_USERS=true synapse broker start', to let others in)",
        )
        .into_response();
    }
    if !config.enabled {
        return next.run(request).await;
    }
    // No peer address: the request came over a Unix socket.
    let local = !other_user
        && request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .is_none_or(|ConnectInfo(peer)| peer.ip().is_loopback());
    if local && config.allow_localhost {
        return next.run(request).await;
    }
    // The dashboard's event stream: a browser's EventSource cannot send a key, so the page
    // trades its key for a one-stream token first (POST /dashboard/stream-token).
    if request.uri().path() == "/events"
        && let Some(token) = stream_token(request.uri().query())
    {
        return if config.stream_tokens.redeem(&token) {
            next.run(request).await
        } else {
            super::dashboard::bad_stream_token().into_response()
        };
    }
    // The dashboard page opened from the address `synapse dashboard` printed: its key of this
    // start is a key of its own, given only to the user (`GET /dashboard/page-key`: over the
    // Unix socket, or with the admin key), after this check. So the page never asks for the API key, and never holds one that a server
    // squatting the port while the broker is stopped could take from it. Over the user's own
    // loopback connection only (what `synapse dashboard` prints); what the page may then do is
    // decided per route, as for any caller (`caller::is_the_users_browser`).
    if config.accepts_page_key
        && config.page.key_is_shown_in(request.headers())
        && from_the_users_loopback_socket(&request)
    {
        return next.run(request).await;
    }
    match presented_key(request.headers()).map(|key| config.accepts(key)) {
        None => ApiError::new(StatusCode::UNAUTHORIZED, "API key required").into_response(),
        Some(true) => next.run(request).await,
        Some(false) => ApiError::new(StatusCode::UNAUTHORIZED, "Invalid API key").into_response(),
    }
}

/// The `token` parameter of a query, decoded.
fn stream_token(query: Option<&str>) -> Option<String> {
    url::form_urlencoded::parse(query?.as_bytes())
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_configured_keys_are_accepted() {
        let config = AuthConfig {
            enabled: true,
            key_digests: vec![digest("alpha"), digest("beta")],
            allow_localhost: false,
            allow_other_users: false,
            stream_tokens: Arc::default(),
            page: Arc::default(),
            accepts_page_key: true,
        };
        assert!(config.accepts("alpha"));
        assert!(config.accepts("beta"));
        assert!(!config.accepts("gamma"));
        assert!(!config.accepts(""));
    }

    #[test]
    fn cards_and_status_stay_open() {
        assert!(is_open("/.well-known/agent.json"));
        assert!(is_open("/agents/synapse-dummy-8190/.well-known/agent-card.json"));
        assert!(is_open("/agents/synapse-dummy-8190/status"));
        assert!(is_open("/status"));
        assert!(is_open("/broker/health"));
        assert!(!is_open("/tasks/send"));
        assert!(!is_open("/agents"));
        // Routes are matched whole, not by their ends.
        assert!(!is_open("/agents/status"), "the JSON-RPC endpoint of an agent named 'status'");
        assert!(!is_open("/agents//status"));
        assert!(!is_open("/agents/a/tasks/t/pushNotificationConfigs/status"));
        assert!(!is_open("/tasks/.well-known/agent.json"));
        use axum::http::Method;
        assert!(is_open_request(&Method::GET, "/agents/synapse-dummy-8190/status"));
        assert!(!is_open_request(&Method::POST, "/agents/synapse-dummy-8190/status"), "sets the status");
        assert!(!is_open_request(&Method::POST, "/agents/status"));
        assert!(!is_open_request(&Method::DELETE, "/agents/a/tasks/t/pushNotificationConfigs/status"));
        assert!(is_open_request(&Method::POST, "/external-replies/tasks/send"));
        assert!(is_open_request(&Method::GET, "/"));
        assert!(is_open_request(&Method::GET, "/dashboard/app.js"));
        assert!(!is_open_request(&Method::POST, "/"), "an agent's JSON-RPC endpoint");
        assert!(!is_open_request(&Method::GET, "/dashboard/state"));
        assert!(!is_open_request(&Method::POST, "/dashboard/stream-token"));
    }

    #[test]
    fn a_loopback_caller_whose_socket_cannot_be_found_counts_as_another_user() {
        let request = |peer: Option<&str>, socket: Option<u32>| {
            let mut request = Request::new(axum::body::Body::empty());
            if let Some(peer) = peer {
                request.extensions_mut().insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
            }
            if let Some(uid) = socket {
                request.extensions_mut().insert(crate::process::TcpSocket { uid, inode: 1 });
            }
            request
        };
        let me = crate::private_files::my_uid();
        assert!(!from_another_user(&request(None, None)), "the Unix socket");
        assert!(!from_another_user(&request(Some("127.0.0.1:5000"), Some(me))));
        assert!(from_another_user(&request(Some("127.0.0.1:5000"), Some(me.wrapping_add(1)))));
        // Reset by the caller before its socket was looked up: not known to be the user's.
        assert!(from_another_user(&request(Some("127.0.0.1:5000"), None)));
        assert!(from_another_user(&request(Some("[::1]:5000"), None)));
        // From another machine: not "local" either way (a key is needed when auth is on).
        assert!(!from_another_user(&request(Some("192.0.2.7:5000"), None)));
    }
}
