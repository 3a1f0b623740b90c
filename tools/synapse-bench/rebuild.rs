//! `rebuild`: replay a 1M-event log.
//!
//! Writes a realistic log straight into a store, times reading and decoding every event of it
//! (`floor_scan_1m_seconds`, the floor of a rebuild: issue 16), then rebuilding the projections
//! from it (`rebuild_1m_seconds`).

use crate::common::{BenchDir, result};
use anyhow::{Result, bail};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use synapse::event::{AgentStatus, Artifact, Delivery, Direction, Event, Message, Role, TaskState};
use synapse::secret::hash_secret;
use synapse::store::{Appender, Store, StoreError};

/// Events in the `rebuild` log, and events per transaction while building it.
const REBUILD_EVENTS: u64 = 1_000_000;
const REBUILD_BATCH: u64 = 10_000;
/// Agents registered at the start of the `rebuild` log.
const REBUILD_AGENTS: usize = 8;

pub fn run() -> Result<()> {
    let dir = BenchDir::new("rebuild")?;
    let database = dir.paths().database();
    let store = Store::open(&database)?;
    let building = Instant::now();
    let mut log = LogGenerator::new(REBUILD_EVENTS);
    let time_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64);
    let mut batch = 0;
    while !log.is_done() {
        store.transact(time_ms + batch, |appender| log.fill(appender, REBUILD_BATCH))?;
        batch += 1;
    }
    drop(store);
    let size_mib = std::fs::metadata(&database)?.len() as f64 / f64::from(1 << 20);
    println!(
        "built {} events ({} exchanges, {batch} transactions) in {:.2} s; file {size_mib:.0} MiB",
        REBUILD_EVENTS,
        log.exchanges,
        building.elapsed().as_secs_f64()
    );

    // Reopened, so redb's own cache starts empty (the OS page cache stays warm).
    let store = Store::open(&database)?;
    let count = store.event_count()?;
    if count != REBUILD_EVENTS {
        bail!("the log holds {count} events, expected {REBUILD_EVENTS}");
    }
    let sample = store.read_after(REBUILD_EVENTS / 2, 10_000)?;
    let sample_bytes: usize = sample.iter().map(|envelope| envelope.encode().len()).sum();
    println!(
        "encoded events average {:.0} bytes (10,000 from the middle of the log)",
        sample_bytes as f64 / sample.len().max(1) as f64
    );
    // The floor of a rebuild (issue 16): reading and decoding every event without applying it.
    let scanning = Instant::now();
    let (mut after, mut scanned) = (0, 0_u64);
    loop {
        let chunk = store.read_after(after, 10_000)?;
        let Some(last) = chunk.last() else { break };
        after = last.seq;
        scanned += chunk.len() as u64;
    }
    let scan_seconds = scanning.elapsed().as_secs_f64();
    if scanned != REBUILD_EVENTS {
        bail!("the scan read {scanned} events, expected {REBUILD_EVENTS}");
    }
    println!("read and decoded every event (no projection) in {scan_seconds:.2} s");
    result("floor_scan_1m_seconds", scan_seconds, 2, "s");
    let started = Instant::now();
    let report = store.rebuild()?;
    let seconds = started.elapsed().as_secs_f64();
    if report.events != REBUILD_EVENTS {
        bail!("the rebuild replayed {} events, expected {REBUILD_EVENTS}", report.events);
    }
    drop(store);
    let size_after_mib = std::fs::metadata(&database)?.len() as f64 / f64::from(1 << 20);
    println!(
        "rebuild replayed {} events in {seconds:.3} s ({:.0} events/s; the store reports {:.1} ms); file {size_after_mib:.0} MiB after",
        report.events,
        report.events as f64 / seconds,
        report.elapsed_ms
    );
    result("rebuild_1m_seconds", seconds, 3, "s");
    Ok(())
}

