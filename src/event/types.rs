//! Value types carried by events and shown on the wire.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What an agent's CLI is doing, as read from its screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum AgentStatus {
    /// Started, not yet seen idle.
    Starting,
    /// Idle at its prompt: tickets may be written.
    Ready,
    /// Working on something.
    Processing,
    /// Asking the user something (a confirmation, a choice).
    Waiting,
}

/// How a ticket reached the agent's CLI, as its wrapper says when it acknowledges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Typed at the CLI's prompt (the CLI was idle, or interrupted for it).
    Typed,
    /// Handed to the model mid-turn by the CLI's hook.
    HandedOver,
    /// Not written into this CLI: written before a restart into the CLI that died with its
    /// wrapper, a cancel notice of an earlier run, or a message whose task failed instead.
    Unwritten,
}

/// As `?how=` and the log spell it.
impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Delivery::Typed => "typed",
            Delivery::HandedOver => "handed_over",
            Delivery::Unwritten => "unwritten",
        })
    }
}

impl fmt::Display for AgentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AgentStatus::Starting => "STARTING",
            AgentStatus::Ready => "READY",
            AgentStatus::Processing => "PROCESSING",
            AgentStatus::Waiting => "WAITING",
        })
    }
}

impl std::str::FromStr for AgentStatus {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.to_ascii_uppercase().as_str() {
            "STARTING" => Ok(AgentStatus::Starting),
            "READY" => Ok(AgentStatus::Ready),
            "PROCESSING" => Ok(AgentStatus::Processing),
            "WAITING" => Ok(AgentStatus::Waiting),
            _ => Err(format!("unknown status '{text}' (READY, PROCESSING, WAITING)")),
        }
    }
}

/// A2A task states (seed 003 spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Failed,
    Canceled,
}

impl TaskState {
    /// Every state, in lifecycle order.
    pub const ALL: [TaskState; 6] = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
    ];

    /// A final state never changes again.
    pub fn is_final(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Canceled)
    }

    /// The state as A2A 1.0 spells it (`TASK_STATE_COMPLETED`), in its bindings and in the
    /// push notifications the broker sends.
    pub fn a2a_name(self) -> &'static str {
        match self {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input_required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TaskState {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "submitted" => Ok(TaskState::Submitted),
            "working" => Ok(TaskState::Working),
            "input_required" => Ok(TaskState::InputRequired),
            "completed" => Ok(TaskState::Completed),
            "failed" => Ok(TaskState::Failed),
            "canceled" => Ok(TaskState::Canceled),
            _ => {
                Err(format!("unknown state '{text}' (submitted, working, input_required, completed, failed, canceled)"))
            }
        }
    }
}

/// Which side of an exchange a task records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// A task the owner received (a message written into its PTY).
    Incoming,
    /// A task the owner sent and waits on (`--response`).
    Outgoing,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Incoming => "incoming",
            Direction::Outgoing => "outgoing",
        })
    }
}

/// One part of a message or artifact (A2A: `{"type":"text","text":...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    File {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uri: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
    },
    Data {
        /// JSON text of the data part (kept as text so msgpack stores it losslessly).
        json: String,
    },
}

impl Part {
    /// The bytes of the strings it holds.
    pub fn bytes(&self) -> usize {
        let length = |value: &Option<String>| value.as_ref().map_or(0, String::len);
        match self {
            Part::Text { text } => text.len(),
            Part::File { name, uri, mime_type } => length(name) + length(uri) + length(mime_type),
            Part::Data { json } => json.len(),
        }
    }
}

/// An A2A message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
    /// The sender's own id for the message (A2A `messageId`), kept as the sender gave it; absent
    /// when the sender named none (Synapse then shows an id of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

impl Message {
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message { role, parts: vec![Part::Text { text: text.into() }], message_id: None }
    }

    /// All text parts joined by newlines.
    pub fn joined_text(&self) -> String {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        texts.join("\n")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Agent,
}

/// An output of a task (a reply is a text artifact).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub parts: Vec<Part>,
}

impl Artifact {
    pub fn text(text: impl Into<String>) -> Artifact {
        Artifact { name: None, parts: vec![Part::Text { text: text.into() }] }
    }
}

/// What happened to a file (file safety).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ChangeType {
    Create,
    Modify,
    Delete,
}

impl fmt::Display for ChangeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChangeType::Create => "created",
            ChangeType::Modify => "modified",
            ChangeType::Delete => "deleted",
        })
    }
}
