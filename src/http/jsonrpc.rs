//! The A2A JSON-RPC 2.0 binding at `POST /` of an agent (and `POST /agents/{agent}/` on the
//! broker): A2A v1.0 (`SendMessage`, `SendStreamingMessage`, `GetTask`, `ListTasks`,
//! `CancelTask`, `SubscribeToTask`) and, when the `A2A-Version` header is absent or 0.3, the
//! 0.3 names and shapes (`message/send`, `message/stream`, `tasks/get`, `tasks/list`,
//! `tasks/cancel`, `tasks/resubscribe`).
//!
//! An A2A message is the same event as `synapse send`: an anonymous send to this agent that
//! expects a reply. The A2A task is the sender's side of that exchange (owner none, peer this
//! agent), so the agent's `synapse reply` completes it and `GetTask` shows the reply artifact.
//! Invariants:
//! - Every answer is a JSON-RPC response (HTTP 200), errors included; bad input never panics.
//! - Streams follow the log (see [`super::subscribe`]): no change is lost or repeated between
//!   the first `task` snapshot and the updates, and every stream ends on broker shutdown.

use super::subscribe::{self, StreamEnd, TaskChange};
use super::{AppState, FixedAgent, MAX_WAIT, Scope};
use crate::broker::command::{Actor, Command, CommandError, Outcome, SendRequest, default_priority};
use crate::broker::tail;
use crate::event::{Artifact, Part, Role, TaskState};
use crate::store::{TaskIndexKind, TaskRecord};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use std::time::Duration;

/// The header naming the A2A protocol version of a request.
pub const VERSION_HEADER: &str = "a2a-version";

/// Tasks per `ListTasks` page when the client names none, and the most it may ask for.
const DEFAULT_PAGE_SIZE: usize = 50;
const MAX_PAGE_SIZE: usize = 100;
/// Longest context id accepted.
const MAX_CONTEXT_ID_CHARS: usize = 256;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
pub const TASK_NOT_FOUND: i64 = -32001;
pub const TASK_NOT_CANCELABLE: i64 = -32002;
pub const PUSH_NOT_SUPPORTED: i64 = -32003;
pub const UNSUPPORTED_OPERATION: i64 = -32004;
pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
pub const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
pub const VERSION_NOT_SUPPORTED: i64 = -32009;

/// The protocol version a request speaks (it decides method names and shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V03,
    V10,
}

/// A JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }
    fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }
    fn task_not_found(id: &str) -> RpcError {
        RpcError::new(TASK_NOT_FOUND, format!("Task {id} not found"))
    }
}

impl From<CommandError> for RpcError {
    fn from(error: CommandError) -> Self {
        let code = match &error {
            CommandError::BadRequest { .. } | CommandError::Ambiguous { .. } | CommandError::TooLarge { .. } => {
                INVALID_PARAMS
            }
            CommandError::NotFound { .. }
            | CommandError::Conflict { .. }
            | CommandError::Forbidden { .. }
            | CommandError::Unavailable { .. } => INTERNAL_ERROR,
        };
        RpcError::new(code, error.to_string())
    }
}

impl From<super::ApiError> for RpcError {
    fn from(error: super::ApiError) -> Self {
        let message = error.body["message"].as_str().unwrap_or("error").to_string();
        let code = if error.status.is_client_error() { INVALID_PARAMS } else { INTERNAL_ERROR };
        RpcError::new(code, message)
    }
}

impl From<crate::store::StoreError> for RpcError {
    fn from(error: crate::store::StoreError) -> Self {
        RpcError::new(INTERNAL_ERROR, format!("the broker cannot read its log: {error}"))
    }
}

pub fn error_response(id: &Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": error.code, "message": error.message}})
}

pub fn result_response(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The version named by the `A2A-Version` header: absent means 0.3; 1.0 and 0.3 (any patch)
/// are served; anything else is refused.
pub fn version_of(headers: &HeaderMap) -> Result<Version, RpcError> {
    let Some(value) = headers.get(VERSION_HEADER) else { return Ok(Version::V03) };
    let text = value.to_str().unwrap_or("").trim();
    let mut numbers = text.split('.');
    let major = numbers.next().unwrap_or("");
    let minor = numbers.next().unwrap_or("0");
    match (major, minor) {
        ("", _) => Ok(Version::V03),
        ("1", "0") => Ok(Version::V10),
        ("0", "3") => Ok(Version::V03),
        _ => Err(RpcError::new(
            VERSION_NOT_SUPPORTED,
            format!("A2A version '{text}' is not supported; this agent speaks 1.0 and 0.3"),
        )),
    }
}

// ---- shapes ----

pub fn state_name(version: Version, state: TaskState) -> &'static str {
    match version {
        Version::V10 => match state {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
        },
        Version::V03 => match state {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input-required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
        },
    }
}

