//! Events: the only source of truth in Synapse.
//!
//! Every fact (an agent registered, a message sent, a reply posted, a lock taken, ...) is one
//! [`Event`] wrapped in an [`Envelope`] and appended to the log. Everything users query is a
//! projection of these events (see `store`).
//!
//! This module does no I/O. Invariants that must stay true:
//! - Encoding is msgpack **with field names** (`rmp_serde::to_vec_named`), so an optional field
//!   can be skipped or added without breaking older records.
//! - Evolution is additive: a new field gets `#[serde(default)]`, a new kind is a new variant.
//!   A kind is never renamed or repurposed. [`SCHEMA_VERSION`] is bumped when a change would make
//!   an older Synapse misread the log; an older binary refuses a log written by a newer schema.
//! - `schema/events.md` documents every kind with an example; a test keeps it in step.

use serde::{Deserialize, Serialize};

pub mod types;
pub use types::*;

/// Version of the event encoding written by this build. Version 3: a long text is stored once
/// (`task_created.message_in`, `task_state_changed.reply_of`); an older build would read those
/// tasks without their text, so it must refuse the log. Version 4: `idempotency_keys_expired`
/// and `reply_posted.idempotency_key`, which an older build does not know. Version 5:
/// `task_continued` and `ticket_issued.turn` (an older build would write a follow-up's ticket
/// with the task's first message). Version 6: `push_config_set` and `push_config_deleted` (an
/// older build would lose an A2A client's push notifications), `message_sent.unverified_sender`,
/// `sender_endpoint` and `external_task_id`. Version 7: `external_message_sent` and
/// `external_reply_received` (an older build could not read a reply to an external message).
pub const SCHEMA_VERSION: u32 = 7;

/// Texts longer than this (bytes) are stored once per send and once per reply: the
/// `message_sent` / `reply_posted` event carries the text, and the tasks refer to it
/// (`message_in`, `reply_of`) instead of copying it. Shorter texts are copied into the tasks'
/// events and rows, as before: a few hundred bytes more per message, and listings and searches
/// read them without following a reference.
pub const INLINE_TEXT_MAX_BYTES: usize = 1024;

/// One event as stored in the log: the event plus where and when it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Schema version the event was written with.
    pub v: u32,
    /// Position in the log, starting at 1, without gaps.
    pub seq: u64,
    /// Unix time in milliseconds, assigned by the writer when the batch was decided.
    pub time_ms: u64,
    /// The agent on whose behalf the event was appended (None: anonymous or the broker itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    pub event: Event,
}

/// Just the version of an envelope, decodable from any version's bytes.
#[derive(Deserialize)]
struct VersionPeek {
    v: u32,
}

/// Why an event could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "event written by a newer Synapse (schema {found}, this build reads up to {SCHEMA_VERSION}); upgrade synapse"
    )]
    NewerSchema { found: u32 },
    #[error("event is not valid msgpack: {0}")]
    Malformed(String),
}

/// What an event's or a projection row's encoding reserves first: more than most take, so one
/// allocation serves instead of a chain of growths (the allocator's slow path, in the writer).
pub const ENCODE_ROOM: usize = 512;

