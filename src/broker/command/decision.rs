//! The decision types every decider shares: what a decision produces ([`Decision`], [`Answer`]),
//! what the writer answers ([`Outcome`]), why a command is refused ([`CommandError`]), and what
//! the writer looked up for the batch before deciding ([`Context`], [`Liveness`]).
//!
//! Invariant: a decider reads nothing but the projections, its command and this context: the
//! process table is read by the writer, once per batch, into [`Liveness`]. The deciders of
//! other broker modules (webhooks, file safety, externals) import this file, never the
//! dispatcher, so no file cycle runs through `command/mod.rs`.

use crate::event::Event;
use crate::store::{AgentRecord, StoreError, TaskRecord};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What the writer answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Registered {
        agent: Box<AgentRecord>,
    },
    StatusSet {
        changed: bool,
    },
    Deregistered,
    Sent(Box<SendOutcome>),
    Task {
        /// Boxed: a task row is much larger than the other outcomes.
        task: Box<TaskRecord>,
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

/// What the writer gives every decision of a batch besides the projections.
pub struct Context<'a> {
    /// The batch's time (lock expiry, idempotency windows and held queues are measured
    /// against it).
    pub now_ms: u64,
    /// Which processes run, looked up by the writer before the batch.
    pub liveness: &'a Liveness,
}

/// Which processes ran when the writer looked, before deciding a batch: every pid a command of
/// the batch may ask about (see `Command::liveness_needed`).
///
/// A pid that was not looked up counts as running: deciding on a guess must never take
/// anything from an agent (its slot, its name, its lock); at worst a send is queued for an agent
/// the liveness sweeper removes a moment later.
#[derive(Debug, Default, Clone)]
pub struct Liveness {
    processes: HashMap<u32, ProcessState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcessState {
    Running,
    /// Exited, not yet reaped by its parent: its pid exists but it is gone for our purposes.
    Exited,
    Gone,
}

impl Liveness {
    /// Reads the process table for `pids` (each once).
    pub fn look_up(pids: impl IntoIterator<Item = u32>) -> Liveness {
        let mut processes = HashMap::new();
        for pid in pids {
            processes.entry(pid).or_insert_with(|| {
                if !crate::process::pid_exists(pid) {
                    ProcessState::Gone
                } else if crate::process::is_zombie(pid) {
                    ProcessState::Exited
                } else {
                    ProcessState::Running
                }
            });
        }
        Liveness { processes }
    }

    /// The states given, for tests: `(pid, running)`.
    pub fn of(states: impl IntoIterator<Item = (u32, bool)>) -> Liveness {
        Liveness {
            processes: states
                .into_iter()
                .map(|(pid, running)| (pid, if running { ProcessState::Running } else { ProcessState::Gone }))
                .collect(),
        }
    }

    /// Does this process run (a zombie does not)?
    pub fn is_alive(&self, pid: u32) -> bool {
        self.processes.get(&pid).is_none_or(|state| *state == ProcessState::Running)
    }
}