/// A state filter as a client spells it (either version's spelling).
pub fn parse_state(text: &str) -> Option<TaskState> {
    TaskState::ALL.into_iter().find(|state| {
        text == state_name(Version::V10, *state) || text == state_name(Version::V03, *state) || text == state.as_str()
    })
}

fn role_name(version: Version, role: Role) -> &'static str {
    match (version, role) {
        (Version::V10, Role::User) => "ROLE_USER",
        (Version::V10, Role::Agent) => "ROLE_AGENT",
        (Version::V03, Role::User) => "user",
        (Version::V03, Role::Agent) => "agent",
    }
}

pub fn part_json(version: Version, part: &Part) -> Value {
    match (version, part) {
        (Version::V10, Part::Text { text }) => json!({"text": text}),
        (Version::V03, Part::Text { text }) => json!({"kind": "text", "text": text}),
        (Version::V10, Part::File { name, uri, mime_type }) => {
            let mut value = json!({"url": uri.clone().unwrap_or_default()});
            if let Some(name) = name {
                value["filename"] = json!(name);
            }
            if let Some(mime_type) = mime_type {
                value["mediaType"] = json!(mime_type);
            }
            value
        }
        (Version::V03, Part::File { name, uri, mime_type }) => {
            json!({"kind": "file", "file": {"uri": uri, "name": name, "mimeType": mime_type}})
        }
        (Version::V10, Part::Data { json }) => {
            json!({"data": serde_json::from_str::<Value>(json).unwrap_or(Value::Null)})
        }
        (Version::V03, Part::Data { json }) => {
            json!({"kind": "data", "data": serde_json::from_str::<Value>(json).unwrap_or(Value::Null)})
        }
    }
}

fn message_json(version: Version, message_id: &str, task: &TaskRecord, role: Role, parts: &[Part]) -> Value {
    let mut value = json!({
        "messageId": message_id,
        "contextId": task.context_id,
        "taskId": task.id,
        "role": role_name(version, role),
        "parts": parts.iter().map(|part| part_json(version, part)).collect::<Vec<_>>(),
    });
    if version == Version::V03 {
        value["kind"] = json!("message");
    }
    value
}

/// An artifact; its id is its position in the task (artifacts are only ever appended).
pub fn artifact_json(version: Version, index: usize, artifact: &Artifact) -> Value {
    let mut value = json!({
        "artifactId": format!("artifact-{index}"),
        "parts": artifact.parts.iter().map(|part| part_json(version, part)).collect::<Vec<_>>(),
    });
    if let Some(name) = &artifact.name {
        value["name"] = json!(name);
    }
    value
}

/// What the agent says with a state: its question (input required) or the failure.
fn status_text(task: &TaskRecord) -> Option<String> {
    match task.state {
        TaskState::InputRequired => super::wire::reply_text(task).or_else(|| task.error.clone()),
        TaskState::Failed | TaskState::Canceled => task.error.clone(),
        _ => None,
    }
}

fn status_json(version: Version, task: &TaskRecord) -> Value {
    let mut status = json!({
        "state": state_name(version, task.state),
        "timestamp": crate::time::rfc3339(task.updated_ms),
    });
    if let Some(text) = status_text(task) {
        let id = format!("{}-status-{}", task.id, task.updated_ms);
        status["message"] = message_json(version, &id, task, Role::Agent, &[Part::Text { text }]);
    }
    status
}

/// A task in the A2A shape of `version`. `history_length`: how many messages of the history
/// to include (None: all; the history is the request). `artifacts`: include the artifacts.
pub fn task_json(version: Version, task: &TaskRecord, history_length: Option<usize>, artifacts: bool) -> Value {
    let mut value = json!({
        "id": task.id,
        "contextId": task.context_id,
        "status": status_json(version, task),
        "metadata": {"synapse": {
            "agent_id": task.peer.as_ref().or(task.owner.as_ref()),
            "direction": task.direction,
            "created_at": crate::time::rfc3339(task.created_ms),
        }},
    });
    if version == Version::V03 {
        value["kind"] = json!("task");
    }
    if artifacts {
        value["artifacts"] =
            json!(task.artifacts.iter().enumerate().map(|(i, a)| artifact_json(version, i, a)).collect::<Vec<_>>());
    }
    if history_length != Some(0) {
        let request = message_json(version, &format!("{}-request", task.id), task, Role::User, &task.message.parts);
        value["history"] = json!([request]);
    }
    value
}