/// Writes a realistic log: agents register, then exchanges follow. In every ten exchanges six
/// are requests with a reply (13 events: send, injection, status changes, reply, reverse ticket
/// and its injection), three are acknowledged fire-and-forget messages (5 events) and one stays
/// in the inbox (3 events).
pub struct LogGenerator {
    target: u64,
    agents: Vec<String>,
    pub exchanges: u64,
    written: u64,
    /// The receiver's task of the latest exchange (`scale` reads it back).
    pub last_task: Option<String>,
}

const REQUEST_TEXT: &str = "Please review the error handling in src/store/mod.rs and tell me whether a full disk \
                            during commit can lose an acknowledged event. Keep the answer short.";
const REPLY_TEXT: &str = "Reviewed: a failed commit answers every caller with an error, nothing acknowledged is lost.";

impl LogGenerator {
    pub fn new(target: u64) -> LogGenerator {
        LogGenerator { target, agents: Vec::new(), exchanges: 0, written: 0, last_task: None }
    }

    pub fn is_done(&self) -> bool {
        self.written >= self.target
    }

    /// Goes on to a longer log (`scale`): the next [`LogGenerator::fill`]s append up to `target`.
    pub fn grow_to(&mut self, target: u64) {
        self.target = self.target.max(target);
    }

    /// The agents of the log (registered by its first events).
    pub fn agents(&self) -> &[String] {
        &self.agents
    }

    /// Appends up to `limit` events (fewer only at the end of the log).
    pub fn fill(&mut self, appender: &mut Appender<'_>, limit: u64) -> Result<(), StoreError> {
        let room = limit.min(self.target - self.written);
        let end = appender.next_seq() + room;
        while appender.next_seq() < end {
            let before = appender.next_seq();
            self.append_next(appender, end - before)?;
            self.written += appender.next_seq() - before;
        }
        Ok(())
    }

    fn append_next(&mut self, appender: &mut Appender<'_>, room: u64) -> Result<(), StoreError> {
        let pid = std::process::id();
        if self.agents.len() < REBUILD_AGENTS {
            let port = 8100 + self.agents.len() as u16;
            let agent_id = format!("synapse-claude-{port}");
            let event = Event::AgentRegistered {
                agent_id: agent_id.clone(),
                agent_type: "claude".into(),
                name: Some(format!("worker{}", self.agents.len())),
                role: Some("reviewer".into()),
                pid,
                port,
                working_dir: "/home/user/project".into(),
                secret_hash: hash_secret(&agent_id),
                pid_start: None,
                wrapper: false,
                resumes: false,
            };
            appender.append(Some(&agent_id), vec![event])?;
            self.agents.push(agent_id);
            return Ok(());
        }
        let k = self.exchanges as usize;
        let n = self.agents.len();
        let sender = self.agents[k % n].clone();
        let receiver = self.agents[(k % n + 1 + (k / n) % (n - 1)) % n].clone();
        let (needed, reply, acked) = match k % 10 {
            0..=5 => (13, true, true),
            6..=8 => (5, false, true),
            _ => (3, false, false),
        };
        if room < needed {
            // Pad the end of a batch with status changes, so the log has exactly `target` events.
            let event =
                Event::AgentStatusChanged { agent_id: receiver.clone(), status: AgentStatus::Ready, note: None };
            appender.append(Some(&receiver), vec![event])?;
            return Ok(());
        }
        self.exchanges += 1;
        self.append_exchange(appender, &sender, &receiver, reply, acked)
    }

