//! Projection tables and how each event changes them.
//!
//! [`Projections::apply`] is the only code that writes projections. It must stay a pure function
//! of (current tables, envelope): no clock, no environment, no randomness. Events it does not
//! find a row for are ignored (the writer only appends events it has decided are valid, and a
//! replay applies them in the same order, so live and rebuilt tables agree).

use super::StoreError;
use super::records::{self, *};
use crate::event::{Artifact, Direction, Envelope, Event, INLINE_TEXT_MAX_BYTES, Message, Part, Role, TaskState};
use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

/// Key of the prune cut-off in the history meta table (read by `history`, compared by verify).
pub const PRUNED_BEFORE: &str = "pruned_before_ms";

type AgentsDef = TableDefinition<'static, &'static str, &'static [u8]>;
type TasksDef = TableDefinition<'static, &'static str, &'static [u8]>;
type ReplyTargetsDef = TableDefinition<'static, (&'static str, &'static str), &'static [u8]>;
type InboxDef = TableDefinition<'static, (&'static str, u8, u64), &'static [u8]>;
type LocksDef = TableDefinition<'static, &'static str, &'static [u8]>;
type ModificationsDef = TableDefinition<'static, (&'static str, u64), &'static [u8]>;
type HistoryMetaDef = TableDefinition<'static, &'static str, u64>;
type IdempotencyDef = TableDefinition<'static, &'static str, &'static [u8]>;
type TaskIndexDef = TableDefinition<'static, TaskIndexKey<'static>, &'static [u8]>;
/// Agent id to the number of tickets in its inbox (u64, little-endian): a queue's depth in one
/// read, however long the queue.
type InboxDepthDef = TableDefinition<'static, &'static str, &'static [u8]>;
type ReplyTokensDef = TableDefinition<'static, &'static str, &'static [u8]>;

/// A row of the task index: (agent, [`TaskIndexKind`] as u8, order, task id); the value is
/// empty. The order is the task's `created_seq` (owned and served tasks, oldest first) or its
/// `updated_ms` (working tasks, so the newest is the last row of the agent's range).
pub type TaskIndexKey<'a> = (&'a str, u8, u64, &'a str);

/// Which of an agent's lists a task index row belongs to. A task is in every list whose rule
/// holds for its row, and [`Projections::put_task`] moves it when its row changes: the index
/// is a pure function of the task rows, so a replay rebuilds it and `verify` compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TaskIndexKind {
    /// Tasks the agent owns (its task list, `GET /agents/{agent}/tasks`).
    Owned = 0,
    /// Tasks of anonymous senders (A2A clients) given to the agent: owner none, peer the agent.
    Served = 1,
    /// The agent's incoming tasks in state working, by `updated_ms`: the last is its current
    /// task.
    Working = 2,
}

/// A task index row, owned: (agent, kind, order, task id).
pub(super) type IndexRow = (String, u8, u64, String);

/// The index rows of `task` (at most two), borrowed from it.
fn task_index_keys(task: &TaskRecord) -> impl Iterator<Item = TaskIndexKey<'_>> {
    let id = task.id.as_str();
    let rows = match (&task.owner, &task.peer) {
        (Some(owner), _) => [
            Some((owner.as_str(), TaskIndexKind::Owned as u8, task.created_seq, id)),
            (task.direction == Direction::Incoming && task.state == TaskState::Working).then_some((
                owner.as_str(),
                TaskIndexKind::Working as u8,
                task.updated_ms,
                id,
            )),
        ],
        (None, Some(peer)) => [Some((peer.as_str(), TaskIndexKind::Served as u8, task.created_seq, id)), None],
        (None, None) => [None, None],
    };
    rows.into_iter().flatten()
}

/// The index rows of `task`, owned.
pub(super) fn task_index_rows(task: &TaskRecord) -> Vec<IndexRow> {
    task_index_keys(task).map(|(agent, kind, order, id)| (agent.to_string(), kind, order, id.to_string())).collect()
}

/// The row key of an idempotency key: scoped by its sender (anonymous senders share one scope).
pub fn idempotency_row(from: Option<&str>, key: &str) -> String {
    format!("{}\0{key}", from.unwrap_or(""))
}

/// Names of one complete set of projection tables (live, or scratch for `verify`).
pub struct ProjectionNames {
    pub agents: AgentsDef,
    pub tasks: TasksDef,
    pub reply_targets: ReplyTargetsDef,
    pub inbox: InboxDef,
    /// File safety: the lock on each path.
    pub locks: LocksDef,
    /// File safety: modifications by (path, sequence number).
    pub modifications: ModificationsDef,
    /// History: the prune cut-off (the records themselves are derived from the tasks).
    pub history_meta: HistoryMetaDef,
    /// Agents that left, by id: whose queue an id still holds.
    pub departed: AgentsDef,
    /// Sends made with an `Idempotency-Key`: (sender, key) to the tasks it created.
    pub idempotency: IdempotencyDef,
    /// Each agent's tasks (owned, served, working), so that listings and the current task read
    /// the agent's rows instead of decoding every task (see [`TaskIndexKind`]).
    pub task_index: TaskIndexDef,
    /// Each agent's inbox depth (no row for an empty inbox), kept with the inbox.
    pub inbox_depth: InboxDepthDef,
    /// The reply tokens of messages to external agents still waiting for their reply: the
    /// token's SHA-256 (hex) to the task id (see `Event::ExternalMessageSent`).
    pub reply_tokens: ReplyTokensDef,
}

pub const LIVE: ProjectionNames = ProjectionNames {
    agents: TableDefinition::new("agents"),
    tasks: TableDefinition::new("tasks"),
    reply_targets: TableDefinition::new("reply_targets"),
    inbox: TableDefinition::new("inbox"),
    locks: TableDefinition::new("file_locks"),
    modifications: TableDefinition::new("file_modifications"),
    history_meta: TableDefinition::new("history_meta"),
    departed: TableDefinition::new("departed_agents"),
    idempotency: TableDefinition::new("idempotency_keys"),
    task_index: TableDefinition::new("task_index"),
    inbox_depth: TableDefinition::new("inbox_depth"),
    reply_tokens: TableDefinition::new("reply_tokens"),
};

pub const SCRATCH: ProjectionNames = ProjectionNames {
    agents: TableDefinition::new("scratch_agents"),
    tasks: TableDefinition::new("scratch_tasks"),
    reply_targets: TableDefinition::new("scratch_reply_targets"),
    inbox: TableDefinition::new("scratch_inbox"),
    locks: TableDefinition::new("scratch_file_locks"),
    modifications: TableDefinition::new("scratch_file_modifications"),
    history_meta: TableDefinition::new("scratch_history_meta"),
    departed: TableDefinition::new("scratch_departed_agents"),
    idempotency: TableDefinition::new("scratch_idempotency_keys"),
    task_index: TableDefinition::new("scratch_task_index"),
    inbox_depth: TableDefinition::new("scratch_inbox_depth"),
    reply_tokens: TableDefinition::new("scratch_reply_tokens"),
};

impl ProjectionNames {
    pub(crate) fn delete_all(&self, txn: &WriteTransaction) -> Result<(), StoreError> {
        txn.delete_table(self.agents)?;
        txn.delete_table(self.tasks)?;
        txn.delete_table(self.reply_targets)?;
        txn.delete_table(self.inbox)?;
        txn.delete_table(self.locks)?;
        txn.delete_table(self.modifications)?;
        txn.delete_table(self.history_meta)?;
        txn.delete_table(self.departed)?;
        txn.delete_table(self.idempotency)?;
        txn.delete_table(self.task_index)?;
        txn.delete_table(self.inbox_depth)?;
        txn.delete_table(self.reply_tokens)?;
        Ok(())
    }
}

/// A depth row's value (a malformed one reads as 0: `verify` reports it, a rebuild mends it).
fn depth_of(bytes: &[u8]) -> u64 {
    <[u8; 8]>::try_from(bytes).map_or(0, u64::from_le_bytes)
}

/// Inbox order: higher priority first (rank 5 for priority 5 ... rank 9 for priority 1), then
/// arrival (sequence number).
pub fn inbox_rank(priority: u8) -> u8 {
    10u8.saturating_sub(priority.clamp(1, 5))
}

