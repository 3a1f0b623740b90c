//! The broker's own API (REST, on its Unix socket and TCP port): health, shutdown and admin,
//! the event stream, agents (registration, status, inbox), send and reply, tasks by id.
//!
//! Thin by rule: a handler parses the [`crate::api`] request, checks who asks, maps it to a
//! broker [`Command`] (or a store query) and writes the answer as its `api` type; every choice
//! (target, reply target, task state) is the writer's. Long polls and streams follow the log's
//! head and end on broker shutdown.

use super::error::{ApiError, ApiResult, answer};
use super::extract::{Path, Scope, authorize_agent, idempotency_key, parse_body, parse_query};
use super::{AppState, MAX_WAIT, agent_endpoints, caller, subscribe, wire};
use crate::api;
use crate::broker::command::{self, Command, Outcome};
use crate::broker::{agents, tail};
use crate::store::TaskRecord;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

/// The broker's identity (the clients' version handshake) and whether it can store: 503 with
/// the same body plus the reason while its last write failed and none has succeeded since.
/// Over a connection not known to be the user's (another user's process, another machine)
/// and without the admin key, it says only whether it is healthy and its version: not where
/// the user's home is, nor its pid.
pub async fn health(State(state): State<AppState>, extensions: axum::http::Extensions, headers: HeaderMap) -> Response {
    let info = state.info();
    let status = if info.healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let answered = if caller::the_users_connection(&extensions) || caller::has_admin_key(&state, &headers) {
        answer(&info)
    } else {
        answer(&api::BrokerHealth { version: info.version, schema: info.schema, healthy: info.healthy })
    };
    match answered {
        Ok(body) => (status, body).into_response(),
        Err(error) => error.into_response(),
    }
}

pub async fn shutdown(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    // Marked before the socket closes, so a wrapper that sees the broker gone knows the stop
    // was deliberate and waits instead of autostarting a new one.
    if let Err(error) = crate::trust::mark_stopped(&state.paths.home) {
        tracing::warn!("cannot record the deliberate stop: {error}");
    }
    state.request_shutdown();
    answer(&api::Stopping { stopping: true, pid: std::process::id() })
}

pub async fn rebuild(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    let report = state.writer.rebuild().await?;
    state.index_wake.notify_one();
    answer(&api::RebuildReport { events: report.events, elapsed_ms: report.elapsed_ms })
}

pub async fn verify(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    let report = state.writer.verify().await?;
    answer(&api::VerifyReport { events: report.events, differences: report.differences })
}

fn index_progress_answer(progress: crate::store::search_index::IndexProgress) -> ApiResult {
    answer(&api::IndexProgress {
        indexed_through: progress.indexed_through,
        head: progress.head,
        segments: progress.segments,
    })
}

/// Where the history search index stands (the broker keeps it up in the background).
pub async fn index_progress(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    index_progress_answer(state.store.index_progress()?)
}

/// Brings the history search index up to the newest event now.
pub async fn index_history(State(state): State<AppState>, _user: caller::TheUser) -> ApiResult {
    let store = state.store.clone();
    let progress = tokio::task::spawn_blocking(move || {
        let progress = store.index_history();
        crate::process::release_free_memory();
        progress
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the indexer stopped"))??;
    // Its last step was committed without an fsync.
    state.writer.index_stepped();
    if !progress.caught_up() && state.store.indexing_stopped() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the broker is stopping: the history index stopped at event {} of {}; the next broker goes on from there (searches read the log meanwhile)",
                progress.indexed_through, progress.head
            ),
        ));
    }
    index_progress_answer(progress)
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
    /// The dashboard's stream token (checked by authentication, see `auth::check`).
    #[serde(default, rename = "token")]
    _token: Option<String>,
}

