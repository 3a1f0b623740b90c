//! Rows of the projection tables. Stored as named msgpack, like events, so they can gain fields.

use crate::event::{AgentStatus, Artifact, Direction, Message, Part, TaskState};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
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
    /// Start time of the process `pid` at registration (see `Event::AgentRegistered`).
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// Registered by its own process over the Unix socket (see `Event::AgentRegistered`).
    #[serde(default)]
    pub wrapper: bool,
    pub registered_ms: u64,
    /// Where in the log the agent this id names began: its registration, or that of the agent
    /// whose id it took back (same name and type). A message its id asked before then was
    /// asked by an agent that held the id before: the reply is not typed into this one. None
    /// in records written before it was kept.
    #[serde(default)]
    pub since_seq: Option<u64>,
    pub status_ms: u64,
    /// Why the agent takes no message now, when its wrapper said (see `agent_status_changed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_note: Option<String>,
    /// The task of the last message written into the agent's CLI that began its work: typed at
    /// its prompt, an interrupting (priority-5) one, or one that asks for a reply. A one-way
    /// message a hook hands over mid-turn (the agent PROCESSING), a reply and a notice leave it:
    /// they join the work under way. While the agent is PROCESSING (or WAITING), what its CLI
    /// works on: a cancel of that task interrupts the CLI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_written: Option<String>,
    /// Message tickets a cancel took out of the agent's inbox lately (newest last; at most
    /// [`CANCELED_UNWRITTEN`]; one older than [`CANCELED_UNWRITTEN_MS`] is known to no
    /// acknowledgement, and leaves at the agent's next cancel). Its wrapper may have
    /// taken one of them to write, or its hook to hand over, before the cancel came: when it
    /// acknowledges that one, the CLI has it, and it is told at once that the task was canceled
    /// (`decide_ack_injection`). A ticket leaves the list when it is acknowledged. A wrapper
    /// acknowledges only tickets it took from the inbox, so one canceled before that stays
    /// unknown to acknowledgements, wherever it is in the list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canceled_unwritten: Vec<CanceledTicket>,
}

/// Does a message written into a CLI (acknowledged as `how`, while the agent was `status`)
/// begin its work, so that the CLI works on it now (see [`AgentRecord::last_written`])? Typed
/// at the prompt, an interrupting one (priority 5), or one that asks for a reply. A one-way
/// message a hook handed over mid-turn joins the work under way; one not written into this CLI
/// begins nothing. A wrapper that does not say how is read from the agent's status: typed at
/// the prompt unless PROCESSING (which its CLI may report before the acknowledgement, though).
pub fn begins_work(
    how: Option<crate::event::Delivery>,
    status: crate::event::AgentStatus,
    response_expected: bool,
    priority: u8,
) -> bool {
    use crate::event::Delivery;
    let mid_turn = match how {
        Some(Delivery::Typed) => false,
        Some(Delivery::HandedOver) => true,
        Some(Delivery::Unwritten) => return false,
        None => status == crate::event::AgentStatus::Processing,
    };
    !mid_turn || response_expected || priority == 5
}

/// How many [`AgentRecord::canceled_unwritten`] tickets an agent's record keeps.
/// More than a hook hands over at once.
pub const CANCELED_UNWRITTEN: usize = 32;

/// How long [`AgentRecord::canceled_unwritten`] keeps a ticket: far longer than a write takes
/// (the settle delay, the CLI's reaction, a few resubmits) or a hook's hand-over.
pub const CANCELED_UNWRITTEN_MS: u64 = 10 * 60 * 1000;

/// A message ticket a cancel took out of an agent's inbox before it was acknowledged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanceledTicket {
    pub ticket: u64,
    /// The agent's own (receiving) task.
    pub task_id: String,
    /// Who canceled it (see `Event::TaskCanceled::by`).
    pub by: String,
    pub priority: u8,
    pub response_expected: bool,
    /// When it was canceled.
    #[serde(default)]
    pub canceled_ms: u64,
}