impl Envelope {
    pub fn encode(&self) -> Vec<u8> {
        // Serialising plain data structs to a Vec cannot fail; an error here is a programming
        // error (e.g. a map with non-string keys), so it is reported loudly in debug builds.
        let mut bytes = Vec::with_capacity(ENCODE_ROOM);
        match rmp_serde::encode::write_named(&mut bytes, self) {
            Ok(()) => bytes,
            Err(error) => {
                debug_assert!(false, "event encoding failed: {error}");
                Vec::new()
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Envelope, DecodeError> {
        match rmp_serde::from_slice::<Envelope>(bytes) {
            Ok(envelope) if envelope.v <= SCHEMA_VERSION => Ok(envelope),
            Ok(envelope) => Err(DecodeError::NewerSchema { found: envelope.v }),
            Err(error) => match rmp_serde::from_slice::<VersionPeek>(bytes) {
                Ok(peek) if peek.v > SCHEMA_VERSION => Err(DecodeError::NewerSchema { found: peek.v }),
                _ => Err(DecodeError::Malformed(error.to_string())),
            },
        }
    }

    /// The envelope as served by `GET /events` and printed by `synapse events --json`. A
    /// webhook secret from an old log (written before `secret_ref`) and an external sender's
    /// task id (another broker's reply token) are shown as redacted: the log keeps them for
    /// signing and for the reply, nobody reads them back.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Event::WebhookRegistered { secret: Some(_), .. } = &self.event
            && let Some(secret) = value.pointer_mut("/event/data/secret")
        {
            *secret = serde_json::Value::String("[redacted]".into());
        }
        // What an external sender named its own task: another Synapse broker names the reply
        // token its reply endpoint takes there. Whoever reads this log must not be able to
        // answer in its place.
        if let Event::MessageSent { external_task_id: Some(_), .. } = &self.event
            && let Some(token) = value.pointer_mut("/event/data/external_task_id")
        {
            *token = serde_json::Value::String("[redacted]".into());
        }
        value
    }
}

/// Every kind of fact Synapse records. Serialised as `{"kind": ..., "data": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum Event {
    AgentRegistered {
        agent_id: String,
        agent_type: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<String>,
        pid: u32,
        port: u16,
        working_dir: String,
        /// SHA-256 (hex) of the agent's secret; the secret itself is never stored.
        secret_hash: String,
        /// Start time of process `pid` (field 22 of `/proc/<pid>/stat`) when the broker checked
        /// it: with the pid it names one process, so a reused pid is not mistaken for the agent
        /// and `synapse stop` never signals a process that merely got the same number.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid_start: Option<u64>,
        /// The process registered itself over the broker's Unix socket (the peer's pid is
        /// `pid`): a wrapper. Processes below it are inside the agent (they are not the user).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        wrapper: bool,
        /// The registration takes back a departed agent's id and queue (`--name`, or the same
        /// port without one): it is that agent again, and what it asked before still finds it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        resumes: bool,
    },
    AgentStatusChanged {
        agent_id: String,
        status: AgentStatus,
        /// Why the agent takes no message although it could be expected to (e.g. a priority-5
        /// message held because the CLI did not come back to its prompt after the interrupt).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    AgentDeregistered {
        agent_id: String,
        reason: String,
    },
    TaskCreated {
        task_id: String,
        /// The agent whose task list holds it; None for an anonymous sender's own task.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
        context_id: String,
        direction: Direction,
        /// The agent on the other side of the exchange.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        state: TaskState,
        message: Message,
        #[serde(default)]
        priority: u8,
        #[serde(default)]
        response_expected: bool,
        /// For a received task: the sender's own task that a reply completes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_task_id: Option<String>,
        /// For a reply: the task this one answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_reply_to: Option<String>,
        /// For a sender's task: the receiver's task created with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer_task_id: Option<String>,
        /// A long message is stored once: `message` has no parts, and its text is the `text` of
        /// the `message_sent` event of this task id (the receiver's task), in the same batch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_in: Option<String>,
    },
    MessageSent {
        /// The receiver's task that carries the message.
        task_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        to: String,
        priority: u8,
        response_expected: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_task_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_reply_to: Option<String>,
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parts: Vec<Part>,
        /// The sender's `Idempotency-Key`: a retry with the same key (same sender, within
        /// 24 h) answers this send's tasks instead of sending again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
        /// An anonymous send by the user (the CLI in a plain shell, the admin key): only the
        /// user may cancel it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        by_user: bool,
        /// An anonymous send that names its sender without proving it (a Python Synapse agent,
        /// `metadata.sender.sender_id`): the name, shown as unverified, never a registered
        /// agent's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unverified_sender: Option<String>,
        /// That sender's own endpoint (`metadata.sender.sender_endpoint`), as it gave it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_endpoint: Option<String>,
        /// That sender's own task (`metadata.sender_task_id`): a reply to this message goes to
        /// `sender_endpoint` naming it (`in_reply_to`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        external_task_id: Option<String>,
    },
    /// Something the agent's watcher must write into its PTY. The ticket's id is the sequence
    /// number of this event.
    TicketIssued {
        agent_id: String,
        task_id: String,
        priority: u8,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        /// The id shown in the terminal (`[A2A:<id8>:...]`): the id to reply to.
        display_task_id: String,
        response_expected: bool,
        /// Which message of the task the ticket writes: 0 its first message, N its N-th
        /// follow-up (`task_continued`).
        #[serde(default, skip_serializing_if = "is_zero")]
        turn: u32,
    },
    /// The watcher wrote the ticket into the PTY; it leaves the inbox.
    TicketInjected {
        agent_id: String,
        ticket: u64,
        priority: u8,
        /// How, as the wrapper said; None from wrappers (and in logs) before it was said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        how: Option<Delivery>,
    },
    ReplyPosted {
        /// The replier's (receiver's) task.
        task_id: String,
        /// The original sender's task, completed by this reply.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_task_id: Option<String>,
        from: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
        text: String,
        /// The replier's `Idempotency-Key`: a retry with the same key (same replier, within
        /// 24 h) answers this reply's tasks instead of failing as already answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
    },
    /// A reply travelling back into the original sender's inbox. Its id is its sequence number.
    ReverseTicketIssued {
        agent_id: String,
        /// The sender's task whose artifact holds the reply text.
        task_id: String,
        from: String,
        #[serde(default)]
        priority: u8,
    },
    TaskStateChanged {
        task_id: String,
        state: TaskState,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        artifacts: Vec<Artifact>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// A long reply is stored once: the `text` of the `reply_posted` event of this task
        /// (the replier's task) becomes one more text artifact, after `artifacts`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_of: Option<String>,
        /// The agent answered with a message instead of a task result (A2A: a `Message` as the
        /// answer to a send); only with `completed`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        as_message: bool,
    },
    TaskCanceled {
        task_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Who canceled it, as a cancel notice names them: `user`, an agent's id, `anonymous`.
        /// None in logs written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    FileLockAcquired {
        path: String,
        agent_id: String,
        expires_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        intent: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task_id: Option<String>,
    },
    FileLockReleased {
        path: String,
        agent_id: String,
        #[serde(default)]
        forced: bool,
    },
    FileModified {
        path: String,
        agent_id: String,
        task_id: String,
        change_type: ChangeType,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        intent: Option<String>,
    },
    HistoryPruned {
        /// Records last updated before this time leave the history view.
        before_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_size_mb: Option<u64>,
    },
    WebhookRegistered {
        webhook_id: String,
        url: String,
        events: Vec<String>,
        /// Only in logs written before secrets moved out of the log: read, never written.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
        /// The signing secret's file under `$SYNAPSE_HOME/webhook-secrets/`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret_ref: Option<String>,
    },
    WebhookRemoved {
        webhook_id: String,
        url: String,
    },
    WebhookDeliveryAttempted {
        delivery_id: String,
        webhook_id: String,
        event: String,
        attempt: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// None when the delivery is finished (succeeded or gave up).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_attempt_ms: Option<u64>,
    },
    ExternalAgentAdded {
        alias: String,
        url: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
    },
    ExternalAgentRemoved {
        alias: String,
    },
    /// `synapse file-safety cleanup --days N`: modification records older than the cut-off
    /// leave the file-safety views.
    FileModificationsPruned {
        before_ms: u64,
    },
    /// An agent left with messages still queued and no agent started again under its name
    /// took them back within the hold time: its inbox is emptied (the tasks waiting on it were
    /// failed, with `reason`, by events just before this one) and its id may be used again.
    InboxExpired {
        agent_id: String,
        /// Why the queue was dropped, as shown to the senders.
        reason: String,
        /// How many tickets were dropped.
        tickets: u64,
    },
    /// Idempotency keys older than their 24 h window leave the `idempotency_keys` projection,
    /// so it holds about one day of keyed sends (the periodic sweep appends it, at most hourly).
    IdempotencyKeysExpired {
        /// Keys recorded before this time (Unix ms) are dropped.
        before_ms: u64,
    },
    /// A follow-up message on a task that asked for input (A2A multi-turn: a message naming
    /// the task's id). Both tasks of the exchange record it after the agent's question, and the
    /// `task_state_changed` events right after it take them back to work; a `ticket_issued`
    /// with `turn` carries it to the agent.
    TaskContinued {
        /// The receiver's task the message continues.
        task_id: String,
        /// The sender's task that follows it (the A2A task).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_task_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        to: String,
        text: String,
        /// The sender's id of the message (A2A `messageId`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        /// As in `message_sent`: a retry with the same key answers this task again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
    },
    /// An A2A client asked for the task's updates at `url` (a push notification config). Its
    /// token and credentials never enter the log: they are files under
    /// `$SYNAPSE_HOME/webhook-secrets/`, and the event holds their references.
    PushConfigSet {
        /// The client's task.
        task_id: String,
        config_id: String,
        context_id: String,
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token_ref: Option<String>,
        /// The `Authorization` scheme (`Bearer`, `Basic`, ...) of the credentials.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        auth_scheme: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credentials_ref: Option<String>,
        /// The task had already ended when the config was set: no notification will follow.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        task_ended: bool,
    },
    PushConfigDeleted {
        task_id: String,
        config_id: String,
    },
    /// The user sent a message to an external agent (`synapse send <alias>`, `external send`)
    /// and waits for its reply: the task (`task_created` before it: owner none, peer
    /// `external:<alias>`) is completed by a reply that names the send's reply token, once.
    ExternalMessageSent {
        task_id: String,
        alias: String,
        /// SHA-256 (hex) of the random reply token sent as `metadata.sender_task_id`: the
        /// token itself is never stored, shown or answered.
        reply_token_sha256: String,
        /// Sent by the user (the only sender of external messages): only the user cancels it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        by_user: bool,
    },
    /// An external agent answered an `external_message_sent` with its reply token: `text`
    /// completes the task (a `task_state_changed` to `completed` follows in the same batch).
    ExternalReplyReceived {
        task_id: String,
        /// The name the replier gave (`metadata.sender.sender_id`), unverified; none when it
        /// gave none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        text: String,
        /// The token the reply named (its SHA-256): spent, never taken again.
        reply_token_sha256: String,
    },
}

fn is_zero(number: &u32) -> bool {
    *number == 0
}

impl Event {
    /// The bytes of the texts it carries (a message, a reply, an output, an error): all but a
    /// few hundred bytes of a long event, and what makes one long.
    pub fn text_bytes(&self) -> usize {
        let parts = |parts: &[Part]| parts.iter().map(Part::bytes).sum::<usize>();
        match self {
            Event::TaskCreated { message, .. } => parts(&message.parts),
            Event::MessageSent { text, parts: more, .. } => text.len() + parts(more),
            Event::ReplyPosted { text, .. }
            | Event::TaskContinued { text, .. }
            | Event::ExternalReplyReceived { text, .. } => text.len(),
            Event::TaskStateChanged { artifacts, error, .. } => {
                artifacts.iter().map(|artifact| parts(&artifact.parts)).sum::<usize>()
                    + error.as_ref().map_or(0, String::len)
            }
            _ => 0,
        }
    }