/// `GET /events`: the log as SSE (`id:` = sequence number); `Last-Event-ID` resumes.
pub async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let query: EventsQuery = parse_query(uri.query())?;
    let resume = subscribe::last_event_id(&headers)?;
    let mut cursor = resume.or(query.after).unwrap_or(0);
    let follow = query.follow.unwrap_or(false);
    let kinds: Vec<String> = query
        .kind
        .map(|kinds| kinds.split(',').map(|k| k.trim().to_string()).filter(|k| !k.is_empty()).collect())
        .unwrap_or_default();
    // A misspelt kind matched nothing, silently: an empty answer, or a stream that never spoke.
    if let Some(unknown) = kinds.iter().find(|kind| !crate::event::Event::KINDS.contains(&kind.as_str())) {
        return Err(ApiError::bad(format!(
            "unknown event kind '{}'; the kinds are: {}",
            crate::escape::visible_line(unknown),
            crate::event::Event::KINDS.join(", ")
        )));
    }
    let filter = tail::TailFilter { agent: super::extract::agent_filter(&state, query.agent)?, kinds };
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
                    if chunk.is_empty() {
                        // Nothing matched: the next batch waits its turn behind the others.
                        tokio::task::yield_now().await;
                    } else {
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

pub async fn list_agents(State(state): State<AppState>) -> ApiResult {
    let agents = agent_views(&state)?.into_iter().map(|(_, view)| view).collect();
    answer(&api::AgentList { agents })
}

/// Every registered agent with its view as `GET /agents` shows it (queue depth, current task,
/// socket), read in one transaction.
pub fn agent_views(state: &AppState) -> Result<Vec<(crate::store::AgentRecord, api::AgentView)>, ApiError> {
    let paths = &state.paths;
    Ok(state.store.read(|view| {
        let mut list = Vec::new();
        for agent in view.agents()? {
            let depth = view.inbox_depth(&agent.agent_id)?;
            let current = view.current_task(&agent.agent_id)?;
            let socket = paths.agent_socket(&agent.agent_id).display().to_string();
            let shown = wire::agent(&agent, &socket, depth, current.as_ref());
            list.push((agent, shown));
        }
        Ok(list)
    })?)
}

/// `POST /agents`: only over the Unix socket (the kernel names the peer process) or with the
/// admin key; see [`agent_endpoints::register`] for which pids a peer may register.
pub async fn register(
    State(state): State<AppState>,
    proof: caller::RegistrationProof,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request: api::RegisterRequest = parse_body(body)?;
    let registration = agent_endpoints::register(&state, request, proof).await?;
    answer(&api::Registration {
        agent: wire::registered_agent(&registration.agent),
        secret: registration.secret,
        socket: registration.socket,
        endpoint: registration.endpoint,
    })
}

pub async fn deregister(State(state): State<AppState>, Scope(agent): Scope, headers: HeaderMap) -> ApiResult {
    authorize_agent(&state, &agent, &headers)?;
    agents::deregister(&state, &agent, "deregistered", None).await?;
    answer(&api::Deregistered { deregistered: agent })
}

/// A status report or an acknowledgement, as the writer answered it.
fn outcome_answer(outcome: Outcome) -> ApiResult {
    match outcome {
        Outcome::StatusSet { changed } => answer(&api::Outcome::StatusSet { changed }),
        Outcome::Injected { ticket } => answer(&api::Outcome::Injected { ticket }),
        _ => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer")),
    }
}

pub async fn set_status(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let update: api::StatusUpdate = parse_body(body)?;
    authorize_agent(&state, &agent, &headers)?;
    let outcome = state
        .writer
        .submit(Command::SetStatus {
            agent_id: agent,
            status: update.status,
            note: update.note.filter(|note| !note.is_empty()).map(|note| crate::event::preview(&note, 200)),
        })
        .await?;
    outcome_answer(outcome)
}

pub async fn agent_status(State(state): State<AppState>, Scope(agent): Scope) -> ApiResult {
    // By id, name or type, as a send names its target and the agent's other routes are read.
    let agent = super::extract::agent_id(&state, &agent)?;
    let (record, depth) = state.store.read(|view| Ok((view.agent(&agent)?, view.inbox_depth(&agent)?)))?;
    let record = record.ok_or_else(|| ApiError::not_found(format!("Agent '{agent}' is not registered")))?;
    answer(&api::AgentStatusView {
        agent_id: record.agent_id,
        status: record.status,
        status_note: record.status_note,
        queue_depth: depth,
        since: crate::time::rfc3339(record.status_ms),
    })
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
pub async fn inbox(
    State(state): State<AppState>,
    Scope(agent): Scope,
    caller: caller::Caller,
    uri: axum::http::Uri,
) -> ApiResult {
    let query: InboxQuery = parse_query(uri.query())?;
    // An inbox holds other agents' words to this one: only it, or the user, reads it.
    caller.require_act_as(&agent, "read the inbox")?;
    let limit = ticket_limit(query.limit);
    let wait = Duration::from_millis(query.wait_ms.unwrap_or(0)).min(MAX_WAIT);
    answer(&inbox_within(&state, agent, limit, wait).await?)
}

/// How many tickets an inbox answer holds: `limit`, 1..10,000, 100 when not given.
fn ticket_limit(limit: Option<usize>) -> usize {
    limit.unwrap_or(100).clamp(1, 10_000)
}

/// The first `limit` tickets of `agent`'s inbox; an empty inbox is watched for `wait`.
async fn inbox_within(state: &AppState, agent: String, limit: usize, wait: Duration) -> Result<api::Inbox, ApiError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let cursor = *state.head.borrow();
        let tickets = inbox_tickets(state, &agent, limit)?;
        if !tickets.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(api::Inbox { agent_id: agent, tickets });
        }
        match tokio::time::timeout_at(deadline, tail::wait_past(state, cursor)).await {
            Ok(true) => continue,
            _ => return Ok(api::Inbox { agent_id: agent, tickets: Vec::new() }),
        }
    }
}