/// The stream responses for one change of a task: its new artifacts, then its status when it
/// changed (or is final). `artifact_count` is the number of artifacts the client has seen.
fn change_responses(
    version: Version,
    task: &TaskRecord,
    change: &TaskChange,
    artifact_count: &mut usize,
    last_state: &mut TaskState,
) -> Vec<Value> {
    let mut responses = Vec::new();
    for artifact in &change.artifacts {
        let mut update = json!({
            "taskId": task.id,
            "contextId": task.context_id,
            "artifact": artifact_json(version, *artifact_count, artifact),
            "append": false,
            "lastChunk": true,
        });
        *artifact_count += 1;
        responses.push(match version {
            Version::V10 => json!({"artifactUpdate": update}),
            Version::V03 => {
                update["kind"] = json!("artifact-update");
                update
            }
        });
    }
    if change.state != *last_state || change.state.is_final() {
        *last_state = change.state;
        let mut changed = task.clone();
        changed.state = change.state;
        changed.updated_ms = change.time_ms;
        if change.error.is_some() {
            changed.error = change.error.clone();
        }
        changed.artifacts.extend(change.artifacts.iter().cloned());
        let mut update =
            json!({"taskId": task.id, "contextId": task.context_id, "status": status_json(version, &changed)});
        responses.push(match version {
            Version::V10 => json!({"statusUpdate": update}),
            Version::V03 => {
                update["kind"] = json!("status-update");
                update["final"] = json!(is_done(change.state));
                update
            }
        });
    }
    responses
}

/// A blocking send returns, and a stream ends, at a final or interrupted state.
fn is_done(state: TaskState) -> bool {
    state.is_final() || state == TaskState::InputRequired
}

// ---- requests ----

/// A parsed call: method, params, id.
struct Call {
    id: Value,
    method: String,
    params: Value,
}

fn parse_call(body: Result<Bytes, BytesRejection>) -> Result<Call, (Value, RpcError)> {
    let bytes = body.map_err(|rejection| {
        let message = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!("request body too large (limit {} bytes)", super::MAX_BODY_BYTES)
        } else {
            format!("cannot read the request body: {}", rejection.body_text())
        };
        (Value::Null, RpcError::new(INVALID_REQUEST, message))
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|error| (Value::Null, RpcError::new(PARSE_ERROR, format!("invalid JSON: {error}"))))?;
    let Value::Object(object) = value else {
        let message = if value.is_array() {
            "batch requests are not supported: send one JSON-RPC request object"
        } else {
            "a JSON-RPC request must be an object"
        };
        return Err((Value::Null, RpcError::new(INVALID_REQUEST, message)));
    };
    let id = object.get("id").cloned().unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return Err((Value::Null, RpcError::new(INVALID_REQUEST, "the id must be a string, a number or null")));
    }
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id, RpcError::new(INVALID_REQUEST, "'jsonrpc' must be \"2.0\"")));
    }
    let Some(method) = object.get("method").and_then(Value::as_str).map(str::to_string) else {
        return Err((id, RpcError::new(INVALID_REQUEST, "'method' must be a string")));
    };
    let params = object.get("params").cloned().unwrap_or_else(|| json!({}));
    if !params.is_object() {
        return Err((id, RpcError::params("'params' must be an object")));
    }
    Ok(Call { id, method, params })
}

/// The methods, by their name in each version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Send,
    Stream,
    Get,
    List,
    Cancel,
    Subscribe,
    PushConfig,
    ExtendedCard,
}