/// The projection tables open for writing inside the writer's transaction.
pub struct Projections<'txn> {
    agents: redb::Table<'txn, &'static str, &'static [u8]>,
    tasks: redb::Table<'txn, &'static str, &'static [u8]>,
    reply_targets: redb::Table<'txn, (&'static str, &'static str), &'static [u8]>,
    inbox: redb::Table<'txn, (&'static str, u8, u64), &'static [u8]>,
    locks: redb::Table<'txn, &'static str, &'static [u8]>,
    modifications: redb::Table<'txn, (&'static str, u64), &'static [u8]>,
    pub(super) history_meta: redb::Table<'txn, &'static str, u64>,
    /// Small (one row per id ever left) and rarely written: not cached during a replay.
    departed: redb::Table<'txn, &'static str, &'static [u8]>,
    /// Written directly even during a replay (one row per keyed send, read only by decide).
    idempotency: redb::Table<'txn, &'static str, &'static [u8]>,
    /// Kept by [`Projections::put_task`]; during a replay, written from the final task rows
    /// by [`Projections::flush`] (the index is a function of the rows).
    task_index: redb::Table<'txn, TaskIndexKey<'static>, &'static [u8]>,
    /// Kept with the inbox (during a replay, counted from the cached inbox at the flush).
    inbox_depth: redb::Table<'txn, &'static str, &'static [u8]>,
    /// Written directly even during a replay (one row per external message waiting for its
    /// reply, read only by decide).
    reply_tokens: redb::Table<'txn, &'static str, &'static [u8]>,
    /// The log, in the writer's transaction (None during a replay, which reads it itself):
    /// the appender writes it, and reads take long texts from it (see [`hydrate_task`]).
    pub(super) log: Option<redb::Table<'txn, u64, &'static [u8]>>,
    /// Replay only: every row kept in memory and written once, in key order, by
    /// [`Projections::flush`]. A replay starts from empty tables, so the cache is the whole
    /// state; a task changes 3-4 times in its life and most tickets leave the inbox again, so
    /// decoding, encoding and B-tree updates per event dominated a rebuild.
    replay: Option<ReplayCache>,
    /// Live only (a replay keeps every row in `replay`): see [`Decoded`].
    decoded: Decoded,
}

/// The agent and task rows this transaction has read or written, as decoded rows (`None`: no
/// row). The writer's batch reads the same few rows again and again: the sender's and the
/// receiver's agent for every send, a task just written read back for its answer; decoding
/// them was about a tenth of the writer's time. Each entry is always the table's row as it is
/// now: the only writes of the two tables outside a replay are [`Projections::put_agent`],
/// [`Projections::remove_agent`] and [`Projections::put_task`], which keep it. It lives as long
/// as the transaction: a batch's rows (a few hundred usually; up to two per send of a full
/// batch of 4,096 commands), or the 10,000 rows a benchmark writes in one transaction, a few
/// MB at most, freed with it.
#[derive(Default)]
struct Decoded {
    agents: std::cell::RefCell<std::collections::HashMap<String, Option<AgentRecord>>>,
    tasks: std::cell::RefCell<std::collections::HashMap<String, Option<TaskRecord>>>,
}

#[derive(Default)]
struct ReplayCache {
    agents: std::collections::BTreeMap<String, AgentRecord>,
    /// Changed in place ([`Projections::update_task`]): a task row is not copied per event.
    /// Boxed, so the map's growth moves pointers, not rows.
    tasks: std::collections::HashMap<String, Box<TaskRecord>>,
    reply_targets: std::collections::BTreeMap<(String, String), ReplyTarget>,
    inbox: std::collections::BTreeMap<(String, u8, u64), Ticket>,
}

/// A replay's rows once they are in their tables ([`Projections::flush`]): only to be dropped.
pub(crate) struct ReplayRows {
    _rows: Option<ReplayCache>,
}

/// The projection tables in a short read transaction.
pub struct ReadProjections {
    agents: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    tasks: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    reply_targets: redb::ReadOnlyTable<(&'static str, &'static str), &'static [u8]>,
    inbox: redb::ReadOnlyTable<(&'static str, u8, u64), &'static [u8]>,
    locks: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    modifications: redb::ReadOnlyTable<(&'static str, u64), &'static [u8]>,
    pub(super) history_meta: redb::ReadOnlyTable<&'static str, u64>,
    departed: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    task_index: redb::ReadOnlyTable<TaskIndexKey<'static>, &'static [u8]>,
    inbox_depth: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    /// Long texts are read from their event (see [`hydrate_task`]).
    log: redb::ReadOnlyTable<u64, &'static [u8]>,
}

/// The text of the `message_sent` or `reply_posted` event at `seq`.
fn text_at(log: &impl ReadableTable<u64, &'static [u8]>, seq: u64) -> Result<Option<String>, StoreError> {
    let Some(row) = log.get(seq)? else { return Ok(None) };
    Ok(match Envelope::decode(row.value())?.event {
        Event::MessageSent { text, .. } | Event::ReplyPosted { text, .. } | Event::TaskContinued { text, .. } => {
            Some(text)
        }
        _ => None,
    })
}

/// Fills in the texts a task row refers to (a long message or reply is stored once, in its
/// event): what every read of a task returns, so API output is the same as when rows held
/// the text.
fn hydrate_task(log: &impl ReadableTable<u64, &'static [u8]>, task: &mut TaskRecord) -> Result<(), StoreError> {
    if let Some(seq) = task.message_seq
        && task.message.parts.is_empty()
        && let Some(text) = text_at(log, seq)?
    {
        task.message.parts.push(Part::Text { text });
    }
    for follow_up in &mut task.follow_ups {
        if follow_up.message.parts.is_empty()
            && let Some(text) = text_at(log, follow_up.seq)?
        {
            follow_up.message.parts.push(Part::Text { text });
        }
    }
    for reference in &task.artifact_texts {
        if let Some(artifact) = task.artifacts.get_mut(reference.index as usize)
            && artifact.parts.is_empty()
            && let Some(text) = text_at(log, reference.seq)?
        {
            artifact.parts.push(Part::Text { text });
        }
    }
    Ok(())
}

/// Gives an event that refers to a long text (`message_in`, `reply_of`) the shape it has when
/// the text is copied into it, so that `/events`, tails and webhooks show the same JSON for
/// every message. `task_row` reads a raw task row.
fn hydrate_event(
    log: &impl ReadableTable<u64, &'static [u8]>,
    event: &mut Event,
    task_row: impl Fn(&str) -> Result<Option<TaskRecord>, StoreError>,
) -> Result<(), StoreError> {
    match event {
        Event::TaskCreated { message, message_in, .. } => {
            if let Some(holder) = message_in.as_deref()
                && let Some(seq) = task_row(holder)?.and_then(|task| task.message_seq)
                && let Some(text) = text_at(log, seq)?
            {
                message.parts = vec![Part::Text { text }];
                *message_in = None;
            }
        }
        Event::TaskStateChanged { artifacts, reply_of, .. } => {
            if let Some(replier_task) = reply_of.as_deref()
                && let Some(seq) = task_row(replier_task)?.and_then(|task| task.reply_seq)
                && let Some(text) = text_at(log, seq)?
            {
                artifacts.push(Artifact::text(text));
                *reply_of = None;
            }
        }
        _ => {}
    }
    Ok(())
}

impl<'txn> Projections<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction, names: &ProjectionNames) -> Result<Self, StoreError> {
        Ok(Projections {
            agents: txn.open_table(names.agents)?,
            tasks: txn.open_table(names.tasks)?,
            reply_targets: txn.open_table(names.reply_targets)?,
            inbox: txn.open_table(names.inbox)?,
            locks: txn.open_table(names.locks)?,
            modifications: txn.open_table(names.modifications)?,
            history_meta: txn.open_table(names.history_meta)?,
            departed: txn.open_table(names.departed)?,
            idempotency: txn.open_table(names.idempotency)?,
            task_index: txn.open_table(names.task_index)?,
            inbox_depth: txn.open_table(names.inbox_depth)?,
            reply_tokens: txn.open_table(names.reply_tokens)?,
            log: None,
            replay: None,
            decoded: Decoded::default(),
        })
    }

    /// Opens the tables for a replay into empty tables: task rows are cached until
    /// [`flush`](Self::flush).
    pub(crate) fn open_for_replay(txn: &'txn WriteTransaction, names: &ProjectionNames) -> Result<Self, StoreError> {
        let mut projections = Projections::open(txn, names)?;
        projections.replay = Some(ReplayCache::default());
        Ok(projections)
    }

