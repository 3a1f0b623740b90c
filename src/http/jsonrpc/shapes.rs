//! The A2A shapes of each protocol version: task states and roles spelled as the version
//! spells them, parts, messages, artifacts, tasks, and the stream responses of a task change.
//!
//! Invariant: an artifact's id is its position in the task (artifacts are only appended), so a
//! client sees the same id in a snapshot and in the stream.

use super::Version;
use crate::event::{Artifact, Part, Role, TaskState};
use crate::http::subscribe::TaskChange;
use crate::store::TaskRecord;
use serde_json::{Value, json};

pub fn state_name(version: Version, state: TaskState) -> &'static str {
    match version {
        Version::V10 => state.a2a_name(),
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

pub(super) fn role_name(version: Version, role: Role) -> &'static str {
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

pub(super) fn message_json(version: Version, message_id: &str, task: &TaskRecord, role: Role, parts: &[Part]) -> Value {
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

/// The agent's answer given as a message instead of a task result (`as_message`): the parts of
/// its newest artifact, in the task's context, naming no task (A2A: a `Message` answers the
/// send; the client never hears of a task).
pub(super) fn answer_message_json(version: Version, task: &TaskRecord) -> Value {
    let parts = task.artifacts.last().map(|artifact| artifact.parts.as_slice()).unwrap_or_default();
    let mut value = message_json(version, &format!("{}-answer", task.id), task, Role::Agent, parts);
    if let Some(object) = value.as_object_mut() {
        object.remove("taskId");
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
pub(super) fn status_text(task: &TaskRecord) -> Option<String> {
    match task.state {
        TaskState::InputRequired => task.question(),
        TaskState::Failed | TaskState::Canceled => task.error.clone(),
        _ => None,
    }
}

pub(super) fn status_json(version: Version, task: &TaskRecord) -> Value {
    let mut status = json!({
        "state": state_name(version, task.state),
        "timestamp": crate::time::rfc3339(task.updated_ms),
    });
    if let Some(text) = status_text(task) {
        status["message"] =
            message_json(version, &status_message_id(task, task.updated_ms), task, Role::Agent, &[Part::Text { text }]);
    }
    status
}

/// The id of the status message the task had at `time_ms`: made up by Synapse, and the same
/// when that message later shows in the history.
fn status_message_id(task: &TaskRecord, time_ms: u64) -> String {
    format!("{}-status-{time_ms}", task.id)
}

/// The task's messages in order: the request, then for each follow-up the agent's question
/// (when it asked one) and the follow-up. The sender's messages keep the sender's ids.
fn history_json(version: Version, task: &TaskRecord) -> Vec<Value> {
    let mut history = Vec::with_capacity(1 + 2 * task.follow_ups.len());
    let request_id = task.message.message_id.clone().unwrap_or_else(|| format!("{}-request", task.id));
    history.push(message_json(version, &request_id, task, Role::User, &task.message.parts));
    for (number, follow_up) in task.follow_ups.iter().enumerate() {
        if let Some(question) = &follow_up.question {
            let id = status_message_id(task, follow_up.asked_ms);
            history.push(message_json(version, &id, task, Role::Agent, &[Part::Text { text: question.clone() }]));
        }
        let id = follow_up.message.message_id.clone().unwrap_or_else(|| format!("{}-message-{}", task.id, number + 1));
        history.push(message_json(version, &id, task, Role::User, &follow_up.message.parts));
    }
    history
}

/// A task in the A2A shape of `version`. `history_length`: how many of the newest messages of
/// the history to include (None: all). `artifacts`: include the artifacts.
pub fn task_json(version: Version, task: &TaskRecord, history_length: Option<usize>, artifacts: bool) -> Value {
    let mut value = json!({
        "id": task.id,
        "contextId": task.context_id,
        "status": status_json(version, task),
        // camelCase like every key of the A2A bindings' payloads.
        "metadata": {"synapse": {
            "agentId": task.peer.as_ref().or(task.owner.as_ref()),
            "direction": task.direction,
            "createdAt": crate::time::rfc3339(task.created_ms),
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
        let mut history = history_json(version, task);
        if let Some(length) = history_length {
            history.drain(..history.len().saturating_sub(length));
        }
        value["history"] = Value::Array(history);
    }
    value
}

/// The stream responses for one change of a task: its new artifacts, then its status when it
/// changed (or is final). `artifact_count` is the number of artifacts the client has seen.
pub(super) fn change_responses(
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
pub(super) fn is_done(state: TaskState) -> bool {
    state.is_final() || state == TaskState::InputRequired
}
