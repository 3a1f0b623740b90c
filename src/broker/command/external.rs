//! Messages to external agents that wait for a reply, and the replies that name their reply
//! token (issue 15: a Python Synapse agent answers with `in_reply_to` and no secret).
//!
//! The rule: a task id proves nothing (ids are shown by `/events` and history), so the user's
//! message carries a random token as `sender_task_id`; the log keeps only its SHA-256, and a
//! reply naming the token completes that task, once.

use super::checks::{check_sender_name, new_id, validate_text};
use super::decision::{Answer, CommandError, DecideError, Decision};
use super::requests::{ExternalReplyRequest, ExternalSendRequest};
use super::send::validate_priority;
use crate::event::{Artifact, Direction, Event, Message, Role, TaskState, short_id};
use crate::store::Projections;

/// The peer of a task sent to the external agent `alias`.
pub fn external_peer(alias: &str) -> String {
    format!("external:{alias}")
}

/// Longest reply token accepted (Synapse makes 64 hex digits).
const MAX_TOKEN_CHARS: usize = 256;

pub fn decide_send_external(view: &Projections<'_>, request: &ExternalSendRequest) -> Result<Decision, DecideError> {
    validate_text(&request.text)?;
    validate_priority(request.priority)?;
    if !crate::broker::externals::is_valid_alias(&request.alias) {
        return Err(CommandError::bad(format!("Invalid alias '{}'", crate::event::preview(&request.alias, 80))).into());
    }
    let digest = &request.reply_token_sha256;
    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) || view.reply_token_task(digest)?.is_some()
    {
        return Err(CommandError::bad("a reply token must be new and given as its SHA-256 in hex").into());
    }
    let task_id = new_id();
    let events = vec![
        Event::TaskCreated {
            task_id: task_id.clone(),
            owner: None,
            context_id: new_id(),
            direction: Direction::Outgoing,
            peer: Some(external_peer(&request.alias)),
            state: TaskState::Working,
            message: Message::text(Role::User, request.text.clone()),
            priority: request.priority,
            response_expected: true,
            sender_task_id: None,
            in_reply_to: None,
            peer_task_id: None,
            message_in: None,
        },
        Event::ExternalMessageSent {
            task_id: task_id.clone(),
            alias: request.alias.clone(),
            reply_token_sha256: digest.clone(),
            by_user: true,
        },
    ];
    Ok(Decision { actor: None, events, answer: Answer::Task { task_id } })
}

pub fn decide_external_reply(view: &Projections<'_>, request: &ExternalReplyRequest) -> Result<Decision, DecideError> {
    validate_text(&request.text)?;
    let token = request.reply_token.as_str();
    if token.is_empty() || token.chars().count() > MAX_TOKEN_CHARS || token.chars().any(char::is_control) {
        return Err(CommandError::bad(format!(
            "in_reply_to must be 1-{MAX_TOKEN_CHARS} characters without control characters"
        ))
        .into());
    }
    if let Some(from) = &request.from {
        check_sender_name(from)?;
    }
    let digest = crate::secret::hash_secret(token);
    let task = match view.reply_token_task(&digest)? {
        Some(task_id) => view.task(&task_id)?,
        None => None,
    };
    let Some(task) = task else {
        return Err(CommandError::not_found(
            "no message waits for a reply with this in_reply_to (unknown, or already answered)",
        )
        .into());
    };
    if task.state.is_final() {
        return Err(CommandError::conflict(format!(
            "task {} is already {}; the reply is refused",
            short_id(&task.id),
            task.state
        ))
        .into());
    }
    let events = vec![
        Event::ExternalReplyReceived {
            task_id: task.id.clone(),
            from: request.from.clone(),
            text: request.text.clone(),
            reply_token_sha256: digest,
        },
        Event::TaskStateChanged {
            task_id: task.id.clone(),
            state: TaskState::Completed,
            artifacts: vec![Artifact::text(request.text.clone())],
            error: None,
            reply_of: None,
            as_message: false,
        },
    ];
    Ok(Decision { actor: None, events, answer: Answer::Task { task_id: task.id } })
}

/// The message could not be delivered (or the remote task ended without a reply): the task
/// fails with the reason. Nothing happens to a task that is already over.
pub fn decide_external_failed(view: &Projections<'_>, task_id: &str, error: &str) -> Result<Decision, DecideError> {
    let task = view.task(task_id)?.filter(|task| {
        task.direction == Direction::Outgoing
            && task.owner.is_none()
            && task.peer.as_deref().is_some_and(|peer| peer.starts_with("external:"))
    });
    let Some(task) = task else {
        return Err(CommandError::not_found(format!("no message to an external agent has task {task_id}")).into());
    };
    let events = if task.state.is_final() {
        Vec::new()
    } else {
        vec![Event::TaskStateChanged {
            task_id: task.id.clone(),
            state: TaskState::Failed,
            artifacts: Vec::new(),
            error: Some(error.to_string()),
            reply_of: None,
            as_message: false,
        }]
    };
    Ok(Decision { actor: None, events, answer: Answer::Task { task_id: task.id } })
}
