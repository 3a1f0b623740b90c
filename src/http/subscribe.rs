//! Task subscriptions: one task's status changes and artifacts, read from the log.
//!
//! [`task_changes`] is the one tail both `GET /tasks/{id}/subscribe` (SSE, Synapse shapes) and
//! the A2A JSON-RPC streams (`SendStreamingMessage`, `SubscribeToTask`) follow. It reads the log
//! from a cursor, keeps the events about one task, and ends after the task's final state or on
//! broker shutdown. Invariants:
//! - Each change carries the sequence number of the event it comes from; a client resuming with
//!   `Last-Event-ID: <seq>` gets exactly the changes after it (the tail has no gap, no repeat).
//! - Catch-up starts at the task's `task_created` event: found by a binary search on the log's
//!   time and then confirmed by finding the event itself, so a clock that went backwards costs
//!   a longer scan, never a missed event.

use super::extract::Path;
use super::{ApiError, AppState, FixedAgent, Scope, wire};
use crate::broker::command::{self, CommandError};
use crate::broker::tail::{self, TailEnd};
use crate::event::{Artifact, Event, TaskState};
use crate::store::TaskRecord;
use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;
use tokio_stream::Stream;

/// One change of a task, as recorded by one event.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskChange {
    /// Sequence number of the event.
    pub seq: u64,
    pub time_ms: u64,
    pub state: TaskState,
    /// Artifacts added by this change.
    pub artifacts: Vec<Artifact>,
    pub error: Option<String>,
    /// True for the event that created the task.
    pub created: bool,
}

/// The change `envelope` makes to `task_id`, if any.
pub fn change_of(envelope: &crate::event::Envelope, task_id: &str) -> Option<TaskChange> {
    let change = |state, artifacts: &[Artifact], error: &Option<String>, created| TaskChange {
        seq: envelope.seq,
        time_ms: envelope.time_ms,
        state,
        artifacts: artifacts.to_vec(),
        error: error.clone(),
        created,
    };
    match &envelope.event {
        Event::TaskCreated { task_id: id, state, .. } if id == task_id => Some(change(*state, &[], &None, true)),
        Event::TaskStateChanged { task_id: id, state, artifacts, error, .. } if id == task_id => {
            Some(change(*state, artifacts, error, false))
        }
        Event::TaskCanceled { task_id: id, reason, .. } if id == task_id => {
            Some(change(TaskState::Canceled, &[], reason, false))
        }
        _ => None,
    }
}

/// Why a task stream ended early.
#[derive(Debug)]
pub enum StreamEnd {
    Shutdown,
    Failed(String),
}

/// The changes of `task_id` after `cursor`, live; ends after a final state (or shutdown).
/// `already_final`: the task was final when the caller read it, so its last event is in the log
/// and the stream ends once caught up (a client resuming after the final event gets nothing).
/// `served_by`: the agent whose own port serves the stream; it ends when that agent is
/// deregistered, because its server waits for open responses before it lets the port go.
pub fn task_changes(
    state: AppState,
    task_id: String,
    mut cursor: u64,
    already_final: bool,
    served_by: Option<String>,
) -> impl Stream<Item = Result<TaskChange, StreamEnd>> + Send + 'static {
    async_stream::stream! {
        loop {
            match tail::next_batch(&state, cursor, !already_final).await {
                Ok(batch) if batch.is_empty() => return,
                Ok(batch) => {
                    for envelope in batch {
                        cursor = envelope.seq;
                        if let (Some(agent), Event::AgentDeregistered { agent_id, .. }) = (&served_by, &envelope.event)
                            && agent == agent_id
                        {
                            yield Err(StreamEnd::Shutdown);
                            return;
                        }
                        if let Some(change) = change_of(&envelope, &task_id) {
                            let is_final = change.state.is_final();
                            yield Ok(change);
                            if is_final {
                                return;
                            }
                        }
                    }
                }
                Err(TailEnd::Shutdown) => {
                    yield Err(StreamEnd::Shutdown);
                    return;
                }
                Err(TailEnd::Failed(message)) => {
                    yield Err(StreamEnd::Failed(message));
                    return;
                }
            }
        }
    }
}

