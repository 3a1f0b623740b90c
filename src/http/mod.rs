//! HTTP: the broker API and the per-agent A2A endpoints, one error type, SSE.
//!
//! The same handlers serve an agent's endpoints at the root of its own port and socket (the
//! agent fixed by [`FixedAgent`]) and on the broker under `/agents/{agent}/...`.
//! Bad input is always a 4xx JSON error, never a 500 or a panic.

pub mod a2a_card;
pub mod agent_endpoints;
pub mod agent_tasks;
pub mod auth;
pub mod caller;
pub mod externals;
pub mod file_safety;
pub mod guard;
pub mod history;
pub mod jsonrpc;
pub mod openapi;
pub mod server;
pub mod subscribe;
pub mod webhooks;
pub mod wire;

use crate::broker::command::{self, Command, CommandError, Outcome, SendRequest};
use crate::broker::{BrokerState, agents, tail};
use crate::event::{AgentStatus, Message, Part, Role, TaskState};
use crate::store::{StoreError, TaskIndexKind, TaskRecord};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, request::Parts};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Request bodies above this are refused with 413 (a message may be up to 16 MiB of text; JSON
/// escaping can add a little).
pub const MAX_BODY_BYTES: usize = command::MAX_MESSAGE_BYTES + (64 << 10);

/// Header carrying an agent's secret for requests made on its behalf.
pub const SECRET_HEADER: &str = "x-synapse-agent-secret";

/// Longest a long-poll or wait may last.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// What every handler shares: the broker, and what only HTTP needs (authentication, request
/// rules, connection limits), read once when the daemon starts serving. Derefs to the broker's
/// state, which handlers mostly read.
pub struct HttpState {
    pub broker: Arc<BrokerState>,
    /// API-key authentication, from the home's security settings at start.
    pub auth: Arc<auth::AuthConfig>,
    /// Host / Origin / content-type rules of every HTTP server, read from the environment at start.
    pub request_rules: guard::RequestRules,
    /// Idle timeout and connection limit shared by every HTTP server of this broker.
    pub connection_limits: Arc<server::ConnectionLimits>,
}

impl HttpState {
    pub fn new(broker: Arc<BrokerState>) -> Arc<HttpState> {
        Arc::new(HttpState {
            auth: Arc::new(auth::AuthConfig::from_trust(&broker.trust)),
            request_rules: guard::RequestRules::from_env(),
            connection_limits: Arc::new(server::ConnectionLimits::from_env()),
            broker,
        })
    }
}

impl std::ops::Deref for HttpState {
    type Target = BrokerState;
    fn deref(&self) -> &BrokerState {
        &self.broker
    }
}

type AppState = Arc<HttpState>;

/// The one error type of the HTTP layer: a status and a JSON body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        let message = message.into();
        ApiError { status, body: json!({"error": status.canonical_reason().unwrap_or("error"), "message": message}) }
    }
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
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
        let mut api = ApiError::new(status, error.to_string());
        if let CommandError::Ambiguous { candidates, .. } = &error {
            api.body["candidates"] = json!(candidates);
        }
        api
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("the broker cannot read its log: {error}"))
    }
}

type ApiResult<T = Json<Value>> = Result<T, ApiError>;

/// Parses a JSON body with clear 4xx errors (413 too large, 400 not UTF-8 / not JSON / unknown
/// fields).
fn parse_body<T: for<'de> Deserialize<'de>>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, format!("request body too large (limit {MAX_BODY_BYTES} bytes)"))
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

fn parse_query<T: for<'de> Deserialize<'de>>(query: Option<&str>) -> Result<T, ApiError> {
    let query = query.unwrap_or("");
    serde_urlencoded_parse(query).map_err(|error| ApiError::bad(format!("invalid query: {error}")))
}

