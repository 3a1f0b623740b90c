//! Commands to the writer and how each is decided against the projections.
//!
//! `decide` runs inside the writer's transaction and sees every command decided before it in
//! the same batch. It returns the events to append (all or nothing) and the answer for the
//! caller; a rejected command returns an error and appends nothing.

use crate::event::{Artifact, Direction, Event, INLINE_TEXT_MAX_BYTES, Message, Part, Role, TaskState, short_id};
use crate::process::{is_pid_alive, pid_exists};
use crate::store::{AgentRecord, DepartedAgent, Projections, StoreError, TaskRecord};
use serde::{Deserialize, Serialize};

/// Largest accepted message text, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// A request to change the log.
#[derive(Debug, Clone)]
pub enum Command {
    RegisterAgent(RegisterRequest),
    SetStatus {
        agent_id: String,
        status: crate::event::AgentStatus,
        note: Option<String>,
    },
    Deregister {
        agent_id: String,
        reason: String,
    },
    Send(SendRequest),
    CreateTask {
        owner: String,
        secret: Option<String>,
        message: Message,
        peer: Option<String>,
    },
    /// Cancel a task: by its sender or receiver (proved), or the user; a task sent anonymously
    /// may also be canceled anonymously (its sender cannot prove itself, A2A clients do this).
    CancelTask {
        task_id: String,
        reason: Option<String>,
        actor: Actor,
    },
    AckInjection {
        agent_id: String,
        ticket: u64,
    },
    /// The receiving agent itself (proved by its secret) moves a task it received to a new
    /// state, with artifacts; the sender's task waiting on it follows (scenario agent, A2A).
    UpdateTask(UpdateTaskRequest),
    /// Webhook registrations and delivery records (see `broker::webhooks`).
    Webhook(super::webhooks::WebhookCommand),
    /// External agents added or removed (see `broker::externals`).
    External(super::externals::ExternalCommand),
    /// File locks and modification records (see `broker::file_safety`).
    FileSafety(super::file_safety::FileCommand),
    /// Prune the history view (the event is `HistoryPruned`, built by the caller).
    Prune(Event),
    /// Drop the queues of departed agents that nobody took back within `hold_ms` (see
    /// [`crate::broker::agents`] for the rule).
    ExpireInboxes {
        hold_ms: u64,
    },
    /// Drop the idempotency keys older than [`IDEMPOTENCY_WINDOW_MS`] (nothing is appended
    /// when none is).
    ExpireIdempotencyKeys,
}

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

/// The body of [`Command::UpdateTask`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateTaskRequest {
    pub agent_id: String,
    #[serde(default)]
    pub secret: Option<String>,
    /// The agent's own received task (full id or unique prefix).
    pub task_id: String,
    pub state: TaskState,
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub agent_type: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    pub pid: u32,
    #[serde(default)]
    pub working_dir: String,
    /// The port the broker has bound for this agent.
    #[serde(default)]
    pub port: u16,
    #[serde(default, skip_serializing)]
    pub secret_hash: String,
    /// The start time of `pid`, read by the broker when it checked the registration.
    #[serde(default, skip_serializing)]
    pub pid_start: Option<u64>,
    /// The registering peer is the process registered (see `Event::AgentRegistered`).
    #[serde(default, skip_serializing)]
    pub wrapper: bool,
    /// The registration was made by the user (the admin key, or a peer not inside an agent):
    /// only then may it take back a departed agent's queue.
    #[serde(default, skip_serializing)]
    pub by_user: bool,
}

/// A message to an agent (the body of `synapse send` and `POST /tasks/send`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    /// Target: a custom name, an agent id, `<type>-<port>` or a type.
    pub to: String,
    #[serde(default)]
    pub from: Option<String>,
    /// The sender agent's secret (`SYNAPSE_AGENT_SECRET`), required when `from` is registered.
    #[serde(default)]
    pub secret: Option<String>,
    pub text: String,
    #[serde(default = "default_priority")]
    pub priority: u8,
    #[serde(default)]
    pub response_expected: bool,
    /// Answer this task (full id or unique prefix).
    #[serde(default)]
    pub reply_to: Option<String>,
    #[serde(default)]
    pub context_id: Option<String>,
    /// A task the sender created beforehand (`POST /tasks/create`, seed 002) that the reply
    /// should complete, instead of a new one.
    #[serde(default)]
    pub sender_task_id: Option<String>,
    /// `Idempotency-Key`: a second send with the same key from the same sender within
    /// [`IDEMPOTENCY_WINDOW_MS`] answers the first send's tasks and sends nothing.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Set by the broker, never read from the body: the request came from the user (see
    /// `http::caller`). An anonymous send by the user may be cancelled only by the user.
    #[serde(skip)]
    pub by_user: bool,
}

/// How long an idempotency key holds: a retry after this is a new send.
pub const IDEMPOTENCY_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;
/// The longest idempotency key accepted.
const IDEMPOTENCY_KEY_MAX_CHARS: usize = 200;

pub fn default_priority() -> u8 {
    3
}

