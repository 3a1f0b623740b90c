//! The A2A REST endpoints of an agent (seed 003): send (with a priority), create, list, get and
//! cancel its tasks, and its reply stack; served at the root of the agent's own port and socket
//! and under `/agents/{agent}` on the broker.
//!
//! Thin by rule: the A2A body is read into its shape here, mapped to a broker [`Command`] or a
//! store query, and answered with the [`crate::api`] types (`SendAnswer`, `TaskAnswer`,
//! `TaskList`, `ReplyTargets`). An agent's tasks are read through the store's task index.

use super::broker_api::{send_command, sent_answer};
use super::error::{ApiError, ApiResult, answer};
use super::extract::{Path, ReadScope, Scope, idempotency_key, parse_body, parse_query, secret_of};
use super::{AppState, caller, wire};
use crate::api;
use crate::broker::command::{self, Command, Outcome};
use crate::event::{Message, Part, Role, TaskState};
use crate::store::{TaskIndexKind, TaskRecord};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use std::collections::HashMap;

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
pub(super) struct A2aMessage {
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
    /// The Python Synapse's way to ask for a reply: `wait` or `notify` expect one, `silent`
    /// does not (`response_expected`, when given too, decides).
    #[serde(default)]
    response_mode: Option<String>,
    #[serde(default)]
    in_reply_to: Option<String>,
    #[serde(default)]
    sender_task_id: Option<String>,
}

#[derive(Deserialize, Default)]
struct A2aSender {
    #[serde(default)]
    sender_id: Option<String>,
    /// Where the sender itself answers (a Python Synapse agent's endpoint).
    #[serde(default)]
    sender_endpoint: Option<String>,
}