    /// Writes the cached rows (replay) to their tables, and hands them back: freeing a million
    /// small allocations is the caller's to schedule (see `store::replay_into`).
    pub(crate) fn flush(&mut self) -> Result<ReplayRows, StoreError> {
        let Some(cache) = self.replay.take() else { return Ok(ReplayRows { _rows: None }) };
        for (id, agent) in &cache.agents {
            self.agents.insert(id.as_str(), records::encode(agent).as_slice())?;
        }
        // Sorted by reference: moving the rows themselves cost more than the sort's comparisons.
        let mut tasks: Vec<(&str, &TaskRecord)> = cache.tasks.iter().map(|(id, task)| (id.as_str(), &**task)).collect();
        tasks.sort_unstable_by_key(|(id, _)| *id);
        // The index is a function of the final rows: built once here, not moved per event.
        let mut index: Vec<TaskIndexKey<'_>> = Vec::with_capacity(tasks.len() * 2);
        let mut row = Vec::new();
        for (id, task) in tasks {
            row.clear();
            records::encode_into(task, &mut row);
            self.tasks.insert(id, row.as_slice())?;
            index.extend(task_index_keys(task));
        }
        index.sort_unstable();
        for key in index {
            self.task_index.insert(key, [].as_slice())?;
        }
        for ((receiver, sender), target) in &cache.reply_targets {
            self.reply_targets.insert((receiver.as_str(), sender.as_str()), records::encode(target).as_slice())?;
        }
        let mut depths: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
        for ((agent, rank, ticket), row) in &cache.inbox {
            self.inbox.insert((agent.as_str(), *rank, *ticket), records::encode(row).as_slice())?;
            *depths.entry(agent.as_str()).or_default() += 1;
        }
        for (agent, depth) in depths {
            self.inbox_depth.insert(agent, depth.to_le_bytes().as_slice())?;
        }
        Ok(ReplayRows { _rows: Some(cache) })
    }

    /// Changes the agent's record, if there is one: in place during a replay, as tasks are
    /// (`update_task`).
    fn change_agent(&mut self, agent_id: &str, change: impl FnOnce(&mut AgentRecord)) -> Result<(), StoreError> {
        match self.replay.as_mut() {
            Some(cache) => {
                if let Some(record) = cache.agents.get_mut(agent_id) {
                    change(record);
                }
            }
            None => {
                if let Some(mut record) = self.agent(agent_id)? {
                    change(&mut record);
                    self.put_agent(&record)?;
                }
            }
        }
        Ok(())
    }

    /// One ticket of the agent's inbox, if it is there.
    fn inbox_ticket(&self, agent_id: &str, priority: u8, ticket: u64) -> Result<Option<Ticket>, StoreError> {
        let rank = inbox_rank(priority);
        match self.replay.as_ref() {
            Some(cache) => Ok(cache.inbox.get(&(agent_id.to_string(), rank, ticket)).cloned()),
            None => self.inbox.get((agent_id, rank, ticket))?.map(|row| records::decode(row.value())).transpose(),
        }
    }

    fn put_agent(&mut self, agent: &AgentRecord) -> Result<(), StoreError> {
        match self.replay.as_mut() {
            Some(cache) => {
                cache.agents.insert(agent.agent_id.clone(), agent.clone());
            }
            None => {
                self.agents.insert(agent.agent_id.as_str(), records::encode(agent).as_slice())?;
                self.decoded.agents.get_mut().insert(agent.agent_id.clone(), Some(agent.clone()));
            }
        }
        Ok(())
    }

    fn remove_agent(&mut self, agent_id: &str) -> Result<(), StoreError> {
        match self.replay.as_mut() {
            Some(cache) => {
                cache.agents.remove(agent_id);
            }
            None => {
                self.agents.remove(agent_id)?;
                self.decoded.agents.get_mut().insert(agent_id.to_string(), None);
            }
        }
        Ok(())
    }

    fn reply_target(&self, receiver: &str, sender: &str) -> Result<Option<ReplyTarget>, StoreError> {
        if let Some(cache) = &self.replay {
            return Ok(cache.reply_targets.get(&(receiver.to_string(), sender.to_string())).cloned());
        }
        self.reply_targets.get((receiver, sender))?.map(|row| records::decode(row.value())).transpose()
    }

    /// `receiver` owes `sender` an answer to the message (`text`, event `seq`) that reached it
    /// as `receiver_task_id`. While it owes that sender an answer to another request, the new
    /// one waits (on its task) until its ticket reaches the agent: replacing the target at once
    /// made the agent's reply to the request it was working on answer one still queued, which
    /// it had not seen, and the request it answered stayed open for good.
    #[allow(clippy::too_many_arguments)]
    fn owe_reply(
        &mut self,
        receiver: &str,
        sender: String,
        sender_task_id: &Option<String>,
        receiver_task_id: &str,
        time_ms: u64,
        text: &str,
        seq: u64,
    ) -> Result<(), StoreError> {
        let target = ReplyTarget {
            receiver: receiver.to_string(),
            sender_id: sender,
            sender_task_id: sender_task_id.clone(),
            receiver_task_id: receiver_task_id.to_string(),
            received_ms: time_ms,
            preview: crate::event::preview(text, 80),
            seq,
        };
        let owed = self.reply_target(receiver, &target.sender_id)?;
        if owed.is_some_and(|owed| owed.receiver_task_id != receiver_task_id) {
            return self.update_task(receiver_task_id, |task| {
                task.target_on_delivery = Some(target);
                true
            });
        }
        self.put_reply_target(&target)
    }

    /// The ticket of `task_id`'s request reached the agent: the target that waited for it (see
    /// [`Self::owe_reply`]) takes its sender's place, unless the task ended meanwhile.
    fn owe_reply_on_delivery(&mut self, task_id: &str) -> Result<(), StoreError> {
        let mut waiting = None;
        self.update_task(task_id, |task| {
            let Some(target) = task.target_on_delivery.take() else { return false };
            if !task.state.is_final() && task.replied_by.is_none() {
                waiting = Some(target);
            }
            true
        })?;
        match waiting {
            Some(target) => self.put_reply_target(&target),
            None => Ok(()),
        }
    }

    fn put_reply_target(&mut self, target: &ReplyTarget) -> Result<(), StoreError> {
        match self.replay.as_mut() {
            Some(cache) => {
                cache.reply_targets.insert((target.receiver.clone(), target.sender_id.clone()), target.clone());
            }
            None => {
                let key = (target.receiver.as_str(), target.sender_id.as_str());
                self.reply_targets.insert(key, records::encode(target).as_slice())?;
            }
        }
        Ok(())
    }

    fn remove_reply_target(&mut self, receiver: &str, sender: &str) -> Result<(), StoreError> {
        match self.replay.as_mut() {
            Some(cache) => {
                cache.reply_targets.remove(&(receiver.to_string(), sender.to_string()));
            }
            None => {
                self.reply_targets.remove((receiver, sender))?;
            }
        }
        Ok(())
    }

    /// `receiver` owes no answer for its task `task_id` any more (the task ended: canceled,
    /// failed, completed without a reply): a target left for it made `synapse reply` ambiguous
    /// or refused it as already answered. A newer request from the same sender, which replaced
    /// the target, stays.
    fn forget_reply_target_of_task(&mut self, receiver: &str, task_id: &str) -> Result<(), StoreError> {
        for sender in self.reply_targets_of(receiver)? {
            if self.reply_target(receiver, &sender)?.is_some_and(|target| target.receiver_task_id == task_id) {
                self.remove_reply_target(receiver, &sender)?;
            }
        }
        Ok(())
    }

    /// The senders `receiver` owes an answer (replay-aware).
    fn reply_targets_of(&self, receiver: &str) -> Result<Vec<String>, StoreError> {
        if let Some(cache) = &self.replay {
            return Ok(cache
                .reply_targets
                .range((receiver.to_string(), String::new())..)
                .take_while(|((owner, _), _)| owner == receiver)
                .map(|((_, sender), _)| sender.clone())
                .collect());
        }
        Ok(self.reply_targets(receiver)?.into_iter().map(|target| target.sender_id).collect())
    }

    /// Drops every ticket of `agent_id`.
    fn remove_inbox(&mut self, agent_id: &str) -> Result<(), StoreError> {
        self.remove_tickets_where(agent_id, |_| true).map(drop)
    }

    /// Drops the queued tickets of `agent_id` that would write `task_id` (a canceled message
    /// must never reach the terminal), and returns them.
    fn remove_tickets_of_task(&mut self, agent_id: &str, task_id: &str) -> Result<Vec<Ticket>, StoreError> {
        self.remove_tickets_where(agent_id, |ticket| ticket.task_id == task_id)
    }

    /// Drops the tickets of `agent_id` that `doomed` picks, and returns them.
    fn remove_tickets_where(
        &mut self,
        agent_id: &str,
        doomed: impl Fn(&Ticket) -> bool,
    ) -> Result<Vec<Ticket>, StoreError> {
        let mut removed = Vec::new();
        match self.replay.as_mut() {
            Some(cache) => {
                let low = (agent_id.to_string(), 0u8, 0u64);
                let high = (agent_id.to_string(), u8::MAX, u64::MAX);
                let keys: Vec<_> = cache
                    .inbox
                    .range(low..=high)
                    .filter(|(_, ticket)| doomed(ticket))
                    .map(|(key, _)| key.clone())
                    .collect();
                removed.extend(keys.iter().filter_map(|key| cache.inbox.remove(key)));
            }
            None => {
                let mut keys = Vec::new();
                for row in self.inbox.range((agent_id, 0u8, 0u64)..=(agent_id, u8::MAX, u64::MAX))? {
                    let (key, value) = row?;
                    let ticket: Ticket = records::decode(value.value())?;
                    if doomed(&ticket) {
                        let (_, rank, number) = key.value();
                        keys.push((rank, number));
                        removed.push(ticket);
                    }
                }
                for (rank, number) in keys {
                    self.inbox.remove((agent_id, rank, number))?;
                }
                self.add_to_depth(agent_id, -(removed.len() as i64))?;
            }
        }
        Ok(removed)
    }

