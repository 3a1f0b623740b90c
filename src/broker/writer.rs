//! The writer thread: the only code that writes the store.
//!
//! Group commit: it takes every queued job, decides each in order inside one transaction (each
//! sees the effects of those before it), commits once, durably (the write-ahead log's fsync, or
//! redb's own for a store without that log: [`Store::transact`]), and only then answers every
//! caller and moves the head (which wakes the tails). A batch whose storage fails answers every
//! caller with an error and acknowledges nothing.
//!
//! Recovery: after a failed commit redb refuses the database ("Previous I/O error occurred"),
//! reads included. The writer then reopens it ([`Store::reopen`]: redb repairs the file from
//! the last commit), trying again with backoff until it opens; jobs that arrive meanwhile are
//! refused with the reason. [`WriteHealth`] holds the failure from the failed commit until a
//! commit stores events again; `/broker/health` reports it.
//!
//! The job queue is an unbounded channel: lossless (nothing is dropped); callers wait for their
//! answer, so the queue is bounded in practice by the number of callers waiting.
//!
//! Gathering: the callers a commit answered usually send again within microseconds, but not
//! all before the writer looks. So when fewer jobs are queued than the last batch held, it
//! waits up to [`GATHER`] (a fraction of one commit) for the rest, instead of committing a
//! small batch and making the others wait a whole commit. Only under load (a last batch of
//! [`GATHER_FROM`] jobs or more): a lone caller, or a conversation where one step follows
//! another, never waits.

use super::command::{self, Command, CommandError, Context, DecideError, Liveness, LivenessNeeded, Outcome};
use crate::api::WriteFailure;
use crate::store::{RebuildReport, Store, StoreError, VerifyReport};
use crate::time::now_ms;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// Most jobs decided in one transaction.
const MAX_BATCH_JOBS: usize = 4096;
/// Room for this many jobs is kept between batches; a burst's larger batch gives the rest back.
const KEPT_BATCH_ROOM: usize = 256;
/// Longest wait for the callers of the last batch to send again (see the module's notes).
const GATHER: Duration = Duration::from_micros(200);
/// Smallest last batch that makes the writer gather.
const GATHER_FROM: usize = 4;
/// How long the writer waits for more work before it makes the batches that only the
/// write-ahead log holds durable in the database too (`Store::checkpoint`).
const IDLE_CHECKPOINT: Duration = Duration::from_millis(50);
/// First pause between attempts to reopen the database, doubled after each failure.
const REOPEN_BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// Longest pause between attempts to reopen the database.
const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(5);