/// What the writer answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Registered {
        agent: AgentRecord,
    },
    StatusSet {
        changed: bool,
    },
    Deregistered,
    Sent(Box<SendOutcome>),
    Task {
        task: TaskRecord,
    },
    Injected {
        ticket: u64,
    },
    /// Events were appended; `seq` is the last one.
    Appended {
        seq: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendOutcome {
    /// The receiver's task.
    pub task: TaskRecord,
    /// The sender's own task when a reply is expected (or, for a reply, the task it completed).
    #[serde(default)]
    pub sender_task: Option<TaskRecord>,
    /// True when this message answered an earlier one.
    pub is_reply: bool,
    /// Set when `reply_to` was not found and the message went out as a new one.
    #[serde(default)]
    pub warning: Option<String>,
    /// Sequence number of the last event of the send (followers start after it).
    pub seq: u64,
}

/// Why a command was refused. Each maps to one HTTP status.
#[derive(Debug, Clone, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum CommandError {
    #[error("{message}")]
    BadRequest { message: String },
    #[error("{message}")]
    Ambiguous { message: String, candidates: Vec<String> },
    #[error("{message}")]
    NotFound { message: String },
    #[error("{message}")]
    Conflict { message: String },
    #[error("{message}")]
    Forbidden { message: String },
    #[error("{message}")]
    TooLarge { message: String },
    #[error("{message}")]
    Unavailable { message: String },
}

impl CommandError {
    pub fn bad(message: impl Into<String>) -> Self {
        CommandError::BadRequest { message: message.into() }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        CommandError::NotFound { message: message.into() }
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        CommandError::Conflict { message: message.into() }
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        CommandError::Forbidden { message: message.into() }
    }
}

/// A decision failed either because the command is wrong (answer the caller) or because the
/// storage failed (abort the whole batch).
pub enum DecideError {
    Rejected(CommandError),
    Storage(StoreError),
}

impl From<StoreError> for DecideError {
    fn from(error: StoreError) -> Self {
        DecideError::Storage(error)
    }
}

impl From<CommandError> for DecideError {
    fn from(error: CommandError) -> Self {
        DecideError::Rejected(error)
    }
}

/// What decide produced: the acting agent, the events, and how to build the answer once the
/// events have sequence numbers.
pub struct Decision {
    pub actor: Option<String>,
    pub events: Vec<Event>,
    pub answer: Answer,
}

/// The answer, completed with the view after the events were applied.
pub enum Answer {
    Registered { agent_id: String },
    StatusSet { changed: bool },
    Deregistered,
    Sent { task_id: String, sender_task_id: Option<String>, is_reply: bool, warning: Option<String> },
    Task { task_id: String },
    Injected { ticket: u64 },
    Appended,
}

pub fn agent_id_for(agent_type: &str, port: u16) -> String {
    format!("synapse-{agent_type}-{port}")
}

fn is_valid_agent_type(agent_type: &str) -> bool {
    !agent_type.is_empty()
        && agent_type.len() <= 32
        && agent_type.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A task id or prefix: hexadecimal digits and dashes, 1 to 36 characters.
pub fn validate_task_ref(reference: &str) -> Result<String, CommandError> {
    let reference = reference.trim().to_ascii_lowercase();
    if reference.is_empty() || reference.len() > 36 || !reference.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(CommandError::bad(format!(
            "Invalid task id '{reference}': expected a task id or its prefix (hexadecimal, e.g. 'abc12345')"
        )));
    }
    Ok(reference)
}

/// Finds one task by full id or unique prefix.
pub fn find_task(view: &Projections<'_>, reference: &str) -> Result<Option<TaskRecord>, DecideError> {
    let reference = validate_task_ref(reference)?;
    Ok(unique_task(&reference, view.tasks_with_prefix(&reference, 11)?)?)
}

/// The task a prefix names among `candidates` (the tasks whose id starts with it): none, the
/// one, or an ambiguity error listing them.
pub fn unique_task(reference: &str, candidates: Vec<TaskRecord>) -> Result<Option<TaskRecord>, CommandError> {
    match candidates.len() {
        0 | 1 => Ok(candidates.into_iter().next()),
        _ => Err(ambiguous_task(reference, &candidates)),
    }
}

pub fn ambiguous_task(reference: &str, candidates: &[TaskRecord]) -> CommandError {
    let ids: Vec<String> = candidates.iter().take(10).map(|task| task.id.clone()).collect();
    CommandError::Ambiguous {
        message: format!(
            "Ambiguous task id '{reference}': {} tasks start with it ({}). Use more characters.",
            if candidates.len() > 10 { "more than 10".to_string() } else { candidates.len().to_string() },
            ids.join(", ")
        ),
        candidates: ids,
    }
}

/// Resolves a target among the registered agents whose process still runs. An exact agent id
/// is one lookup and one liveness check (the hot path of every send); names, `<type>-<port>`
/// and types scan the agents. Names may not look like agent ids, so the order of SPEC §2 holds.
fn resolve_live_target(view: &Projections<'_>, target: &str) -> Result<AgentRecord, DecideError> {
    if let Some(agent) = view.agent(target.trim())? {
        if pid_exists(agent.pid) {
            return Ok(agent);
        }
        return Err(CommandError::not_found(format!(
            "Error: Agent '{}' is no longer running (process {} is gone); it is being removed from the list.",
            agent.agent_id, agent.pid
        ))
        .into());
    }
    let agents: Vec<AgentRecord> = view.agents()?.into_iter().filter(|agent| is_pid_alive(agent.pid)).collect();
    Ok(resolve_target(&agents, target)?)
}