/// A task of `agent`: one it owns, or one an anonymous client (A2A) sent to it.
pub fn find_task_of_agent(state: &AppState, agent: &str, reference: &str) -> Result<Option<TaskRecord>, ApiError> {
    find_task_where(state, reference, |task| belongs_to(task, agent))
}

/// Most tasks an agent's endpoint reads to find one of its own by a prefix of its id: a
/// prefix of one or two characters may start a fair share of every task in the log.
pub const MAX_PREFIX_READ: usize = 10_000;

/// The one task whose id is or starts with `reference` and that `keep` accepts (an agent's
/// endpoints see their own tasks only). A prefix that more than [`MAX_PREFIX_READ`] tasks start
/// with (any agent's) is refused as too short, without reading them through, even when the
/// agent has one task under it.
pub fn find_task_where(
    state: &AppState,
    reference: &str,
    keep: impl Fn(&TaskRecord) -> bool,
) -> Result<Option<TaskRecord>, ApiError> {
    let reference = command::validate_task_ref(reference)?;
    let candidates = state.store.read(|view| view.tasks_with_prefix_where(&reference, &keep, 11, MAX_PREFIX_READ))?;
    let candidates = candidates
        .ok_or_else(|| CommandError::bad(format!("Task id prefix '{reference}' is too short: use more characters")))?;
    Ok(command::unique_task(&reference, candidates)?)
}

/// Is `task` one of `agent`'s, as its endpoints see them?
pub fn belongs_to(task: &TaskRecord, agent: &str) -> bool {
    task.owner.as_deref() == Some(agent) || (task.owner.is_none() && task.peer.as_deref() == Some(agent))
}

/// `Last-Event-ID` as a sequence number (400 when it is not one).
pub fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| ApiError::bad("Last-Event-ID must be a sequence number")),
        None => Ok(None),
    }
}

/// `GET /tasks/{id}/subscribe`: SSE of the task's changes. Each event's `id:` is the log
/// sequence number; `event:` is `status` (with the artifacts the change added) or `final` for
/// the last one, after which the stream ends. Unknown task: 404 before streaming.
pub async fn subscribe(
    State(state): State<AppState>,
    Scope(agent): Scope,
    fixed: Option<Extension<FixedAgent>>,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let reference = params.get("id").cloned().unwrap_or_default();
    let task = find_task_of_agent(&state, &agent, &reference)?
        .ok_or_else(|| ApiError::not_found(format!("Task {reference} not found")))?;
    // Just before the event that created the task: a tail from there sees its whole life.
    let from_creation = task.created_seq.saturating_sub(1);
    let cursor = match last_event_id(&headers)? {
        // Within the task's life so far: an id past the head waited for events that never come
        // (the task's end included), one before the task read the log from its start.
        Some(seq) => seq.clamp(from_creation, state.store.head()?.max(from_creation)),
        None => from_creation,
    };
    let task_id = task.id.clone();
    let served_by = fixed.map(|Extension(FixedAgent(agent))| agent);
    let changes = task_changes(state, task.id, cursor, task.state.is_final(), served_by);
    let stream = async_stream::stream! {
        tokio::pin!(changes);
        while let Some(item) = tokio_stream::StreamExt::next(&mut changes).await {
            match item {
                Ok(change) => {
                    let data = crate::api::TaskStatusEvent {
                        task_id: task_id.clone(),
                        seq: change.seq,
                        state: change.state,
                        artifacts: change.artifacts.iter().map(wire::artifact).collect(),
                        error: change.error,
                        is_final: change.state.is_final(),
                        time: crate::time::rfc3339(change.time_ms),
                    };
                    let name = if change.state.is_final() { "final" } else { "status" };
                    yield Ok(SseEvent::default().id(change.seq.to_string()).event(name).data(crate::api::json_line(&data).unwrap_or_default()));
                }
                Err(StreamEnd::Shutdown) => break,
                Err(StreamEnd::Failed(message)) => {
                    yield Ok(SseEvent::default().event("error").data(message));
                    break;
                }
            }
        }
    };
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
