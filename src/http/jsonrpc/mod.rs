//! The A2A JSON-RPC 2.0 binding at `POST /` of an agent (and `POST /agents/{agent}/` on the
//! broker): A2A v1.0 (`SendMessage`, `SendStreamingMessage`, `GetTask`, `ListTasks`,
//! `CancelTask`, `SubscribeToTask`) and, when the `A2A-Version` header is absent or 0.3, the
//! 0.3 names and shapes (`message/send`, `message/stream`, `tasks/get`, `tasks/list`,
//! `tasks/cancel`, `tasks/resubscribe`).
//!
//! An A2A message is the same event as `synapse send`: an anonymous send to this agent that
//! expects a reply. The A2A task is the sender's side of that exchange (owner none, peer this
//! agent), so the agent's `synapse reply` completes it and `GetTask` shows the reply artifact.
//! Layout: this file holds the protocol (versions, errors, parsing a call, dispatch);
//! `shapes` the A2A JSON of each version, `methods` the calls answered at once, `stream` the
//! streaming ones.
//!
//! Invariants:
//! - Every answer is a JSON-RPC response (HTTP 200), errors included; bad input never panics.
//! - Streams follow the log (see [`super::subscribe`]): no change is lost or repeated between
//!   the first `task` snapshot and the updates, and every stream ends on broker shutdown.

pub mod http_json;
mod methods;
mod params;
mod push;
mod shapes;
mod stream;

use super::{AppState, FixedAgent, Scope};
use crate::broker::command::CommandError;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use methods::*;
use serde_json::{Value, json};
use stream::*;

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

/// A JSON-RPC error; answered with a `google.rpc.ErrorInfo` in `error.data` (A2A v1.0 §9.5).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// The ErrorInfo's `metadata`: what the error is about (`taskId`, ...), string values.
    pub metadata: Vec<(&'static str, String)>,
    /// The HTTP status the HTTP+JSON binding answers, when the code alone says less than the
    /// error: JSON-RPC has one code for a refusal (`INVALID_PARAMS`) and one for the server's
    /// trouble (`INTERNAL_ERROR`), but a refusal may be 403 or 413 and a broker that is
    /// stopping is 503, not 500. None: [`status_of`] the code.
    pub http_status: Option<StatusCode>,
}

/// The ErrorInfo `domain` of every A2A error.
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";

/// The ErrorInfo `reason` of a code: the A2A error's name in UPPER_SNAKE_CASE without `Error`,
/// or the JSON-RPC error's.
pub fn error_reason(code: i64) -> &'static str {
    match code {
        PARSE_ERROR => "PARSE_ERROR",
        INVALID_REQUEST => "INVALID_REQUEST",
        METHOD_NOT_FOUND => "METHOD_NOT_FOUND",
        INVALID_PARAMS => "INVALID_PARAMS",
        TASK_NOT_FOUND => "TASK_NOT_FOUND",
        TASK_NOT_CANCELABLE => "TASK_NOT_CANCELABLE",
        PUSH_NOT_SUPPORTED => "PUSH_NOTIFICATION_NOT_SUPPORTED",
        UNSUPPORTED_OPERATION => "UNSUPPORTED_OPERATION",
        CONTENT_TYPE_NOT_SUPPORTED => "CONTENT_TYPE_NOT_SUPPORTED",
        EXTENDED_CARD_NOT_CONFIGURED => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        VERSION_NOT_SUPPORTED => "VERSION_NOT_SUPPORTED",
        _ => "INTERNAL",
    }
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), metadata: Vec::new(), http_status: None }
    }
    pub(super) fn answered_as(mut self, status: StatusCode) -> RpcError {
        self.http_status = Some(status);
        self
    }
    pub(super) fn with(mut self, key: &'static str, value: impl Into<String>) -> RpcError {
        self.metadata.push((key, value.into()));
        self
    }
    fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }
    fn task_not_found(id: &str) -> RpcError {
        RpcError::new(TASK_NOT_FOUND, format!("Task {id} not found")).with("taskId", id)
    }

    /// `error.data`: one `google.rpc.ErrorInfo`.
    pub fn data(&self) -> Value {
        let metadata: serde_json::Map<String, Value> =
            self.metadata.iter().map(|(key, value)| (key.to_string(), Value::String(value.clone()))).collect();
        let mut info = json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": error_reason(self.code),
            "domain": ERROR_DOMAIN,
        });
        if !metadata.is_empty() {
            info["metadata"] = Value::Object(metadata);
        }
        json!([info])
    }
}

impl From<CommandError> for RpcError {
    fn from(error: CommandError) -> Self {
        // The caller's request, not the server, is at fault: never an internal error (the
        // HTTP+JSON binding would answer 500). The HTTP status is the REST routes' own.
        let http_status = super::ApiError::from(error.clone()).status();
        let code = match &error {
            CommandError::BadRequest { .. }
            | CommandError::Ambiguous { .. }
            | CommandError::TooLarge { .. }
            | CommandError::Conflict { .. }
            | CommandError::Forbidden { .. } => INVALID_PARAMS,
            CommandError::NotFound { .. } => TASK_NOT_FOUND,
            CommandError::Unavailable { .. } => INTERNAL_ERROR,
        };
        RpcError::new(code, error.to_string()).answered_as(http_status)
    }
}

