//! The A2A methods that answer at once (send, get, list, cancel) and their parameters.
//!
//! An A2A message is an anonymous `synapse send` to the agent that expects a reply (a broker
//! command); the A2A task is the sender's side. An agent's tasks are read through the store's
//! task index (`TaskIndexKind::Served`), never by decoding every task.

use super::params::{bool_param, count_param, find_task, string_param, task_id_param};
use super::shapes::{answer_message_json, is_done, parse_state, task_json};
use super::{
    CONTENT_TYPE_NOT_SUPPORTED, DEFAULT_PAGE_SIZE, INTERNAL_ERROR, MAX_CONTEXT_ID_CHARS, MAX_PAGE_SIZE, RpcError,
    TASK_NOT_CANCELABLE, TASK_NOT_FOUND, UNSUPPORTED_OPERATION, Version,
};
use crate::broker::command::{Actor, Command, CommandError, ContinueRequest, Outcome, SendRequest, default_priority};
use crate::broker::tail;
use crate::event::TaskState;
use crate::http::{AppState, MAX_WAIT};
use crate::store::{TaskIndexKind, TaskRecord};
use serde_json::{Value, json};

/// What a send request asks for.
pub(super) struct SendParams {
    text: String,
    /// The client's `messageId`: a message sent again with the same id (a retry) is the same
    /// message, and gets the first one's task.
    message_id: Option<String>,
    context_id: Option<String>,
    /// The task the message continues (A2A multi-turn), its full id.
    task_id: Option<String>,
    blocking: bool,
    history_length: Option<usize>,
    /// `configuration.taskPushNotificationConfig` (0.3: `pushNotificationConfig`): set on the
    /// task before the send answers.
    push: Option<super::push::ConfigRequest>,
}

pub(super) fn parse_send(
    state: &AppState,
    agent: &str,
    version: Version,
    params: &Value,
) -> Result<SendParams, RpcError> {
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
    // A message naming a task continues it (decided by the writer: it must ask for input).
    let task_id = match string_param(message, "taskId")?.filter(|id| !id.is_empty()) {
        Some(reference) => Some(find_task(state, agent, reference)?.id),
        None => None,
    };
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
    let push_name = match version {
        Version::V10 => "taskPushNotificationConfig",
        Version::V03 => "pushNotificationConfig",
    };
    let push = match configuration.get(push_name).filter(|config| !config.is_null()) {
        Some(config) => Some(super::push::parse_config(version, config)?),
        None => None,
    };
    let blocking = match version {
        Version::V10 => !bool_param(&configuration, "returnImmediately")?.unwrap_or(false),
        Version::V03 => bool_param(&configuration, "blocking")?.unwrap_or(true),
    };
    let message_id = string_param(message, "messageId")?.filter(|id| !id.is_empty());
    if let Some(id) = message_id
        && (id.chars().count() > MAX_MESSAGE_ID_CHARS || id.chars().any(char::is_control))
    {
        return Err(RpcError::params(format!(
            "'messageId' must be at most {MAX_MESSAGE_ID_CHARS} characters without control characters"
        )));
    }
    Ok(SendParams {
        message_id: message_id.map(str::to_string),
        text: texts.join("\n"),
        context_id: context_id.map(str::to_string),
        task_id,
        blocking,
        history_length: count_param(&configuration, "historyLength")?,
        push,
    })
}

/// Longest `messageId` accepted (it is kept with the message and echoed back).
const MAX_MESSAGE_ID_CHARS: usize = 200;

/// The idempotency key of an A2A message: a resend of the same message (same `messageId`,
/// task, context and text) is the first one again, nothing new. Anonymous senders share one
/// key space, so the key holds what the message says too: a client that uses one `messageId`
/// for every message (or a follow-up that reuses the id of another task's message) got the
/// first message's task back, and its message never reached the agent.
fn idempotency_key(agent: &str, message_id: &str, request: &SendParams) -> String {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    for field in [message_id, request.task_id.as_deref().unwrap_or(""), request.context_id.as_deref().unwrap_or("")] {
        digest.update(field.as_bytes());
        digest.update([0]);
    }
    digest.update(request.text.as_bytes());
    format!("a2a:{agent}:{}", crate::secret::to_hex(&digest.finalize()[..16]))
}

