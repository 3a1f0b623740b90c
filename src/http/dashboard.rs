//! The live web dashboard (issue 17): the page at `/`, its script and style sheet (embedded in
//! the binary, no build step), the snapshot it starts from, the event log paged backwards, and
//! the short-lived stream tokens that let a browser's `EventSource` (which cannot set headers)
//! open `/events` when authentication is on.
//!
//! What must stay true:
//! - The page runs no inline script and loads nothing from elsewhere: every asset is served
//!   here under a strict Content-Security-Policy, and the script builds the DOM with
//!   `textContent` only (message text is hostile).
//! - The page has no rights of its own: its reads and its actions (send, cancel) go through the
//!   same routes and rules as the CLI's (Host/Origin guard, API key, who is the user). With auth
//!   on, its page key passes authentication as a key would (`auth::check`), so the page opened
//!   from `synapse dashboard`'s address never holds the API key.
//! - A stream token opens `/events` only, once, within [`STREAM_TOKEN_LIFETIME`] of being
//!   issued; it lives in the broker's memory (a restart forgets it, the page asks again).
//! - The page is the user only with this start's page key ([`Page`]), which it gets from the
//!   address `synapse dashboard` prints: being at the broker's origin is not enough, since
//!   whatever served that origin before the broker started (another user's server on the port)
//!   may have left its script there.

use super::AppState;
use super::error::{ApiError, ApiResult, answer};
use super::extract::parse_query;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// The page may run only its own script and style sheet, talk only to its own origin, load no
/// image, and be framed by no one.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// How long a stream token may wait before it opens `/events`.
pub const STREAM_TOKEN_LIFETIME: Duration = Duration::from_secs(60);

/// Most unspent stream tokens at once (each page opens one stream at a time).
const MAX_STREAM_TOKENS: usize = 1024;

/// Most events one page of `/dashboard/events` answers.
const MAX_EVENTS_PAGE: usize = 5_000;

/// The header by which the page shows its key.
pub const PAGE_KEY_HEADER: &str = "x-synapse-page-key";

/// The page's key and the page that loads its assets, made anew at every broker start.
///
/// The key is what makes a request from the broker's own origin the user's browser rather than
/// any script that came to run at that origin. `synapse dashboard` asks for it over the Unix
/// socket (`GET /dashboard/page-key`, the user's only, refused to any request carrying an
/// `Origin`) and puts it in the address it prints (`/?key=`); the page sends it as
/// [`PAGE_KEY_HEADER`]. A new key at every start: whatever served the port while the broker was
/// stopped, and so may have seen a key (a page sends its key to whoever answers at its origin),
/// saw one that no longer works.
///
/// The page's script and style sheet are loaded under a name of this start
/// (`/dashboard/app.js?v=`): what another server at the port left in the browser's cache under
/// the plain names never runs in the broker's page.
#[derive(Debug)]
pub struct Page {
    key: String,
    index_html: String,
}

impl Default for Page {
    fn default() -> Page {
        let version = &crate::secret::random_token()[..16];
        let index_html = INDEX_HTML
            .replace("\"/dashboard/app.js\"", &format!("\"/dashboard/app.js?v={version}\""))
            .replace("\"/dashboard/app.css\"", &format!("\"/dashboard/app.css?v={version}\""));
        Page { key: crate::secret::random_token(), index_html }
    }
}

impl Page {
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Do `headers` carry this start's key? Constant time in the key's content.
    pub fn key_is_shown_in(&self, headers: &axum::http::HeaderMap) -> bool {
        headers
            .get(PAGE_KEY_HEADER)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|shown| crate::secret::constant_time_eq(shown.trim().as_bytes(), self.key.as_bytes()))
    }
}

/// Tokens handed out for `/events?token=`: each opens one stream, within its lifetime. Guarded
/// by a mutex: issued and spent a few times per page load, never on a hot path.
#[derive(Debug, Default)]
pub struct StreamTokens {
    issued: Mutex<HashMap<String, Instant>>,
}

impl StreamTokens {
    /// A new random token, valid for [`STREAM_TOKEN_LIFETIME`]; None while
    /// [`MAX_STREAM_TOKENS`] unspent ones are outstanding (a caller asking in a loop cannot
    /// grow the broker's memory).
    pub fn issue(&self) -> Option<String> {
        let token = crate::secret::random_token();
        let now = Instant::now();
        let mut issued = self.issued.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Expired tokens go whenever a new one comes: the map stays as small as the tokens in use.
        issued.retain(|_, expires| *expires > now);
        if issued.len() >= MAX_STREAM_TOKENS {
            return None;
        }
        issued.insert(token.clone(), now + STREAM_TOKEN_LIFETIME);
        Some(token)
    }