    /// The kind's wire name (`message_sent`, ...).
    /// Every kind [`Event::kind`] names, in the enum's order.
    pub const KINDS: [&'static str; 28] = [
        "agent_registered",
        "agent_status_changed",
        "agent_deregistered",
        "task_created",
        "message_sent",
        "ticket_issued",
        "ticket_injected",
        "reply_posted",
        "reverse_ticket_issued",
        "task_state_changed",
        "task_canceled",
        "file_lock_acquired",
        "file_lock_released",
        "file_modified",
        "history_pruned",
        "webhook_registered",
        "webhook_removed",
        "webhook_delivery_attempted",
        "external_agent_added",
        "external_agent_removed",
        "file_modifications_pruned",
        "inbox_expired",
        "idempotency_keys_expired",
        "task_continued",
        "push_config_set",
        "push_config_deleted",
        "external_message_sent",
        "external_reply_received",
    ];

    pub fn kind(&self) -> &'static str {
        match self {
            Event::AgentRegistered { .. } => "agent_registered",
            Event::AgentStatusChanged { .. } => "agent_status_changed",
            Event::AgentDeregistered { .. } => "agent_deregistered",
            Event::TaskCreated { .. } => "task_created",
            Event::MessageSent { .. } => "message_sent",
            Event::TicketIssued { .. } => "ticket_issued",
            Event::TicketInjected { .. } => "ticket_injected",
            Event::ReplyPosted { .. } => "reply_posted",
            Event::ReverseTicketIssued { .. } => "reverse_ticket_issued",
            Event::TaskStateChanged { .. } => "task_state_changed",
            Event::TaskCanceled { .. } => "task_canceled",
            Event::FileLockAcquired { .. } => "file_lock_acquired",
            Event::FileLockReleased { .. } => "file_lock_released",
            Event::FileModified { .. } => "file_modified",
            Event::HistoryPruned { .. } => "history_pruned",
            Event::WebhookRegistered { .. } => "webhook_registered",
            Event::WebhookRemoved { .. } => "webhook_removed",
            Event::WebhookDeliveryAttempted { .. } => "webhook_delivery_attempted",
            Event::ExternalAgentAdded { .. } => "external_agent_added",
            Event::ExternalAgentRemoved { .. } => "external_agent_removed",
            Event::FileModificationsPruned { .. } => "file_modifications_pruned",
            Event::InboxExpired { .. } => "inbox_expired",
            Event::IdempotencyKeysExpired { .. } => "idempotency_keys_expired",
            Event::TaskContinued { .. } => "task_continued",
            Event::PushConfigSet { .. } => "push_config_set",
            Event::PushConfigDeleted { .. } => "push_config_deleted",
            Event::ExternalMessageSent { .. } => "external_message_sent",
            Event::ExternalReplyReceived { .. } => "external_reply_received",
        }
    }