enum Job {
    Command {
        command: Box<Command>,
        answer: oneshot::Sender<Result<Outcome, CommandError>>,
    },
    Rebuild {
        answer: oneshot::Sender<Result<RebuildReport, CommandError>>,
    },
    Verify {
        answer: oneshot::Sender<Result<VerifyReport, CommandError>>,
    },
    /// Another writer of the database (the history indexer) saw the storage fail: reopen it.
    StorageFailed {
        reason: String,
    },
    /// Another writer (the history indexer) committed without an fsync: the writer, which may
    /// be asleep with nothing pending, looks again whether a checkpoint is due when it is idle.
    Wake,
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct WriterHandle {
    jobs: mpsc::Sender<Job>,
}

fn unavailable(error: impl std::fmt::Display) -> CommandError {
    CommandError::Unavailable { message: format!("the broker could not store this: {error}") }
}

const STOPPED: &str = "the broker is shutting down";

impl WriterHandle {
    /// Starts the writer thread over `store`. `head` is moved after every commit.
    pub fn start(
        store: Arc<Store>,
        head: watch::Sender<u64>,
        recent: Arc<super::tail::RecentEvents>,
        health: Arc<WriteHealth>,
    ) -> std::io::Result<(WriterHandle, std::thread::JoinHandle<()>)> {
        let (jobs, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new().name("synapse-writer".into()).spawn(move || {
            let mut writer = Writer { store, head, recent, health, recovery: None };
            run(&mut writer, &receiver);
        })?;
        Ok((WriterHandle { jobs }, thread))
    }

    /// Submits a command and waits until it is durable (or refused).
    pub async fn submit(&self, command: Command) -> Result<Outcome, CommandError> {
        let (answer, receiver) = oneshot::channel();
        self.jobs
            .send(Job::Command { command: Box::new(command), answer })
            .map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?;
        receiver.await.map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?
    }

    /// Same as [`submit`](Self::submit) for threads outside the async runtime.
    pub fn submit_blocking(&self, command: Command) -> Result<Outcome, CommandError> {
        let (answer, receiver) = oneshot::channel();
        self.jobs
            .send(Job::Command { command: Box::new(command), answer })
            .map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?;
        receiver.blocking_recv().map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?
    }

    pub async fn rebuild(&self) -> Result<RebuildReport, CommandError> {
        let (answer, receiver) = oneshot::channel();
        self.jobs.send(Job::Rebuild { answer }).map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?;
        receiver.await.map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?
    }

    /// Tells the writer that a write outside it (the history indexer's) failed on the storage:
    /// the writer reopens the database, as after a failed batch.
    pub fn report_storage_failure(&self, reason: String) {
        let _ = self.jobs.send(Job::StorageFailed { reason });
    }

    /// Tells the writer that the history indexer committed a step without an fsync: its idle
    /// checkpoint makes the step durable.
    pub fn index_stepped(&self) {
        let _ = self.jobs.send(Job::Wake);
    }

    pub async fn verify(&self) -> Result<VerifyReport, CommandError> {
        let (answer, receiver) = oneshot::channel();
        self.jobs.send(Job::Verify { answer }).map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?;
        receiver.await.map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?
    }
}

type Pending = (Command, oneshot::Sender<Result<Outcome, CommandError>>);

/// The writer's own state: what it writes to, whom it tells, and whether the database must be
/// reopened before the next batch.
struct Writer {
    store: Arc<Store>,
    head: watch::Sender<u64>,
    recent: Arc<super::tail::RecentEvents>,
    health: Arc<WriteHealth>,
    /// Set when the storage failed: redb refuses the database until it is reopened.
    recovery: Option<Recovery>,
}

/// A reopen that has not succeeded yet.
struct Recovery {
    reason: String,
    next_attempt: Instant,
    backoff: Duration,
}

fn run(writer: &mut Writer, receiver: &mpsc::Receiver<Job>) {
    let mut batch: Vec<Pending> = Vec::new();
    let mut last_batch = 0;
    loop {
        if writer.recovery.is_some() {
            // Jobs that arrive before the database is back are refused at once (callers hear
            // why), not held: a reopen may take a while when the disk is really broken.
            match writer.recover(receiver) {
                Recovering::Reopened | Recovering::Pending => {}
                Recovering::Arrived(job) => writer.refuse(job),
                Recovering::Stopped => return,
            }
            continue;
        }
        let job = if writer.store.checkpoint_pending() {
            match receiver.recv_timeout(IDLE_CHECKPOINT) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    writer.checkpoint();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        } else {
            let Ok(job) = receiver.recv() else { return };
            job
        };
        writer.take(job, &mut batch);
        while batch.len() < MAX_BATCH_JOBS {
            let Ok(job) = receiver.try_recv() else { break };
            writer.take(job, &mut batch);
        }
        let deadline = Instant::now() + GATHER;
        while last_batch >= GATHER_FROM && batch.len() < last_batch.min(MAX_BATCH_JOBS) {
            let Ok(job) = receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) else { break };
            writer.take(job, &mut batch);
        }
        last_batch = batch.len();
        writer.commit_batch(&mut batch);
    }
}

/// What one step of recovery came to.
enum Recovering {
    Reopened,
    /// A job arrived before the database was back.
    Arrived(Job),
    /// Nothing yet: the next attempt is due.
    Pending,
    /// Every handle has gone (the broker stopped).
    Stopped,
}

impl Writer {
    fn take(&mut self, job: Job, batch: &mut Vec<Pending>) {
        match job {
            Job::Command { command, answer } => batch.push((*command, answer)),
            Job::Rebuild { answer } => {
                self.commit_batch(batch);
                if self.recovery.is_some() {
                    let _ = answer.send(Err(self.refusal()));
                    return;
                }
                let result = catch_storage_panic(|| self.store.rebuild());
                match &result {
                    Ok(_) => self.health.succeeded(),
                    Err(error) => self.storage_failed(error),
                }
                let _ = answer.send(result.map_err(unavailable));
            }
            Job::Verify { answer } => {
                self.commit_batch(batch);
                if self.recovery.is_some() {
                    let _ = answer.send(Err(self.refusal()));
                    return;
                }
                let result = catch_storage_panic(|| self.store.verify());
                if let Err(error) = &result
                    && needs_reopen(error)
                {
                    self.start_recovery(error.to_string());
                }
                let _ = answer.send(result.map_err(unavailable));
            }
            Job::StorageFailed { reason } => {
                if self.recovery.is_none() {
                    self.start_recovery(reason);
                }
            }
            Job::Wake => {}
        }
    }