/// The last agent that held an id, kept after it left: its inbox (and the id) wait for an
/// agent started again with the same name, or expire (see `broker::agents`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DepartedAgent {
    pub agent_id: String,
    pub agent_type: String,
    #[serde(default)]
    pub name: Option<String>,
    pub port: u16,
    pub departed_ms: u64,
    /// The departed agent's `since_seq` (see [`AgentRecord`]).
    #[serde(default)]
    pub since_seq: Option<u64>,
    /// Its process, as (pid, start time) when the start time was known: the same process
    /// registering again is the same agent, named or not.
    #[serde(default)]
    pub process: Option<(u32, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub context_id: String,
    pub direction: Direction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    pub state: TaskState,
    pub message: Message,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub priority: u8,
    pub response_expected: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// For a sender's task: the receiver's task created with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_task_id: Option<String>,
    /// Who replied to this task, once someone has (a second reply is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replied_by: Option<String>,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Sequence number of the `task_created` event: the task's number in the history index.
    #[serde(default)]
    pub created_seq: u64,
    /// A long message is stored once, in the log: the task id whose `message_sent` carries
    /// the text (`task_created.message_in`). The row's `message` then has no parts; the reads
    /// of the store fill them in from the event at `message_seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_in: Option<String>,
    /// Sequence number of that `message_sent`, set when it is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_seq: Option<u64>,
    /// For a replier's task: the sequence number of its `reply_posted`, which a
    /// `task_state_changed.reply_of` turns into an artifact without copying the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_seq: Option<u64>,
    /// Artifacts whose text is stored once, in the log: in the row they have no parts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifact_texts: Vec<ArtifactText>,
    /// Sent anonymously by the user (see `Event::MessageSent`): only the user cancels it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sent_by_user: bool,
    /// The messages after the first, in order (A2A multi-turn, `task_continued`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub follow_ups: Vec<FollowUp>,
    /// The agent answered with a message, not a task result (`task_state_changed.as_message`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub as_message: bool,
    /// For a receiver's task: the reply target its request becomes once its ticket reaches the
    /// agent. It arrived while the agent owed the same sender an answer to an earlier request,
    /// which stays the target until then: the agent's `synapse reply` answers what it has seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_on_delivery: Option<ReplyTarget>,
}

impl TaskRecord {
    /// What the agent asks while the task is `input_required`: its newest text artifact, or
    /// else its error. One rule for the status message A2A clients see and for the question a
    /// follow-up keeps in the task's history.
    pub fn question(&self) -> Option<String> {
        if self.state != TaskState::InputRequired {
            return None;
        }
        let newest_text = self.artifacts.iter().rev().find_map(|artifact| {
            artifact.parts.iter().find_map(|part| match part {
                Part::Text { text } => Some(text.clone()),
                _ => None,
            })
        });
        newest_text.or_else(|| self.error.clone())
    }
}

/// A message that continued a task (`task_continued`), with the agent's question it answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FollowUp {
    /// What the agent asked (its status message while `input_required`), if it said anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// When the agent asked: the task's `updated_ms` then (A2A shows the status message's id
    /// from it, so the question keeps the id the client saw).
    pub asked_ms: u64,
    /// The follow-up; a long one has no parts, its text is the `task_continued` at `seq`.
    pub message: Message,
    /// Sequence number of the `task_continued` event.
    pub seq: u64,
    pub time_ms: u64,
}

/// An artifact of a task whose text is the `text` of the `reply_posted` event at `seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactText {
    /// Position in the task's `artifacts`.
    pub index: u32,
    pub seq: u64,
}

/// An agent waiting for `receiver`'s answer: the newest request from one sender.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyTarget {
    pub receiver: String,
    pub sender_id: String,
    #[serde(default)]
    pub sender_task_id: Option<String>,
    /// The receiver's task holding the request.
    pub receiver_task_id: String,
    pub received_ms: u64,
    pub preview: String,
    /// Sequence number of the request: targets are listed in this order.
    pub seq: u64,
}

