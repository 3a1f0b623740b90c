//! The HTTP+JSON (REST) binding of A2A v1.0, under `/v1` of an agent's endpoints (its port, or
//! `/agents/{agent}/v1` on the broker; the agent card names that URL). Bare `/tasks/...` is taken
//! by the legacy Synapse endpoints, so the binding lives below its own base path, where the
//! spec's paths are relative to the interface URL.
//!
//! Same behaviour as JSON-RPC by construction: each route reads its request into the params the
//! JSON-RPC method takes and calls that method ([`super::methods`], [`super::stream`]); only the
//! envelope differs. Answers are the bare v1.0 objects; streams send each `StreamResponse` as an
//! SSE `data` line; errors are a `google.rpc.Status` (`{"error": {"code": <HTTP status>,
//! "status": ..., "message": ..., "details": [ErrorInfo]}}`) with the status the spec gives each
//! A2A error.

use super::methods::{cancel_task, get_task, list_tasks_apart, parse_send, send, submit_send};
use super::stream::{stream_task, task_snapshot};
use super::{
    INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RpcError, VERSION_NOT_SUPPORTED, Version,
    agent_id_of, http_status_of, status_body, version_of,
};
use crate::http::AppState;
use crate::http::extract::{FixedAgent, Path, Scope};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{Map, Value, json};

/// The base path of the binding, relative to an agent's endpoints.
pub const BASE_PATH: &str = "/v1";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/message:send", post(message_send))
        .route("/message:stream", post(message_stream))
        .route("/tasks", get(tasks_list))
        .route("/tasks/{task}", get(task_get_or_subscribe).post(task_action))
        .route("/tasks/{task}/pushNotificationConfigs", get(push_read).post(push_create))
        .route("/tasks/{task}/pushNotificationConfigs/{config}", get(push_read).delete(push_delete))
        .route("/extendedAgentCard", get(extended_card))
        .fallback(unknown)
}

fn error_response(error: &RpcError) -> Response {
    (http_status_of(error).0, Json(status_body(error))).into_response()
}

fn answer(result: Result<Value, RpcError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(error) => error_response(&error),
    }
}

/// This binding speaks v1.0 only: a client asking for another version is told so.
fn check_version(headers: &HeaderMap) -> Result<(), RpcError> {
    match version_of(headers) {
        Ok(Version::V10) => Ok(()),
        // No header: a REST client of this binding speaks the version of the card it read.
        Ok(Version::V03) if !headers.contains_key(super::VERSION_HEADER) => Ok(()),
        Ok(Version::V03) => Err(RpcError::new(
            VERSION_NOT_SUPPORTED,
            "the HTTP+JSON binding is served in A2A 1.0 only; use JSON-RPC for 0.3",
        )),
        Err(error) => Err(error),
    }
}

fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, RpcError> {
    let bytes = body.map_err(|rejection| {
        let message = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            crate::http::body_too_large()
        } else {
            rejection.body_text()
        };
        RpcError::new(INVALID_REQUEST, message)
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|error| RpcError::new(PARSE_ERROR, format!("the body is not JSON: {error}")))?;
    if !value.is_object() {
        return Err(RpcError::new(INVALID_REQUEST, "the body must be a JSON object"));
    }
    Ok(value)
}

/// The query of a list or get as the JSON-RPC params: counts as numbers, flags as booleans,
/// the rest as text (a malformed count is refused by the method, as over JSON-RPC).
fn query_params(query: Option<&str>) -> Result<Map<String, Value>, RpcError> {
    let pairs: Vec<(String, String)> = crate::http::extract::parse_query(query)
        .map_err(|error| RpcError::new(INVALID_PARAMS, error.message().to_string()))?;
    Ok(pairs
        .into_iter()
        .map(|(key, text)| {
            let value = match key.as_str() {
                "pageSize" | "historyLength" => text.parse::<u64>().map(Value::from).unwrap_or(Value::String(text)),
                "includeArtifacts" => match text.as_str() {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    _ => Value::String(text),
                },
                _ => Value::String(text),
            };
            (key, value)
        })
        .collect())
}