impl A2aMessage {
    /// The text parts joined by newlines; any other part is refused (a CLI is given text).
    pub(super) fn text(&self) -> Result<String, ApiError> {
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

pub async fn tasks_send(
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

pub async fn tasks_send_priority(
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
    let sender = metadata.sender.unwrap_or_default();
    // A named sender proves itself with its secret; without one it is an unverified external
    // sender (a Python Synapse agent), shown as such and never taken for a registered agent.
    let secret = secret_of(headers);
    let (from, unverified) = match (sender.sender_id.filter(|id| !id.is_empty()), &secret) {
        (Some(id), Some(_)) => (Some(id), None),
        (Some(id), None) => {
            let task_id = metadata.sender_task_id.clone();
            (None, Some(command::UnverifiedSender { id, endpoint: sender.sender_endpoint, task_id }))
        }
        (None, _) => (None, None),
    };
    let request = api::SendRequest {
        to: agent,
        secret: if from.is_some() { secret } else { None },
        from,
        text,
        priority,
        // As the Python Synapse 0.35 decides: response_mode first, then response_expected, and
        // with neither a reply is expected ("notify").
        response_expected: match (metadata.response_mode.as_deref(), metadata.response_expected) {
            (Some("wait" | "notify"), _) => true,
            (Some("silent"), _) => false,
            (Some(other), _) => {
                return Err(ApiError::bad(format!(
                    "metadata.response_mode must be wait, notify or silent (got '{other}')"
                )));
            }
            (None, Some(expected)) => expected,
            (None, None) => true,
        },
        reply_to: metadata.in_reply_to,
        // An unverified sender's task lives on its own server, not here.
        sender_task_id: if unverified.is_some() { None } else { metadata.sender_task_id },
        context_id: body.context_id,
        idempotency_key: idempotency_key(headers)?,
    };
    let mut command = send_command(request, false);
    if let Command::Send(send) = &mut command {
        send.unverified_sender = unverified;
    }
    sent_answer(state.writer.submit(command).await?)
}

pub async fn tasks_create(
    State(state): State<AppState>,
    Scope(agent): Scope,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: A2aSendBody = parse_body(body)?;
    let text = body.message.text()?;
    let message =
        Message { role: body.message.role.unwrap_or(Role::User), parts: vec![Part::Text { text }], message_id: None };
    let outcome = state
        .writer
        .submit(Command::CreateTask { owner: agent, secret: secret_of(&headers), message, peer: None })
        .await?;
    task_outcome(outcome)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TasksQuery {
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    state: Option<String>,
}

pub async fn tasks_list(State(state): State<AppState>, Scope(agent): Scope, uri: axum::http::Uri) -> ApiResult {
    let query: TasksQuery = parse_query(uri.query())?;
    let wanted_state: Option<TaskState> = query.state.as_deref().map(str::parse).transpose().map_err(ApiError::bad)?;
    let scope = ReadScope::of(&state, &agent)?;
    // Every task of the agent, texts and all: read on a blocking thread (two such reads at a
    // time), not on the thread that serves the broker's Unix socket, which it held for seconds.
    let owner = scope.agent_id.clone();
    let owned =
        super::long_read(&state, move |store| Ok(store.read(|view| view.tasks_of(&owner, TaskIndexKind::Owned))?))
            .await?;
    if owned.is_empty() && !scope.registered {
        return Err(scope.unknown());
    }
    let mut tasks: Vec<TaskRecord> = owned
        .into_iter()
        .filter(|task| query.context_id.as_ref().is_none_or(|context| &task.context_id == context))
        .filter(|task| wanted_state.is_none_or(|wanted| task.state == wanted))
        .collect();
    // Oldest first: the index gives them in the order they were created, and a stable sort by
    // creation time keeps that order within a millisecond.
    tasks.sort_by_key(|task| task.created_ms);
    answer(&api::TaskList { tasks: tasks.iter().map(wire::task).collect() })
}

fn find_agent_task(state: &AppState, agent: &str, reference: &str) -> Result<TaskRecord, ApiError> {
    let reference = command::validate_task_ref(reference)?;
    let scope = ReadScope::of(state, agent)?;
    let agent = scope.agent_id.as_str();
    match super::subscribe::find_task_where(state, &reference, |task| task.owner.as_deref() == Some(agent))? {
        Some(task) => Ok(task),
        None if !scope.registered => Err(scope.unknown()),
        None => Err(ApiError::not_found(format!("Task {reference} not found"))),
    }
}

pub async fn agent_task(
    State(state): State<AppState>,
    Scope(agent): Scope,
    Path(params): Path<HashMap<String, String>>,
) -> ApiResult {
    let id = params.get("id").cloned().unwrap_or_default();
    let task = wire::task(&find_agent_task(&state, &agent, &id)?);
    answer(&api::AgentTaskAnswer { top_level: task.clone(), task })
}

pub async fn tasks_cancel(
    State(state): State<AppState>,
    Scope(agent): Scope,
    caller: caller::Caller,
    Path(params): Path<HashMap<String, String>>,
) -> ApiResult {
    let id = params.get("id").cloned().unwrap_or_default();
    let task = find_agent_task(&state, &agent, &id)?;
    // No reason of its own: the decision names who canceled.
    let cancel = Command::CancelTask { task_id: task.id, reason: None, actor: caller.actor() };
    task_outcome(state.writer.submit(cancel).await?)
}

pub async fn reply_stack_list(State(state): State<AppState>, Scope(agent): Scope) -> ApiResult {
    let scope = ReadScope::of(&state, &agent)?;
    let targets = state.store.read(|view| view.reply_targets(&scope.agent_id))?;
    if targets.is_empty() && !scope.registered {
        return Err(scope.unknown());
    }
    answer(&api::ReplyTargets { targets: targets.iter().map(wire::reply_target).collect() })
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
pub async fn reply_stack_get(State(state): State<AppState>, Scope(agent): Scope, uri: axum::http::Uri) -> ApiResult {
    let query: ReplyStackQuery = parse_query(uri.query())?;
    let scope = ReadScope::of(&state, &agent)?;
    let targets = state.store.read(|view| view.reply_targets(&scope.agent_id))?;
    let target = match &query.sender_id {
        Some(sender) => targets.iter().rev().find(|target| &target.sender_id == sender),
        None => targets.last(),
    };
    answer(&wire::reply_target(target.ok_or_else(|| ApiError::not_found("No reply target"))?))
}

/// A task as the writer answered a command on it.
pub(super) fn task_outcome(outcome: Outcome) -> ApiResult {
    match outcome {
        Outcome::Task { task } => answer(&wire::task_answer(&task)),
        _ => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer")),
    }
}