    /// Makes what only the write-ahead log holds durable in the database; a failure is a
    /// storage failure like a failed batch (nothing is lost: the log still holds it all).
    fn checkpoint(&mut self) {
        if let Err(error) = catch_storage_panic(|| self.store.checkpoint()) {
            tracing::error!("checkpoint failed: {error}");
            self.storage_failed(&error);
        }
    }

    /// Answers a job that arrived while the database is being reopened.
    fn refuse(&mut self, job: Job) {
        match job {
            Job::Command { answer, .. } => {
                let _ = answer.send(Err(self.refusal()));
            }
            Job::Rebuild { answer } => {
                let _ = answer.send(Err(self.refusal()));
            }
            Job::Verify { answer } => {
                let _ = answer.send(Err(self.refusal()));
            }
            Job::StorageFailed { .. } | Job::Wake => {}
        }
    }

    fn refusal(&self) -> CommandError {
        let reason = self.recovery.as_ref().map_or("", |recovery| recovery.reason.as_str());
        CommandError::Unavailable {
            message: format!(
                "not stored: the broker is reopening its database after a storage error ({reason}); nothing was written. Try again in a moment"
            ),
        }
    }

    fn start_recovery(&mut self, reason: String) {
        tracing::warn!("reopening the database after a storage error: {reason}");
        self.recovery = Some(Recovery { reason, next_attempt: Instant::now(), backoff: REOPEN_BACKOFF_FIRST });
    }

    /// Tries to reopen when an attempt is due; otherwise waits for the next job until then.
    fn recover(&mut self, receiver: &mpsc::Receiver<Job>) -> Recovering {
        let Some(recovery) = self.recovery.as_mut() else { return Recovering::Reopened };
        let now = Instant::now();
        if now >= recovery.next_attempt {
            match catch_storage_panic(|| self.store.reopen(&recovery.reason)) {
                Ok(()) => {
                    tracing::info!("database reopened; writes are tried again");
                    self.recovery = None;
                    return Recovering::Reopened;
                }
                Err(error) => {
                    tracing::warn!("cannot reopen the database yet ({error}); next try in {:?}", recovery.backoff);
                    recovery.reason = format!("reopening failed: {error}");
                    recovery.next_attempt = now + recovery.backoff;
                    recovery.backoff = (recovery.backoff * 2).min(REOPEN_BACKOFF_MAX);
                }
            }
        }
        let wait = recovery.next_attempt.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(wait) {
            Ok(job) => Recovering::Arrived(job),
            Err(mpsc::RecvTimeoutError::Timeout) => Recovering::Pending,
            Err(mpsc::RecvTimeoutError::Disconnected) => Recovering::Stopped,
        }
    }

    /// Records a failed write: the health check reports it, and an I/O failure makes the
    /// writer reopen the database before the next batch.
    fn storage_failed(&mut self, error: &StoreError) {
        self.health.failed(error.to_string());
        if needs_reopen(error) {
            self.start_recovery(error.to_string());
        }
    }