fn method_of(version: Version, name: &str) -> Option<Method> {
    Some(match (version, name) {
        (Version::V10, "SendMessage") | (Version::V03, "message/send") => Method::Send,
        (Version::V10, "SendStreamingMessage") | (Version::V03, "message/stream") => Method::Stream,
        (Version::V10, "GetTask") | (Version::V03, "tasks/get") => Method::Get,
        (Version::V10, "ListTasks") | (Version::V03, "tasks/list") => Method::List,
        (Version::V10, "CancelTask") | (Version::V03, "tasks/cancel") => Method::Cancel,
        (Version::V10, "SubscribeToTask") | (Version::V03, "tasks/resubscribe") => Method::Subscribe,
        (
            Version::V10,
            "CreateTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig",
        )
        | (
            Version::V03,
            "tasks/pushNotificationConfig/set"
            | "tasks/pushNotificationConfig/get"
            | "tasks/pushNotificationConfig/list"
            | "tasks/pushNotificationConfig/delete",
        ) => Method::PushConfig,
        (Version::V10, "GetExtendedAgentCard") | (Version::V03, "agent/getAuthenticatedExtendedCard") => {
            Method::ExtendedCard
        }
        _ => return None,
    })
}

fn method_not_found(version: Version, name: &str) -> RpcError {
    let other = match version {
        Version::V03 => Version::V10,
        Version::V10 => Version::V03,
    };
    let hint = match (method_of(other, name), other) {
        (Some(_), Version::V10) => " (a 1.0 method: send the header 'A2A-Version: 1.0')",
        (Some(_), Version::V03) => " (a 0.3 method: send 'A2A-Version: 0.3' or no A2A-Version header)",
        _ => "",
    };
    let version = match version {
        Version::V10 => "1.0",
        Version::V03 => "0.3",
    };
    RpcError::new(METHOD_NOT_FOUND, format!("method '{name}' does not exist in A2A {version}{hint}"))
}

/// `POST /`: one JSON-RPC call.
pub async fn handle(
    State(state): State<AppState>,
    Scope(agent): Scope,
    fixed: Option<Extension<FixedAgent>>,
    caller: super::caller::Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // Streams served on the agent's own port end when the agent goes (its server waits for them).
    let served_by = fixed.map(|Extension(FixedAgent(agent))| agent);
    let call = match parse_call(body) {
        Ok(call) => call,
        Err((id, error)) => return Json(error_response(&id, &error)).into_response(),
    };
    let version = match version_of(&headers) {
        Ok(version) => version,
        Err(error) => return Json(error_response(&call.id, &error)).into_response(),
    };
    let Some(method) = method_of(version, &call.method) else {
        return Json(error_response(&call.id, &method_not_found(version, &call.method))).into_response();
    };
    let agent = agent_id_of(&state, agent);
    let result = match method {
        Method::Send => send(&state, &agent, version, &call.params).await,
        Method::Get => get_task(&state, &agent, version, &call.params),
        Method::List => list_tasks(&state, &agent, version, &call.params),
        Method::Cancel => cancel_task(&state, &agent, caller.actor(), version, &call.params).await,
        Method::Stream => return stream_send(state, agent, version, call, served_by).await,
        Method::Subscribe => return subscribe_task(state, agent, version, call, served_by),
        Method::PushConfig => {
            Err(RpcError::new(PUSH_NOT_SUPPORTED, "push notifications are not supported by this agent"))
        }
        Method::ExtendedCard => Err(RpcError::new(
            EXTENDED_CARD_NOT_CONFIGURED,
            "this agent has no extended agent card; read /.well-known/agent-card.json",
        )),
    };
    match result {
        Ok(value) => Json(result_response(&call.id, value)).into_response(),
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}

/// The agent id a broker path names (`/agents/<id or name>/`); unknown names stay as they are
/// (a send to them then says no agent matches).
fn agent_id_of(state: &AppState, scope: String) -> String {
    let found = state.store.read(|view| {
        if view.agent(&scope)?.is_some() {
            return Ok(None);
        }
        Ok(view.agents()?.into_iter().find(|agent| agent.name.as_deref() == Some(scope.as_str())))
    });
    match found {
        Ok(Some(agent)) => agent.agent_id,
        _ => scope,
    }
}

fn string_param<'a>(params: &'a Value, name: &str) -> Result<Option<&'a str>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(RpcError::params(format!("'{name}' must be a string"))),
    }
}

fn count_param(params: &Value, name: &str) -> Result<Option<usize>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .and_then(|count| usize::try_from(count).ok())
            .map(Some)
            .ok_or_else(|| RpcError::params(format!("'{name}' must be a number of 0 or more"))),
    }
}

fn bool_param(params: &Value, name: &str) -> Result<Option<bool>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(_) => Err(RpcError::params(format!("'{name}' must be true or false"))),
    }
}

