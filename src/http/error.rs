//! The one error type of the HTTP layer: a status and an [`api::ErrorBody`].
//!
//! Invariants: every 4xx and 5xx answer of the REST endpoints is built here, so its body is
//! always `{"error": <reason phrase>, "message": ..., "candidates"?: [...]}`; bad input is a
//! 4xx, never a 500 or a panic. The broker's refusals ([`CommandError`]) and storage failures
//! ([`StoreError`]) map to one status each.

use crate::api;
use crate::broker::command::CommandError;
use crate::store::StoreError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

/// An error answer: its status and its body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: api::ErrorBody,
}

/// What a handler answers: JSON, or an [`ApiError`].
pub type ApiResult<T = Answer> = Result<T, ApiError>;

/// A JSON answer, serialized once, straight from a typed value of the [`crate::api`] contract
/// ([`answer`]).
pub struct Answer(Response);

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        self.0
    }
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        let body = api::ErrorBody {
            error: status.canonical_reason().unwrap_or("error").to_string(),
            message: message.into(),
            candidates: None,
        };
        ApiError { status, body }
    }

    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// The same error, naming what an ambiguous reference could mean.
    pub fn with_candidates(mut self, candidates: Vec<String>) -> ApiError {
        self.body.candidates = Some(candidates);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn message(&self) -> &str {
        &self.body.message
    }

    /// The body as JSON text (for an answer written without axum, see `server::refuse`).
    pub fn body_text(&self) -> String {
        self.body_json().to_string()
    }

    /// Through `Value`, as [`answer`]: the keys in the order they always had.
    fn body_json(&self) -> Value {
        serde_json::to_value(&self.body).unwrap_or(Value::Null)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body_json();
        (self.status, Json(body)).into_response()
    }
}

impl From<CommandError> for ApiError {
    fn from(error: CommandError) -> Self {
        let status = match &error {
            CommandError::BadRequest { .. } | CommandError::Ambiguous { .. } => StatusCode::BAD_REQUEST,
            CommandError::NotFound { .. } => StatusCode::NOT_FOUND,
            CommandError::Conflict { .. } => StatusCode::CONFLICT,
            CommandError::Forbidden { .. } => StatusCode::FORBIDDEN,
            CommandError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            CommandError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        let api = ApiError::new(status, error.to_string());
        match error {
            CommandError::Ambiguous { candidates, .. } => api.with_candidates(candidates),
            _ => api,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("the broker cannot read its log: {error}"))
    }
}

/// An answer of the [`crate::api`] contract as JSON, serialized directly (its keys in the type's
/// field order: no detour through `serde_json::Value`, which cost a tenth of the sends per
/// second).
pub fn answer<T: Serialize>(value: &T) -> ApiResult {
    let bytes = serde_json::to_vec(value)
        .map_err(|error| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("cannot write the answer: {error}")))?;
    let content_type = [(axum::http::header::CONTENT_TYPE, "application/json")];
    Ok(Answer((content_type, bytes).into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ambiguous_reference_answers_400_with_its_candidates() {
        let error =
            ApiError::from(CommandError::Ambiguous { message: "Ambiguous".into(), candidates: vec!["a".into()] });
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        let body = serde_json::to_value(&error.body).unwrap();
        assert_eq!(body, serde_json::json!({"error": "Bad Request", "message": "Ambiguous", "candidates": ["a"]}));
    }

    #[test]
    fn an_error_without_candidates_writes_no_candidates_field() {
        let body = serde_json::to_value(&ApiError::not_found("no such endpoint").body).unwrap();
        assert_eq!(body, serde_json::json!({"error": "Not Found", "message": "no such endpoint"}));
    }
}
