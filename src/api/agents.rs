//! Agents: registration, the list (`GET /agents`, `synapse list`), status reports, the inbox
//! a wrapper follows, reply targets, and the line a started agent announces itself with.

use crate::event::AgentStatus;
use serde::{Deserialize, Serialize};

/// `POST /agents`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub agent_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    pub pid: u32,
    #[serde(default)]
    pub working_dir: String,
    /// A fixed port; 0 lets the system choose; absent takes the first free port of the
    /// profile's range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The ports to take the first free one from when no port is given, `[low, high]` (the
    /// agent's profile's); absent takes the built-in range of `agent_type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range: Option<(u16, u16)>,
}

/// The answer to a registration: the agent's secret is shown here only, once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub agent: RegisteredAgent,
    pub secret: String,
    /// The agent's own Unix socket.
    pub socket: String,
    /// The agent's A2A endpoint (`http://127.0.0.1:<port>`).
    pub endpoint: String,
}

/// The agent as the broker recorded it at registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisteredAgent {
    pub agent_id: String,
    pub agent_type: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    pub pid: u32,
    pub port: u16,
    pub working_dir: String,
    pub status: AgentStatus,
    pub secret_hash: String,
    #[serde(default)]
    pub pid_start: Option<u64>,
    #[serde(default)]
    pub wrapper: bool,
    pub registered_ms: u64,
    pub status_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_note: Option<String>,
}

/// `GET /agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentList {
    pub agents: Vec<AgentView>,
}

/// One running agent, as `GET /agents` and `synapse list --json` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentView {
    pub agent_id: String,
    pub agent_type: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    pub port: u16,
    pub status: AgentStatus,
    /// Why it takes no message now, in its wrapper's words.
    #[serde(default)]
    pub status_note: Option<String>,
    pub pid: u32,
    /// The process's start time at registration: a reused pid is never the agent.
    #[serde(default)]
    pub pid_start: Option<u64>,
    pub working_dir: String,
    pub endpoint: String,
    pub uds_path: String,
    pub queue_depth: usize,
    #[serde(default)]
    pub current_task: Option<CurrentTask>,
    pub registered_at: String,
}

/// The task an agent works on now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentTask {
    pub id: String,
    pub preview: String,
}

/// `GET /agents/{agent}/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentStatusView {
    pub agent_id: String,
    pub status: AgentStatus,
    #[serde(default)]
    pub status_note: Option<String>,
    pub queue_depth: usize,
    pub since: String,
}

/// `POST /agents/{agent}/status`: what the wrapper reads on its CLI's screen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusUpdate {
    /// Read in any case (`ready`, `READY`), as the broker always accepted it.
    #[serde(deserialize_with = "status_in_any_case")]
    pub status: AgentStatus,
    /// Why the agent takes no message now (shown by `synapse list`); absent clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn status_in_any_case<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<AgentStatus, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(serde::de::Error::custom)
}

/// What the broker's writer answers to a status report or an acknowledgement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A status report: `changed` is false when the agent already had that status.
    StatusSet { changed: bool },
    /// An acknowledged ticket.
    Injected { ticket: u64 },
}

/// `POST /agents/{agent}/inbox/{ticket}/ack?next=true`: the acknowledgement, and the inbox as it
/// stands once the acknowledgement is stored (what `GET /agents/{agent}/inbox` would answer then,
/// without waiting). A watcher takes its next ticket from it instead of asking again: one round
/// trip less per delivery, and a message stored together with the acknowledgement is not left
/// waiting for that extra request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AckAndInbox {
    /// The ticket acknowledged.
    pub ticket: u64,
    pub inbox: Inbox,
}

/// `DELETE /agents/{agent}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deregistered {
    pub deregistered: String,
}

/// `GET /agents/{agent}/inbox`: the tickets still to be written, in delivery order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inbox {
    pub agent_id: String,
    pub tickets: Vec<InboxTicket>,
}

/// One message or reply waiting to be written into an agent's CLI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxTicket {
    /// The ticket's number, acknowledged once written.
    pub ticket: u64,
    pub kind: TicketKind,
    /// The task the ticket belongs to (for a reply, the task the reply completed).
    pub task_id: String,
    /// The task id shown in the prefix and answered by `reply_to`.
    pub display_task_id: String,
    #[serde(default)]
    pub from: Option<String>,
    pub priority: u8,
    pub response_expected: bool,
    /// The header written before the text (`[A2A:<id8>:<sender>:R]`): the broker decides it.
    pub prefix: String,
    pub text: String,
    pub issued_at: String,
    /// A task the agent received and was working on was canceled (kind `reply`, prefix
    /// `:CANCELED]`): at priority 5 when its CLI works on it now (the interrupt comes first),
    /// else at 3. A field rather than a kind of its own, which a wrapper of an earlier build
    /// could not read: it would stop taking tickets.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_notice: bool,
}

/// What a ticket carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketKind {
    Message,
    /// How a request of the agent's ended: a reply, `Failed:`, `Canceled:`; or, with
    /// [`InboxTicket::cancel_notice`], that a task the agent was working on was canceled.
    Reply,
}

/// `GET /agents/{agent}/reply-stack/list`: the senders waiting for this agent's reply, oldest
/// first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyTargets {
    pub targets: Vec<ReplyTarget>,
}

/// A sender waiting for a reply (also the answer of `reply-stack/get` and `pop`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyTarget {
    pub sender_id: String,
    #[serde(default)]
    pub sender_task_id: Option<String>,
    /// The receiving agent's task.
    pub task_id: String,
    pub received_at: String,
    pub preview: String,
}

/// The one JSON line a started agent prints on stdout once registered: `synapse <profile>
/// --announce` (read by `synapse start`) and `synapse scenario-agent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Announce {
    pub agent_id: String,
    /// The wrapper's (or scenario agent's) pid.
    pub pid: u32,
    /// The CLI's pid in the wrapper's PTY.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_pid: Option<u32>,
    pub port: u16,
    /// The wrapper's terminal log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    pub socket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    pub secret: String,
}