    /// Does the event refer to a text stored in another event (`message_in`, `reply_of`)?
    pub fn refers_to_text(&self) -> bool {
        matches!(
            self,
            Event::TaskCreated { message_in: Some(_), .. } | Event::TaskStateChanged { reply_of: Some(_), .. }
        )
    }

    /// Agents this event concerns (for filtering tails by agent).
    pub fn agents(&self) -> Vec<&str> {
        match self {
            Event::AgentRegistered { agent_id, .. }
            | Event::AgentStatusChanged { agent_id, .. }
            | Event::AgentDeregistered { agent_id, .. }
            | Event::TicketIssued { agent_id, .. }
            | Event::TicketInjected { agent_id, .. }
            | Event::ReverseTicketIssued { agent_id, .. }
            | Event::FileLockAcquired { agent_id, .. }
            | Event::FileLockReleased { agent_id, .. }
            | Event::FileModified { agent_id, .. }
            | Event::InboxExpired { agent_id, .. } => vec![agent_id.as_str()],
            Event::TaskCreated { owner, peer, .. } => {
                [owner.as_deref(), peer.as_deref()].into_iter().flatten().collect()
            }
            Event::MessageSent { from, to, .. } | Event::TaskContinued { from, to, .. } => {
                [from.as_deref(), Some(to.as_str())].into_iter().flatten().collect()
            }
            Event::ReplyPosted { from, to, .. } => [Some(from.as_str()), to.as_deref()].into_iter().flatten().collect(),
            _ => Vec::new(),
        }
    }