    fn remove_ticket(&mut self, agent_id: &str, priority: u8, ticket: u64) -> Result<(), StoreError> {
        let rank = inbox_rank(priority);
        match self.replay.as_mut() {
            Some(cache) => {
                cache.inbox.remove(&(agent_id.to_string(), rank, ticket));
            }
            None => {
                if self.inbox.remove((agent_id, rank, ticket))?.is_some() {
                    self.add_to_depth(agent_id, -1)?;
                }
            }
        }
        Ok(())
    }

    /// Applies one event. Pure: depends only on the tables and the envelope.
    pub fn apply(&mut self, envelope: &Envelope) -> Result<(), StoreError> {
        let time_ms = envelope.time_ms;
        match &envelope.event {
            Event::AgentRegistered {
                agent_id,
                agent_type,
                name,
                role,
                pid,
                port,
                working_dir,
                secret_hash,
                pid_start,
                wrapper,
                resumes,
            } => {
                // The same agent again (registered again, by the same process or with its name
                // and type, after it left) goes on from when it began; another agent begins now.
                let since_seq = match self.agent(agent_id)? {
                    Some(current) => current.since_seq,
                    None => match self.departed.get(agent_id.as_str())? {
                        Some(row) => {
                            let departed: DepartedAgent = records::decode(row.value())?;
                            let same_name = departed.name.is_some() && departed.name == *name;
                            let same_process = pid_start.is_some_and(|start| departed.process == Some((*pid, start)));
                            (departed.agent_type == *agent_type && (same_name || same_process || *resumes))
                                .then_some(departed.since_seq)
                                .flatten()
                        }
                        None => None,
                    },
                }
                .or(Some(envelope.seq));
                let record = AgentRecord {
                    agent_id: agent_id.clone(),
                    agent_type: agent_type.clone(),
                    name: name.clone(),
                    role: role.clone(),
                    pid: *pid,
                    port: *port,
                    working_dir: working_dir.clone(),
                    status: crate::event::AgentStatus::Starting,
                    secret_hash: secret_hash.clone(),
                    pid_start: *pid_start,
                    wrapper: *wrapper,
                    registered_ms: time_ms,
                    since_seq,
                    status_ms: time_ms,
                    status_note: None,
                    last_written: None,
                    canceled_unwritten: Vec::new(),
                };
                self.put_agent(&record)?;
                // The id is held again: whatever waited under it is this agent's.
                self.departed.remove(agent_id.as_str())?;
            }
            Event::AgentStatusChanged { agent_id, status, note } => {
                self.change_agent(agent_id, |record| {
                    record.status = *status;
                    record.status_note.clone_from(note);
                    record.status_ms = time_ms;
                })?;
            }
            Event::AgentDeregistered { agent_id, .. } => {
                // The inbox and reply targets stay, and the departed row says whose they are:
                // an agent started again with the same name takes the id (and so them) back;
                // no other agent gets an id that still holds a queue (`broker::agents`).
                if let Some(agent) = self.agent(agent_id)? {
                    let departed = DepartedAgent {
                        agent_id: agent.agent_id.clone(),
                        agent_type: agent.agent_type.clone(),
                        name: agent.name.clone(),
                        port: agent.port,
                        departed_ms: time_ms,
                        since_seq: agent.since_seq,
                        process: agent.pid_start.map(|start| (agent.pid, start)),
                    };
                    self.departed.insert(agent_id.as_str(), records::encode(&departed).as_slice())?;
                }
                self.remove_agent(agent_id)?;
            }
            Event::InboxExpired { agent_id, .. } => {
                self.remove_inbox(agent_id)?;
                for target in self.reply_targets_of(agent_id)? {
                    self.remove_reply_target(agent_id, &target)?;
                }
                self.departed.remove(agent_id.as_str())?;
            }
            Event::TaskCreated {
                task_id,
                owner,
                context_id,
                direction,
                peer,
                state,
                message,
                priority,
                response_expected,
                sender_task_id,
                in_reply_to,
                peer_task_id,
                message_in,
            } => {
                let record = TaskRecord {
                    id: task_id.clone(),
                    owner: owner.clone(),
                    context_id: context_id.clone(),
                    direction: *direction,
                    peer: peer.clone(),
                    state: *state,
                    message: message.clone(),
                    artifacts: Vec::new(),
                    error: None,
                    priority: *priority,
                    response_expected: *response_expected,
                    sender_task_id: sender_task_id.clone(),
                    in_reply_to: in_reply_to.clone(),
                    peer_task_id: peer_task_id.clone(),
                    replied_by: None,
                    created_ms: time_ms,
                    updated_ms: time_ms,
                    created_seq: envelope.seq,
                    message_in: message_in.clone(),
                    message_seq: None,
                    reply_seq: None,
                    artifact_texts: Vec::new(),
                    sent_by_user: false,
                    follow_ups: Vec::new(),
                    as_message: false,
                    target_on_delivery: None,
                };
                // The deciders refuse a taken id, but a log may still hold one created twice:
                // the second replaces the first, and so do its index rows.
                self.create_task(record)?;
            }
            Event::MessageSent {
                task_id,
                from,
                to,
                response_expected,
                sender_task_id,
                text,
                idempotency_key,
                by_user,
                ..
            } => {
                // The row as stored (`task_row`), not as read (`task`): a read fills in the long
                // texts the row only refers to, and writing that back would copy them into the
                // row live but not during a replay, which has no log to fill them from.
                if *by_user {
                    self.update_task(task_id, |record| {
                        record.sent_by_user = true;
                        true
                    })?;
                }
                if let Some(key) = idempotency_key {
                    let first = FirstSend { task_id, sender_task_id: sender_task_id.as_deref(), to, text };
                    self.remember_send(from.as_deref(), key, first, time_ms)?;
                }
                // A sender task created beforehand (POST /tasks/create) is linked to this message.
                if let Some(sender_task) = sender_task_id {
                    self.update_task(sender_task, |record| {
                        if record.peer_task_id.is_some() {
                            return false;
                        }
                        record.peer_task_id = Some(task_id.clone());
                        record.peer = Some(to.clone());
                        true
                    })?;
                }
                // Tasks whose long message this event carries point at it (only a long text is
                // carried that way: a short one is read without decoding the tasks again).
                let carried = if text.len() > INLINE_TEXT_MAX_BYTES { Some(task_id) } else { None };
                for holder in carried.into_iter().chain(carried.and(sender_task_id.as_ref())) {
                    self.update_task(holder, |record| {
                        if record.message_in.as_ref() != Some(task_id) || record.message_seq.is_some() {
                            return false;
                        }
                        record.message_seq = Some(envelope.seq);
                        true
                    })?;
                }
                let sender = reply_target_sender(from.as_deref(), sender_task_id.as_deref());
                if let (true, Some(from)) = (*response_expected, sender) {
                    self.owe_reply(to, from, sender_task_id, task_id, time_ms, text, envelope.seq)?;
                }
            }
            Event::TicketIssued { agent_id, task_id, priority, from, display_task_id, response_expected, turn } => {
                let ticket = Ticket {
                    ticket: envelope.seq,
                    agent_id: agent_id.clone(),
                    kind: TicketKind::Message,
                    task_id: task_id.clone(),
                    display_task_id: display_task_id.clone(),
                    from: from.clone(),
                    priority: *priority,
                    response_expected: *response_expected,
                    issued_ms: time_ms,
                    turn: *turn,
                };
                self.put_ticket(&ticket)?;
            }
            Event::ReverseTicketIssued { agent_id, task_id, from, priority } => {
                let ticket = Ticket {
                    ticket: envelope.seq,
                    agent_id: agent_id.clone(),
                    kind: TicketKind::Reply,
                    task_id: task_id.clone(),
                    display_task_id: task_id.clone(),
                    from: Some(from.clone()),
                    priority: if *priority == 0 { 3 } else { *priority },
                    response_expected: false,
                    issued_ms: time_ms,
                    turn: 0,
                };
                self.put_ticket(&ticket)?;
            }
            Event::TicketInjected { agent_id, ticket, priority, how } => {
                let written = self.inbox_ticket(agent_id, *priority, *ticket)?;
                self.remove_ticket(agent_id, *priority, *ticket)?;
                let message = written.filter(|ticket| ticket.kind == TicketKind::Message);
                if let Some(message) = message.as_ref().filter(|message| message.response_expected) {
                    self.owe_reply_on_delivery(&message.task_id)?;
                }
                let canceled = |agent: &AgentRecord| agent.canceled_unwritten.iter().position(|c| c.ticket == *ticket);
                if message.is_some() || self.agent(agent_id)?.is_some_and(|agent| canceled(&agent).is_some()) {
                    self.change_agent(agent_id, |record| {
                        // What the CLI works on: a message that begins its work (see
                        // `last_written`), or one canceled while it was on its way.
                        let began = match (message, canceled(record)) {
                            (Some(message), _) => Some((message.task_id, message.response_expected, message.priority)),
                            (None, Some(at)) => {
                                let canceled = record.canceled_unwritten.remove(at);
                                Some((canceled.task_id, canceled.response_expected, canceled.priority))
                            }
                            (None, None) => None,
                        };
                        if let Some((task_id, response_expected, priority)) = began
                            && begins_work(*how, record.status, response_expected, priority)
                        {
                            record.last_written = Some(task_id);
                        }
                    })?;
                }
            }
            Event::ReplyPosted { task_id, from, to, sender_task_id, idempotency_key, text } => {
                if let Some(key) = idempotency_key {
                    let row = IdempotentSend {
                        task_id: task_id.clone(),
                        sender_task_id: sender_task_id.clone(),
                        time_ms,
                        is_reply: true,
                        // Who was answered: a retry naming another sender is refused.
                        to: reply_target_sender(to.as_deref(), sender_task_id.as_deref()),
                        text_digest: Some(records::text_digest(text)),
                    };
                    self.idempotency
                        .insert(idempotency_row(Some(from), key).as_str(), records::encode(&row).as_slice())?;
                }
                self.update_task(task_id, |task| {
                    task.replied_by = Some(from.clone());
                    task.reply_seq = Some(envelope.seq);
                    task.updated_ms = time_ms;
                    true
                })?;
                if let Some(to) = reply_target_sender(to.as_deref(), sender_task_id.as_deref()) {
                    let pending = self.reply_target(from, &to)?;
                    if pending.is_some_and(|target| target.receiver_task_id == *task_id) {
                        self.remove_reply_target(from, &to)?;
                    }
                }
            }
            Event::TaskStateChanged { task_id, state, artifacts, error, reply_of, as_message } => {
                // A long reply is in the replier's `reply_posted` (this task's own, or another's).
                let other_reply_seq = match reply_of {
                    Some(replier_task) if replier_task != task_id => {
                        self.read_task(replier_task, |replier| replier.reply_seq)?.flatten()
                    }
                    _ => None,
                };
                let mut owner = None;
                self.update_task(task_id, |task| {
                    if state.is_final() {
                        owner.clone_from(&task.owner);
                    }
                    task.state = *state;
                    task.as_message = *as_message;
                    task.artifacts.extend(artifacts.iter().cloned());
                    // A long reply: an artifact without parts, its text read from the log.
                    if let Some(replier_task) = reply_of {
                        let reply_seq = if replier_task == task_id { task.reply_seq } else { other_reply_seq };
                        if let Some(seq) = reply_seq {
                            let index = u32::try_from(task.artifacts.len()).unwrap_or(u32::MAX);
                            task.artifacts.push(Artifact { name: None, parts: Vec::new() });
                            task.artifact_texts.push(ArtifactText { index, seq });
                        }
                    }
                    if error.is_some() {
                        task.error = error.clone();
                    }
                    task.updated_ms = time_ms;
                    true
                })?;
                if let Some(owner) = owner {
                    self.forget_reply_target_of_task(&owner, task_id)?;
                }
            }
            Event::TaskContinued { task_id, sender_task_id, from, to, text, message_id, idempotency_key } => {
                if let Some(key) = idempotency_key {
                    let first = FirstSend { task_id, sender_task_id: sender_task_id.as_deref(), to, text };
                    self.remember_send(from.as_deref(), key, first, time_ms)?;
                }
                // A long follow-up is stored once, in this event: the rows refer to it by `seq`.
                let parts = if text.len() > INLINE_TEXT_MAX_BYTES {
                    Vec::new()
                } else {
                    vec![Part::Text { text: text.clone() }]
                };
                for holder in std::iter::once(task_id).chain(sender_task_id.iter()) {
                    self.update_task(holder, |record| {
                        // Taken before the `task_state_changed` after this event moves the task
                        // on: the question is what the task asked while it waited.
                        let follow_up = FollowUp {
                            question: record.question(),
                            asked_ms: record.updated_ms,
                            message: Message { role: Role::User, parts: parts.clone(), message_id: message_id.clone() },
                            seq: envelope.seq,
                            time_ms,
                        };
                        record.follow_ups.push(follow_up);
                        true
                    })?;
                }
                // The agent owes an answer again, now to this message.
                if let Some(sender) = reply_target_sender(from.as_deref(), sender_task_id.as_deref()) {
                    self.owe_reply(to, sender, sender_task_id, task_id, time_ms, text, envelope.seq)?;
                }
            }
            Event::TaskCanceled { task_id, reason, by } => {
                let mut owner = None;
                let mut queued = false;
                self.update_task(task_id, |task| {
                    queued = task.state == TaskState::Submitted;
                    task.state = TaskState::Canceled;
                    if reason.is_some() {
                        task.error = reason.clone();
                    }
                    task.updated_ms = time_ms;
                    owner.clone_from(&task.owner);
                    true
                })?;
                // Its tickets go too (the inbox is apart from the task rows: order is free), and
                // so does the reply its owner owed for it.
                if let Some(owner) = owner {
                    let removed = self.remove_tickets_of_task(&owner, task_id)?;
                    self.forget_reply_target_of_task(&owner, task_id)?;
                    // A message not yet acknowledged: its wrapper may be writing it now.
                    let canceled: Vec<CanceledTicket> = removed
                        .into_iter()
                        .filter(|ticket| queued && ticket.kind == TicketKind::Message)
                        .map(|ticket| CanceledTicket {
                            ticket: ticket.ticket,
                            task_id: task_id.clone(),
                            by: by.clone().unwrap_or_else(|| "anonymous".into()),
                            priority: ticket.priority,
                            response_expected: ticket.response_expected,
                            canceled_ms: time_ms,
                        })
                        .collect();
                    if !canceled.is_empty() {
                        self.change_agent(&owner, |record| {
                            let list = &mut record.canceled_unwritten;
                            list.retain(|old| old.canceled_ms.saturating_add(CANCELED_UNWRITTEN_MS) >= time_ms);
                            list.extend(canceled);
                            let over = list.len().saturating_sub(CANCELED_UNWRITTEN);
                            list.drain(..over);
                        })?;
                    }
                }
            }
            // Projections of these kinds (file safety, history, webhooks, externals) are not
            // kept yet; the events are in the log and a later rebuild will pick them up.
            Event::FileLockAcquired { path, agent_id, expires_ms, intent, task_id } => {
                let lock = FileLock {
                    path: path.clone(),
                    agent_id: agent_id.clone(),
                    expires_ms: *expires_ms,
                    acquired_ms: time_ms,
                    intent: intent.clone(),
                    task_id: task_id.clone(),
                };
                self.locks.insert(path.as_str(), records::encode(&lock).as_slice())?;
            }
            Event::FileLockReleased { path, .. } => {
                self.locks.remove(path.as_str())?;
            }
            Event::FileModified { path, agent_id, task_id, change_type, intent } => {
                let modification = FileModification {
                    path: path.clone(),
                    agent_id: agent_id.clone(),
                    task_id: task_id.clone(),
                    change_type: *change_type,
                    intent: intent.clone(),
                    time_ms,
                    seq: envelope.seq,
                };
                self.modifications.insert((path.as_str(), envelope.seq), records::encode(&modification).as_slice())?;
            }
            Event::IdempotencyKeysExpired { before_ms } => {
                let mut old = Vec::new();
                for row in self.idempotency.iter()? {
                    let (key, value) = row?;
                    let send: IdempotentSend = records::decode(value.value())?;
                    if send.time_ms < *before_ms {
                        old.push(key.value().to_string());
                    }
                }
                for key in old {
                    self.idempotency.remove(key.as_str())?;
                }
            }
            Event::FileModificationsPruned { before_ms } => {
                let mut old = Vec::new();
                for row in self.modifications.iter()? {
                    let (key, value) = row?;
                    let modification: FileModification = records::decode(value.value())?;
                    if modification.time_ms < *before_ms {
                        let (path, seq) = key.value();
                        old.push((path.to_string(), seq));
                    }
                }
                for (path, seq) in old {
                    self.modifications.remove((path.as_str(), seq))?;
                }
            }
            Event::ExternalMessageSent { task_id, reply_token_sha256, by_user, .. } => {
                self.update_task(task_id, |task| {
                    task.sent_by_user = *by_user;
                    true
                })?;
                self.reply_tokens.insert(reply_token_sha256.as_str(), task_id.as_bytes())?;
            }
            Event::ExternalReplyReceived { task_id, from, reply_token_sha256, .. } => {
                self.reply_tokens.remove(reply_token_sha256.as_str())?;
                self.update_task(task_id, |task| {
                    task.replied_by = Some(from.clone().unwrap_or_else(|| "external".to_string()));
                    true
                })?;
            }
            Event::HistoryPruned { .. }
            | Event::WebhookRegistered { .. }
            | Event::WebhookRemoved { .. }
            | Event::WebhookDeliveryAttempted { .. }
            | Event::PushConfigSet { .. }
            | Event::PushConfigDeleted { .. }
            | Event::ExternalAgentAdded { .. }
            | Event::ExternalAgentRemoved { .. } => {}
        }
        self.apply_history(envelope)
    }