impl ReplyTarget {
    /// The task id the request's message showed the receiver (`[A2A:<id8>:...]`): the sender's
    /// own task, or else the receiver's.
    pub fn shown_task_id(&self) -> &str {
        self.sender_task_id.as_deref().unwrap_or(&self.receiver_task_id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketKind {
    /// A message sent to the agent.
    Message,
    /// A reply to the agent's own earlier message (reverse ticket); for a task the agent itself
    /// received, the notice that it was canceled while the agent worked on it (the inbox
    /// marks it `cancel_notice`).
    Reply,
}

/// Something still to be written into an agent's PTY.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "TicketRow", into = "TicketRow")]
pub struct Ticket {
    /// Sequence number of the event that issued it.
    pub ticket: u64,
    pub agent_id: String,
    pub kind: TicketKind,
    pub task_id: String,
    /// The id shown in the terminal, the one to reply to.
    pub display_task_id: String,
    pub from: Option<String>,
    pub priority: u8,
    pub response_expected: bool,
    pub issued_ms: u64,
    /// The task's message it writes: 0 the first, N the N-th follow-up.
    pub turn: u32,
}

/// A [`Ticket`] as its row holds it: what is usual is left out (a ticket's display id is
/// mostly its task's id; most tickets expect no reply and write the first message). Rows
/// written with every field read the same.
#[derive(Serialize, Deserialize)]
struct TicketRow {
    ticket: u64,
    agent_id: String,
    kind: TicketKind,
    task_id: String,
    /// Absent: the same as `task_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    display_task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    priority: u8,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    response_expected: bool,
    issued_ms: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    turn: u32,
}

fn is_zero(turn: &u32) -> bool {
    *turn == 0
}

impl From<Ticket> for TicketRow {
    fn from(ticket: Ticket) -> TicketRow {
        let display_task_id = (ticket.display_task_id != ticket.task_id).then_some(ticket.display_task_id);
        TicketRow {
            ticket: ticket.ticket,
            agent_id: ticket.agent_id,
            kind: ticket.kind,
            task_id: ticket.task_id,
            display_task_id,
            from: ticket.from,
            priority: ticket.priority,
            response_expected: ticket.response_expected,
            issued_ms: ticket.issued_ms,
            turn: ticket.turn,
        }
    }
}

impl From<TicketRow> for Ticket {
    fn from(row: TicketRow) -> Ticket {
        Ticket {
            display_task_id: row.display_task_id.unwrap_or_else(|| row.task_id.clone()),
            ticket: row.ticket,
            agent_id: row.agent_id,
            kind: row.kind,
            task_id: row.task_id,
            from: row.from,
            priority: row.priority,
            response_expected: row.response_expected,
            issued_ms: row.issued_ms,
            turn: row.turn,
        }
    }
}

/// A lock on a file (file safety), as the API shows it. Free once `expires_ms` has passed or
/// its holder is gone; that is decided against an explicit `now`, never here.
pub use crate::api::FileLock;
/// A recorded change to a file, as the API shows it.
pub use crate::api::Modification as FileModification;

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Most rows fit: one allocation instead of a chain of growths (the allocator's slow path).
    let mut row = Vec::with_capacity(crate::event::ENCODE_ROOM);
    encode_into(value, &mut row);
    row
}

/// [`encode`] into a buffer the caller reuses (appended to `buffer`; nothing is, on an error).
pub(crate) fn encode_into<T: Serialize>(value: &T, buffer: &mut Vec<u8>) {
    let start = buffer.len();
    if rmp_serde::encode::write_named(buffer, value).is_err() {
        buffer.truncate(start);
    }
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, super::StoreError> {
    rmp_serde::from_slice(bytes).map_err(|error| super::StoreError::Corrupt(format!("projection row: {error}")))
}

/// A send made with an idempotency key (table `idempotency_keys`, key: sender, NUL, key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotentSend {
    /// The receiver's task.
    pub task_id: String,
    #[serde(default)]
    pub sender_task_id: Option<String>,
    /// When the first send was decided (the event's time).
    pub time_ms: u64,
    /// The send was a reply (`reply_posted`): a retry answers `is_reply` as the first did.
    #[serde(default)]
    pub is_reply: bool,
    /// The agent the first send went to (none for a reply) and a digest of its text
    /// ([`text_digest`]): the key used again for another message or another agent is refused
    /// rather than answered with the first send's tasks (the new message was lost). None in
    /// rows kept before they were recorded.
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub text_digest: Option<String>,
}

/// The digest of a send's text an idempotency key is kept with: the first 16 bytes of its
/// SHA-256, in hex.
pub fn text_digest(text: &str) -> String {
    use sha2::Digest;
    crate::secret::to_hex(&sha2::Sha256::digest(text.as_bytes())[..16])
}

/// The key a reply target is kept under: the sender's id, or for an anonymous sender (who can
/// still wait for the answer with `--wait`) `anonymous-<task8>` so that two anonymous requests
/// do not replace each other.
pub fn reply_target_sender(from: Option<&str>, sender_task_id: Option<&str>) -> Option<String> {
    match (from, sender_task_id) {
        (Some(from), _) => Some(from.to_string()),
        (None, Some(task)) => Some(format!("{ANONYMOUS_TARGET}{}", crate::event::short_id(task))),
        (None, None) => None,
    }
}

/// How the key of a sender without an id begins ([`reply_target_sender`]).
const ANONYMOUS_TARGET: &str = "anonymous-";

/// Is this reply target's key ([`reply_target_sender`]) that of a sender without an id?
pub fn waits_anonymously(sender_id: &str) -> bool {
    sender_id.starts_with(ANONYMOUS_TARGET)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(display_task_id: &str, response_expected: bool, turn: u32) -> Ticket {
        Ticket {
            ticket: 7,
            agent_id: "claude-8100".into(),
            kind: TicketKind::Message,
            task_id: "0195f0e2-aaaa-7bbb-8ccc-000000000001".into(),
            display_task_id: display_task_id.into(),
            from: None,
            priority: 3,
            response_expected,
            issued_ms: 1_700_000_000_000,
            turn,
        }
    }

    /// The names in a row (a msgpack map's keys).
    fn keys(row: &[u8]) -> Vec<String> {
        let value: serde_json::Value = rmp_serde::from_slice(row).unwrap();
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn a_ticket_row_leaves_out_the_usual_and_reads_back_the_same() {
        let usual = ticket("0195f0e2-aaaa-7bbb-8ccc-000000000001", false, 0);
        let row = encode(&usual);
        let names = keys(&row);
        for left_out in ["display_task_id", "from", "response_expected", "turn"] {
            assert!(!names.contains(&left_out.to_string()), "{left_out} in {names:?}");
        }
        assert_eq!(decode::<Ticket>(&row).unwrap(), usual);

        let mut unusual = ticket("0195f0e2-aaaa-7bbb-8ccc-000000000002", true, 2);
        unusual.from = Some("gemini-8110".into());
        let row = encode(&unusual);
        assert_eq!(keys(&row).len(), 10, "every field is kept: {:?}", keys(&row));
        assert_eq!(decode::<Ticket>(&row).unwrap(), unusual);
        assert!(row.len() > encode(&usual).len());
    }

    /// Rows written before version 10 held every field, `null` included: they read the same.
    #[test]
    fn rows_with_every_field_read_as_before() {
        let old_ticket = serde_json::json!({
            "ticket": 7, "agent_id": "claude-8100", "kind": "message",
            "task_id": "0195f0e2-aaaa-7bbb-8ccc-000000000001",
            "display_task_id": "0195f0e2-aaaa-7bbb-8ccc-000000000001",
            "from": null, "priority": 3, "response_expected": false,
            "issued_ms": 1_700_000_000_000_u64, "turn": 0,
        });
        let row = rmp_serde::to_vec_named(&old_ticket).unwrap();
        assert_eq!(decode::<Ticket>(&row).unwrap(), ticket("0195f0e2-aaaa-7bbb-8ccc-000000000001", false, 0));

        let task = serde_json::json!({
            "id": "t1", "owner": null, "context_id": "c1", "direction": "incoming", "peer": null,
            "state": "submitted", "message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]},
            "artifacts": [], "error": null, "priority": 3, "response_expected": false,
            "sender_task_id": null, "in_reply_to": null, "peer_task_id": null, "replied_by": null,
            "created_ms": 1, "updated_ms": 2, "created_seq": 3, "sent_by_user": false,
        });
        let old_row = rmp_serde::to_vec_named(&task).unwrap();
        let record: TaskRecord = decode(&old_row).unwrap();
        assert_eq!(record.id, "t1");
        assert_eq!(record.owner, None);
        assert!(record.artifacts.is_empty() && !record.sent_by_user);
        // Written again, the empty fields are left out, and it reads back the same.
        let row = encode(&record);
        assert!(row.len() < old_row.len(), "{} >= {}", row.len(), old_row.len());
        let names = keys(&row);
        for left_out in ["owner", "peer", "artifacts", "error", "sender_task_id", "in_reply_to", "replied_by"] {
            assert!(!names.contains(&left_out.to_string()), "{left_out} in {names:?}");
        }
        assert_eq!(decode::<TaskRecord>(&row).unwrap(), record);
    }
}