    /// Spends `token`: true once, if it was issued and has not expired.
    pub fn redeem(&self, token: &str) -> bool {
        let mut issued = self.issued.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Looked up by the token itself: a guess that is not in the map learns nothing from time
        // beyond what a hash map lookup of random 256-bit strings can tell.
        match issued.remove(token) {
            Some(expires) => expires > Instant::now(),
            None => false,
        }
    }
}

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/", get(index))
        .route("/dashboard/app.js", get(script))
        .route("/dashboard/app.css", get(style))
        .route("/dashboard/state", get(snapshot))
        .route("/dashboard/events", get(events_page))
        .route("/dashboard/stream-token", post(stream_token))
        .route("/dashboard/page-key", get(page_key))
}

/// Paths the page itself needs before it has a key: the page and its assets.
pub fn is_asset(path: &str) -> bool {
    matches!(path, "/" | "/dashboard/app.js" | "/dashboard/app.css")
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    asset_owned(content_type, body.to_string())
}

fn asset_owned(content_type: &'static str, body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn index(State(state): State<AppState>) -> Response {
    asset_owned("text/html; charset=utf-8", state.auth.page.index_html.clone())
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

/// One agent as the dashboard's cards show it: the `/agents` view plus since when it has its
/// status.
#[derive(Serialize)]
struct DashboardAgent {
    #[serde(flatten)]
    agent: crate::api::AgentView,
    status_since_ms: u64,
}

#[derive(Serialize)]
struct Snapshot {
    /// The log's head when the snapshot was read: the page follows `/events` from here.
    head: u64,
    agents: Vec<DashboardAgent>,
    /// When the log's first event was written (0: the log is empty): what tells this log from
    /// another one answering at the same port later (a fresh home's broker).
    log_started_ms: u64,
    /// Whether the page must authenticate its stream with a token.
    auth_enabled: bool,
    /// Whether the page may act as the user (sends and cancels): it showed its key (or the API
    /// key). A page opened without its key reads only.
    as_user: bool,
}

/// `GET /dashboard/state`: what the page starts from, and the head to follow `/events` from.
/// The head is taken before the read: the stream that follows misses nothing, and an event it
/// repeats from the snapshot changes nothing on the page (each sets a value, none adds one).
async fn snapshot(
    State(state): State<AppState>,
    caller: super::caller::Caller,
    headers: axum::http::HeaderMap,
) -> ApiResult {
    let head = *state.head.borrow();
    let agents = super::broker_api::agent_views(&state)?
        .into_iter()
        .map(|(record, agent)| DashboardAgent { agent, status_since_ms: record.status_ms })
        .collect();
    // The page's own GET carries no Origin (a browser adds it to its posts), so the key shown is
    // what tells: its sends and cancels are judged again, with the Origin, when they come.
    let as_user = caller.is_user() || state.auth.page.key_is_shown_in(&headers);
    let log_started_ms = state.store.read_after(0, 1)?.first().map_or(0, |first| first.time_ms);
    answer(&Snapshot { head, agents, log_started_ms, auth_enabled: state.auth.enabled, as_user })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsPageQuery {
    /// Events before this sequence number (default: the newest).
    #[serde(default)]
    before: Option<u64>,
    /// Events after this sequence number instead, oldest first (the page after one shown).
    #[serde(default)]
    after: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Serialize)]
struct EventsPage {
    head: u64,
    /// Oldest first, each an envelope as `synapse events --json` prints it.
    events: Vec<serde_json::Value>,
}

/// The texts one page of `/dashboard/events` holds at most (and at least one event, however
/// long): pages of 16 MB messages made answers of gigabytes, built on the thread that serves
/// every command.
const EVENTS_PAGE_TEXT_BYTES: usize = 4 << 20;

/// `GET /dashboard/events?before=N&limit=L`: the `limit` events just before `before` (fewer when
/// their texts pass [`EVENTS_PAGE_TEXT_BYTES`]), so the page can walk the log backwards a page
/// at a time (the stream only goes forwards). `after=N` instead: the `limit` events just after
/// `N`, as bounded, so that "newer" goes on where a page ends, however few events it held. Read
/// on a blocking thread.
async fn events_page(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let query: EventsPageQuery = parse_query(uri.query())?;
    let limit = query.limit.unwrap_or(200);
    if limit == 0 || limit > MAX_EVENTS_PAGE {
        return Err(ApiError::bad(format!("limit must be between 1 and {MAX_EVENTS_PAGE}")));
    }
    let head = state.store.head()?;
    let events = match (query.before, query.after) {
        (Some(_), Some(_)) => return Err(ApiError::bad("give before or after, not both")),
        (before, None) => {
            let before = before.unwrap_or(head.saturating_add(1)).min(head.saturating_add(1));
            let first = before.saturating_sub(limit as u64).max(1);
            let mut events = super::long_read(&state, move |store| {
                Ok(store.read_back_within(first, before, EVENTS_PAGE_TEXT_BYTES)?)
            })
            .await?;
            events.reverse();
            events
        }
        (None, Some(after)) => {
            super::long_read(&state, move |store| Ok(store.read_after_within(after, limit, EVENTS_PAGE_TEXT_BYTES)?))
                .await?
        }
    };
    answer(&EventsPage { head, events: events.iter().map(|envelope| envelope.to_json()).collect() })
}

#[derive(Serialize)]
struct StreamToken {
    token: String,
    expires_in_ms: u64,
}

/// `POST /dashboard/stream-token`: a token for one `/events?token=...` stream. Authenticated
/// like every route (the API key or the page key when auth is on), so the token proves a key
/// was shown.
async fn stream_token(State(state): State<AppState>) -> ApiResult {
    let token = state.auth.stream_tokens.issue().ok_or_else(|| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{MAX_STREAM_TOKENS} stream tokens are waiting to be used: open a stream with one, or wait a minute"
            ),
        )
    })?;
    answer(&StreamToken { token, expires_in_ms: STREAM_TOKEN_LIFETIME.as_millis() as u64 })
}