/// Target resolution: custom name → agent id → `<type>-<port>` → type; first hit wins.
pub fn resolve_target(agents: &[AgentRecord], target: &str) -> Result<AgentRecord, CommandError> {
    let target = target.trim();
    if target.is_empty() {
        return Err(CommandError::bad("Error: no target given"));
    }
    if let Some(agent) = agents.iter().find(|agent| agent.name.as_deref() == Some(target)) {
        return Ok(agent.clone());
    }
    if let Some(agent) = agents.iter().find(|agent| agent.agent_id == target) {
        return Ok(agent.clone());
    }
    if let Some(agent) = agents.iter().find(|agent| format!("{}-{}", agent.agent_type, agent.port) == target) {
        return Ok(agent.clone());
    }
    let of_type: Vec<&AgentRecord> = agents.iter().filter(|agent| agent.agent_type == target).collect();
    match of_type.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(CommandError::not_found(format!(
            "Error: No agent found matching '{target}'. Run 'synapse list' to see the running agents."
        ))),
        many => {
            let ids: Vec<String> = many.iter().map(|agent| agent.agent_id.clone()).collect();
            Err(CommandError::Ambiguous {
                message: format!(
                    "Error: Ambiguous target '{target}'. Multiple agents found: {}. Use the agent id or name.",
                    ids.join(", ")
                ),
                candidates: ids,
            })
        }
    }
}

/// Checks that `from` may speak: anonymous, or a registered agent proving it with its secret.
fn check_sender(
    view: &Projections<'_>,
    from: Option<&str>,
    secret: Option<&str>,
) -> Result<Option<AgentRecord>, DecideError> {
    let Some(from) = from else { return Ok(None) };
    let Some(agent) = view.agent(from)? else {
        return Err(CommandError::bad(format!(
            "Error: unknown sender '{from}': no registered agent has this id. Leave --from out to send anonymously."
        ))
        .into());
    };
    match secret {
        Some(secret) if crate::secret::secret_matches(secret, &agent.secret_hash) => Ok(Some(agent)),
        Some(_) => Err(CommandError::forbidden(format!(
            "Error: the secret does not match agent '{from}'. Only {from} itself (with its SYNAPSE_AGENT_SECRET) can send as it."
        ))
        .into()),
        None => Err(CommandError::forbidden(format!(
            "Error: sending as '{from}' requires its secret. Run the command inside that agent (SYNAPSE_AGENT_SECRET is set there), or leave --from out to send anonymously."
        ))
        .into()),
    }
}

fn validate_text(text: &str) -> Result<(), CommandError> {
    if text.trim().is_empty() {
        return Err(CommandError::bad("Error: the message is empty"));
    }
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(CommandError::TooLarge {
            message: format!("Error: the message is {} bytes; the limit is {MAX_MESSAGE_BYTES}", text.len()),
        });
    }
    Ok(())
}