fn task_id_param(params: &Value) -> Result<&str, RpcError> {
    string_param(params, "id")?
        .filter(|id| !id.is_empty())
        .ok_or_else(|| RpcError::params("'id' (the task id) is required"))
}

/// The task `reference` names among this agent's tasks.
fn find_task(state: &AppState, agent: &str, reference: &str) -> Result<TaskRecord, RpcError> {
    if crate::broker::command::validate_task_ref(reference).is_err() {
        return Err(RpcError::task_not_found(reference));
    }
    subscribe::find_task_of_agent(state, agent, reference)?.ok_or_else(|| RpcError::task_not_found(reference))
}

/// What a send request asks for.
struct SendParams {
    text: String,
    /// The client's `messageId`: a message sent again with the same id (a retry) is the same
    /// message, and gets the first one's task.
    message_id: Option<String>,
    context_id: Option<String>,
    blocking: bool,
    history_length: Option<usize>,
}

fn parse_send(state: &AppState, agent: &str, version: Version, params: &Value) -> Result<SendParams, RpcError> {
    let message =
        params.get("message").filter(|m| m.is_object()).ok_or_else(|| RpcError::params("'message' is required"))?;
    if let Some(role) = string_param(message, "role")?
        && !matches!(role, "ROLE_USER" | "user")
    {
        return Err(RpcError::params(format!("a client message has the role ROLE_USER (got '{role}')")));
    }
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .filter(|parts| !parts.is_empty())
        .ok_or_else(|| RpcError::params("'message.parts' must be a non-empty list"))?;
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        match (part.get("text").and_then(Value::as_str), part.get("kind").and_then(Value::as_str)) {
            (Some(text), None | Some("text")) => texts.push(text),
            _ => {
                return Err(RpcError::new(
                    CONTENT_TYPE_NOT_SUPPORTED,
                    "only text parts are supported: the message is written into the agent's CLI",
                ));
            }
        }
    }
    if let Some(task_id) = string_param(message, "taskId")?.filter(|id| !id.is_empty()) {
        find_task(state, agent, task_id)?;
        return Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            format!("continuing task {task_id} is not supported: send a new message (same contextId) instead"),
        ));
    }
    let context_id = string_param(message, "contextId")?.or(string_param(params, "contextId")?);
    if let Some(context) = context_id
        && (context.chars().count() > MAX_CONTEXT_ID_CHARS || context.chars().any(char::is_control))
    {
        return Err(RpcError::params(format!(
            "'contextId' must be at most {MAX_CONTEXT_ID_CHARS} printable characters"
        )));
    }
    let configuration = params.get("configuration").cloned().unwrap_or_else(|| json!({}));
    if !configuration.is_object() {
        return Err(RpcError::params("'configuration' must be an object"));
    }
    let push = ["taskPushNotificationConfig", "pushNotificationConfig"];
    if push.iter().any(|name| configuration.get(*name).is_some_and(|v| !v.is_null())) {
        return Err(RpcError::new(PUSH_NOT_SUPPORTED, "push notifications are not supported by this agent"));
    }
    let blocking = match version {
        Version::V10 => !bool_param(&configuration, "returnImmediately")?.unwrap_or(false),
        Version::V03 => bool_param(&configuration, "blocking")?.unwrap_or(true),
    };
    Ok(SendParams {
        message_id: string_param(message, "messageId")?.filter(|id| !id.is_empty()).map(str::to_string),
        text: texts.join("\n"),
        context_id: context_id.map(str::to_string),
        blocking,
        history_length: count_param(&configuration, "historyLength")?,
    })
}

/// Sends the message as an anonymous `synapse send` expecting a reply; returns the A2A task
/// (the sender's side) and the sequence number of the send's last event.
async fn submit_send(state: &AppState, agent: &str, request: &SendParams) -> Result<(TaskRecord, u64), RpcError> {
    let send = SendRequest {
        to: agent.to_string(),
        from: None,
        secret: None,
        text: request.text.clone(),
        priority: default_priority(),
        response_expected: true,
        reply_to: None,
        context_id: request.context_id.clone(),
        sender_task_id: None,
        // Anonymous senders share one key space: the key names the agent and the A2A binding.
        idempotency_key: request.message_id.as_ref().map(|id| format!("a2a:{agent}:{id}")),
        by_user: false,
    };
    match state.writer.submit(Command::Send(send)).await? {
        Outcome::Sent(sent) => match sent.sender_task {
            Some(task) => Ok((task, sent.seq)),
            None => Err(RpcError::new(INTERNAL_ERROR, "the send created no task to follow")),
        },
        _ => Err(RpcError::new(INTERNAL_ERROR, "unexpected answer to a send")),
    }
}