/// Sends the message as an anonymous `synapse send` expecting a reply, or as the follow-up of
/// the task it names; returns the A2A task (the sender's side) and the sequence number of the
/// send's last event.
pub(super) async fn submit_send(
    state: &AppState,
    agent: &str,
    version: Version,
    request: &SendParams,
) -> Result<(TaskRecord, u64), RpcError> {
    // A push config the URL rules refuse, or one more than a follow-up's task may have,
    // refuses the message before anything is sent.
    if let Some(push) = &request.push {
        super::push::check_url(state, push.url()).await?;
        if let Some(task_id) = &request.task_id {
            super::push::check_room(state, task_id, push.config_id()).await?;
        }
    }
    let idempotency_key = request.message_id.as_ref().map(|id| idempotency_key(agent, id, request));
    let command = match &request.task_id {
        Some(task_id) => Command::Continue(ContinueRequest {
            to: agent.to_string(),
            task_id: task_id.clone(),
            text: request.text.clone(),
            message_id: request.message_id.clone(),
            context_id: request.context_id.clone(),
            idempotency_key,
        }),
        None => Command::Send(new_send(agent, request, idempotency_key)),
    };
    let outcome = state.writer.submit(command).await.map_err(|error| match (&request.task_id, error) {
        (Some(task_id), CommandError::NotFound { message }) => {
            RpcError::new(TASK_NOT_FOUND, message).with("taskId", task_id.clone())
        }
        // A final task, or one that does not ask for input: the spec's error for a message
        // to a task that cannot take it.
        (Some(task_id), CommandError::Conflict { message }) => {
            RpcError::new(UNSUPPORTED_OPERATION, message).with("taskId", task_id.clone())
        }
        (_, error) => error.into(),
    })?;
    let (task, seq) = match outcome {
        Outcome::Sent(sent) => match sent.sender_task {
            Some(task) => (task, sent.seq),
            None => return Err(RpcError::new(INTERNAL_ERROR, "the send created no task to follow")),
        },
        _ => return Err(RpcError::new(INTERNAL_ERROR, "unexpected answer to a send")),
    };
    // The push config is set before the client hears of the task: its next changes are posted.
    if let Some(push) = &request.push {
        super::push::set_config(state, version, &task, push.clone()).await?;
    }
    Ok((task, seq))
}

fn new_send(agent: &str, request: &SendParams, idempotency_key: Option<String>) -> SendRequest {
    SendRequest {
        to: agent.to_string(),
        from: None,
        secret: None,
        text: request.text.clone(),
        priority: default_priority(),
        response_expected: true,
        reply_to: None,
        context_id: request.context_id.clone(),
        sender_task_id: None,
        idempotency_key,
        by_user: false,
        message_id: request.message_id.clone(),
        unverified_sender: None,
    }
}

pub(super) async fn send(state: &AppState, agent: &str, version: Version, params: &Value) -> Result<Value, RpcError> {
    let request = parse_send(state, agent, version, params)?;
    let (mut task, _) = submit_send(state, agent, version, &request).await?;
    if request.blocking {
        task = wait_until_done(state, agent, &task.id).await?;
    }
    // The agent answered at once with a message: the client gets that message, not a task.
    if task.as_message && task.state == TaskState::Completed {
        let message = answer_message_json(version, &task);
        return Ok(match version {
            Version::V10 => json!({"message": message}),
            Version::V03 => message,
        });
    }
    let task = task_json(version, &task, request.history_length, true);
    Ok(match version {
        Version::V10 => json!({"task": task}),
        Version::V03 => task,
    })
}