/// `POST /v1/message:send`: a `SendMessageRequest`; answers a `SendMessageResponse`.
async fn message_send(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let agent = agent_id_of(&state, agent);
    answer(
        async {
            check_version(&headers)?;
            send(&state, &agent, Version::V10, &json_body(body)?).await
        }
        .await,
    )
}

/// `POST /v1/message:stream`: the task, then its updates, as SSE.
async fn message_stream(
    State(state): State<AppState>,
    Scope(agent): Scope,
    fixed: Option<Extension<FixedAgent>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let served_by = fixed.map(|Extension(FixedAgent(agent))| agent);
    let agent = agent_id_of(&state, agent);
    let submitted = async {
        check_version(&headers)?;
        let request = parse_send(&state, &agent, Version::V10, &json_body(body)?)?;
        submit_send(&state, &agent, Version::V10, &request).await
    }
    .await;
    match submitted {
        Ok((task, seq)) => stream_task(state, Version::V10, None, task, seq, true, served_by),
        Err(error) => error_response(&error),
    }
}

/// `GET /v1/tasks`: `ListTasks`, its request in the query.
async fn tasks_list(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let agent = agent_id_of(&state, agent);
    let listed = match check_version(&headers).and_then(|()| query_params(query.as_deref())) {
        Ok(params) => list_tasks_apart(&state, &agent, Version::V10, &Value::Object(params)).await,
        Err(error) => Err(error),
    };
    answer(listed)
}

/// `GET /v1/tasks/{id}` (`GetTask`) and `GET /v1/tasks/{id}:subscribe` (`SubscribeToTask`).
async fn task_get_or_subscribe(
    State(state): State<AppState>,
    Scope(agent): Scope,
    fixed: Option<Extension<FixedAgent>>,
    Path(path): Path<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let (task, agent) = match task_route(&state, agent, &path, &headers) {
        Ok(route) => route,
        Err(error) => return error_response(&error),
    };
    match task.split_once(':') {
        None => answer((|| {
            let mut params = query_params(query.as_deref())?;
            params.insert("id".into(), Value::String(task));
            get_task(&state, &agent, Version::V10, &Value::Object(params))
        })()),
        Some((id, "subscribe")) => subscribe(state, agent, id, fixed),
        Some((_, action)) => error_response(&not_a_method(&Method::GET, action)),
    }
}

/// `POST /v1/tasks/{id}:cancel` (`CancelTask`) and `POST /v1/tasks/{id}:subscribe`.
async fn task_action(
    State(state): State<AppState>,
    Scope(agent): Scope,
    fixed: Option<Extension<FixedAgent>>,
    caller: crate::http::caller::Caller,
    Path(path): Path<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let (task, agent) = match task_route(&state, agent, &path, &headers) {
        Ok(route) => route,
        Err(error) => return error_response(&error),
    };
    match task.split_once(':') {
        Some((id, "cancel")) => {
            answer(cancel_task(&state, &agent, caller.actor(), Version::V10, &json!({"id": id})).await)
        }
        Some((id, "subscribe")) => subscribe(state, agent, id, fixed),
        Some((_, action)) => error_response(&not_a_method(&Method::POST, action)),
        None => error_response(&not_a_method(&Method::POST, "")),
    }
}