/// The first `limit` tickets of `agent`'s inbox as stored now, with their texts.
fn inbox_tickets(state: &AppState, agent: &str, limit: usize) -> Result<Vec<api::InboxTicket>, ApiError> {
    Ok(state.store.read(|view| {
        let mut tickets = Vec::new();
        for ticket in view.inbox(agent, limit)? {
            let text = match ticket.kind {
                // A follow-up's ticket writes that follow-up, not the task's first message.
                crate::store::TicketKind::Message => view.task(&ticket.task_id)?.map(|task| {
                    match ticket.turn.checked_sub(1).and_then(|index| task.follow_ups.get(index as usize)) {
                        Some(follow_up) => follow_up.message.joined_text(),
                        None => task.message.joined_text(),
                    }
                }),
                crate::store::TicketKind::Reply => match view.task(&ticket.task_id)? {
                    // A reverse ticket for the agent's own received task: it was canceled.
                    Some(task) if task.direction == crate::event::Direction::Incoming => {
                        tickets.push(wire::cancel_notice(&ticket, &task));
                        continue;
                    }
                    task => task.map(|task| wire::answer_text(&task)),
                },
            };
            tickets.push(wire::inbox_ticket(&ticket, text.unwrap_or_default()));
        }
        Ok(tickets)
    })?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckQuery {
    /// Answer with the inbox as it stands once the acknowledgement is stored.
    #[serde(default)]
    next: bool,
    /// How many of those tickets (with `next`).
    #[serde(default)]
    limit: Option<usize>,
    /// How the ticket reached the CLI: `typed`, `handed_over` or `unwritten`.
    #[serde(default)]
    how: Option<crate::event::Delivery>,
}

/// `POST /agents/{agent}/inbox/{ticket}/ack[?next=true[&limit=N]][&how=H]`: the ticket was
/// written (the agent's secret), `how` it reached the CLI (see [`crate::event::Delivery`]).
/// With `next`, the answer also carries the inbox read right after the acknowledgement was
/// stored ([`api::AckAndInbox`]).
pub async fn ack(
    State(state): State<AppState>,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> ApiResult {
    let query: AckQuery = parse_query(uri.query())?;
    if query.limit.is_some() && !query.next {
        return Err(ApiError::bad("limit applies only with next=true"));
    }
    let agent = params.get("agent").cloned().unwrap_or_default();
    let ticket: u64 = params
        .get("ticket")
        .and_then(|ticket| ticket.parse().ok())
        .ok_or_else(|| ApiError::bad("the ticket must be a number"))?;
    authorize_agent(&state, &agent, &headers)?;
    let outcome =
        state.writer.submit(Command::AckInjection { agent_id: agent.clone(), ticket, how: query.how }).await?;
    if !query.next {
        return outcome_answer(outcome);
    }
    let Outcome::Injected { ticket } = outcome else {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer"));
    };
    let limit = ticket_limit(query.limit);
    let inbox = inbox_within(&state, agent, limit, Duration::ZERO).await?;
    answer(&api::AckAndInbox { ticket, inbox })
}

/// The answer to a send or a reply.
pub(super) fn sent_answer(outcome: Outcome) -> ApiResult {
    match outcome {
        Outcome::Sent(sent) => answer(&wire::sent(&sent)),
        _ => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer")),
    }
}

/// The broker's send request for an `api` send: the body as it came, and what only the broker
/// proves (whether the user sent it).
pub(super) fn send_command(request: api::SendRequest, by_user: bool) -> Command {
    Command::Send(command::SendRequest {
        to: request.to,
        from: request.from,
        secret: request.secret,
        text: request.text,
        priority: request.priority,
        response_expected: request.response_expected,
        reply_to: request.reply_to,
        context_id: request.context_id,
        sender_task_id: request.sender_task_id,
        idempotency_key: request.idempotency_key,
        by_user,
        message_id: None,
        unverified_sender: None,
    })
}

/// `POST /send`: what `synapse send` uses (target resolution by name, id, type-port or type).
pub async fn send(
    State(state): State<AppState>,
    caller: caller::Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let mut request: api::SendRequest = parse_body(body)?;
    if let Some(key) = idempotency_key(&headers)? {
        request.idempotency_key = Some(key);
    }
    sent_answer(state.writer.submit(send_command(request, caller.is_user())).await?)
}

/// `POST /reply`: answer the agent's most recent reply target (or the one from `to`); which
/// one is decided by the writer ([`Command::Reply`]).
pub async fn reply(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let request: api::ReplyRequest = parse_body(body)?;
    let request = command::ReplyRequest {
        from: request.from,
        secret: request.secret,
        to: request.to,
        text: request.text,
        idempotency_key: request.idempotency_key,
    };
    sent_answer(state.writer.submit(Command::Reply(request)).await?)
}

fn find_task_global(state: &AppState, reference: &str) -> Result<TaskRecord, ApiError> {
    let reference = command::validate_task_ref(reference)?;
    let candidates = state.store.read(|view| view.tasks_with_prefix(&reference, 11))?;
    command::unique_task(&reference, candidates)?
        .ok_or_else(|| ApiError::not_found(format!("Task {reference} not found")))
}

pub async fn global_task(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    answer(&wire::task_answer(&find_task_global(&state, &id)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// `GET /tasks/{id}/wait`: answers when the task reaches a final state (following the log's
/// head, not polling) or when the timeout passes (`timed_out: true`).
pub async fn wait_task(State(state): State<AppState>, Path(id): Path<String>, uri: axum::http::Uri) -> ApiResult {
    let query: WaitQuery = parse_query(uri.query())?;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(query.timeout_ms.unwrap_or(60_000)).min(MAX_WAIT);
    let task_id = find_task_global(&state, &id)?.id;
    match wait_until_final(&state, &task_id, deadline).await? {
        (task, WaitEnd::Final) => {
            answer(&api::TaskWait { task: wire::task(&task), reply: wire::reply_text(&task), timed_out: false })
        }
        (task, WaitEnd::TimedOut) => answer(&api::TaskWait { task: wire::task(&task), reply: None, timed_out: true }),
        (_, WaitEnd::ShuttingDown) => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the broker is shutting down"))
        }
    }
}

/// How [`wait_until_final`] ended.
pub(super) enum WaitEnd {
    Final,
    TimedOut,
    ShuttingDown,
}

/// Follows the log's head (not polling) until the task `task_id` is in a final state, the
/// deadline passes or the broker stops; answers the task as it then is.
pub(super) async fn wait_until_final(
    state: &AppState,
    task_id: &str,
    deadline: tokio::time::Instant,
) -> Result<(TaskRecord, WaitEnd), ApiError> {
    loop {
        let cursor = *state.head.borrow();
        let task = state
            .store
            .read(|view| view.task(task_id))?
            .ok_or_else(|| ApiError::not_found(format!("Task {task_id} not found")))?;
        if task.state.is_final() {
            return Ok((task, WaitEnd::Final));
        }
        match tokio::time::timeout_at(deadline, tail::wait_past(state, cursor)).await {
            Ok(true) => continue,
            Ok(false) => return Ok((task, WaitEnd::ShuttingDown)),
            Err(_) => return Ok((task, WaitEnd::TimedOut)),
        }
    }
}
