//! What callers ask of the writer: the request bodies of the commands and who acts in them.
//!
//! These are the broker's own command types, never a wire format: the HTTP layer fills them
//! from the `api::*` body it parsed and from what it proved itself (`by_user`, `message_id`).

use crate::event::Artifact;
use crate::event::TaskState;

/// Largest accepted message text, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Who acts in a command, as the HTTP layer proved it (see `http::caller`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// The user: the same uid over the broker's Unix socket with no agent secret, or the admin
    /// key. May act for any agent.
    User,
    /// A registered agent, proved by its secret. Acts only as itself.
    Agent(String),
    /// Nobody proved: may act for no agent.
    Anonymous,
}

/// The body of [`Command::UpdateTask`](super::Command::UpdateTask).
#[derive(Debug, Clone)]
pub struct UpdateTaskRequest {
    pub agent_id: String,
    pub secret: Option<String>,
    /// The agent's own received task (full id or unique prefix).
    pub task_id: String,
    pub state: TaskState,
    pub artifacts: Vec<Artifact>,
    pub error: Option<String>,
    /// The answer is a message, not a task result (A2A `Message`); only with `completed`.
    pub as_message: bool,
}

#[derive(Debug, Clone)]
pub struct RegisterRequest {
    pub agent_type: String,
    pub name: Option<String>,
    pub role: Option<String>,
    pub pid: u32,
    pub working_dir: String,
    /// The port the broker has bound for this agent.
    pub port: u16,
    pub secret_hash: String,
    /// The start time of `pid`, read by the broker when it checked the registration.
    pub pid_start: Option<u64>,
    /// The registering peer is the process registered (see `Event::AgentRegistered`).
    pub wrapper: bool,
    /// The registration was made by the user (the admin key, or a peer not inside an agent):
    /// only then may it take back a departed agent's queue.
    pub by_user: bool,
}

/// A message to an agent (the body of `synapse send` and `POST /tasks/send`).
#[derive(Debug, Clone, Default)]
pub struct SendRequest {
    /// Target: a custom name, an agent id, `<type>-<port>` or a type.
    pub to: String,
    pub from: Option<String>,
    /// The sender agent's secret (`SYNAPSE_AGENT_SECRET`), required when `from` is registered.
    pub secret: Option<String>,
    pub text: String,
    pub priority: u8,
    pub response_expected: bool,
    /// Answer this task (full id or unique prefix).
    pub reply_to: Option<String>,
    pub context_id: Option<String>,
    /// A task the sender created beforehand (`POST /tasks/create`, seed 002) that the reply
    /// should complete, instead of a new one.
    pub sender_task_id: Option<String>,
    /// `Idempotency-Key`: a second send with the same key from the same sender within
    /// [`IDEMPOTENCY_WINDOW_MS`] answers the first send's tasks and sends nothing.
    pub idempotency_key: Option<String>,
    /// Set by the broker, never read from the body: the request came from the user (see
    /// `http::caller`). An anonymous send by the user may be cancelled only by the user.
    pub by_user: bool,
    /// Set by the A2A binding, never read from the body: the client's `messageId`, kept in the
    /// tasks' message.
    pub message_id: Option<String>,
    /// Set by the legacy A2A binding: an anonymous send that names a sender without its
    /// secret (a Python Synapse agent). Refused when the name is a registered agent's.
    pub unverified_sender: Option<UnverifiedSender>,
}

/// A sender that names itself without proof (`metadata.sender` of the Python Synapse 0.35).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnverifiedSender {
    pub id: String,
    pub endpoint: Option<String>,
    /// Its own task for this message (`metadata.sender_task_id`), which its reply names.
    pub task_id: Option<String>,
}

/// A follow-up message on a task that asks for input (A2A multi-turn: a message naming the
/// task's id), from the task's anonymous sender (an A2A client).
#[derive(Debug, Clone, Default)]
pub struct ContinueRequest {
    /// The agent the task was sent to (the agent whose A2A endpoint was called).
    pub to: String,
    /// The sender's task, the A2A task (full id or unique prefix).
    pub task_id: String,
    pub text: String,
    /// The sender's id of the message (A2A `messageId`), kept in the task's history.
    pub message_id: Option<String>,
    /// The context the sender named, if any: it must be the task's.
    pub context_id: Option<String>,
    /// As for a send: a retry with the same key answers the task again and sends nothing.
    pub idempotency_key: Option<String>,
}

/// A reply (`synapse reply`): a message to the sender `from` owes an answer, which completes
/// the task it waits on. Which sender, when several wait, is decided against the reply targets
/// in the writer's transaction ([`Command::Reply`](super::Command::Reply)).
#[derive(Debug, Clone, Default)]
pub struct ReplyRequest {
    /// The replying agent.
    pub from: String,
    pub secret: Option<String>,
    /// The sender to answer; absent answers the only one waiting.
    pub to: Option<String>,
    pub text: String,
    /// As for a send: a retry with the same key answers the first reply and replies nothing
    /// (the reply target is gone by then, so the key is looked up first).
    pub idempotency_key: Option<String>,
}

/// How long an idempotency key holds: a retry after this is a new send.
pub const IDEMPOTENCY_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;

pub fn default_priority() -> u8 {
    3
}

/// The body of [`Command::SendExternal`](super::Command::SendExternal): the user's message to
/// an external agent, waiting for its reply (see `Event::ExternalMessageSent`).
#[derive(Debug, Clone)]
pub struct ExternalSendRequest {
    pub alias: String,
    pub text: String,
    pub priority: u8,
    /// SHA-256 (hex) of the reply token the HTTP layer made and sends with the message.
    pub reply_token_sha256: String,
}

/// The body of [`Command::ExternalReply`](super::Command::ExternalReply): a reply that names a
/// reply token (`metadata.in_reply_to`), from whoever holds the token.
#[derive(Debug, Clone)]
pub struct ExternalReplyRequest {
    pub reply_token: String,
    /// The name the replier gives itself (`metadata.sender.sender_id`), unverified.
    pub from: Option<String>,
    pub text: String,
}