impl From<super::ApiError> for RpcError {
    fn from(error: super::ApiError) -> Self {
        let message = error.message().to_string();
        let code = if error.status().is_client_error() { INVALID_PARAMS } else { INTERNAL_ERROR };
        RpcError::new(code, message).answered_as(error.status())
    }
}

impl From<crate::store::StoreError> for RpcError {
    fn from(error: crate::store::StoreError) -> Self {
        let error = super::ApiError::from(error);
        RpcError::new(INTERNAL_ERROR, error.message()).answered_as(error.status())
    }
}

/// The HTTP status and `google.rpc.Code` name the HTTP+JSON binding answers an error with.
pub fn http_status_of(error: &RpcError) -> (StatusCode, &'static str) {
    let Some(status) = error.http_status else { return status_of(error.code) };
    let name = match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "INVALID_ARGUMENT",
        StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
        StatusCode::FORBIDDEN => "PERMISSION_DENIED",
        StatusCode::NOT_FOUND => "NOT_FOUND",
        StatusCode::CONFLICT => "FAILED_PRECONDITION",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "INVALID_ARGUMENT",
        StatusCode::TOO_MANY_REQUESTS => "RESOURCE_EXHAUSTED",
        StatusCode::SERVICE_UNAVAILABLE => "UNAVAILABLE",
        status if status.is_client_error() => "FAILED_PRECONDITION",
        _ => "INTERNAL",
    };
    (status, name)
}

/// The HTTP status and `google.rpc.Code` name of an error code (A2A v1.0 §5.4's mapping).
pub fn status_of(code: i64) -> (StatusCode, &'static str) {
    match code {
        TASK_NOT_FOUND => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        METHOD_NOT_FOUND => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        TASK_NOT_CANCELABLE => (StatusCode::CONFLICT, "FAILED_PRECONDITION"),
        CONTENT_TYPE_NOT_SUPPORTED => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "INVALID_ARGUMENT"),
        PUSH_NOT_SUPPORTED | UNSUPPORTED_OPERATION | VERSION_NOT_SUPPORTED | EXTENDED_CARD_NOT_CONFIGURED => {
            (StatusCode::BAD_REQUEST, "FAILED_PRECONDITION")
        }
        PARSE_ERROR | INVALID_REQUEST | INVALID_PARAMS => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        INTERNAL_ERROR => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
    }
}

/// An error as this binding answers it: a `google.rpc.Status`.
pub fn status_body(error: &RpcError) -> Value {
    let (status, name) = http_status_of(error);
    json!({"error": {"code": status.as_u16(), "status": name, "message": error.message, "details": error.data()}})
}

pub fn error_response(id: &Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": error.code, "message": error.message, "data": error.data()}})
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
        )
        .with("requestedVersion", text)),
    }
}

/// A parsed call: method, params, id.
struct Call {
    id: Value,
    method: String,
    params: Value,
}

fn parse_call(body: Result<Bytes, BytesRejection>) -> Result<Call, Box<(Value, RpcError)>> {
    let bytes = body.map_err(|rejection| {
        let message = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            super::body_too_large()
        } else {
            format!("cannot read the request body: {}", rejection.body_text())
        };
        Box::new((Value::Null, RpcError::new(INVALID_REQUEST, message)))
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|error| Box::new((Value::Null, RpcError::new(PARSE_ERROR, format!("invalid JSON: {error}")))))?;
    let Value::Object(object) = value else {
        let message = if value.is_array() {
            "batch requests are not supported: send one JSON-RPC request object"
        } else {
            "a JSON-RPC request must be an object"
        };
        return Err(Box::new((Value::Null, RpcError::new(INVALID_REQUEST, message))));
    };
    let id = object.get("id").cloned().unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return Err(Box::new((
            Value::Null,
            RpcError::new(INVALID_REQUEST, "the id must be a string, a number or null"),
        )));
    }
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Box::new((id, RpcError::new(INVALID_REQUEST, "'jsonrpc' must be \"2.0\""))));
    }
    let Some(method) = object.get("method").and_then(Value::as_str).map(str::to_string) else {
        return Err(Box::new((id, RpcError::new(INVALID_REQUEST, "'method' must be a string"))));
    };
    let params = object.get("params").cloned().unwrap_or_else(|| json!({}));
    if !params.is_object() {
        return Err(Box::new((id, RpcError::params("'params' must be an object"))));
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
    PushCreate,
    PushGet,
    PushList,
    PushDelete,
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
        (Version::V10, "CreateTaskPushNotificationConfig") | (Version::V03, "tasks/pushNotificationConfig/set") => {
            Method::PushCreate
        }
        (Version::V10, "GetTaskPushNotificationConfig") | (Version::V03, "tasks/pushNotificationConfig/get") => {
            Method::PushGet
        }
        (Version::V10, "ListTaskPushNotificationConfigs") | (Version::V03, "tasks/pushNotificationConfig/list") => {
            Method::PushList
        }
        (Version::V10, "DeleteTaskPushNotificationConfig") | (Version::V03, "tasks/pushNotificationConfig/delete") => {
            Method::PushDelete
        }
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
        Err(refused) => {
            let (id, error) = *refused;
            return Json(error_response(&id, &error)).into_response();
        }
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
        Method::List => list_tasks_apart(&state, &agent, version, &call.params).await,
        Method::Cancel => cancel_task(&state, &agent, caller.actor(), version, &call.params).await,
        Method::Stream => return stream_send(state, agent, version, call, served_by).await,
        Method::Subscribe => return subscribe_task(state, agent, version, call, served_by),
        Method::PushCreate => push::create(&state, &agent, &caller.actor(), version, &call.params).await,
        Method::PushGet => push::get(&state, &agent, &caller.actor(), version, &call.params).await,
        Method::PushList => push::list(&state, &agent, &caller.actor(), version, &call.params).await,
        Method::PushDelete => push::delete(&state, &agent, &caller.actor(), version, &call.params).await,
        Method::ExtendedCard => extended_card(&state, &agent, served_by.is_some()),
    };
    match result {
        Ok(value) => Json(result_response(&call.id, value)).into_response(),
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}

