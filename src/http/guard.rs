//! Request rules that keep web pages out (issue 12): every server of the broker (its TCP port and
//! Unix socket, each agent's port and socket) answers only requests that a browser page cannot
//! forge.
//!
//! - **Host** (TCP only): a loopback name (`localhost`, `127.0.0.1`, `[::1]`, any port) or one of
//!   `SYNAPSE_ALLOWED_HOSTS`; anything else is a DNS-rebinding page and gets 421. A Unix socket
//!   lives in a 0700 directory and no browser can open one, so its Host (the CLI used to send
//!   `synapse`, raw clients send anything or nothing) is not judged.
//! - **Origin**: absent (not a browser), the broker's own loopback origin (the dashboard), or one of
//!   `SYNAPSE_ALLOWED_ORIGINS`; any other origin gets 403.
//! - **Content type**: a POST, PUT or PATCH that declares a type or carries a body must be JSON
//!   (`application/json`, `application/a2a+json`, parameters allowed), else 415: a page can post a
//!   form or `text/plain` without a preflight, never JSON. An empty body without a type passes
//!   to the route, which refuses it (400) if it takes a body.
//!
//! Errors keep the API's JSON shape ([`ApiError`]).

use super::ApiError;
use super::origin::{LOOPBACK_HOSTS, is_broker_origin, split_host};
use super::server::Transport;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Names a request may carry as Host besides the loopback ones, and origins it may carry.
#[derive(Debug, Clone, Default)]
pub struct RequestRules {
    /// Lowercase host names or `host:port` values (`SYNAPSE_ALLOWED_HOSTS`).
    allowed_hosts: Vec<String>,
    /// Lowercase origins without a trailing slash (`SYNAPSE_ALLOWED_ORIGINS`).
    allowed_origins: Vec<String>,
}

/// The media types a request body may have.
const JSON_TYPES: [&str; 2] = ["application/json", "application/a2a+json"];

fn is_port(text: Option<&str>) -> bool {
    text.is_none_or(|port| !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()))
}

impl RequestRules {
    /// The home's allowed hosts and origins (`SYNAPSE_ALLOWED_HOSTS`, `SYNAPSE_ALLOWED_ORIGINS`
    /// when the broker was started by hand: see [`crate::trust`]), once at start.
    pub fn from_trust(settings: &crate::trust::TrustSettings) -> RequestRules {
        RequestRules {
            allowed_hosts: settings.allowed_hosts.clone(),
            allowed_origins: settings.allowed_origins.clone(),
        }
    }

    fn is_allowed_host(&self, value: &str) -> bool {
        let (host, port) = split_host(value);
        if !is_port(port) {
            return false;
        }
        LOOPBACK_HOSTS.contains(&host.as_str())
            || self
                .allowed_hosts
                .iter()
                .any(|allowed| *allowed == host || *allowed == value.trim().to_ascii_lowercase())
    }

    /// A browser origin is allowed when configured, or when it is the broker's own loopback
    /// origin (`http://localhost:<broker port>` and the like: the dashboard).
    fn is_allowed_origin(&self, origin: &str, broker_port: u16) -> bool {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        if self.allowed_origins.contains(&origin) {
            return true;
        }
        is_broker_origin(&origin, broker_port)
    }