/// Follows the log's head until the task is final or asks for input (or the agent is no longer
/// registered, the broker stops, or [`MAX_WAIT`] passes); returns the task as it then is.
pub(super) async fn wait_until_done(state: &AppState, agent: &str, task_id: &str) -> Result<TaskRecord, RpcError> {
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

pub(super) fn get_task(state: &AppState, agent: &str, version: Version, params: &Value) -> Result<Value, RpcError> {
    let task = find_task(state, agent, task_id_param(params)?)?;
    let history_length = count_param(params, "historyLength")?;
    Ok(task_json(version, &task, history_length, true))
}

/// The texts one `ListTasks` page holds at most (and at least one task): `pageSize` bounds the
/// tasks, not their texts, and a page of 100 tasks of 16 MB messages was built whole in memory.
const LIST_TEXT_BYTES: usize = 4 << 20;

/// [`list_tasks`] on a blocking thread (two such reads at a time): the broker's Unix socket is
/// served by one thread, which a page of long tasks held for seconds.
pub(super) async fn list_tasks_apart(
    state: &AppState,
    agent: &str,
    version: Version,
    params: &Value,
) -> Result<Value, RpcError> {
    let (shared, agent, params) = (state.clone(), agent.to_string(), params.clone());
    crate::http::long_read(state, move |_| Ok(list_tasks(&shared, &agent, version, &params))).await?
}

/// The bytes of text a task's answer carries: its messages and its artifacts.
fn text_bytes(task: &TaskRecord) -> usize {
    let follow_ups: usize = task.follow_ups.iter().map(|follow_up| follow_up.message.joined_text().len()).sum();
    let artifacts: usize =
        task.artifacts.iter().map(|artifact| serde_json::to_string(artifact).map_or(0, |text| text.len())).sum();
    task.message.joined_text().len() + follow_ups + artifacts
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
    // The tasks A2A clients (anonymous senders) gave this agent, newest first: filtered and
    // paged on their rows, and only the page's texts read (every task's long texts were read
    // for every page).
    let (total, tasks, read) = state.store.read(|view| {
        let mut rows: Vec<TaskRecord> = view
            .task_rows_of(agent, TaskIndexKind::Served)?
            .into_iter()
            .filter(|task| context_id.is_none_or(|context| task.context_id == context))
            .filter(|task| wanted.is_none_or(|wanted| task.state == wanted))
            .filter(|task| after_ms.is_none_or(|after| task.updated_ms >= after))
            .collect();
        // The index gives them in the order they were created: reversed, then a stable sort,
        // so a millisecond's tasks stay newest first too.
        rows.reverse();
        rows.sort_by_key(|task| std::cmp::Reverse(task.created_ms));
        let mut page = Vec::new();
        let mut read = 0;
        let mut bytes = 0;
        for row in rows.iter().skip(offset).take(page_size) {
            read += 1;
            if let Some(task) = view.task(&row.id)? {
                bytes += text_bytes(&task);
                page.push(task);
            }
            if bytes >= LIST_TEXT_BYTES {
                break;
            }
        }
        Ok((rows.len(), page, read))
    })?;
    let page: Vec<Value> =
        tasks.iter().map(|task| task_json(version, task, history_length, include_artifacts)).collect();
    // The next page begins after the last task read (fewer than `pageSize` when their texts
    // filled this one).
    let next = match offset.checked_add(read) {
        Some(end) if end < total => end.to_string(),
        _ => String::new(),
    };
    Ok(json!({"tasks": page, "nextPageToken": next, "pageSize": page_size, "totalSize": total}))
}

pub(super) async fn cancel_task(
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
        )
        .with("taskId", task.id.clone()));
    }
    // A proved caller (the user, an agent) is named by the decision; nobody else can be.
    let reason = (actor == Actor::Anonymous).then(|| "canceled by an A2A client".to_string());
    let canceled = match state
        .writer
        .submit(Command::CancelTask { task_id: task.id.clone(), reason: reason.clone(), actor: actor.clone() })
        .await
    {
        Ok(Outcome::Task { task }) => *task,
        Ok(_) => return Err(RpcError::new(INTERNAL_ERROR, "unexpected answer to a cancel")),
        // Decided against a newer state than the one read above: it became final meanwhile.
        Err(CommandError::BadRequest { message }) => {
            return Err(RpcError::new(TASK_NOT_CANCELABLE, message).with("taskId", task.id.clone()));
        }
        // Not this caller's to cancel (the user's own send, say): the error A2A clients know,
        // but a refusal (403) over HTTP+JSON, not a task in a state that cannot be canceled.
        Err(CommandError::Forbidden { message }) => {
            return Err(RpcError::new(TASK_NOT_CANCELABLE, message)
                .with("taskId", task.id.clone())
                .answered_as(axum::http::StatusCode::FORBIDDEN));
        }
        Err(error) => return Err(error.into()),
    };
    // The agent's side of the exchange stops too (best effort: it may have finished already).
    if let Some(peer) = &task.peer_task_id {
        let _ = state.writer.submit(Command::CancelTask { task_id: peer.clone(), reason, actor }).await;
    }
    Ok(task_json(version, &canceled, None, true))
}