async fn send(state: &AppState, agent: &str, version: Version, params: &Value) -> Result<Value, RpcError> {
    let request = parse_send(state, agent, version, params)?;
    let (mut task, _) = submit_send(state, agent, &request).await?;
    if request.blocking {
        task = wait_until_done(state, agent, &task.id).await?;
    }
    let task = task_json(version, &task, request.history_length, true);
    Ok(match version {
        Version::V10 => json!({"task": task}),
        Version::V03 => task,
    })
}

/// Follows the log's head until the task is final or asks for input (or the agent is no longer
/// registered, the broker stops, or [`MAX_WAIT`] passes); returns the task as it then is.
async fn wait_until_done(state: &AppState, agent: &str, task_id: &str) -> Result<TaskRecord, RpcError> {
    let deadline = tokio::time::Instant::now() + MAX_WAIT;
    loop {
        let cursor = *state.head.borrow();
        let (task, registered) = state.store.read(|view| Ok((view.task(task_id)?, view.agent(agent)?.is_some())))?;
        let task = task.ok_or_else(|| RpcError::task_not_found(task_id))?;
        if is_done(task.state) || !registered {
            return Ok(task);
        }
        match tokio::time::timeout_at(deadline, tail::wait_past(state, cursor)).await {
            Ok(true) => continue,
            Ok(false) | Err(_) => return Ok(task),
        }
    }
}

fn get_task(state: &AppState, agent: &str, version: Version, params: &Value) -> Result<Value, RpcError> {
    let task = find_task(state, agent, task_id_param(params)?)?;
    let history_length = count_param(params, "historyLength")?;
    Ok(task_json(version, &task, history_length, true))
}

fn list_tasks(state: &AppState, agent: &str, version: Version, params: &Value) -> Result<Value, RpcError> {
    let context_id = string_param(params, "contextId")?.filter(|c| !c.is_empty());
    let wanted = match string_param(params, "status")?.filter(|s| !s.is_empty() && *s != "TASK_STATE_UNSPECIFIED") {
        Some(text) => Some(parse_state(text).ok_or_else(|| RpcError::params(format!("unknown task state '{text}'")))?),
        None => None,
    };
    let page_size = match count_param(params, "pageSize")? {
        None => DEFAULT_PAGE_SIZE,
        Some(size) if (1..=MAX_PAGE_SIZE).contains(&size) => size,
        Some(size) => return Err(RpcError::params(format!("'pageSize' must be 1 to {MAX_PAGE_SIZE} (got {size})"))),
    };
    let offset = match string_param(params, "pageToken")?.filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => {
            token.parse::<usize>().map_err(|_| RpcError::params(format!("invalid 'pageToken' '{token}'")))?
        }
    };
    let after_ms = match string_param(params, "statusTimestampAfter")? {
        None => None,
        Some(text) => Some(
            crate::time::parse_rfc3339_ms(text)
                .ok_or_else(|| RpcError::params(format!("'statusTimestampAfter' is not an RFC 3339 time: '{text}'")))?,
        ),
    };
    let history_length = count_param(params, "historyLength")?;
    let include_artifacts = bool_param(params, "includeArtifacts")?.unwrap_or(false);
    // The tasks A2A clients (anonymous senders) gave this agent, newest first.
    let mut tasks: Vec<TaskRecord> = state
        .store
        .read(|view| view.tasks_of(agent, TaskIndexKind::Served))?
        .into_iter()
        .filter(|task| context_id.is_none_or(|context| task.context_id == context))
        .filter(|task| wanted.is_none_or(|wanted| task.state == wanted))
        .filter(|task| after_ms.is_none_or(|after| task.updated_ms >= after))
        .collect();
    tasks.sort_by(|left, right| right.created_ms.cmp(&left.created_ms).then_with(|| left.id.cmp(&right.id)));
    let total = tasks.len();
    let page: Vec<Value> = tasks
        .iter()
        .skip(offset)
        .take(page_size)
        .map(|task| task_json(version, task, history_length, include_artifacts))
        .collect();
    let next = if offset + page_size < total { (offset + page_size).to_string() } else { String::new() };
    Ok(json!({"tasks": page, "nextPageToken": next, "pageSize": page_size, "totalSize": total}))
}