    fn commit_batch(&mut self, batch: &mut Vec<Pending>) {
        if batch.is_empty() {
            return;
        }
        // The batch's vector is drained, not taken: its room serves the next batch (a vector
        // grown from empty for every batch cost the allocator's slow path under load).
        let jobs = batch;
        let mut outcomes: Vec<Result<Outcome, CommandError>> = Vec::with_capacity(jobs.len());
        let mut appended = Vec::new();
        // redb asserts in some paths after a failed write (an abort after a failed allocation):
        // a panic there is a storage failure like the others, not the end of the writer.
        let result = catch_storage_panic(|| {
            self.store.transact(now_ms(), |appender| {
                // The process table is read here, once for the whole batch, so that decide reads
                // nothing but the projections and the command.
                let liveness = look_up_liveness(appender.view(), jobs)?;
                let context = Context { now_ms: appender.time_ms(), liveness: &liveness };
                for (command, _) in jobs.iter() {
                    match command::decide(appender.view(), command, &context) {
                        Ok(decision) => {
                            let written = appender.append(decision.actor.as_deref(), decision.events)?;
                            let last_seq = written.last().map_or(appender.next_seq() - 1, |envelope| envelope.seq);
                            appended.extend(written);
                            outcomes.push(Ok(command::complete(appender.view(), decision.answer, last_seq)?));
                        }
                        Err(DecideError::Rejected(error)) => outcomes.push(Err(error)),
                        Err(DecideError::Storage(error)) => return Err(error),
                    }
                }
                Ok(appender.next_seq() - 1)
            })
        });
        match result {
            Ok(new_head) => {
                // A commit that stored events proves the storage writes again (one that only
                // refused commands may have written nothing).
                if !appended.is_empty() {
                    self.health.succeeded();
                }
                // Into the tails' ring before anyone hears of them (an answered caller may read the
                // log at once) and before the head moves (woken tails find them there).
                self.recent.push(appended);
                // The head moves before the callers hear: the broker's Unix socket is served on
                // one thread, where the tasks woken first run first, and the tails that deliver
                // to the agents (what they wait for) then go before the answers.
                self.head.send_if_modified(|current| {
                    let moved = *current != new_head;
                    *current = new_head;
                    moved
                });
                for ((_, answer), outcome) in jobs.drain(..).zip(outcomes) {
                    let _ = answer.send(outcome);
                }
            }
            Err(error) => {
                // Nothing of this batch is in the log (the transaction was not committed), so
                // every caller hears it failed; none is told it was stored.
                tracing::error!("batch of {} commands not stored: {error}", jobs.len());
                // Recorded before the callers hear: one that asks the health check next sees it.
                self.storage_failed(&error);
                let message = describe_storage_failure(&error);
                for (_, answer) in jobs.drain(..) {
                    let _ = answer.send(Err(CommandError::Unavailable { message: message.clone() }));
                }
            }
        }
        jobs.shrink_to(KEPT_BATCH_ROOM);
    }
}

/// The liveness of every process a command of the batch may ask about: the agents it names
/// (or all agents, when one scans them) and the pids registering in the batch (an agent
/// registered by an earlier command of the batch has no row yet when this is read).
fn look_up_liveness(view: &crate::store::Projections<'_>, jobs: &[Pending]) -> Result<Liveness, StoreError> {
    let mut pids: Vec<u32> = Vec::new();
    let mut all_agents = false;
    for (command, _) in jobs {
        match command.liveness_needed(view)? {
            LivenessNeeded::None => {}
            LivenessNeeded::Pids(needed) => pids.extend(needed),
            LivenessNeeded::AllAgents => all_agents = true,
        }
        pids.extend(command.registering_pid());
    }
    if all_agents {
        pids.extend(view.agents()?.iter().map(|agent| agent.pid));
    }
    Ok(Liveness::look_up(pids))
}

/// Runs storage work, turning a panic inside redb into an I/O failure (the writer then reopens
/// the database).
fn catch_storage_panic<T>(work: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|text| (*text).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".into());
        Err(StoreError::Io(format!("the storage engine failed ({what})")))
    })
}

/// Does this error leave redb's database unusable until it is reopened?
fn needs_reopen(error: &StoreError) -> bool {
    error.refuses_until_reopened() || matches!(error, StoreError::Reopening(_))
}

fn describe_storage_failure(error: &StoreError) -> String {
    format!("not stored: {error}")
}

/// Whether the broker can store: the failure of the last write, until a write succeeds.
/// Shared by the writer (which sets it) and the health check (which reports it).
#[derive(Debug, Default)]
pub struct WriteHealth {
    failure: std::sync::Mutex<Option<WriteFailure>>,
}

impl WriteHealth {
    /// The current failure, or `None` when the last write succeeded.
    pub fn failure(&self) -> Option<WriteFailure> {
        self.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn failed(&self, reason: String) {
        let mut failure = self.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let since_ms = failure.as_ref().map_or_else(now_ms, |earlier| earlier.since_ms);
        *failure = Some(WriteFailure { reason, since_ms });
    }

    fn succeeded(&self) {
        *self.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}
