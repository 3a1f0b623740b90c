//! External A2A agents that `synapse external` adds, lists and sends to.

use serde::{Deserialize, Serialize};

/// An external agent known by its alias.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct External {
    pub alias: String,
    pub url: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub added_seq: u64,
}

/// `POST /external` (its answer) and `GET /external/{alias}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalAnswer {
    #[serde(default)]
    pub external: Option<External>,
}

/// `GET /external`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalList {
    pub externals: Vec<External>,
}

/// `POST /external`: adds the agent at `url` (its card is read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddExternal {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
}

/// `POST /external/{alias}/send`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalSend {
    pub text: String,
    /// Follow the remote task until it ends, at most this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    /// 1-5 (5 interrupts the remote agent's CLI first); absent: the remote's default (3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Whether the remote agent is asked for a reply; absent: only when `wait_seconds` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_expected: Option<bool>,
}

/// The answer to an external send: the remote agent's task as it answered it (without
/// `wait_seconds`), or its last status update (with it; `timed_out` then says whether the
/// time ran out first). The remote side is another A2A server: every field may be missing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalSent {
    /// Null when the remote agent answered no task (or sent no update in time).
    #[serde(default)]
    pub task: Option<RemoteTask>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// The user's own task that waits for the reply (when one is expected): `synapse history`,
    /// `GET /tasks/{id}` and `synapse cancel` know it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_task_id: Option<String>,
}

/// What the CLI reads of a remote task or status update; the rest is kept as it came.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RemoteTask {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The task's state (a task answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    /// The task's state (a status update of its event stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<RemoteArtifact>>,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// A remote artifact: its text parts are the reply.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RemoteArtifact {
    #[serde(default)]
    pub parts: Vec<RemotePart>,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// A remote part; `text` when it is a text part.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RemotePart {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

impl RemoteTask {
    /// The first part of the first artifact, when it is text: the remote agent's reply.
    pub fn reply_text(&self) -> Option<&str> {
        self.artifacts.as_ref()?.first()?.parts.first()?.text.as_deref()
    }

    /// `status` when the remote agent wrote it as text (a Synapse broker does).
    pub fn status_text(&self) -> Option<&str> {
        self.status.as_ref().and_then(serde_json::Value::as_str)
    }
}
