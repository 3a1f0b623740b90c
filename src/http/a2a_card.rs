//! `GET /.well-known/agent-card.json`: the A2A v1.0 agent card of one agent.
//!
//! The card names the JSON-RPC endpoint where this same agent is reached: `POST /` on the
//! agent's own port, or `POST /agents/{agent}/` on the broker when the card was read there; and
//! the HTTP+JSON binding's base URL, `/v1` below either.
//! The Synapse card (`/.well-known/agent.json`, seed 003) stays as it is, and is served here too.

use super::AppState;
use super::error::ApiError;
use super::extract::{FixedAgent, Scope};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use sha2::Digest;

/// How long a client may keep a card without asking again (a card changes only when its agent
/// registers again, renamed or with another role).
pub const CARD_MAX_AGE_SECONDS: u64 = 60;

/// A card with its caching headers (A2A v1.0 §8.6): `Cache-Control` with `max-age`, a strong
/// `ETag` (digest of the body), `Last-Modified` (the agent's registration); `304 Not Modified`
/// without a body when `If-None-Match` names the ETag, or, without that header,
/// `If-Modified-Since` is not older than the registration.
fn cached(request: &HeaderMap, card: &Value, modified_ms: u64) -> Response {
    let body = card.to_string();
    let digest = crate::secret::to_hex(&sha2::Sha256::digest(body.as_bytes()));
    let etag = format!("\"{}\"", &digest[..32]);
    // HTTP dates have whole seconds.
    let modified = std::time::UNIX_EPOCH + std::time::Duration::from_secs(modified_ms / 1000);
    let not_modified = match request.get(header::IF_NONE_MATCH).and_then(|value| value.to_str().ok()) {
        Some(tags) => tags.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag),
        None => request
            .get(header::IF_MODIFIED_SINCE)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| httpdate::parse_http_date(text).ok())
            .is_some_and(|since| since >= modified),
    };
    let mut response =
        if not_modified { StatusCode::NOT_MODIFIED.into_response() } else { Json(card.clone()).into_response() };
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(modified)) {
        headers.insert(header::LAST_MODIFIED, value);
    }
    if let Ok(value) = HeaderValue::from_str(&format!("public, max-age={CARD_MAX_AGE_SECONDS}")) {
        headers.insert(header::CACHE_CONTROL, value);
    }
    response
}

/// The A2A protocol version of the JSON-RPC interface the card announces.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The card of `record`, with its JSON-RPC endpoint at `url`.
pub fn card_json(record: &crate::store::AgentRecord, url: &str, auth: bool) -> Value {
    let role = record.role.as_ref().map(|role| format!(" ({role})")).unwrap_or_default();
    json!({
        "name": record.name.clone().unwrap_or_else(|| record.agent_id.clone()),
        "description": format!(
            "{} agent managed by Synapse{role}: messages are written into its CLI, and its reply completes the task",
            record.agent_type
        ),
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION},
            {
                "url": format!("{}{}", url.trim_end_matches('/'), super::jsonrpc::http_json::BASE_PATH),
                "protocolBinding": "HTTP+JSON",
                "protocolVersion": PROTOCOL_VERSION,
            },
        ],
        "version": crate::broker::VERSION,
        // With authentication on, an authenticated client may read more (GetExtendedAgentCard).
        "capabilities": {"streaming": true, "pushNotifications": true, "extendedAgentCard": auth},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [
            {
                "id": "chat",
                "name": "Chat",
                "description": "Send a message to the agent's CLI; the agent's reply is the task's artifact",
                "tags": ["chat", record.agent_type.as_str()],
                "examples": ["Review src/main.rs and list the bugs you find"],
            },
        ],
    })
}

pub async fn agent_card(
    State(state): State<AppState>,
    Scope(agent): Scope,
    fixed: Option<Extension<FixedAgent>>,
    request: HeaderMap,
) -> Result<Response, ApiError> {
    let agent = super::extract::agent_id(&state, &agent)?;
    let record = state
        .store
        .read(|view| view.agent(&agent))?
        .ok_or_else(|| ApiError::not_found(format!("Agent '{agent}' is not registered")))?;
    let url = card_url(&state, &record, fixed.is_some());
    Ok(cached(&request, &public_card(&state, &record, &url), record.registered_ms))
}