    /// One short human line describing the event (for `synapse events`).
    pub fn summary(&self) -> String {
        fn anon(agent: &Option<String>) -> &str {
            agent.as_deref().unwrap_or("anonymous")
        }
        match self {
            Event::AgentRegistered { agent_id, pid, port, .. } => {
                format!("{agent_id} registered (pid {pid}, port {port})")
            }
            Event::AgentStatusChanged { agent_id, status, note: None } => format!("{agent_id} is {status}"),
            Event::AgentStatusChanged { agent_id, status, note: Some(note) } => {
                format!("{agent_id} is {status}: {note}")
            }
            Event::AgentDeregistered { agent_id, reason } => format!("{agent_id} gone ({reason})"),
            Event::TaskCreated { task_id, owner, direction, .. } => {
                format!("task {} ({direction}) for {}", short_id(task_id), anon(owner))
            }
            Event::MessageSent { task_id, from, to, priority, response_expected, text, unverified_sender, .. } => {
                format!(
                    "{} -> {to} p{priority}{} task {}: {}",
                    match unverified_sender {
                        Some(name) => format!("{name} (unverified)"),
                        None => anon(from).to_string(),
                    },
                    if *response_expected { " (reply expected)" } else { "" },
                    short_id(task_id),
                    preview(text, 60)
                )
            }
            Event::TicketIssued { agent_id, task_id, .. } => {
                format!("ticket for {agent_id} (task {})", short_id(task_id))
            }
            Event::TicketInjected { agent_id, ticket, .. } => {
                format!("ticket {ticket} written into {agent_id}")
            }
            Event::ReplyPosted { task_id, from, to, text, .. } => {
                format!("{from} replied to {} (task {}): {}", anon(to), short_id(task_id), preview(text, 60))
            }
            Event::ReverseTicketIssued { agent_id, task_id, from, .. } => {
                format!("answer from {from} queued for {agent_id} (task {})", short_id(task_id))
            }
            Event::TaskStateChanged { task_id, state, error, .. } => match error {
                Some(error) => format!("task {} {state}: {}", short_id(task_id), preview(error, 60)),
                None => format!("task {} {state}", short_id(task_id)),
            },
            Event::TaskCanceled { task_id, .. } => format!("task {} canceled", short_id(task_id)),
            Event::FileLockAcquired { path, agent_id, .. } => format!("{agent_id} locked {path}"),
            Event::FileLockReleased { path, agent_id, forced } => {
                format!("{agent_id} {} {path}", if *forced { "force-unlocked" } else { "unlocked" })
            }
            Event::FileModified { path, agent_id, change_type, .. } => {
                format!("{agent_id} {change_type} {path}")
            }
            Event::HistoryPruned { before_ms, .. } => format!("history pruned before {before_ms}"),
            Event::WebhookRegistered { url, .. } => format!("webhook {url} registered"),
            Event::WebhookRemoved { url, .. } => format!("webhook {url} removed"),
            Event::WebhookDeliveryAttempted { delivery_id, attempt, status, .. } => format!(
                "webhook delivery {} attempt {attempt}: {}",
                short_id(delivery_id),
                status.map_or("no answer".to_string(), |s| s.to_string())
            ),
            Event::ExternalAgentAdded { alias, url, .. } => format!("external agent {alias} at {url}"),
            Event::ExternalAgentRemoved { alias } => format!("external agent {alias} removed"),
            Event::FileModificationsPruned { before_ms } => {
                format!("file modifications before {} pruned", crate::time::rfc3339(*before_ms))
            }
            Event::InboxExpired { agent_id, reason, tickets } => {
                format!("{tickets} queued ticket(s) of {agent_id} dropped: {reason}")
            }
            Event::IdempotencyKeysExpired { before_ms } => {
                format!("idempotency keys before {} expired", crate::time::rfc3339(*before_ms))
            }
            Event::TaskContinued { task_id, from, to, text, .. } => {
                format!("{} -> {to} follow-up on task {}: {}", anon(from), short_id(task_id), preview(text, 60))
            }
            Event::PushConfigSet { task_id, config_id, url, .. } => {
                format!("push notifications of task {} to {url} (config {config_id})", short_id(task_id))
            }
            Event::PushConfigDeleted { task_id, config_id } => {
                format!("push config {config_id} of task {} deleted", short_id(task_id))
            }
            Event::ExternalMessageSent { task_id, alias, .. } => {
                format!("message to external agent {alias} (task {}, reply expected)", short_id(task_id))
            }
            Event::ExternalReplyReceived { task_id, from, text, .. } => format!(
                "{} (external, unverified) replied (task {}): {}",
                from.as_deref().unwrap_or("an external agent"),
                short_id(task_id),
                preview(text, 60)
            ),
        }
    }
}

/// The first eight characters of an id (what terminals show).
pub fn short_id(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// The text cut to at most `max` characters on one line.
pub fn preview(text: &str, max: usize) -> String {
    let line: String = text.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect();
    if line.chars().count() <= max {
        line
    } else {
        let cut: String = line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests;