/// `GetExtendedAgentCard`: with authentication on, the request got here authenticated (the
/// middleware refuses it otherwise, or it came from this machine while localhost is allowed);
/// without it there is no extended card.
fn extended_card(state: &AppState, agent: &str, own_port: bool) -> Result<Value, RpcError> {
    if !state.auth.enabled {
        return Err(RpcError::new(
            EXTENDED_CARD_NOT_CONFIGURED,
            "this agent has no extended agent card without authentication; read /.well-known/agent-card.json",
        ));
    }
    let record = state
        .store
        .read(|view| view.agent(agent))?
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, format!("Agent '{agent}' is not registered")))?;
    let url = super::a2a_card::card_url(state, &record, own_port);
    Ok(super::a2a_card::extended_card(state, &record, &url))
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

#[cfg(test)]
mod tests {
    use super::shapes::{parse_state, role_name, state_name};
    use super::*;
    use crate::event::{Role, TaskState};
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
    fn the_http_binding_answers_a_refusal_or_the_brokers_trouble_with_the_rest_routes_status() {
        let answered = |error: CommandError| {
            let error = RpcError::from(error);
            let body = status_body(&error);
            (http_status_of(&error).0.as_u16(), body["error"]["code"].as_u64(), body["error"]["status"].clone())
        };
        let stopping = CommandError::Unavailable { message: "the broker is stopping".into() };
        assert_eq!(answered(stopping), (503, Some(503), json!("UNAVAILABLE")));
        assert_eq!(answered(CommandError::forbidden("not yours")), (403, Some(403), json!("PERMISSION_DENIED")));
        let too_large = CommandError::TooLarge { message: "too large".into() };
        assert_eq!(answered(too_large), (413, Some(413), json!("INVALID_ARGUMENT")));
        assert_eq!(answered(CommandError::conflict("gone")), (409, Some(409), json!("FAILED_PRECONDITION")));
        assert_eq!(answered(CommandError::bad("bad")), (400, Some(400), json!("INVALID_ARGUMENT")));
        assert_eq!(answered(CommandError::not_found("none")), (404, Some(404), json!("NOT_FOUND")));
        // JSON-RPC keeps its codes: a refusal is INVALID_PARAMS, the broker's trouble INTERNAL_ERROR.
        assert_eq!(RpcError::from(CommandError::forbidden("not yours")).code, INVALID_PARAMS);
        assert_eq!(RpcError::from(CommandError::Unavailable { message: "x".into() }).code, INTERNAL_ERROR);
        let refused = RpcError::from(super::super::ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down"));
        assert_eq!(http_status_of(&refused), (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"));
        // An error made here, with a code alone, keeps the code's status.
        assert_eq!(http_status_of(&RpcError::task_not_found("t")), (StatusCode::NOT_FOUND, "NOT_FOUND"));
        assert_eq!(
            http_status_of(&RpcError::new(INTERNAL_ERROR, "x")),
            (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL")
        );
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
        let (id, error) = *parse(r#"{"jsonrpc":"1.0","id":"x","method":"GetTask"}"#).err().unwrap();
        assert_eq!((id, error.code), (json!("x"), INVALID_REQUEST));
        assert_eq!(parse(r#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#).err().unwrap().1.code, INVALID_REQUEST);
        let (id, error) = *parse(r#"{"jsonrpc":"2.0","id":4,"method":"GetTask","params":"x"}"#).err().unwrap();
        assert_eq!((id, error.code), (json!(4), INVALID_PARAMS));
        let call = parse(r#"{"jsonrpc":"2.0","id":5,"method":"GetTask"}"#).ok().unwrap();
        assert_eq!((call.id, call.method, call.params), (json!(5), "GetTask".to_string(), json!({})));
    }
}