fn serde_urlencoded_parse<T: for<'de> Deserialize<'de>>(query: &str) -> Result<T, String> {
    axum::extract::Query::<T>::try_from_uri(&format!("/?{query}").parse().map_err(|_| "malformed query".to_string())?)
        .map(|Query(value)| value)
        .map_err(|rejection| rejection.body_text())
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
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::bad(rejection.body_text()))?;
        params.get("agent").cloned().map(Scope).ok_or_else(|| ApiError::bad("no agent in the path"))
    }
}

fn secret_of(headers: &HeaderMap) -> Option<String> {
    headers.get(SECRET_HEADER).and_then(|value| value.to_str().ok()).map(str::to_string)
}

/// Checks the agent's secret header; used for requests that change an agent's own state.
fn authorize_agent(state: &AppState, agent_id: &str, headers: &HeaderMap) -> Result<(), ApiError> {
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

/// The broker's own API (its Unix socket and TCP port).
pub fn broker_router(state: AppState) -> Router {
    Router::new()
        .route("/broker/health", get(health))
        .route("/openapi.json", get(openapi::document))
        .route("/broker/shutdown", post(shutdown))
        .route("/events", get(events))
        .route("/admin/rebuild", post(rebuild))
        .route("/admin/verify", post(verify))
        .route("/admin/index", get(index_progress).post(index_history))
        .route("/agents", get(list_agents).post(register))
        .route("/agents/{agent}", axum::routing::delete(deregister).post(jsonrpc::handle))
        .route("/agents/{agent}/", post(jsonrpc::handle))
        .route("/agents/{agent}/inbox", get(inbox))
        .route("/agents/{agent}/inbox/{ticket}/ack", post(ack))
        .route("/agents/{agent}/tasks/{id}/update", post(agent_tasks::update_task))
        .route("/agents/{agent}/status", get(agent_status).post(set_status))
        .route("/send", post(send))
        .route("/reply", post(reply))
        .route("/tasks/{id}", get(global_task))
        .route("/tasks/{id}/wait", get(wait_task))
        .merge(webhooks::routes())
        .merge(externals::routes())
        .merge(file_safety::routes())
        .merge(history::routes())
        .nest("/agents/{agent}", a2a_routes())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(state.auth.clone(), auth::check))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::check))
        .with_state(state)
}

/// One agent's endpoints (its port and its socket).
pub fn agent_router(state: AppState, agent_id: String) -> Router {
    a2a_routes()
        .route("/", post(jsonrpc::handle))
        .route("/status", get(agent_status))
        .fallback(not_found)
        .layer(axum::Extension(FixedAgent(agent_id)))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(state.auth.clone(), auth::check))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::check))
        .with_state(state)
}

fn a2a_routes() -> Router<AppState> {
    Router::new()
        .route("/.well-known/agent.json", get(agent_card))
        .route("/.well-known/agent-card.json", get(a2a_card::agent_card))
        .route("/tasks/send", post(tasks_send))
        .route("/tasks/send-priority", post(tasks_send_priority))
        .route("/tasks/create", post(tasks_create))
        .route("/tasks", get(tasks_list))
        .route("/tasks/{id}", get(agent_task))
        .route("/tasks/{id}/cancel", post(tasks_cancel))
        .route("/tasks/{id}/subscribe", get(subscribe::subscribe))
        .route("/reply-stack/list", get(reply_stack_list))
        .route("/reply-stack/get", get(reply_stack_get))
        .route("/reply-stack/pop", get(reply_stack_get))
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}

/// The broker's identity (the clients' version handshake) and whether it can store: 503 with
/// the same body plus the reason while its last write failed and none has succeeded since.
async fn health(State(state): State<AppState>) -> Response {
    let info = state.info();
    let status = if info.healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!(info))).into_response()
}

async fn shutdown(State(state): State<AppState>, _user: caller::TheUser) -> Json<Value> {
    // Marked before the socket closes, so a wrapper that sees the broker gone knows the stop
    // was deliberate and waits instead of autostarting a new one.
    if let Err(error) = crate::trust::mark_stopped(&state.paths.home) {
        tracing::warn!("cannot record the deliberate stop: {error}");
    }
    state.request_shutdown();
    Json(json!({"stopping": true, "pid": std::process::id()}))
}