async fn cancel_task(
    state: &AppState,
    agent: &str,
    actor: Actor,
    version: Version,
    params: &Value,
) -> Result<Value, RpcError> {
    let task = find_task(state, agent, task_id_param(params)?)?;
    if task.state.is_final() {
        return Err(RpcError::new(
            TASK_NOT_CANCELABLE,
            format!("Task {} is {} and cannot be canceled", task.id, task.state),
        ));
    }
    let reason = Some("canceled by the A2A client".to_string());
    let canceled = match state
        .writer
        .submit(Command::CancelTask { task_id: task.id.clone(), reason: reason.clone(), actor: actor.clone() })
        .await
    {
        Ok(Outcome::Task { task }) => task,
        Ok(_) => return Err(RpcError::new(INTERNAL_ERROR, "unexpected answer to a cancel")),
        // Decided against a newer state than the one read above: it became final meanwhile.
        Err(CommandError::BadRequest { message }) => return Err(RpcError::new(TASK_NOT_CANCELABLE, message)),
        Err(error) => return Err(error.into()),
    };
    // The agent's side of the exchange stops too (best effort: it may have finished already).
    if let Some(peer) = &task.peer_task_id {
        let _ = state.writer.submit(Command::CancelTask { task_id: peer.clone(), reason, actor }).await;
    }
    Ok(task_json(version, &canceled, None, true))
}

type SseItem = Result<SseEvent, std::convert::Infallible>;

fn sse_event(id: &Value, seq: u64, result: Value) -> SseItem {
    Ok(SseEvent::default().id(seq.to_string()).data(result_response(id, result).to_string()))
}