/// The `{task}` segment (`<id>` or `<id>:<method>`) and the agent of a task route, once the
/// version is one this binding serves. By name: on the broker the path also holds `{agent}`.
fn task_route(
    state: &AppState,
    agent: String,
    path: &std::collections::HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<(String, String), RpcError> {
    check_version(headers)?;
    Ok((path.get("task").cloned().unwrap_or_default(), agent_id_of(state, agent)))
}

fn subscribe(state: AppState, agent: String, id: &str, fixed: Option<Extension<FixedAgent>>) -> Response {
    let served_by = fixed.map(|Extension(FixedAgent(agent))| agent);
    match task_snapshot(&state, &agent, id) {
        Ok((task, cursor)) => {
            let stop_at_input = task.state != crate::event::TaskState::InputRequired;
            stream_task(state, Version::V10, None, task, cursor, stop_at_input, served_by)
        }
        Err(error) => error_response(&error),
    }
}

fn not_a_method(method: &Method, action: &str) -> RpcError {
    RpcError::new(METHOD_NOT_FOUND, format!("{method} /v1/tasks/{{id}}:{action} is not a method of A2A 1.0"))
}

/// The params of a push config route: the task (and config) of its path, over `extra`.
fn push_params(
    state: &AppState,
    agent: String,
    path: &std::collections::HashMap<String, String>,
    headers: &HeaderMap,
    mut extra: Map<String, Value>,
) -> Result<(String, Value), RpcError> {
    let (task, agent) = task_route(state, agent, path, headers)?;
    extra.insert("taskId".into(), Value::String(task));
    if let Some(config) = path.get("config") {
        extra.insert("id".into(), Value::String(config.clone()));
    }
    Ok((agent, Value::Object(extra)))
}

/// `POST /v1/tasks/{id}/pushNotificationConfigs`: `CreateTaskPushNotificationConfig`.
async fn push_create(
    State(state): State<AppState>,
    Scope(agent): Scope,
    caller: crate::http::caller::Caller,
    Path(path): Path<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(
        async {
            let Value::Object(body) = json_body(body)? else {
                return Err(RpcError::new(INVALID_REQUEST, "the body must be a JSON object"));
            };
            // The path names the task; a body's own `taskId` may not name another.
            if let Some(Value::String(named)) = body.get("taskId")
                && path.get("task").is_some_and(|task| task != named)
            {
                return Err(RpcError::params("the body's 'taskId' is not the task of the path"));
            }
            let (agent, params) = push_params(&state, agent, &path, &headers, body)?;
            super::push::create(&state, &agent, &caller.actor(), Version::V10, &params).await
        }
        .await,
    )
}

/// `GET /v1/tasks/{id}/pushNotificationConfigs` (`ListTaskPushNotificationConfigs`) and
/// `GET /v1/tasks/{id}/pushNotificationConfigs/{configId}` (`GetTaskPushNotificationConfig`).
async fn push_read(
    State(state): State<AppState>,
    Scope(agent): Scope,
    caller: crate::http::caller::Caller,
    Path(path): Path<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let (agent, params) = push_params(&state, agent, &path, &headers, Map::new())?;
            match path.contains_key("config") {
                true => super::push::get(&state, &agent, &caller.actor(), Version::V10, &params).await,
                false => super::push::list(&state, &agent, &caller.actor(), Version::V10, &params).await,
            }
        }
        .await,
    )
}

/// `DELETE /v1/tasks/{id}/pushNotificationConfigs/{configId}`: answers `{}` (an empty message).
async fn push_delete(
    State(state): State<AppState>,
    Scope(agent): Scope,
    caller: crate::http::caller::Caller,
    Path(path): Path<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let (agent, params) = push_params(&state, agent, &path, &headers, Map::new())?;
            super::push::delete(&state, &agent, &caller.actor(), Version::V10, &params).await?;
            Ok(json!({}))
        }
        .await,
    )
}

/// `GET /v1/extendedAgentCard`.
async fn extended_card(
    State(state): State<AppState>,
    Scope(agent): Scope,
    fixed: Option<Extension<FixedAgent>>,
) -> Response {
    let agent = agent_id_of(&state, agent);
    answer(super::extended_card(&state, &agent, fixed.is_some()))
}

async fn unknown(method: Method) -> Response {
    error_response(&RpcError::new(
        METHOD_NOT_FOUND,
        format!("{method} is not a route of the A2A 1.0 HTTP+JSON binding"),
    ))
}