    /// Judges one request's headers; `Err` is the answer to send instead.
    pub fn judge(
        &self,
        method: &Method,
        headers: &HeaderMap,
        transport: Option<Transport>,
        broker_port: u16,
    ) -> Result<(), ApiError> {
        // One of each, or the one judged may not be the one a later reader takes.
        for name in [header::HOST, header::ORIGIN] {
            if headers.get_all(&name).iter().nth(1).is_some() {
                return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("more than one {name} header")));
            }
        }
        if !matches!(transport, Some(Transport::Unix)) {
            let host = headers.get(header::HOST).map(|value| value.to_str().unwrap_or("?"));
            match host {
                Some(host) if self.is_allowed_host(host) => {}
                Some(host) => {
                    return Err(ApiError::new(
                        StatusCode::MISDIRECTED_REQUEST,
                        format!(
                            "Host '{host}' is not allowed: Synapse answers only to localhost, 127.0.0.1 and [::1] (to allow it, start the broker with SYNAPSE_ALLOWED_HOSTS naming it: 'synapse broker stop', then 'SYNAPSE_ALLOWED_HOSTS=... synapse broker start')"
                        ),
                    ));
                }
                None => {
                    return Err(ApiError::new(StatusCode::MISDIRECTED_REQUEST, "a Host header is required"));
                }
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("?");
            if !self.is_allowed_origin(origin, broker_port) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "requests from the web origin '{origin}' are not allowed (only the broker's own page; to allow it, start the broker with SYNAPSE_ALLOWED_ORIGINS naming it: 'synapse broker stop', then 'SYNAPSE_ALLOWED_ORIGINS=... synapse broker start')"
                    ),
                ));
            }
        }
        if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
            let declared = headers.get(header::CONTENT_TYPE).map(|value| value.to_str().unwrap_or("?"));
            let has_body = headers.contains_key(header::TRANSFER_ENCODING)
                || headers
                    .get(header::CONTENT_LENGTH)
                    .and_then(|value| value.to_str().ok())
                    .is_some_and(|length| length.trim() != "0");
            let is_json = declared.is_some_and(|declared| {
                let media = declared.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
                JSON_TYPES.contains(&media.as_str())
            });
            if (declared.is_some() || has_body) && !is_json {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!(
                        "the request body must be JSON (Content-Type: application/json or application/a2a+json), not '{}'",
                        declared.unwrap_or("none")
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The middleware: outermost on every router, before authentication.
pub async fn check(State(state): State<super::AppState>, request: Request, next: Next) -> Response {
    let transport = request.extensions().get::<Transport>().copied();
    let broker_port = state.port.load(std::sync::atomic::Ordering::Relaxed);
    match state.request_rules.judge(request.method(), request.headers(), transport, broker_port) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static("?")));
        }
        map
    }

    fn tcp() -> Option<Transport> {
        Some(Transport::Tcp { peer: std::net::SocketAddr::from(([127, 0, 0, 1], 5000)) })
    }

    fn status(result: Result<(), ApiError>) -> u16 {
        result.err().map_or(200, |error| error.status().as_u16())
    }

    #[test]
    fn loopback_and_configured_hosts_pass_over_tcp_and_others_get_421() {
        let rules = RequestRules { allowed_hosts: vec!["devbox".into()], allowed_origins: vec![] };
        for host in ["localhost", "localhost:8100", "127.0.0.1:9", "[::1]", "[::1]:8100", "LOCALHOST", "devbox:1"] {
            assert_eq!(
                status(rules.judge(&Method::GET, &headers(&[(header::HOST, host)]), tcp(), 7000)),
                200,
                "{host}"
            );
        }
        for host in [
            "attacker.example",
            "attacker.example:8100",
            "localhost.evil",
            "127.0.0.1:x",
            "synapse",
            "[::1]evil.example",
            "[::1].evil.example:80",
        ] {
            assert_eq!(
                status(rules.judge(&Method::GET, &headers(&[(header::HOST, host)]), tcp(), 7000)),
                421,
                "{host}"
            );
        }
        assert_eq!(status(rules.judge(&Method::GET, &headers(&[]), tcp(), 7000)), 421);
        // Two Host headers (or Origins): refused whatever their order, never one judged alone.
        for pair in [["localhost", "attacker.example"], ["attacker.example", "localhost"]] {
            let two = headers(&[(header::HOST, pair[0]), (header::HOST, pair[1])]);
            assert_eq!(status(rules.judge(&Method::GET, &two, tcp(), 7000)), 400, "{pair:?}");
        }
        let origins = headers(&[
            (header::HOST, "localhost"),
            (header::ORIGIN, "http://localhost:7000"),
            (header::ORIGIN, "https://attacker.example"),
        ]);
        assert_eq!(status(rules.judge(&Method::GET, &origins, tcp(), 7000)), 400);
        // The Unix socket: no browser reaches it.
        assert_eq!(status(rules.judge(&Method::GET, &headers(&[]), Some(Transport::Unix), 7000)), 200);
        assert_eq!(
            status(rules.judge(&Method::GET, &headers(&[(header::HOST, "x")]), Some(Transport::Unix), 7000)),
            200
        );
    }

    #[test]
    fn only_the_broker_origin_and_configured_origins_pass() {
        let rules = RequestRules { allowed_hosts: vec![], allowed_origins: vec!["https://ok.example".into()] };
        let judge = |origin: &str| {
            status(rules.judge(
                &Method::GET,
                &headers(&[(header::HOST, "localhost"), (header::ORIGIN, origin)]),
                tcp(),
                7000,
            ))
        };
        assert_eq!(judge("http://localhost:7000"), 200);
        assert_eq!(judge("http://127.0.0.1:7000"), 200);
        assert_eq!(judge("https://ok.example/"), 200);
        assert_eq!(judge("http://localhost:7001"), 403);
        assert_eq!(judge("https://evil.example"), 403);
        assert_eq!(judge("null"), 403);
    }

    #[test]
    fn bodies_must_be_json() {
        let rules = RequestRules::default();
        let judge = |method: Method, pairs: &[(header::HeaderName, &str)]| {
            status(rules.judge(&method, &headers(pairs), Some(Transport::Unix), 7000))
        };
        use header::{CONTENT_LENGTH, CONTENT_TYPE};
        assert_eq!(judge(Method::POST, &[(CONTENT_TYPE, "application/json"), (CONTENT_LENGTH, "2")]), 200);
        assert_eq!(
            judge(Method::POST, &[(CONTENT_TYPE, "application/json; charset=utf-8"), (CONTENT_LENGTH, "2")]),
            200
        );
        assert_eq!(judge(Method::POST, &[(CONTENT_TYPE, "Application/A2A+JSON"), (CONTENT_LENGTH, "2")]), 200);
        assert_eq!(judge(Method::POST, &[(CONTENT_LENGTH, "0")]), 200);
        assert_eq!(judge(Method::POST, &[]), 200);
        assert_eq!(judge(Method::POST, &[(CONTENT_TYPE, "text/plain"), (CONTENT_LENGTH, "2")]), 415);
        assert_eq!(judge(Method::PUT, &[(CONTENT_LENGTH, "2")]), 415);
        assert_eq!(judge(Method::PATCH, &[(CONTENT_TYPE, "application/x-www-form-urlencoded")]), 415);
        assert_eq!(judge(Method::POST, &[(CONTENT_TYPE, "application/jsonx"), (CONTENT_LENGTH, "2")]), 415);
        assert_eq!(judge(Method::GET, &[(CONTENT_TYPE, "text/plain")]), 200);
    }
}
