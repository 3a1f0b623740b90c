//! Messages and tasks: send, reply, the task view every answer carries, waiting for a task,
//! and an agent's update of a task it received.

use crate::event::{Artifact, Direction, Role, TaskState};
use serde::{Deserialize, Serialize};

/// The priority of a message sent without one (1 to 5; 5 interrupts the target first).
pub const DEFAULT_PRIORITY: u8 = 3;

fn default_priority() -> u8 {
    DEFAULT_PRIORITY
}

/// `POST /send`: what `synapse send` uses (the target by name, id, `<type>-<port>` or type).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    pub to: String,
    /// The sending agent (absent: anonymous, e.g. the user at a shell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The sending agent's secret, proving `from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    pub text: String,
    #[serde(default = "default_priority")]
    pub priority: u8,
    #[serde(default)]
    pub response_expected: bool,
    /// The task (full id or prefix) this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_task_id: Option<String>,
    /// A retry with the same key within 24 h answers the first send instead of sending again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

impl SendRequest {
    /// A message to `to` with every option at its default.
    pub fn new(to: impl Into<String>, text: impl Into<String>) -> SendRequest {
        SendRequest {
            to: to.into(),
            from: None,
            secret: None,
            text: text.into(),
            priority: DEFAULT_PRIORITY,
            response_expected: false,
            reply_to: None,
            context_id: None,
            sender_task_id: None,
            idempotency_key: None,
        }
    }
}

/// `POST /reply`: answers the agent's most recent reply target (or the one from `to`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyRequest {
    pub from: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The sender to answer when several wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    pub text: String,
    /// As for a send: a retry with the same key (within a day) answers the first reply again
    /// and replies nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// The answer to a send or a reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendAnswer {
    /// The receiver's task.
    pub task: Task,
    /// The sender's own task when a reply is expected (or, for a reply, the task it completed).
    #[serde(default)]
    pub sender_task: Option<Task>,
    /// True when this message answered an earlier one.
    pub is_reply: bool,
    /// Set when `reply_to` was not found and the message went out as a new one.
    #[serde(default)]
    pub warning: Option<String>,
    /// Sequence number of the last event of the send.
    pub seq: u64,
}

/// A task as every answer shows it (the A2A REST shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub context_id: String,
    pub status: TaskState,
    pub message: MessageView,
    /// The messages after the first, in order (A2A multi-turn: each follow-up the sender gave
    /// while the task asked for input); absent when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub follow_ups: Vec<MessageView>,
    pub artifacts: Vec<ArtifactView>,
    #[serde(default)]
    pub error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub metadata: TaskMetadata,
}

/// Synapse's own facts about a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMetadata {
    /// The agent whose task it is.
    #[serde(default)]
    pub owner: Option<String>,
    pub direction: Direction,
    /// The other side of the exchange.
    #[serde(default)]
    pub peer: Option<String>,
    pub priority: u8,
    pub response_expected: bool,
    #[serde(default)]
    pub sender_task_id: Option<String>,
    #[serde(default)]
    pub in_reply_to: Option<String>,
    #[serde(default)]
    pub peer_task_id: Option<String>,
    #[serde(default)]
    pub replied_by: Option<String>,
}

/// A message: who speaks, and its parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageView {
    pub role: Role,
    pub parts: Vec<PartView>,
}

/// An output of a task (a reply is a text artifact).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub parts: Vec<PartView>,
    /// The Python Synapse 0.35's shape of the same artifact, which its client reads (it has no
    /// `parts`): `text` with `data.content` for text, `data` with the data for a data part,
    /// `file` with the file's reference.
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub data: serde_json::Value,
}

/// One part of a message or artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PartView {
    Text {
        text: String,
    },
    File {
        file: FileView,
    },
    /// Structured data, carried as it is.
    Data {
        data: serde_json::Value,
    },
}

/// A file part's reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileView {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub uri: Option<String>,
    #[serde(default)]
    pub mime_type: Option<String>,
}

impl PartView {
    pub fn text(&self) -> Option<&str> {
        match self {
            PartView::Text { text } => Some(text),
            _ => None,
        }
    }
}

impl Task {
    /// The text of the newest text artifact (a reply), if any.
    pub fn reply_text(&self) -> Option<&str> {
        self.artifacts.iter().rev().find_map(|artifact| artifact.parts.iter().find_map(PartView::text))
    }
}

/// One event of `GET /tasks/{id}/subscribe` (SSE `status`, or `final` for the last): the task's
/// state after a change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatusEvent {
    pub task_id: String,
    /// The log position of the change (also the event's SSE id).
    pub seq: u64,
    pub state: TaskState,
    pub artifacts: Vec<ArtifactView>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(rename = "final")]
    pub is_final: bool,
    /// RFC 3339.
    pub time: String,
}

/// `GET /tasks/{id}`, `POST .../tasks/{id}/cancel`, `POST .../tasks/{id}/update`,
/// `POST .../tasks/create`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskAnswer {
    pub task: Task,
}

/// `GET /tasks/{id}` of an agent's own endpoints: the task under `task`, as every Synapse
/// answer has it, and its fields at the top level too, where the Python Synapse 0.35 client
/// reads them (`status` above all: its `--wait` polls it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentTaskAnswer {
    pub task: Task,
    #[serde(flatten)]
    pub top_level: Task,
}

/// `GET /agents/{agent}/tasks`: the agent's tasks, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskList {
    pub tasks: Vec<Task>,
}

/// `GET /tasks/{id}/wait`: the task once final, or as it is when the wait timed out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskWait {
    pub task: Task,
    /// The reply's text (final tasks only).
    #[serde(default)]
    pub reply: Option<String>,
    pub timed_out: bool,
}

/// `POST /agents/{agent}/tasks/{id}/update`: an agent moves a task it received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskUpdate {
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The agent answers with a message instead of a task result (an A2A client that sent the
    /// message gets a `Message`); only with `completed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub as_message: bool,
}
