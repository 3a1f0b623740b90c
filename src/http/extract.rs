//! What handlers read from a request besides its state: the JSON body and the query (with clear
//! 4xx errors), the agent a path is about ([`Scope`]), an agent's secret and the idempotency key
//! of a send, and the check that a request acting as an agent carries its secret.
//!
//! Invariant: a body or query that does not parse is a 4xx [`ApiError`] naming the cause, never
//! a 500; the secret is compared in constant time (`crate::secret`).

use super::HttpState;
use super::error::ApiError;
use crate::api::{IDEMPOTENCY_KEY_HEADER, SECRET_HEADER};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Query};
use axum::http::{HeaderMap, StatusCode, request::Parts};
use serde::Deserialize;
use std::collections::HashMap;

/// Parses a JSON body with clear 4xx errors (413 too large, 400 not UTF-8 / not JSON / unknown
/// fields).
pub fn parse_body<T: for<'de> Deserialize<'de>>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, super::body_too_large())
        } else {
            ApiError::new(status, format!("cannot read the request body: {}", rejection.body_text()))
        }
    })?;
    if bytes.is_empty() {
        return Err(ApiError::bad("the request body is empty: a JSON object is expected"));
    }
    if std::str::from_utf8(&bytes).is_err() {
        return Err(ApiError::bad("the request body is not valid UTF-8"));
    }
    serde_json::from_slice(&bytes).map_err(|error| ApiError::bad(format!("invalid JSON body: {error}")))
}

pub fn parse_query<T: for<'de> Deserialize<'de>>(query: Option<&str>) -> Result<T, ApiError> {
    let query = query.unwrap_or("");
    serde_urlencoded_parse(query).map_err(|error| ApiError::bad(format!("invalid query: {error}")))
}

fn serde_urlencoded_parse<T: for<'de> Deserialize<'de>>(query: &str) -> Result<T, String> {
    axum::extract::Query::<T>::try_from_uri(&format!("/?{query}").parse().map_err(|_| "malformed query".to_string())?)
        .map(|Query(value)| value)
        .map_err(|rejection| rejection.body_text())
}

/// axum's `Path` with a JSON 400 for a segment it cannot take (not UTF-8 once decoded, say),
/// where axum's own rejection is plain text.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| ApiError::bad(rejection.body_text()))
    }
}

/// The agent a request is about: fixed (per-agent server) or from the `{agent}` path segment.
#[derive(Clone)]
pub struct FixedAgent(pub String);

pub struct Scope(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Scope {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(FixedAgent(agent)) = parts.extensions.get::<FixedAgent>() {
            return Ok(Scope(agent.clone()));
        }
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state).await?;
        params.get("agent").cloned().map(Scope).ok_or_else(|| ApiError::bad("no agent in the path"))
    }
}

pub fn secret_of(headers: &HeaderMap) -> Option<String> {
    headers.get(SECRET_HEADER).and_then(|value| value.to_str().ok()).map(str::to_string)
}

/// Checks the agent's secret header; used for requests that change an agent's own state.
pub fn authorize_agent(state: &HttpState, agent_id: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let agent = state
        .store
        .read(|view| view.agent(agent_id))?
        .ok_or_else(|| ApiError::not_found(format!("Agent '{agent_id}' is not registered")))?;
    match secret_of(headers) {
        Some(secret) if crate::secret::secret_matches(&secret, &agent.secret_hash) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::FORBIDDEN, format!("the secret does not match agent '{agent_id}'"))),
        None => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("this request acts as agent '{agent_id}' and needs its secret (header {SECRET_HEADER})"),
        )),
    }
}

/// The `Idempotency-Key` header of a send, if any.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get(IDEMPOTENCY_KEY_HEADER) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|key| Some(key.trim().to_string()))
            .map_err(|_| ApiError::bad("the Idempotency-Key header must be visible ASCII")),
    }
}

/// The id of the agent a request names by id, name, type-port or type, the same way a send's
/// target is resolved (and as ambiguous when several agents share the type). A reference no live
/// agent matches is kept as it is: a departed agent's id still names its records, and the
/// command that needs a live agent says so itself.
pub fn agent_id(state: &super::AppState, reference: &str) -> Result<String, super::ApiError> {
    ReadScope::of(state, reference).map(|scope| scope.agent_id)
}

/// The agent a read under `/agents/{agent}/...` is about, found as a send's target is (by id
/// first, from its key, without reading every agent), and whether it is registered. A reference
/// no registered agent matches is kept: a departed agent's tasks and reply targets stay, for it
/// to take back. The caller answers 404 when such an agent has nothing to show.
pub struct ReadScope {
    pub agent_id: String,
    pub registered: bool,
}

impl ReadScope {
    pub fn of(state: &super::AppState, reference: &str) -> Result<ReadScope, ApiError> {
        if state.store.read(|view| view.agent(reference))?.is_some() {
            return Ok(ReadScope { agent_id: reference.to_string(), registered: true });
        }
        let agents = state.store.read(|view| view.agents())?;
        match crate::broker::command::resolve_target(&agents, reference) {
            Ok(agent) => Ok(ReadScope { agent_id: agent.agent_id, registered: true }),
            Err(crate::broker::command::CommandError::NotFound { .. }) => {
                Ok(ReadScope { agent_id: reference.to_string(), registered: false })
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The 404 of a reference that names no registered agent and nothing it left behind.
    pub fn unknown(&self) -> ApiError {
        ApiError::not_found(format!("Agent '{}' is not registered", self.agent_id))
    }
}

/// [`agent_id`] of an optional filter (`?agent=`).
pub fn agent_filter(state: &super::AppState, reference: Option<String>) -> Result<Option<String>, super::ApiError> {
    reference.map(|reference| agent_id(state, &reference)).transpose()
}