async fn rebuild(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    let report = state.writer.rebuild().await?;
    state.index_wake.notify_one();
    Ok(Json(json!(report)))
}

async fn verify(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    Ok(Json(json!(state.writer.verify().await?)))
}

/// Where the history search index stands (the broker keeps it up in the background).
async fn index_progress(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    Ok(Json(json!(state.store.index_progress()?)))
}

/// Brings the history search index up to the newest event now.
async fn index_history(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    let store = state.store.clone();
    let progress = tokio::task::spawn_blocking(move || store.index_history())
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the indexer stopped"))??;
    Ok(Json(json!(progress)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    #[serde(default)]
    after: Option<u64>,
    #[serde(default)]
    follow: Option<bool>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// `GET /events`: the log as SSE (`id:` = sequence number); `Last-Event-ID` resumes.
async fn events(State(state): State<AppState>, headers: HeaderMap, uri: axum::http::Uri) -> Result<Response, ApiError> {
    let query: EventsQuery = parse_query(uri.query())?;
    let resume = subscribe::last_event_id(&headers)?;
    let mut cursor = resume.or(query.after).unwrap_or(0);
    let follow = query.follow.unwrap_or(false);
    let filter = tail::TailFilter {
        agent: query.agent,
        kinds: query
            .kind
            .map(|kinds| kinds.split(',').map(|k| k.trim().to_string()).filter(|k| !k.is_empty()).collect())
            .unwrap_or_default(),
    };
    // One chunk per batch of events, each event's SSE text made once for every subscriber:
    // with a thousand subscribers, per-event formatting and writes were the bottleneck.
    let stream = async_stream::stream! {
        loop {
            let batch = match tokio::time::timeout(SSE_KEEP_ALIVE, tail::next_batch(&state, cursor, follow)).await {
                Ok(batch) => batch,
                Err(_) => {
                    yield Ok::<_, Infallible>(Bytes::from_static(b":\n\n"));
                    continue;
                }
            };
            match batch {
                Ok(batch) if batch.is_empty() => break,
                Ok(batch) => {
                    let mut chunk = String::new();
                    for envelope in batch {
                        cursor = envelope.seq;
                        if filter.matches(&envelope) {
                            chunk.push_str(envelope.sse_frame());
                        }
                    }
                    if !chunk.is_empty() {
                        yield Ok(Bytes::from(chunk));
                    }
                }
                Err(tail::TailEnd::Shutdown) => break,
                Err(tail::TailEnd::Failed(message)) => {
                    yield Ok(Bytes::from(format!("event: error\ndata: {}\n\n", message.replace('\n', " "))));
                    break;
                }
            }
        }
    };
    Ok(Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "text/event-stream")
        .header(axum::http::header::CACHE_CONTROL, "no-cache")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_else(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cannot stream").into_response()))
}

/// How often an idle event stream sends a comment, so proxies and clients keep it open.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

async fn list_agents(State(state): State<AppState>) -> ApiResult {
    let paths = state.paths.clone();
    let agents = state.store.read(|view| {
        let mut list = Vec::new();
        for agent in view.agents()? {
            let depth = view.inbox_depth(&agent.agent_id)?;
            let current = view.current_task(&agent.agent_id)?;
            let socket = paths.agent_socket(&agent.agent_id).display().to_string();
            list.push(wire::agent_json(&agent, &socket, depth, current.as_ref()));
        }
        Ok(list)
    })?;
    Ok(Json(json!({"agents": agents})))
}

/// `POST /agents`: only over the Unix socket (the kernel names the peer process) or with the
/// admin key; see [`agent_endpoints::register`] for which pids a peer may register.
async fn register(
    State(state): State<AppState>,
    proof: caller::RegistrationProof,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: agents::RegisterBody = parse_body(body)?;
    let registration = agent_endpoints::register(&state, body, proof).await?;
    Ok(Json(json!(registration)))
}

async fn deregister(State(state): State<AppState>, Scope(agent): Scope, headers: HeaderMap) -> ApiResult {
    authorize_agent(&state, &agent, &headers)?;
    agents::deregister(&state, &agent, "deregistered").await?;
    Ok(Json(json!({"deregistered": agent})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusBody {
    status: String,
    /// Why the agent takes no message now (shown by `synapse list`); absent clears it.
    #[serde(default)]
    note: Option<String>,
}

async fn set_status(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: StatusBody = parse_body(body)?;
    let status: AgentStatus = body.status.parse().map_err(ApiError::bad)?;
    authorize_agent(&state, &agent, &headers)?;
    let outcome = state
        .writer
        .submit(Command::SetStatus {
            agent_id: agent,
            status,
            note: body.note.filter(|note| !note.is_empty()).map(|note| crate::event::preview(&note, 200)),
        })
        .await?;
    Ok(Json(json!(outcome)))
}

async fn agent_status(State(state): State<AppState>, Scope(agent): Scope) -> ApiResult {
    let (record, depth) = state.store.read(|view| Ok((view.agent(&agent)?, view.inbox_depth(&agent)?)))?;
    let record = record.ok_or_else(|| ApiError::not_found(format!("Agent '{agent}' is not registered")))?;
    Ok(Json(json!({
        "agent_id": record.agent_id,
        "status": record.status,
        "status_note": record.status_note,
        "queue_depth": depth,
        "since": crate::time::rfc3339(record.status_ms),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InboxQuery {
    #[serde(default)]
    wait_ms: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /agents/{agent}/inbox`: the tickets still to be written, in delivery order, with their
/// text. With `wait_ms`, an empty inbox is long-polled until a ticket arrives.
async fn inbox(
    State(state): State<AppState>,
    Scope(agent): Scope,
    caller: caller::Caller,
    uri: axum::http::Uri,
) -> ApiResult {
    let query: InboxQuery = parse_query(uri.query())?;
    // An inbox holds other agents' words to this one: only it, or the user, reads it.
    caller.require_act_as(&agent, "read the inbox")?;
    let limit = query.limit.unwrap_or(100).clamp(1, 10_000);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(query.wait_ms.unwrap_or(0)).min(MAX_WAIT);
    loop {
        let cursor = *state.head.borrow();
        let tickets = state.store.read(|view| {
            let mut tickets = Vec::new();
            for ticket in view.inbox(&agent, limit)? {
                let text = match ticket.kind {
                    crate::store::TicketKind::Message => {
                        view.task(&ticket.task_id)?.map(|task| task.message.joined_text())
                    }
                    crate::store::TicketKind::Reply => {
                        view.task(&ticket.task_id)?.and_then(|task| wire::reply_text(&task))
                    }
                };
                tickets.push(json!({
                    "ticket": ticket.ticket,
                    "kind": ticket.kind,
                    "task_id": ticket.task_id,
                    "display_task_id": ticket.display_task_id,
                    "from": ticket.from,
                    "priority": ticket.priority,
                    "response_expected": ticket.response_expected,
                    "prefix": wire::ticket_prefix(&ticket),
                    "text": text.unwrap_or_default(),
                    "issued_at": crate::time::rfc3339(ticket.issued_ms),
                }));
            }
            Ok(tickets)
        })?;
        if !tickets.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(json!({"agent_id": agent, "tickets": tickets})));
        }
        match tokio::time::timeout_at(deadline, tail::wait_past(&state, cursor)).await {
            Ok(true) => continue,
            _ => return Ok(Json(json!({"agent_id": agent, "tickets": []}))),
        }
    }
}

async fn ack(
    State(state): State<AppState>,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    let agent = params.get("agent").cloned().unwrap_or_default();
    let ticket: u64 = params
        .get("ticket")
        .and_then(|ticket| ticket.parse().ok())
        .ok_or_else(|| ApiError::bad("the ticket must be a number"))?;
    authorize_agent(&state, &agent, &headers)?;
    let outcome = state.writer.submit(Command::AckInjection { agent_id: agent, ticket }).await?;
    Ok(Json(json!(outcome)))
}

fn sent_json(outcome: Outcome) -> ApiResult {
    match outcome {
        Outcome::Sent(sent) => Ok(Json(json!({
            "task": wire::task_json(&sent.task),
            "sender_task": sent.sender_task.as_ref().map(wire::task_json),
            "is_reply": sent.is_reply,
            "warning": sent.warning,
            "seq": sent.seq,
        }))),
        other => Ok(Json(json!(other))),
    }
}

/// The `Idempotency-Key` header of a send, if any.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|key| Some(key.trim().to_string()))
            .map_err(|_| ApiError::bad("the Idempotency-Key header must be visible ASCII")),
    }
}

/// `POST /send`: what `synapse send` uses (target resolution by name, id, type-port or type).
async fn send(
    State(state): State<AppState>,
    caller: caller::Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let mut request: SendRequest = parse_body(body)?;
    request.by_user = caller.is_user();
    if let Some(key) = idempotency_key(&headers)? {
        request.idempotency_key = Some(key);
    }
    sent_json(state.writer.submit(Command::Send(request)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyBody {
    from: String,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    to: Option<String>,
    text: String,
}

/// `POST /reply`: answer the agent's most recent reply target (or the one from `to`); which
/// one is decided by the writer ([`Command::Reply`]).
async fn reply(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let body: ReplyBody = parse_body(body)?;
    let request = command::ReplyRequest { from: body.from, secret: body.secret, to: body.to, text: body.text };
    sent_json(state.writer.submit(Command::Reply(request)).await?)
}

fn find_task_global(state: &AppState, reference: &str) -> Result<TaskRecord, ApiError> {
    let reference = command::validate_task_ref(reference)?;
    let candidates = state.store.read(|view| view.tasks_with_prefix(&reference, 11))?;
    command::unique_task(&reference, candidates)?
        .ok_or_else(|| ApiError::not_found(format!("Task {reference} not found")))
}

async fn global_task(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    Ok(Json(json!({"task": wire::task_json(&find_task_global(&state, &id)?)})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// `GET /tasks/{id}/wait`: answers when the task reaches a final state (following the log's
/// head, not polling) or when the timeout passes (`timed_out: true`).
async fn wait_task(State(state): State<AppState>, Path(id): Path<String>, uri: axum::http::Uri) -> ApiResult {
    let query: WaitQuery = parse_query(uri.query())?;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(query.timeout_ms.unwrap_or(60_000)).min(MAX_WAIT);
    let task_id = find_task_global(&state, &id)?.id;
    loop {
        let cursor = *state.head.borrow();
        let task = state
            .store
            .read(|view| view.task(&task_id))?
            .ok_or_else(|| ApiError::not_found(format!("Task {task_id} not found")))?;
        if task.state.is_final() {
            return Ok(Json(
                json!({"task": wire::task_json(&task), "reply": wire::reply_text(&task), "timed_out": false}),
            ));
        }
        match tokio::time::timeout_at(deadline, tail::wait_past(&state, cursor)).await {
            Ok(true) => continue,
            Ok(false) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the broker is shutting down")),
            Err(_) => return Ok(Json(json!({"task": wire::task_json(&task), "reply": null, "timed_out": true}))),
        }
    }
}

// ---- A2A REST endpoints (seed 003) ----

async fn agent_card(State(state): State<AppState>, Scope(agent): Scope) -> ApiResult {
    let record = state
        .store
        .read(|view| view.agent(&agent))?
        .ok_or_else(|| ApiError::not_found(format!("Agent '{agent}' is not registered")))?;
    Ok(Json(json!({
        "name": record.name.clone().unwrap_or_else(|| record.agent_id.clone()),
        "description": format!("{} agent managed by Synapse{}", record.agent_type, record.role.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()),
        "url": format!("http://127.0.0.1:{}", record.port),
        "version": crate::broker::VERSION,
        "capabilities": {"streaming": false, "pushNotifications": false},
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
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct A2aSendBody {
    message: A2aMessage,
    #[serde(default)]
    metadata: Option<A2aMetadata>,
    #[serde(default)]
    context_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct A2aMessage {
    #[serde(default)]
    role: Option<Role>,
    parts: Vec<A2aPart>,
    #[serde(default, rename = "messageId")]
    _message_id: Option<String>,
}

#[derive(Deserialize)]
struct A2aPart {
    #[serde(rename = "type", alias = "kind")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize, Default)]
struct A2aMetadata {
    #[serde(default)]
    sender: Option<A2aSender>,
    #[serde(default)]
    response_expected: Option<bool>,
    #[serde(default)]
    in_reply_to: Option<String>,
    #[serde(default)]
    sender_task_id: Option<String>,
}

#[derive(Deserialize, Default)]
struct A2aSender {
    #[serde(default)]
    sender_id: Option<String>,
}

impl A2aMessage {
    fn text(&self) -> Result<String, ApiError> {
        let mut texts = Vec::new();
        for part in &self.parts {
            match (part.kind.as_str(), &part.text) {
                ("text", Some(text)) => texts.push(text.as_str()),
                ("text", None) => return Err(ApiError::bad("a text part needs a 'text' field")),
                (other, _) => {
                    return Err(ApiError::bad(format!(
                        "unsupported part type '{other}' (only text parts are written into a CLI)"
                    )));
                }
            }
        }
        Ok(texts.join("\n"))
    }
}

async fn tasks_send(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    a2a_send(&state, agent, &headers, body, command::default_priority()).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityQuery {
    priority: Option<String>,
}

async fn tasks_send_priority(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let query: PriorityQuery = parse_query(uri.query())?;
    let priority = match query.priority {
        None => command::default_priority(),
        Some(text) => match text.trim().parse::<u8>() {
            Ok(priority) if (1..=5).contains(&priority) => priority,
            _ => return Err(ApiError::bad(format!("priority must be between 1 and 5 (got '{text}')"))),
        },
    };
    a2a_send(&state, agent, &headers, body, priority).await
}

async fn a2a_send(
    state: &AppState,
    agent: String,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    priority: u8,
) -> ApiResult {
    let body: A2aSendBody = parse_body(body)?;
    let text = body.message.text()?;
    let metadata = body.metadata.unwrap_or_default();
    let from = metadata.sender.and_then(|sender| sender.sender_id);
    let request = SendRequest {
        to: agent,
        secret: if from.is_some() { secret_of(headers) } else { None },
        from,
        text,
        priority,
        response_expected: metadata.response_expected.unwrap_or(false),
        reply_to: metadata.in_reply_to,
        sender_task_id: metadata.sender_task_id,
        context_id: body.context_id,
        idempotency_key: idempotency_key(headers)?,
        by_user: false,
    };
    sent_json(state.writer.submit(Command::Send(request)).await?)
}

async fn tasks_create(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: A2aSendBody = parse_body(body)?;
    let text = body.message.text()?;
    let message = Message { role: body.message.role.unwrap_or(Role::User), parts: vec![Part::Text { text }] };
    let outcome = state
        .writer
        .submit(Command::CreateTask { owner: agent, secret: secret_of(&headers), message, peer: None })
        .await?;
    match outcome {
        Outcome::Task { task } => Ok(Json(json!({"task": wire::task_json(&task)}))),
        other => Ok(Json(json!(other))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TasksQuery {
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    state: Option<String>,
}

async fn tasks_list(State(state): State<AppState>, Scope(agent): Scope, uri: axum::http::Uri) -> ApiResult {
    let query: TasksQuery = parse_query(uri.query())?;
    let wanted_state: Option<TaskState> = query.state.as_deref().map(str::parse).transpose().map_err(ApiError::bad)?;
    let mut tasks: Vec<TaskRecord> = state
        .store
        .read(|view| view.tasks_of(&agent, TaskIndexKind::Owned))?
        .into_iter()
        .filter(|task| query.context_id.as_ref().is_none_or(|context| &task.context_id == context))
        .filter(|task| wanted_state.is_none_or(|wanted| task.state == wanted))
        .collect();
    // The order of a scan of every task, sorted stably by creation: by time, then by id.
    tasks.sort_by(|left, right| left.created_ms.cmp(&right.created_ms).then_with(|| left.id.cmp(&right.id)));
    Ok(Json(json!({"tasks": tasks.iter().map(wire::task_json).collect::<Vec<_>>()})))
}

fn find_agent_task(state: &AppState, agent: &str, reference: &str) -> Result<TaskRecord, ApiError> {
    let reference = command::validate_task_ref(reference)?;
    let candidates: Vec<TaskRecord> = state
        .store
        .read(|view| view.tasks_with_prefix(&reference, usize::MAX))?
        .into_iter()
        .filter(|task| task.owner.as_deref() == Some(agent))
        .collect();
    command::unique_task(&reference, candidates)?
        .ok_or_else(|| ApiError::not_found(format!("Task {reference} not found")))
}

async fn agent_task(
    State(state): State<AppState>,
    Scope(agent): Scope,
    Path(params): Path<HashMap<String, String>>,
) -> ApiResult {
    let id = params.get("id").cloned().unwrap_or_default();
    Ok(Json(json!({"task": wire::task_json(&find_agent_task(&state, &agent, &id)?)})))
}

async fn tasks_cancel(
    State(state): State<AppState>,
    Scope(agent): Scope,
    caller: caller::Caller,
    Path(params): Path<HashMap<String, String>>,
) -> ApiResult {
    let id = params.get("id").cloned().unwrap_or_default();
    let task = find_agent_task(&state, &agent, &id)?;
    let cancel = Command::CancelTask { task_id: task.id, reason: Some("canceled".into()), actor: caller.actor() };
    match state.writer.submit(cancel).await? {
        Outcome::Task { task } => Ok(Json(json!({"task": wire::task_json(&task)}))),
        other => Ok(Json(json!(other))),
    }
}

fn target_json(target: &crate::store::ReplyTarget) -> Value {
    json!({
        "sender_id": target.sender_id,
        "sender_task_id": target.sender_task_id,
        "task_id": target.receiver_task_id,
        "received_at": crate::time::rfc3339(target.received_ms),
        "preview": target.preview,
    })
}

async fn reply_stack_list(State(state): State<AppState>, Scope(agent): Scope) -> ApiResult {
    let targets = state.store.read(|view| view.reply_targets(&agent))?;
    Ok(Json(json!({"targets": targets.iter().map(target_json).collect::<Vec<_>>()})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyStackQuery {
    #[serde(default)]
    sender_id: Option<String>,
}

/// `get` and `pop` both answer the newest target (or the one from `sender_id`); the target
/// leaves the stack when the reply is posted, as an event, so a pop that is never followed by a
/// reply loses nothing.
async fn reply_stack_get(State(state): State<AppState>, Scope(agent): Scope, uri: axum::http::Uri) -> ApiResult {
    let query: ReplyStackQuery = parse_query(uri.query())?;
    let targets = state.store.read(|view| view.reply_targets(&agent))?;
    let target = match &query.sender_id {
        Some(sender) => targets.iter().rev().find(|target| &target.sender_id == sender),
        None => targets.last(),
    };
    target.map(|target| Json(target_json(target))).ok_or_else(|| ApiError::not_found("No reply target"))
}