pub fn validate_priority(priority: u8) -> Result<(), CommandError> {
    if !(1..=5).contains(&priority) {
        return Err(CommandError::bad(format!("Error: priority must be between 1 and 5 (got {priority})")));
    }
    Ok(())
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The agent that sent the message a task records (None: anonymous).
fn task_sender(task: &TaskRecord) -> Option<&str> {
    match task.direction {
        Direction::Incoming => task.peer.as_deref(),
        Direction::Outgoing => task.owner.as_deref(),
    }
}

/// The agent that received the message a task records.
fn task_receiver(task: &TaskRecord) -> Option<&str> {
    match task.direction {
        Direction::Incoming => task.owner.as_deref(),
        Direction::Outgoing => task.peer.as_deref(),
    }
}

/// Cancel rights: the user; the task's sender or receiver; anyone when the sender was
/// anonymous (an anonymous sender has nothing to prove itself with) — unless that sender was
/// the user, whose sends only the user (and the receiver) cancel.
fn may_cancel(task: &TaskRecord, actor: &Actor) -> bool {
    match actor {
        Actor::User => true,
        Actor::Agent(agent) => task_sender(task) == Some(agent.as_str()) || task_receiver(task) == Some(agent.as_str()),
        Actor::Anonymous => task_sender(task).is_none() && !task.sent_by_user,
    }
}

/// Decides one command against the current projections; `now_ms` is the batch's time (lock
/// expiry is measured against it).
pub fn decide(view: &Projections<'_>, command: &Command, now_ms: u64) -> Result<Decision, DecideError> {
    match command {
        Command::RegisterAgent(request) => decide_register(view, request),
        Command::SetStatus { agent_id, status, note } => {
            let Some(agent) = view.agent(agent_id)? else {
                return Err(CommandError::not_found(format!("Agent '{agent_id}' is not registered")).into());
            };
            let changed = agent.status != *status || agent.status_note != *note;
            let events = if changed {
                vec![Event::AgentStatusChanged { agent_id: agent_id.clone(), status: *status, note: note.clone() }]
            } else {
                Vec::new()
            };
            Ok(Decision { actor: Some(agent_id.clone()), events, answer: Answer::StatusSet { changed } })
        }
        Command::Deregister { agent_id, reason } => {
            if view.agent(agent_id)?.is_none() {
                return Err(CommandError::not_found(format!("Agent '{agent_id}' is not registered")).into());
            }
            Ok(Decision {
                actor: Some(agent_id.clone()),
                events: vec![Event::AgentDeregistered { agent_id: agent_id.clone(), reason: reason.clone() }],
                answer: Answer::Deregistered,
            })
        }
        Command::Send(request) => decide_send(view, request, now_ms),
        Command::CreateTask { owner, secret, message, peer } => {
            check_sender(view, Some(owner), secret.as_deref())?;
            validate_text(&message.joined_text())?;
            let task_id = new_id();
            Ok(Decision {
                actor: Some(owner.clone()),
                events: vec![Event::TaskCreated {
                    task_id: task_id.clone(),
                    owner: Some(owner.clone()),
                    context_id: new_id(),
                    direction: Direction::Outgoing,
                    peer: peer.clone(),
                    state: TaskState::Working,
                    message: message.clone(),
                    priority: default_priority(),
                    response_expected: true,
                    sender_task_id: None,
                    in_reply_to: None,
                    peer_task_id: None,
                    message_in: None,
                }],
                answer: Answer::Task { task_id },
            })
        }
        Command::CancelTask { task_id, reason, actor } => {
            let Some(task) = find_task(view, task_id)? else {
                return Err(CommandError::not_found(format!("Task {task_id} not found")).into());
            };
            if !may_cancel(&task, actor) {
                return Err(CommandError::forbidden(format!(
                    "Error: task {} may be canceled only by its sender ({}), its receiver ({}) or the user",
                    short_id(&task.id),
                    task_sender(&task).unwrap_or("anonymous"),
                    task_receiver(&task).unwrap_or("anonymous"),
                ))
                .into());
            }
            if !matches!(task.state, TaskState::Submitted | TaskState::Working | TaskState::InputRequired) {
                return Err(CommandError::bad(format!(
                    "Task {} is {} and cannot be canceled",
                    short_id(&task.id),
                    task.state
                ))
                .into());
            }
            Ok(Decision {
                actor: task.owner.clone(),
                events: vec![Event::TaskCanceled { task_id: task.id.clone(), reason: reason.clone() }],
                answer: Answer::Task { task_id: task.id },
            })
        }
        Command::AckInjection { agent_id, ticket } => {
            let mut found = None;
            for priority in (1..=5).rev() {
                if let Some(entry) = view.ticket(agent_id, priority, *ticket)? {
                    found = Some(entry);
                    break;
                }
            }
            let Some(entry) = found else {
                return Err(CommandError::not_found(format!(
                    "Ticket {ticket} is not in {agent_id}'s inbox (already delivered?)"
                ))
                .into());
            };
            let mut events =
                vec![Event::TicketInjected { agent_id: agent_id.clone(), ticket: *ticket, priority: entry.priority }];
            // A ticket just written means the CLI is working on it.
            if let Some(agent) = view.agent(agent_id)?
                && agent.status != crate::event::AgentStatus::Processing
            {
                events.push(Event::AgentStatusChanged {
                    agent_id: agent_id.clone(),
                    status: crate::event::AgentStatus::Processing,
                    note: None,
                });
            }
            if entry.kind == crate::store::TicketKind::Message
                && let Some(task) = view.task(&entry.task_id)?
                && task.state == TaskState::Submitted
            {
                events.push(Event::TaskStateChanged {
                    task_id: task.id,
                    state: TaskState::Working,
                    artifacts: Vec::new(),
                    error: None,
                    reply_of: None,
                });
            }
            Ok(Decision { actor: Some(agent_id.clone()), events, answer: Answer::Injected { ticket: *ticket } })
        }
        Command::UpdateTask(request) => decide_update_task(view, request),
        Command::Webhook(command) => super::webhooks::decide(command),
        Command::External(command) => super::externals::decide(command),
        Command::FileSafety(command) => super::file_safety::decide(view, command, now_ms),
        Command::ExpireInboxes { hold_ms } => decide_expire_inboxes(view, *hold_ms, now_ms),
        Command::ExpireIdempotencyKeys => decide_expire_idempotency_keys(view, now_ms),
        Command::Prune(event) => match event {
            Event::HistoryPruned { .. } => {
                Ok(Decision { actor: None, events: vec![event.clone()], answer: Answer::Appended })
            }
            _ => Err(CommandError::bad("only history_pruned events can be appended this way").into()),
        },
    }
}

/// An agent moves a task it received: its own task and the sender's task waiting on it change
/// together (all or nothing). Final tasks never change again; cancel has its own command.
fn decide_update_task(view: &Projections<'_>, request: &UpdateTaskRequest) -> Result<Decision, DecideError> {
    check_sender(view, Some(&request.agent_id), request.secret.as_deref())?;
    let Some(task) = find_task(view, &request.task_id)? else {
        return Err(CommandError::not_found(format!("Task {} not found", request.task_id)).into());
    };
    if task.owner.as_deref() != Some(request.agent_id.as_str()) || task.direction != Direction::Incoming {
        return Err(CommandError::forbidden(format!(
            "Error: task {} was not sent to {}; only its receiver can change it",
            short_id(&task.id),
            request.agent_id
        ))
        .into());
    }
    if matches!(request.state, TaskState::Submitted | TaskState::Canceled) {
        return Err(CommandError::bad(format!(
            "Error: an agent cannot move a task to {} (use working, input_required, completed or failed; cancel has its own request)",
            request.state
        ))
        .into());
    }
    if task.state.is_final() {
        return Err(CommandError::conflict(format!(
            "Error: task {} is already {}; nothing changed",
            short_id(&task.id),
            task.state
        ))
        .into());
    }
    let change = |task_id: &str| Event::TaskStateChanged {
        task_id: task_id.to_string(),
        state: request.state,
        artifacts: request.artifacts.clone(),
        error: request.error.clone(),
        reply_of: None,
    };
    let mut events = vec![change(&task.id)];
    if let Some(sender_task) = view.open_outgoing_of(&task)?
        && !sender_task.state.is_final()
    {
        events.push(change(&sender_task.id));
    }
    Ok(Decision { actor: Some(request.agent_id.clone()), events, answer: Answer::Task { task_id: task.id } })
}

/// Does `agent_id` still hold a departed agent's queue? Then it is that agent's until it is
/// started again with the same name, or the queue expires.
fn held_queue(view: &Projections<'_>, agent_id: &str) -> Result<Option<(DepartedAgent, usize)>, StoreError> {
    let Some(departed) = view.departed(agent_id)? else { return Ok(None) };
    let pending = view.pending_for(agent_id)?;
    Ok((pending > 0).then_some((departed, pending)))
}

/// The id an agent registering with `name` takes back: the id a departed agent of the same name
/// and type left with messages queued.
fn reclaimable_id(view: &Projections<'_>, request: &RegisterRequest) -> Result<Option<String>, StoreError> {
    let Some(name) = &request.name else { return Ok(None) };
    for departed in view.departed_agents()? {
        if departed.name.as_ref() == Some(name)
            && departed.agent_type == request.agent_type
            && view.pending_for(&departed.agent_id)? > 0
        {
            return Ok(Some(departed.agent_id));
        }
    }
    Ok(None)
}

/// Drops the keys whose window has passed: decide already ignores them, so this only keeps
/// the table from growing with every keyed send.
fn decide_expire_idempotency_keys(view: &Projections<'_>, now_ms: u64) -> Result<Decision, DecideError> {
    let before_ms = now_ms.saturating_sub(IDEMPOTENCY_WINDOW_MS);
    let events = if view.has_idempotency_keys_before(before_ms)? {
        vec![Event::IdempotencyKeysExpired { before_ms }]
    } else {
        Vec::new()
    };
    Ok(Decision { actor: None, events, answer: Answer::Appended })
}

/// Drops the queues nobody took back in time: the tasks still waiting on them fail with a
/// visible reason (the sender's task too), then `inbox_expired` empties the inbox.
fn decide_expire_inboxes(view: &Projections<'_>, hold_ms: u64, now_ms: u64) -> Result<Decision, DecideError> {
    let mut events = Vec::new();
    for departed in view.departed_agents()? {
        if now_ms < departed.departed_ms.saturating_add(hold_ms) {
            continue;
        }
        if view.pending_for(&departed.agent_id)? == 0 {
            continue;
        }
        let tickets = view.inbox(&departed.agent_id, usize::MAX)?;
        let reason = format!(
            "{}{} left with this message queued and was not started again (same --name) within {} s; the message was dropped",
            departed.agent_id,
            departed.name.as_ref().map(|name| format!(" ({name})")).unwrap_or_default(),
            hold_ms / 1000
        );
        // The messages queued and the requests received but not answered: each task once.
        let mut waiting: Vec<String> = tickets
            .iter()
            .filter(|ticket| ticket.kind == crate::store::TicketKind::Message)
            .map(|ticket| ticket.task_id.clone())
            .collect();
        for target in view.reply_targets(&departed.agent_id)? {
            if !waiting.contains(&target.receiver_task_id) {
                waiting.push(target.receiver_task_id);
            }
        }
        for task_id in waiting {
            let Some(task) = view.task(&task_id)? else { continue };
            if task.state.is_final() {
                continue;
            }
            let failed = |task_id: &str| Event::TaskStateChanged {
                task_id: task_id.to_string(),
                state: TaskState::Failed,
                artifacts: Vec::new(),
                error: Some(reason.clone()),
                reply_of: None,
            };
            if let Some(sender_task) = view.open_outgoing_of(&task)?
                && !sender_task.state.is_final()
            {
                events.push(failed(&sender_task.id));
            }
            events.push(failed(&task.id));
        }
        events.push(Event::InboxExpired {
            agent_id: departed.agent_id.clone(),
            reason,
            tickets: u64::try_from(tickets.len()).unwrap_or(u64::MAX),
        });
    }
    Ok(Decision { actor: None, events, answer: Answer::Appended })
}

fn decide_register(view: &Projections<'_>, request: &RegisterRequest) -> Result<Decision, DecideError> {
    if !is_valid_agent_type(&request.agent_type) {
        return Err(CommandError::bad(format!(
            "Invalid agent type '{}': use lowercase letters, digits and '_' (at most 32)",
            request.agent_type
        ))
        .into());
    }
    if request.port == 0 {
        return Err(CommandError::bad("Invalid port 0").into());
    }
    if let Some(name) = &request.name
        && (name.trim().is_empty() || name.len() > 64 || name.chars().any(char::is_whitespace))
    {
        return Err(CommandError::bad(format!("Invalid name '{name}': 1 to 64 characters, no spaces")).into());
    }
    if let Some(name) = &request.name
        && name.starts_with("synapse-")
    {
        return Err(CommandError::bad(format!(
            "Invalid name '{name}': names may not start with 'synapse-' (agent ids do)"
        ))
        .into());
    }
    // The inbox belongs to the agent: the same name takes its departed id (and its queue) back,
    // even on another port; no other agent gets an id that still holds someone's queue.
    let agent_id = match reclaimable_id(view, request)? {
        // Taking a queue back gives its messages (other agents' words) to the caller: only the
        // user, never a process inside another agent.
        Some(agent_id) if !request.by_user => {
            return Err(CommandError::forbidden(format!(
                "Error: {agent_id} left with messages queued; only the user takes them back: start the agent again with --name {} from a plain shell (not inside another agent), or register with the admin key",
                request.name.as_deref().unwrap_or_default()
            ))
            .into());
        }
        Some(agent_id) => agent_id,
        None => {
            let agent_id = agent_id_for(&request.agent_type, request.port);
            if let Some((departed, pending)) = held_queue(view, &agent_id)? {
                return Err(CommandError::conflict(format!(
                    "port {}: its id {agent_id} holds {pending} pending message(s) of {} which left (queued, or received and not answered); they wait for it to start again{} or expire",
                    request.port,
                    departed.name.as_deref().unwrap_or(agent_id.as_str()),
                    departed.name.as_ref().map(|name| format!(" with --name {name}")).unwrap_or_default(),
                ))
                .into());
            }
            agent_id
        }
    };
    let mut events = Vec::new();
    let agents = view.agents()?;
    for other in &agents {
        let alive = is_pid_alive(other.pid);
        let same_slot = other.agent_id == agent_id || other.port == request.port;
        let same_name = request.name.is_some() && other.name == request.name;
        if !(same_slot || same_name) {
            continue;
        }
        if alive && other.pid != request.pid {
            let what = if same_slot {
                format!("port {}", request.port)
            } else {
                format!("name '{}'", other.name.as_deref().unwrap_or_default())
            };
            return Err(CommandError::conflict(format!(
                "{what} is taken by agent {} (pid {})",
                other.agent_id, other.pid
            ))
            .into());
        }
        events.push(Event::AgentDeregistered {
            agent_id: other.agent_id.clone(),
            reason: if alive { "re-registered".into() } else { "process gone".into() },
        });
    }
    events.push(Event::AgentRegistered {
        agent_id: agent_id.clone(),
        agent_type: request.agent_type.clone(),
        name: request.name.clone(),
        role: request.role.clone(),
        pid: request.pid,
        port: request.port,
        working_dir: request.working_dir.clone(),
        secret_hash: request.secret_hash.clone(),
        pid_start: request.pid_start,
        wrapper: request.wrapper,
    });
    Ok(Decision { actor: Some(agent_id.clone()), events, answer: Answer::Registered { agent_id } })
}

fn decide_send(view: &Projections<'_>, request: &SendRequest, now_ms: u64) -> Result<Decision, DecideError> {
    validate_text(&request.text)?;
    validate_priority(request.priority)?;
    let sender = check_sender(view, request.from.as_deref(), request.secret.as_deref())?;
    let sender_id = sender.as_ref().map(|agent| agent.agent_id.clone());

    // A retry of a send whose answer was lost: the first send's tasks, nothing new. Decided
    // here, in the writer, so two retries in one batch are decided once.
    if let Some(key) = &request.idempotency_key {
        if key.is_empty() || key.chars().count() > IDEMPOTENCY_KEY_MAX_CHARS || key.chars().any(char::is_control) {
            return Err(CommandError::bad(format!(
                "Error: an idempotency key must be 1-{IDEMPOTENCY_KEY_MAX_CHARS} characters without control characters"
            ))
            .into());
        }
        if let Some(first) = view.idempotent_send(sender_id.as_deref(), key)?
            && now_ms.saturating_sub(first.time_ms) < IDEMPOTENCY_WINDOW_MS
        {
            return Ok(Decision {
                actor: sender_id,
                events: Vec::new(),
                answer: Answer::Sent {
                    task_id: first.task_id,
                    sender_task_id: first.sender_task_id,
                    is_reply: first.is_reply,
                    warning: None,
                },
            });
        }
    }

    // A reply is decided by the task it answers: its sender may be anonymous or gone, and the
    // reply still completes the task (the reverse ticket waits in the sender's inbox).
    let mut warning = None;
    if let Some(reference) = &request.reply_to {
        match find_task(view, reference)? {
            Some(task) => {
                if let Some(decision) = decide_reply(view, request, sender_id.as_deref(), task)? {
                    return Ok(decision);
                }
                warning =
                    Some(format!("Warning: --reply-to {reference} does not expect a reply, sending as a new message"));
            }
            None => {
                warning = Some(format!("Warning: --reply-to {reference} not found (404), retrying as new message"));
            }
        }
    }

    let target = resolve_live_target(view, &request.to)?;
    if sender_id.as_deref() == Some(target.agent_id.as_str()) {
        return Err(CommandError::bad(format!("Error: cannot send a message to yourself ({})", target.agent_id)).into());
    }

    let task_id = new_id();
    let existing_sender_task = match &request.sender_task_id {
        Some(reference) => {
            let task = find_task(view, reference)?
                .ok_or_else(|| CommandError::not_found(format!("Sender task {reference} not found")))?;
            if task.direction != Direction::Outgoing
                || task.owner != sender_id
                || task.state.is_final()
                || task.peer_task_id.is_some()
            {
                return Err(CommandError::bad(format!(
                    "Sender task {} is not an open task of {} waiting for a reply",
                    short_id(&task.id),
                    sender_id.as_deref().unwrap_or("this sender")
                ))
                .into());
            }
            Some(task.id)
        }
        None => None,
    };
    let response_expected = request.response_expected || existing_sender_task.is_some();
    let sender_task_id = existing_sender_task.clone().or_else(|| response_expected.then(new_id));
    let context_id = request.context_id.clone().unwrap_or_else(new_id);
    // A long text is stored once, in the `message_sent` event; both tasks refer to it.
    let is_long = request.text.len() > INLINE_TEXT_MAX_BYTES;
    let (message, message_in) = if is_long {
        (Message { role: Role::User, parts: Vec::new() }, Some(task_id.clone()))
    } else {
        (Message::text(Role::User, request.text.clone()), None)
    };
    let mut events = Vec::with_capacity(4);
    if let (Some(sender_task_id), None) = (&sender_task_id, &existing_sender_task) {
        events.push(Event::TaskCreated {
            task_id: sender_task_id.clone(),
            owner: sender_id.clone(),
            context_id: context_id.clone(),
            direction: Direction::Outgoing,
            peer: Some(target.agent_id.clone()),
            state: TaskState::Working,
            message: message.clone(),
            priority: request.priority,
            response_expected: true,
            sender_task_id: None,
            in_reply_to: None,
            peer_task_id: Some(task_id.clone()),
            message_in: message_in.clone(),
        });
    }
    events.push(Event::TaskCreated {
        task_id: task_id.clone(),
        owner: Some(target.agent_id.clone()),
        context_id,
        direction: Direction::Incoming,
        peer: sender_id.clone(),
        state: TaskState::Submitted,
        message,
        priority: request.priority,
        response_expected,
        sender_task_id: sender_task_id.clone(),
        in_reply_to: None,
        peer_task_id: None,
        message_in,
    });
    events.push(Event::MessageSent {
        task_id: task_id.clone(),
        from: sender_id.clone(),
        to: target.agent_id.clone(),
        priority: request.priority,
        response_expected,
        sender_task_id: sender_task_id.clone(),
        in_reply_to: None,
        text: request.text.clone(),
        parts: Vec::new(),
        idempotency_key: request.idempotency_key.clone(),
        by_user: sender_id.is_none() && request.by_user,
    });
    events.push(Event::TicketIssued {
        agent_id: target.agent_id.clone(),
        task_id: task_id.clone(),
        priority: request.priority,
        from: sender_id.clone(),
        display_task_id: sender_task_id.clone().unwrap_or_else(|| task_id.clone()),
        response_expected,
    });
    Ok(Decision {
        actor: sender_id,
        events,
        answer: Answer::Sent { task_id, sender_task_id, is_reply: false, warning },
    })
}

/// A message answering `task`. Returns None when the task does not expect a reply (the caller
/// then sends a new message).
fn decide_reply(
    view: &Projections<'_>,
    request: &SendRequest,
    replier: Option<&str>,
    task: TaskRecord,
) -> Result<Option<Decision>, DecideError> {
    // The pair: the sender's outgoing task and the receiver's incoming task.
    let (sender_task, receiver_task) = match task.direction {
        Direction::Outgoing => match &task.peer_task_id {
            Some(peer) => match view.task(peer)? {
                Some(receiver_task) => (task, receiver_task),
                None => return Ok(None),
            },
            None => return Ok(None),
        },
        Direction::Incoming => match view.open_outgoing_of(&task)? {
            Some(sender_task) => (sender_task, task),
            None => return Ok(None),
        },
    };
    let Some(replier) = replier else {
        return Err(CommandError::forbidden(format!(
            "Error: replying to task {} needs the replier's identity: run it inside {} or pass --from {}",
            short_id(&sender_task.id),
            receiver_task.owner.as_deref().unwrap_or("the receiving agent"),
            receiver_task.owner.as_deref().unwrap_or("<agent id>"),
        ))
        .into());
    };
    if receiver_task.owner.as_deref() != Some(replier) {
        return Err(CommandError::forbidden(format!(
            "Error: task {} was sent to {}, not to {replier}; only its receiver can reply",
            short_id(&sender_task.id),
            receiver_task.owner.as_deref().unwrap_or("another agent"),
        ))
        .into());
    }
    if let Some(owner) = &sender_task.owner {
        let addressed = match view.agent(owner)? {
            Some(record) => resolve_target(std::slice::from_ref(&record), &request.to).is_ok(),
            None => request.to.trim() == owner,
        };
        if !addressed {
            return Err(CommandError::bad(format!(
                "Error: task {} came from {owner}, not from '{}'",
                short_id(&sender_task.id),
                request.to
            ))
            .into());
        }
    }
    if receiver_task.replied_by.is_some() || sender_task.state.is_final() {
        return Err(CommandError::conflict(format!(
            "Error: task {} was already answered ({}); nothing changed",
            short_id(&sender_task.id),
            sender_task.state
        ))
        .into());
    }
    // A long reply is stored once, in the `reply_posted` event; both tasks refer to it.
    let (artifacts, reply_of) = if request.text.len() > INLINE_TEXT_MAX_BYTES {
        (Vec::new(), Some(receiver_task.id.clone()))
    } else {
        (vec![Artifact { name: None, parts: vec![Part::Text { text: request.text.clone() }] }], None)
    };
    let mut events = vec![
        Event::ReplyPosted {
            task_id: receiver_task.id.clone(),
            sender_task_id: Some(sender_task.id.clone()),
            from: replier.to_string(),
            to: sender_task.owner.clone(),
            text: request.text.clone(),
            idempotency_key: request.idempotency_key.clone(),
        },
        Event::TaskStateChanged {
            task_id: sender_task.id.clone(),
            state: TaskState::Completed,
            artifacts: artifacts.clone(),
            error: None,
            reply_of: reply_of.clone(),
        },
        Event::TaskStateChanged {
            task_id: receiver_task.id.clone(),
            state: TaskState::Completed,
            artifacts,
            error: None,
            reply_of,
        },
    ];
    if let Some(owner) = &sender_task.owner {
        events.push(Event::ReverseTicketIssued {
            agent_id: owner.clone(),
            task_id: sender_task.id.clone(),
            from: replier.to_string(),
            priority: request.priority,
        });
    }
    Ok(Some(Decision {
        actor: Some(replier.to_string()),
        events,
        answer: Answer::Sent {
            task_id: receiver_task.id,
            sender_task_id: Some(sender_task.id),
            is_reply: true,
            warning: None,
        },
    }))
}

/// Turns a decision's answer into the outcome, reading the state after its events.
pub fn complete(view: &Projections<'_>, answer: Answer, last_seq: u64) -> Result<Outcome, StoreError> {
    Ok(match answer {
        Answer::Registered { agent_id } => match view.agent(&agent_id)? {
            Some(agent) => Outcome::Registered { agent },
            None => return Err(StoreError::Corrupt(format!("agent {agent_id} missing after registration"))),
        },
        Answer::StatusSet { changed } => Outcome::StatusSet { changed },
        Answer::Deregistered => Outcome::Deregistered,
        Answer::Sent { task_id, sender_task_id, is_reply, warning } => {
            let task = view
                .task(&task_id)?
                .ok_or_else(|| StoreError::Corrupt(format!("task {task_id} missing after send")))?;
            let sender_task = match sender_task_id {
                Some(id) => view.task(&id)?,
                None => None,
            };
            Outcome::Sent(Box::new(SendOutcome { task, sender_task, is_reply, warning, seq: last_seq }))
        }
        Answer::Task { task_id } => Outcome::Task {
            task: view.task(&task_id)?.ok_or_else(|| StoreError::Corrupt(format!("task {task_id} missing")))?,
        },
        Answer::Injected { ticket } => Outcome::Injected { ticket },
        Answer::Appended => Outcome::Appended { seq: last_seq },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::hash_secret;
    use crate::store::Store;
    use redb::backends::InMemoryBackend;

    const SENDER: &str = "synapse-claude-8100";
    const RECEIVER: &str = "synapse-codex-8120";
    const START_MS: u64 = 1_767_225_600_000;

    fn registered(agent_id: &str, port: u16) -> Event {
        Event::AgentRegistered {
            agent_id: agent_id.into(),
            agent_type: "dummy".into(),
            name: None,
            role: None,
            // A live process, so the target resolves.
            pid: std::process::id(),
            port,
            working_dir: "/tmp".into(),
            secret_hash: hash_secret(agent_id),
            pid_start: None,
            wrapper: false,
        }
    }

    /// Decides `command` at `now_ms` and appends its events, as the writer does.
    fn run(store: &Store, now_ms: u64, command: Command) -> Answer {
        store
            .transact(now_ms, |appender| {
                let decision = match decide(appender.view(), &command, now_ms) {
                    Ok(decision) => decision,
                    Err(DecideError::Rejected(error)) => panic!("rejected: {error}"),
                    Err(DecideError::Storage(error)) => return Err(error),
                };
                appender.append(decision.actor.as_deref(), decision.events)?;
                Ok(decision.answer)
            })
            .expect("the transaction commits")
    }

    fn send(from: &str, text: &str, reply_to: Option<&str>, key: &str) -> Command {
        Command::Send(SendRequest {
            to: if from == SENDER { RECEIVER.into() } else { SENDER.into() },
            from: Some(from.into()),
            secret: Some(from.into()),
            text: text.into(),
            priority: 3,
            response_expected: reply_to.is_none(),
            reply_to: reply_to.map(str::to_string),
            idempotency_key: Some(key.into()),
            ..SendRequest::default()
        })
    }

    fn sent(answer: Answer) -> (String, Option<String>, bool) {
        match answer {
            Answer::Sent { task_id, sender_task_id, is_reply, .. } => (task_id, sender_task_id, is_reply),
            _ => panic!("the answer is not a send"),
        }
    }

    fn expired_events(store: &Store) -> usize {
        store
            .read_after(0, usize::MAX)
            .expect("the log reads")
            .iter()
            .filter(|envelope| matches!(envelope.event, Event::IdempotencyKeysExpired { .. }))
            .count()
    }

    #[test]
    fn keys_older_than_a_day_expire_through_the_log_and_a_later_retry_sends_again() {
        let store = Store::open_with_backend(InMemoryBackend::new()).expect("memory store");
        store
            .transact(START_MS, |appender| {
                appender.append(None, vec![registered(SENDER, 8100), registered(RECEIVER, 8120)])
            })
            .expect("agents registered");

        let (first, first_sender_task, first_is_reply) = sent(run(&store, START_MS, send(SENDER, "hi", None, "k1")));
        assert!(!first_is_reply);
        let retry = sent(run(&store, START_MS + 1_000, send(SENDER, "hi", None, "k1")));
        assert_eq!(retry, (first.clone(), first_sender_task.clone(), false), "a retry answers the first send");

        // A reply retried with its key says it was a reply, as the first answer did.
        let reply = sent(run(&store, START_MS + 2_000, send(RECEIVER, "done", Some(&first), "r1")));
        assert!(reply.2, "the first answer is a reply");
        let reply_retry = sent(run(&store, START_MS + 3_000, send(RECEIVER, "done", Some(&first), "r1")));
        assert_eq!(reply_retry, reply, "a retried reply answers the first reply, is_reply included");

        // Nothing is past its window yet: the sweep appends nothing.
        run(&store, START_MS + IDEMPOTENCY_WINDOW_MS - 1, Command::ExpireIdempotencyKeys);
        assert_eq!(expired_events(&store), 0);

        let later = START_MS + IDEMPOTENCY_WINDOW_MS + 5_000;
        run(&store, later, Command::ExpireIdempotencyKeys);
        assert_eq!(expired_events(&store), 1, "one event drops the old keys");
        run(&store, later + 1, Command::ExpireIdempotencyKeys);
        assert_eq!(expired_events(&store), 1, "nothing is left to drop");
        store
            .transact(later, |appender| {
                assert!(appender.view().idempotent_send(Some(SENDER), "k1")?.is_none(), "the key row is gone");
                assert!(appender.view().idempotent_send(Some(RECEIVER), "r1")?.is_none(), "the reply key row is gone");
                Ok(())
            })
            .expect("the view reads");

        let (again, _, _) = sent(run(&store, later, send(SENDER, "hi", None, "k1")));
        assert_ne!(again, first, "a retry after the window creates a new task");

        let report = store.verify().expect("verify runs");
        assert!(report.differences.is_empty(), "replay differs: {:?}", report.differences);
    }
}