/// The SSE response of a streaming call: the task snapshot first, then its updates from the
/// log after `cursor`, until the task is done (or the broker stops).
fn stream_task(
    state: AppState,
    version: Version,
    id: Value,
    snapshot: TaskRecord,
    cursor: u64,
    stop_at_input: bool,
    served_by: Option<String>,
) -> Response {
    let changes = subscribe::task_changes(state, snapshot.id.clone(), cursor, snapshot.state.is_final(), served_by);
    let stream = async_stream::stream! {
        let first = task_json(version, &snapshot, None, true);
        yield sse_event(&id, cursor, match version {
            Version::V10 => json!({"task": first}),
            Version::V03 => first,
        });
        if snapshot.state.is_final() || (stop_at_input && snapshot.state == TaskState::InputRequired) {
            return;
        }
        let mut artifact_count = snapshot.artifacts.len();
        let mut last_state = snapshot.state;
        tokio::pin!(changes);
        while let Some(item) = tokio_stream::StreamExt::next(&mut changes).await {
            match item {
                Ok(change) => {
                    for response in change_responses(version, &snapshot, &change, &mut artifact_count, &mut last_state) {
                        yield sse_event(&id, change.seq, response);
                    }
                    if change.state.is_final() || (stop_at_input && change.state == TaskState::InputRequired) {
                        break;
                    }
                }
                Err(StreamEnd::Shutdown) => break,
                Err(StreamEnd::Failed(message)) => {
                    let error = RpcError::new(INTERNAL_ERROR, message);
                    yield Ok(SseEvent::default().data(error_response(&id, &error).to_string()));
                    break;
                }
            }
        }
    };
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

async fn stream_send(
    state: AppState,
    agent: String,
    version: Version,
    call: Call,
    served_by: Option<String>,
) -> Response {
    let request = match parse_send(&state, &agent, version, &call.params) {
        Ok(request) => request,
        Err(error) => return Json(error_response(&call.id, &error)).into_response(),
    };
    match submit_send(&state, &agent, &request).await {
        Ok((task, seq)) => stream_task(state, version, call.id, task, seq, true, served_by),
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}

fn subscribe_task(state: AppState, agent: String, version: Version, call: Call, served_by: Option<String>) -> Response {
    let snapshot = (|| {
        let reference = task_id_param(&call.params)?;
        // A snapshot and the cursor it is exact at: the head did not move while reading.
        // (The log's own head, not the watch: the watch moves only after the commit.)
        loop {
            let before = state.store.head()?;
            let task = find_task(&state, &agent, reference)?;
            if state.store.head()? == before {
                return Ok((task, before));
            }
        }
    })();
    match snapshot {
        Ok((task, _)) if task.state.is_final() => Json(error_response(
            &call.id,
            &RpcError::new(
                UNSUPPORTED_OPERATION,
                format!("Task {} is already {}; nothing to subscribe to", task.id, task.state),
            ),
        ))
        .into_response(),
        Ok((task, cursor)) => {
            let stop_at_input = task.state != TaskState::InputRequired;
            stream_task(state, version, call.id, task, cursor, stop_at_input, served_by)
        }
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(version: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(version) = version {
            headers.insert("A2A-Version", HeaderValue::from_str(version).unwrap());
        }
        headers
    }

    #[test]
    fn a_missing_version_header_means_0_3_and_only_1_0_and_0_3_are_served() {
        assert_eq!(version_of(&headers(None)), Ok(Version::V03));
        assert_eq!(version_of(&headers(Some("0.3"))), Ok(Version::V03));
        assert_eq!(version_of(&headers(Some("0.3.0"))), Ok(Version::V03));
        assert_eq!(version_of(&headers(Some("1.0"))), Ok(Version::V10));
        assert_eq!(version_of(&headers(Some("1.0.2"))), Ok(Version::V10));
        for refused in ["1.1", "2.0", "0.2.6", "latest"] {
            assert_eq!(version_of(&headers(Some(refused))).unwrap_err().code, VERSION_NOT_SUPPORTED, "{refused}");
        }
    }

    #[test]
    fn each_version_has_its_own_method_names() {
        assert_eq!(method_of(Version::V10, "SendMessage"), Some(Method::Send));
        assert_eq!(method_of(Version::V03, "message/send"), Some(Method::Send));
        assert_eq!(method_of(Version::V10, "SubscribeToTask"), Some(Method::Subscribe));
        assert_eq!(method_of(Version::V03, "tasks/resubscribe"), Some(Method::Subscribe));
        assert_eq!(method_of(Version::V03, "SendMessage"), None);
        assert_eq!(method_of(Version::V10, "tasks/get"), None);
        assert!(method_not_found(Version::V03, "GetTask").message.contains("A2A-Version: 1.0"));
    }

    #[test]
    fn states_and_roles_use_each_versions_spelling_and_filters_accept_all_of_them() {
        assert_eq!(state_name(Version::V10, TaskState::Completed), "TASK_STATE_COMPLETED");
        assert_eq!(state_name(Version::V10, TaskState::InputRequired), "TASK_STATE_INPUT_REQUIRED");
        assert_eq!(state_name(Version::V03, TaskState::InputRequired), "input-required");
        assert_eq!(role_name(Version::V10, Role::User), "ROLE_USER");
        assert_eq!(role_name(Version::V03, Role::Agent), "agent");
        for text in ["TASK_STATE_INPUT_REQUIRED", "input-required", "input_required"] {
            assert_eq!(parse_state(text), Some(TaskState::InputRequired));
        }
        assert_eq!(parse_state("TASK_STATE_REJECTED"), None);
    }

    #[test]
    fn malformed_calls_get_parse_and_invalid_request_errors_with_the_id_when_known() {
        let parse = |body: &str| parse_call(Ok(Bytes::from(body.to_string())));
        assert_eq!(parse("{").err().unwrap().1.code, PARSE_ERROR);
        assert_eq!(parse("[]").err().unwrap().1.code, INVALID_REQUEST);
        assert_eq!(parse("3").err().unwrap().1.code, INVALID_REQUEST);
        let (id, error) = parse(r#"{"jsonrpc":"1.0","id":"x","method":"GetTask"}"#).err().unwrap();
        assert_eq!((id, error.code), (json!("x"), INVALID_REQUEST));
        assert_eq!(parse(r#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#).err().unwrap().1.code, INVALID_REQUEST);
        let (id, error) = parse(r#"{"jsonrpc":"2.0","id":4,"method":"GetTask","params":"x"}"#).err().unwrap();
        assert_eq!((id, error.code), (json!(4), INVALID_PARAMS));
        let call = parse(r#"{"jsonrpc":"2.0","id":5,"method":"GetTask"}"#).ok().unwrap();
        assert_eq!((call.id, call.method, call.params), (json!(5), "GetTask".to_string(), json!({})));
    }
}