    fn append_exchange(
        &mut self,
        appender: &mut Appender<'_>,
        sender: &str,
        receiver: &str,
        reply: bool,
        acked: bool,
    ) -> Result<(), StoreError> {
        let priority = 3;
        let task_id = synapse::ids::new_id();
        let sender_task_id = reply.then(synapse::ids::new_id);
        let context_id = synapse::ids::new_id();
        self.last_task = Some(task_id.clone());
        let text = format!("{REQUEST_TEXT} (#{})", self.exchanges);
        let message = Message::text(Role::User, text.clone());

        let mut send = Vec::with_capacity(4);
        if let Some(sender_task_id) = &sender_task_id {
            send.push(Event::TaskCreated {
                task_id: sender_task_id.clone(),
                owner: Some(sender.into()),
                context_id: context_id.clone(),
                direction: Direction::Outgoing,
                peer: Some(receiver.into()),
                state: TaskState::Working,
                message: message.clone(),
                priority,
                response_expected: true,
                sender_task_id: None,
                in_reply_to: None,
                peer_task_id: Some(task_id.clone()),
                message_in: None,
            });
        }
        send.push(Event::TaskCreated {
            task_id: task_id.clone(),
            owner: Some(receiver.into()),
            context_id,
            direction: Direction::Incoming,
            peer: Some(sender.into()),
            state: TaskState::Submitted,
            message,
            priority,
            response_expected: reply,
            sender_task_id: sender_task_id.clone(),
            in_reply_to: None,
            peer_task_id: None,
            message_in: None,
        });
        send.push(Event::MessageSent {
            task_id: task_id.clone(),
            from: Some(sender.into()),
            to: receiver.into(),
            priority,
            response_expected: reply,
            sender_task_id: sender_task_id.clone(),
            in_reply_to: None,
            text,
            parts: Vec::new(),
            idempotency_key: None,
            by_user: false,
            unverified_sender: None,
            sender_endpoint: None,
            external_task_id: None,
        });
        send.push(Event::TicketIssued {
            agent_id: receiver.into(),
            task_id: task_id.clone(),
            priority,
            from: Some(sender.into()),
            display_task_id: sender_task_id.clone().unwrap_or_else(|| task_id.clone()),
            response_expected: reply,
            turn: 0,
        });
        let written = appender.append(Some(sender), send)?;
        let ticket = written.last().map_or(0, |envelope| envelope.seq);
        if !acked {
            return Ok(());
        }
        appender.append(
            Some(receiver),
            vec![
                Event::TicketInjected { agent_id: receiver.into(), ticket, priority, how: Some(Delivery::Typed) },
                Event::TaskStateChanged {
                    task_id: task_id.clone(),
                    state: TaskState::Working,
                    artifacts: Vec::new(),
                    error: None,
                    reply_of: None,
                    as_message: false,
                },
            ],
        )?;
        let Some(sender_task_id) = sender_task_id else { return Ok(()) };

        let status = |status| Event::AgentStatusChanged { agent_id: receiver.into(), status, note: None };
        appender.append(Some(receiver), vec![status(AgentStatus::Processing)])?;
        let completed = |task_id: &str| Event::TaskStateChanged {
            task_id: task_id.into(),
            state: TaskState::Completed,
            artifacts: vec![Artifact::text(REPLY_TEXT)],
            error: None,
            reply_of: None,
            as_message: false,
        };
        let written = appender.append(
            Some(receiver),
            vec![
                Event::ReplyPosted {
                    task_id: task_id.clone(),
                    sender_task_id: Some(sender_task_id.clone()),
                    from: receiver.into(),
                    to: Some(sender.into()),
                    text: REPLY_TEXT.into(),
                    idempotency_key: None,
                },
                completed(&sender_task_id),
                completed(&task_id),
                Event::ReverseTicketIssued {
                    agent_id: sender.into(),
                    task_id: sender_task_id.clone(),
                    from: receiver.into(),
                    priority,
                },
            ],
        )?;
        let reverse_ticket = written.last().map_or(0, |envelope| envelope.seq);
        appender.append(
            Some(sender),
            vec![Event::TicketInjected {
                agent_id: sender.into(),
                ticket: reverse_ticket,
                priority,
                how: Some(Delivery::Typed),
            }],
        )?;
        appender.append(Some(receiver), vec![status(AgentStatus::Ready)])?;
        Ok(())
    }
}