    /// Keeps a send's idempotency key (`from`'s key space): a retry within the window answers
    /// this send's tasks.
    fn remember_send(
        &mut self,
        from: Option<&str>,
        key: &str,
        first: FirstSend<'_>,
        time_ms: u64,
    ) -> Result<(), StoreError> {
        let row = IdempotentSend {
            task_id: first.task_id.to_string(),
            sender_task_id: first.sender_task_id.map(str::to_string),
            time_ms,
            is_reply: false,
            to: Some(first.to.to_string()),
            text_digest: Some(records::text_digest(first.text)),
        };
        self.idempotency.insert(idempotency_row(from, key).as_str(), records::encode(&row).as_slice())?;
        Ok(())
    }

    /// Writes a task's row outside a replay (a replay changes its cached rows in place, see
    /// [`Self::update_task`]); `was` are the index rows of the row it replaces (none for a new
    /// task), which the caller has in hand: read again here, the row would be decoded twice.
    pub(super) fn put_task(&mut self, task: TaskRecord, was: &[IndexRow]) -> Result<(), StoreError> {
        debug_assert!(self.replay.is_none(), "task {} written to its table during a replay", task.id);
        debug_assert_row_holds_no_long_reply(&task);
        // Read from the table itself: the check must not change what `decoded` holds.
        debug_assert_eq!(
            was,
            self.stored_task(&task.id).ok().flatten().as_ref().map(task_index_rows).unwrap_or_default(),
            "task {}: the index rows given are not those of its stored row",
            task.id
        );
        // The index follows the row in the same transaction: drop the rows the old row had and
        // the new one has not, add the new ones.
        let new_rows = task_index_rows(&task);
        self.tasks.insert(task.id.as_str(), records::encode(&task).as_slice())?;
        for (agent, kind, order, id) in was.iter().filter(|row| !new_rows.contains(row)) {
            self.task_index.remove((agent.as_str(), *kind, *order, id.as_str()))?;
        }
        for (agent, kind, order, id) in new_rows.iter().filter(|row| !was.contains(row)) {
            self.task_index.insert((agent.as_str(), *kind, *order, id.as_str()), [].as_slice())?;
        }
        self.decoded.tasks.get_mut().insert(task.id.clone(), Some(task));
        Ok(())
    }