/// `GET /dashboard/page-key`: the page key, for `synapse dashboard` to put in the address it
/// prints. The user's only, and never to a web page (see [`super::caller::TheUser`]).
async fn page_key(State(state): State<AppState>, _user: super::caller::TheUser) -> ApiResult {
    answer(&crate::api::PageKey { key: state.auth.page.key().to_string() })
}

/// A refusal for a stream token that is missing its purpose.
pub fn bad_stream_token() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "Invalid stream token: get a new one with POST /dashboard/stream-token (it opens one stream, within 60 s)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_token_opens_one_stream_and_a_guess_none() {
        let tokens = StreamTokens::default();
        let token = tokens.issue().unwrap_or_default();
        assert_eq!(token.len(), 64);
        assert!(!tokens.redeem("0".repeat(64).as_str()));
        assert!(tokens.redeem(&token));
        assert!(!tokens.redeem(&token), "a token is spent by its first stream");
    }

    #[test]
    fn an_expired_stream_token_is_refused() {
        let tokens = StreamTokens::default();
        let token = tokens.issue().unwrap_or_default();
        if let Ok(mut issued) = tokens.issued.lock()
            && let Some(expires) = issued.get_mut(&token)
        {
            *expires = Instant::now() - Duration::from_secs(1);
        }
        assert!(!tokens.redeem(&token));
    }

    #[test]
    fn unspent_tokens_are_bounded_and_spending_one_makes_room() {
        let tokens = StreamTokens::default();
        let issued: Vec<String> = (0..MAX_STREAM_TOKENS).filter_map(|_| tokens.issue()).collect();
        assert_eq!(issued.len(), MAX_STREAM_TOKENS);
        assert!(tokens.issue().is_none());
        assert!(tokens.redeem(&issued[0]));
        assert!(tokens.issue().is_some());
    }

    #[test]
    fn each_start_has_its_own_page_key_and_asset_names_and_only_its_key_passes() {
        let page = Page::default();
        let other = Page::default();
        assert_ne!(page.key(), other.key());
        assert_eq!(page.key().len(), 64);
        assert_ne!(page.index_html, other.index_html, "the asset names differ from start to start");
        assert!(page.index_html.contains("src=\"/dashboard/app.js?v="), "{}", page.index_html);
        assert!(page.index_html.contains("href=\"/dashboard/app.css?v="), "{}", page.index_html);
        let headers = |value: &str| {
            let mut headers = axum::http::HeaderMap::new();
            if let Ok(value) = axum::http::HeaderValue::from_str(value) {
                headers.insert(PAGE_KEY_HEADER, value);
            }
            headers
        };
        assert!(page.key_is_shown_in(&headers(page.key())));
        assert!(!page.key_is_shown_in(&headers(other.key())));
        assert!(!page.key_is_shown_in(&headers(&"0".repeat(64))));
        assert!(!page.key_is_shown_in(&headers("")));
        assert!(!page.key_is_shown_in(&axum::http::HeaderMap::new()));
    }

    #[test]
    fn the_page_allows_no_inline_script_and_no_other_origin() {
        assert!(CONTENT_SECURITY_POLICY.contains("script-src 'self'"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-inline"));
        assert!(!INDEX_HTML.contains("<script>"), "no inline script in the page");
        assert!(!APP_JS.contains("innerHTML"), "the script builds the DOM with textContent only");
    }
}