/// The JSON-RPC URL a card read on the agent's port (`own_port`) or on the broker names.
pub fn card_url(state: &AppState, record: &crate::store::AgentRecord, own_port: bool) -> String {
    if own_port {
        format!("http://127.0.0.1:{}/", record.port)
    } else {
        format!(
            "http://127.0.0.1:{}/agents/{}/",
            state.port.load(std::sync::atomic::Ordering::Relaxed),
            record.agent_id
        )
    }
}

/// The card anyone may read: with authentication on, it says how to authenticate (an API key in
/// `X-API-Key`, or the same key as a bearer token) and that an extended card exists.
pub fn public_card(state: &AppState, record: &crate::store::AgentRecord, url: &str) -> Value {
    let auth = state.auth.enabled;
    let mut card = card_json(record, url, auth);
    if auth {
        card["securitySchemes"] = json!({
            "apiKey": {"apiKeySecurityScheme": {"location": "header", "name": "X-API-Key",
                "description": "one of the broker's SYNAPSE_API_KEYS"}},
            "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer",
                "description": "the same key as a bearer token"}},
        });
        card["securityRequirements"] =
            json!([{"schemes": {"apiKey": {"list": []}}}, {"schemes": {"bearer": {"list": []}}}]);
    }
    card
}

/// The extended card (GetExtendedAgentCard), for an authenticated client when authentication is
/// on: the public card plus what only a trusted client should read, as the Synapse extension's
/// params (the agent's id, type, working directory and Unix socket, and what it supports).
pub fn extended_card(state: &AppState, record: &crate::store::AgentRecord, url: &str) -> Value {
    let mut card = public_card(state, record, url);
    card["capabilities"]["extensions"] = json!([{
        "uri": SYNAPSE_EXTENSION_URI,
        "description": "A Synapse agent: a CLI in a PTY that a broker writes messages into",
        "required": false,
        "params": {
            "agentId": record.agent_id,
            "agentType": record.agent_type,
            "workingDir": record.working_dir,
            "socket": state.paths.agent_socket(&record.agent_id).display().to_string(),
            "priorityInterrupt": true,
        },
    }]);
    card
}

/// The URI naming the Synapse extension of an extended card.
pub const SYNAPSE_EXTENSION_URI: &str = "urn:synapse:agent:v1";

/// `GET /.well-known/agent.json`: the Synapse card of seed 003 (kept as it was).
pub async fn synapse_card(
    State(state): State<AppState>,
    Scope(agent): Scope,
    request: HeaderMap,
) -> Result<Response, ApiError> {
    let agent = super::extract::agent_id(&state, &agent)?;
    let record = state
        .store
        .read(|view| view.agent(&agent))?
        .ok_or_else(|| ApiError::not_found(format!("Agent '{agent}' is not registered")))?;
    let card = json!({
        "name": record.name.clone().unwrap_or_else(|| record.agent_id.clone()),
        "description": format!("{} agent managed by Synapse{}", record.agent_type, record.role.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()),
        "url": format!("http://127.0.0.1:{}", record.port),
        "version": crate::broker::VERSION,
        // It streams (message/stream, SubscribeToTask): the card says so.
        "capabilities": {"streaming": true, "pushNotifications": true},
        "defaultInputModes": ["text"],
        "defaultOutputModes": ["text"],
        "skills": [
            {"id": "chat", "name": "Chat", "description": "Send a message to the agent's CLI"},
            {"id": "interrupt", "name": "Interrupt", "description": "Priority 5 interrupts the CLI before writing"},
        ],
        "extensions": {"synapse": {
            "agent_id": record.agent_id,
            "agent_type": record.agent_type,
            "uds_path": state.paths.agent_socket(&record.agent_id).display().to_string(),
            "priority_interrupt": true,
            "reply_to": true,
        }},
    });
    Ok(cached(&request, &card, record.registered_ms))
}