    /// Writes a new task's row (replacing one of the same id, which a log may hold).
    fn create_task(&mut self, task: TaskRecord) -> Result<(), StoreError> {
        match self.replay.as_mut() {
            Some(cache) => {
                debug_assert_row_holds_no_long_reply(&task);
                cache.tasks.insert(task.id.clone(), Box::new(task));
                Ok(())
            }
            None => {
                let was = self.take_task_row(&task.id)?.as_ref().map(task_index_rows).unwrap_or_default();
                self.put_task(task, &was)
            }
        }
    }

    /// Changes a task's row with `change`, which says whether it changed anything (nothing is
    /// written when it did not). Nothing happens to a task the projections do not hold. During
    /// a replay the cached row is changed in place: a task changes several times in its life,
    /// and copying its row out and back each time was most of a rebuild's work.
    fn update_task(&mut self, task_id: &str, change: impl FnOnce(&mut TaskRecord) -> bool) -> Result<(), StoreError> {
        match self.replay.as_mut() {
            Some(cache) => {
                if let Some(task) = cache.tasks.get_mut(task_id) {
                    change(task);
                    debug_assert_row_holds_no_long_reply(task);
                }
            }
            None => {
                if let Some(mut task) = self.take_task_row(task_id)? {
                    let was = task_index_rows(&task);
                    // Unchanged, the row stays as it is (and out of `decoded`, read again if needed).
                    if change(&mut task) {
                        self.put_task(task, &was)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// What `read` takes from a task's row, without copying the row (during a replay, or when
    /// the transaction has it decoded). `read` must not call back into the projections: the
    /// decoded rows are borrowed while it runs.
    fn read_task<R>(&self, task_id: &str, read: impl FnOnce(&TaskRecord) -> R) -> Result<Option<R>, StoreError> {
        if let Some(cache) = &self.replay {
            return Ok(cache.tasks.get(task_id).map(|task| read(task)));
        }
        if let Some(known) = self.decoded.tasks.borrow().get(task_id) {
            return Ok(known.as_ref().map(read));
        }
        let task = self.stored_task(task_id)?;
        let answer = task.as_ref().map(read);
        self.decoded.tasks.borrow_mut().insert(task_id.to_string(), task);
        Ok(answer)
    }

    /// A task's row to change and write back: taken out of `decoded` (no copy), or decoded.
    fn take_task_row(&mut self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        match self.decoded.tasks.get_mut().remove(task_id) {
            Some(known) => Ok(known),
            None => self.stored_task(task_id),
        }
    }

    /// A task's row decoded from the table itself (neither the replay's rows nor `decoded`).
    fn stored_task(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.tasks.get(task_id)?.map(|row| records::decode(row.value())).transpose()
    }

    fn put_ticket(&mut self, ticket: &Ticket) -> Result<(), StoreError> {
        let rank = inbox_rank(ticket.priority);
        match self.replay.as_mut() {
            Some(cache) => {
                cache.inbox.insert((ticket.agent_id.clone(), rank, ticket.ticket), ticket.clone());
            }
            None => {
                let replaced = self
                    .inbox
                    .insert((ticket.agent_id.as_str(), rank, ticket.ticket), records::encode(ticket).as_slice())?
                    .is_some();
                if !replaced {
                    self.add_to_depth(&ticket.agent_id, 1)?;
                }
            }
        }
        Ok(())
    }

    /// Moves an agent's inbox depth by `change`; an empty inbox has no row (as after a replay).
    fn add_to_depth(&mut self, agent_id: &str, change: i64) -> Result<(), StoreError> {
        if change == 0 {
            return Ok(());
        }
        let depth = self.inbox_depth.get(agent_id)?.map_or(0, |row| depth_of(row.value()));
        let depth = depth.saturating_add_signed(change);
        if depth == 0 {
            self.inbox_depth.remove(agent_id)?;
        } else {
            self.inbox_depth.insert(agent_id, depth.to_le_bytes().as_slice())?;
        }
        Ok(())
    }
}

/// A row holds a long reply only by reference; a row read with `task` (texts filled in) must
/// not be written back, or live rows would differ from replayed ones.
fn debug_assert_row_holds_no_long_reply(task: &TaskRecord) {
    debug_assert!(
        task.artifact_texts
            .iter()
            .all(|reference| task.artifacts.get(reference.index as usize).is_none_or(|a| a.parts.is_empty())),
        "task {} written with the text of a long reply copied into its row",
        task.id
    );
}

impl ReadProjections {
    pub(crate) fn open(txn: &ReadTransaction, names: &ProjectionNames) -> Result<Self, StoreError> {
        Ok(ReadProjections {
            agents: txn.open_table(names.agents)?,
            tasks: txn.open_table(names.tasks)?,
            reply_targets: txn.open_table(names.reply_targets)?,
            inbox: txn.open_table(names.inbox)?,
            locks: txn.open_table(names.locks)?,
            modifications: txn.open_table(names.modifications)?,
            history_meta: txn.open_table(names.history_meta)?,
            departed: txn.open_table(names.departed)?,
            task_index: txn.open_table(names.task_index)?,
            inbox_depth: txn.open_table(names.inbox_depth)?,
            log: txn.open_table(super::LOG)?,
        })
    }

    /// See [`hydrate_event`].
    pub(crate) fn hydrate_event(&self, event: &mut Event) -> Result<(), StoreError> {
        hydrate_event(&self.log, event, |task_id| self.task_row(task_id))
    }
}

/// Queries shared by the writer's view and read transactions.
macro_rules! impl_queries {
    ($type:ty) => {
        impl $type {
            pub fn agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
                let mut agents = Vec::new();
                for row in self.agents.iter()? {
                    let (_, value) = row?;
                    agents.push(records::decode(value.value())?);
                }
                Ok(agents)
            }

            /// Tasks whose id starts with `prefix`, at most `limit` of them.
            pub fn tasks_with_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
                // Without a read limit the answer is always there.
                Ok(self.tasks_with_prefix_where(prefix, |_| true, limit, usize::MAX)?.unwrap_or_default())
            }

            /// Tasks whose id starts with `prefix` and that `keep` accepts (asked before their
            /// texts are read), at most `limit` of them. `None` when `read_limit` tasks starting
            /// with `prefix` have been read and more follow before `limit` are kept: a prefix that
            /// short is not read through on a request.
            pub fn tasks_with_prefix_where(
                &self,
                prefix: &str,
                keep: impl Fn(&TaskRecord) -> bool,
                limit: usize,
                read_limit: usize,
            ) -> Result<Option<Vec<TaskRecord>>, StoreError> {
                let mut tasks = Vec::new();
                for (read, row) in self.tasks.range(prefix..)?.enumerate() {
                    let (key, value) = row?;
                    if !key.value().starts_with(prefix) || tasks.len() >= limit {
                        break;
                    }
                    if read >= read_limit {
                        return Ok(None);
                    }
                    let task: TaskRecord = records::decode(value.value())?;
                    if keep(&task) {
                        tasks.push(self.hydrated(task)?);
                    }
                }
                Ok(Some(tasks))
            }

            /// Every task, with its texts (tests, and checks of the whole projection).
            pub fn tasks(&self) -> Result<Vec<TaskRecord>, StoreError> {
                let mut tasks = Vec::new();
                self.visit_tasks(
                    |_| true,
                    |task| {
                        tasks.push(task);
                        Ok(())
                    },
                )?;
                Ok(tasks)
            }

            /// Calls `visit` with each task that `wanted` accepts (asked before its texts are
            /// read), in id order, one at a time: a pass over every task holds one of them.
            pub fn visit_tasks(
                &self,
                wanted: impl Fn(&TaskRecord) -> bool,
                mut visit: impl FnMut(TaskRecord) -> Result<(), StoreError>,
            ) -> Result<(), StoreError> {
                for row in self.tasks.iter()? {
                    let (_, value) = row?;
                    let task: TaskRecord = records::decode(value.value())?;
                    if wanted(&task) {
                        visit(self.hydrated(task)?)?;
                    }
                }
                Ok(())
            }

            /// The ids of `agent`'s tasks of one kind, in index order (oldest first).
            fn indexed_task_ids(&self, agent: &str, kind: TaskIndexKind) -> Result<Vec<String>, StoreError> {
                let kind = kind as u8;
                let mut ids = Vec::new();
                for row in self.task_index.range((agent, kind, 0u64, "")..(agent, kind + 1, 0u64, ""))? {
                    let (key, _) = row?;
                    ids.push(key.value().3.to_string());
                }
                Ok(ids)
            }

            /// Like [`Self::tasks_of`], the rows only: a long text stays in the log (read the
            /// tasks a caller keeps with `task`). For lists that filter and page before they
            /// show anything.
            pub fn task_rows_of(&self, agent: &str, kind: TaskIndexKind) -> Result<Vec<TaskRecord>, StoreError> {
                let mut tasks = Vec::new();
                for id in self.indexed_task_ids(agent, kind)? {
                    if let Some(task) = self.task_row(&id)? {
                        tasks.push(task);
                    }
                }
                Ok(tasks)
            }

            /// The tasks of `agent` of one kind, oldest first (see [`TaskIndexKind`]); read
            /// through the index, so the cost is the agent's tasks, not every task.
            pub fn tasks_of(&self, agent: &str, kind: TaskIndexKind) -> Result<Vec<TaskRecord>, StoreError> {
                self.task_rows_of(agent, kind)?.into_iter().map(|task| self.hydrated(task)).collect()
            }

            /// The task `agent` works on now: its incoming task in state working updated last
            /// (of two updated in the same millisecond, the greater id).
            pub fn current_task(&self, agent: &str) -> Result<Option<TaskRecord>, StoreError> {
                let kind = TaskIndexKind::Working as u8;
                let newest = self.task_index.range((agent, kind, 0u64, "")..(agent, kind + 1, 0u64, ""))?.next_back();
                match newest {
                    Some(row) => {
                        let (key, _) = row?;
                        let id = key.value().3.to_string();
                        self.task(&id)
                    }
                    None => Ok(None),
                }
            }

            /// Agents waiting for `receiver`'s answer, oldest request first.
            pub fn reply_targets(&self, receiver: &str) -> Result<Vec<ReplyTarget>, StoreError> {
                let mut targets: Vec<ReplyTarget> = Vec::new();
                for row in self.reply_targets.range((receiver, "")..)? {
                    let (key, value) = row?;
                    if key.value().0 != receiver {
                        break;
                    }
                    targets.push(records::decode(value.value())?);
                }
                targets.sort_by_key(|target| target.seq);
                Ok(targets)
            }

            /// Tickets still to be written into `agent_id`'s PTY, in delivery order.
            pub fn inbox(&self, agent_id: &str, limit: usize) -> Result<Vec<Ticket>, StoreError> {
                let mut tickets = Vec::new();
                for row in self.inbox.range((agent_id, 0u8, 0u64)..=(agent_id, u8::MAX, u64::MAX))?.take(limit) {
                    let (_, value) = row?;
                    tickets.push(records::decode(value.value())?);
                }
                Ok(tickets)
            }

            pub fn ticket(&self, agent_id: &str, priority: u8, ticket: u64) -> Result<Option<Ticket>, StoreError> {
                self.inbox
                    .get((agent_id, inbox_rank(priority), ticket))?
                    .map(|row| records::decode(row.value()))
                    .transpose()
            }

            pub fn inbox_depth(&self, agent_id: &str) -> Result<usize, StoreError> {
                let depth = self.inbox_depth.get(agent_id)?.map_or(0, |row| depth_of(row.value()));
                Ok(usize::try_from(depth).unwrap_or(usize::MAX))
            }

            /// The agent that last held `agent_id` and left (None while one holds it).
            pub fn departed(&self, agent_id: &str) -> Result<Option<DepartedAgent>, StoreError> {
                self.departed.get(agent_id)?.map(|row| records::decode(row.value())).transpose()
            }

            /// What still waits for `agent_id`: tickets in its inbox, and requests it has not
            /// answered yet (reply targets whose task is open). A departed agent's id is held
            /// while this is not zero.
            pub fn pending_for(&self, agent_id: &str) -> Result<usize, StoreError> {
                let mut pending = self.inbox_depth(agent_id)?;
                for target in self.reply_targets(agent_id)? {
                    if self.task_row(&target.receiver_task_id)?.is_some_and(|task| !task.state.is_final()) {
                        pending += 1;
                    }
                }
                Ok(pending)
            }

            /// Every departed agent (one per id that was ever left).
            pub fn departed_agents(&self) -> Result<Vec<DepartedAgent>, StoreError> {
                let mut departed = Vec::new();
                for row in self.departed.iter()? {
                    let (_, value) = row?;
                    departed.push(records::decode(value.value())?);
                }
                Ok(departed)
            }

            pub fn lock(&self, path: &str) -> Result<Option<FileLock>, StoreError> {
                self.locks.get(path)?.map(|row| records::decode(row.value())).transpose()
            }

            pub fn locks(&self) -> Result<Vec<FileLock>, StoreError> {
                let mut locks = Vec::new();
                for row in self.locks.iter()? {
                    let (_, value) = row?;
                    locks.push(records::decode(value.value())?);
                }
                Ok(locks)
            }

            /// How many files are locked, and how many modifications are recorded (read from
            /// the tables' own counts, nothing decoded).
            pub fn file_safety_counts(&self) -> Result<(usize, usize), StoreError> {
                let count = |rows: u64| usize::try_from(rows).unwrap_or(usize::MAX);
                Ok((count(self.locks.len()?), count(self.modifications.len()?)))
            }

            /// A file's modifications, newest first, at most `limit`.
            pub fn modifications_of(&self, path: &str, limit: usize) -> Result<Vec<FileModification>, StoreError> {
                let mut found = Vec::new();
                for row in self.modifications.range((path, 0u64)..=(path, u64::MAX))?.rev().take(limit) {
                    let (_, value) = row?;
                    found.push(records::decode(value.value())?);
                }
                Ok(found)
            }

            /// Every modification, newest first (optionally of one agent), at most `limit`.
            pub fn recent_modifications(
                &self,
                agent: Option<&str>,
                limit: usize,
            ) -> Result<Vec<FileModification>, StoreError> {
                let mut all: Vec<FileModification> = Vec::new();
                for row in self.modifications.iter()? {
                    let (_, value) = row?;
                    let modification: FileModification = records::decode(value.value())?;
                    if agent.is_none_or(|agent| modification.agent_id == agent) {
                        all.push(modification);
                    }
                }
                all.sort_by(|left, right| right.seq.cmp(&left.seq));
                all.truncate(limit);
                Ok(all)
            }

            /// The task a received task's sender is waiting on, and the received task.
            pub fn open_outgoing_of(&self, task: &TaskRecord) -> Result<Option<TaskRecord>, StoreError> {
                match (&task.direction, &task.sender_task_id) {
                    (Direction::Incoming, Some(sender_task)) => self.task(sender_task),
                    _ => Ok(None),
                }
            }
        }
    };
}

impl_queries!(Projections<'_>);
impl_queries!(ReadProjections);

impl Projections<'_> {
    /// The send an idempotency key of `from` made, if any (decide checks its age).
    pub fn idempotent_send(&self, from: Option<&str>, key: &str) -> Result<Option<IdempotentSend>, StoreError> {
        self.idempotency.get(idempotency_row(from, key).as_str())?.map(|row| records::decode(row.value())).transpose()
    }

    /// Is any idempotency key older than `before_ms` still kept (so expiring them drops rows)?
    pub fn has_idempotency_keys_before(&self, before_ms: u64) -> Result<bool, StoreError> {
        for row in self.idempotency.iter()? {
            let (_, value) = row?;
            let send: IdempotentSend = records::decode(value.value())?;
            if send.time_ms < before_ms {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether an agent is registered, without decoding (or copying) its row: the writer asks
    /// this for every file-safety decision, and a batch of 64 agents' locks decoded 64 rows.
    pub fn agent_exists(&self, agent_id: &str) -> Result<bool, StoreError> {
        if let Some(cache) = &self.replay {
            return Ok(cache.agents.contains_key(agent_id));
        }
        if let Some(known) = self.decoded.agents.borrow().get(agent_id) {
            return Ok(known.is_some());
        }
        Ok(self.agents.get(agent_id)?.is_some())
    }

    pub fn agent(&self, agent_id: &str) -> Result<Option<AgentRecord>, StoreError> {
        if let Some(cache) = &self.replay {
            return Ok(cache.agents.get(agent_id).cloned());
        }
        if let Some(known) = self.decoded.agents.borrow().get(agent_id) {
            return Ok(known.clone());
        }
        let agent: Option<AgentRecord> =
            self.agents.get(agent_id)?.map(|row| records::decode(row.value())).transpose()?;
        self.decoded.agents.borrow_mut().insert(agent_id.to_string(), agent.clone());
        Ok(agent)
    }

    /// The task waiting for the reply that names the reply token whose SHA-256 is `token_sha256`
    /// (see `Event::ExternalMessageSent`); none once a reply spent it.
    pub fn reply_token_task(&self, token_sha256: &str) -> Result<Option<String>, StoreError> {
        Ok(self.reply_tokens.get(token_sha256)?.map(|row| String::from_utf8_lossy(row.value()).into_owned()))
    }

    /// One task as its row holds it (a long text only referred to); during a replay the
    /// write-back cache holds the newest rows.
    pub(crate) fn task_row(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.read_task(task_id, TaskRecord::clone)
    }

    /// One task, with its texts.
    pub fn task(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.task_row(task_id)?.map(|task| self.hydrated(task)).transpose()
    }

    /// The task with the texts its row refers to (as is during a replay, which needs none).
    fn hydrated(&self, mut task: TaskRecord) -> Result<TaskRecord, StoreError> {
        if let Some(log) = &self.log {
            hydrate_task(log, &mut task)?;
        }
        Ok(task)
    }

    /// See [`hydrate_event`].
    pub(crate) fn hydrate_event(&self, event: &mut Event) -> Result<(), StoreError> {
        match &self.log {
            Some(log) => hydrate_event(log, event, |task_id| self.task_row(task_id)),
            None => Ok(()),
        }
    }
}

impl ReadProjections {
    pub fn agent(&self, agent_id: &str) -> Result<Option<AgentRecord>, StoreError> {
        self.agents.get(agent_id)?.map(|row| records::decode(row.value())).transpose()
    }

    pub(crate) fn task_row(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.tasks.get(task_id)?.map(|row| records::decode(row.value())).transpose()
    }

    /// One task, with its texts.
    pub fn task(&self, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.task_row(task_id)?.map(|task| self.hydrated(task)).transpose()
    }

    /// One task, if `wanted` accepts it (asked before its texts are read).
    pub fn task_if(
        &self,
        task_id: &str,
        wanted: impl Fn(&TaskRecord) -> bool,
    ) -> Result<Option<TaskRecord>, StoreError> {
        self.task_row(task_id)?.filter(|task| wanted(task)).map(|task| self.hydrated(task)).transpose()
    }

    fn hydrated(&self, mut task: TaskRecord) -> Result<TaskRecord, StoreError> {
        hydrate_task(&self.log, &mut task)?;
        Ok(task)
    }
}

/// Compares two projection sets row by row; returns a line per difference (at most 50).
pub(crate) fn compare(
    txn: &WriteTransaction,
    live: &ProjectionNames,
    scratch: &ProjectionNames,
) -> Result<Vec<String>, StoreError> {
    let mut differences = Vec::new();
    compare_table(txn, live.agents, scratch.agents, "agents", &mut differences)?;
    compare_table(txn, live.tasks, scratch.tasks, "tasks", &mut differences)?;
    compare_table(txn, live.reply_targets, scratch.reply_targets, "reply_targets", &mut differences)?;
    compare_table(txn, live.inbox, scratch.inbox, "inbox", &mut differences)?;
    compare_table(txn, live.locks, scratch.locks, "file_locks", &mut differences)?;
    compare_table(txn, live.modifications, scratch.modifications, "file_modifications", &mut differences)?;
    compare_table(txn, live.departed, scratch.departed, "departed_agents", &mut differences)?;
    compare_table(txn, live.idempotency, scratch.idempotency, "idempotency_keys", &mut differences)?;
    compare_table(txn, live.task_index, scratch.task_index, "task_index", &mut differences)?;
    compare_table(txn, live.inbox_depth, scratch.inbox_depth, "inbox_depth", &mut differences)?;
    compare_table(txn, live.reply_tokens, scratch.reply_tokens, "reply_tokens", &mut differences)?;
    let live_cutoff = txn.open_table(live.history_meta)?.get(PRUNED_BEFORE)?.map(|v| v.value());
    let replay_cutoff = txn.open_table(scratch.history_meta)?.get(PRUNED_BEFORE)?.map(|v| v.value());
    if live_cutoff != replay_cutoff {
        differences.push(format!("history_meta: live {live_cutoff:?}, replay {replay_cutoff:?}"));
    }
    Ok(differences)
}

const MAX_DIFFERENCES: usize = 50;

fn compare_table<K: redb::Key + 'static>(
    txn: &WriteTransaction,
    live: TableDefinition<'static, K, &'static [u8]>,
    scratch: TableDefinition<'static, K, &'static [u8]>,
    name: &str,
    differences: &mut Vec<String>,
) -> Result<(), StoreError>
where
    for<'a> K::SelfType<'a>: std::fmt::Debug,
{
    let live_table = txn.open_table(live)?;
    let scratch_table = txn.open_table(scratch)?;
    let mut live_rows = live_table.iter()?;
    let mut scratch_rows = scratch_table.iter()?;
    loop {
        if differences.len() >= MAX_DIFFERENCES {
            return Ok(());
        }
        match (live_rows.next().transpose()?, scratch_rows.next().transpose()?) {
            (None, None) => return Ok(()),
            (Some((key, _)), None) => {
                differences.push(format!("{name}: live has {:?}, replay does not", key.value()));
            }
            (None, Some((key, _))) => {
                differences.push(format!("{name}: replay has {:?}, live does not", key.value()));
            }
            (Some((live_key, live_value)), Some((scratch_key, scratch_value))) => {
                let live_bytes = K::as_bytes(&live_key.value()).as_ref().to_vec();
                let scratch_bytes = K::as_bytes(&scratch_key.value()).as_ref().to_vec();
                if live_bytes != scratch_bytes {
                    differences.push(format!(
                        "{name}: row {:?} (live) against {:?} (replay)",
                        live_key.value(),
                        scratch_key.value()
                    ));
                    // Keys are out of step; report once and stop comparing this table.
                    return Ok(());
                }
                if live_value.value() != scratch_value.value() {
                    differences.push(format!("{name}: row {:?} differs", live_key.value()));
                }
            }
        }
    }
}

/// A send made with an idempotency key, as [`Projections::remember_send`] keeps it.
struct FirstSend<'a> {
    task_id: &'a str,
    sender_task_id: Option<&'a str>,
    to: &'a str,
    text: &'a str,
}
