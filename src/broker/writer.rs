//! The writer thread: the only code that writes the store.
//!
//! Group commit: it takes every queued job, decides each in order inside one transaction (each
//! sees the effects of those before it), commits once with `Durability::Immediate`, and only
//! then answers every caller and moves the head (which wakes the tails). A batch whose storage
//! fails answers every caller with an error and acknowledges nothing.
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

use super::command::{self, Command, CommandError, DecideError, Outcome};
use crate::store::{RebuildReport, Store, StoreError, VerifyReport};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{oneshot, watch};

/// Most jobs decided in one transaction.
const MAX_BATCH_JOBS: usize = 4096;
/// Longest wait for the callers of the last batch to send again (see the module's notes).
const GATHER: Duration = Duration::from_micros(200);
/// Smallest last batch that makes the writer gather.
const GATHER_FROM: usize = 4;

enum Job {
    Command { command: Box<Command>, answer: oneshot::Sender<Result<Outcome, CommandError>> },
    Rebuild { answer: oneshot::Sender<Result<RebuildReport, CommandError>> },
    Verify { answer: oneshot::Sender<Result<VerifyReport, CommandError>> },
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct WriterHandle {
    jobs: mpsc::Sender<Job>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
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
    ) -> std::io::Result<(WriterHandle, std::thread::JoinHandle<()>)> {
        let (jobs, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("synapse-writer".into())
            .spawn(move || run(store, receiver, head, recent))?;
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

    pub async fn verify(&self) -> Result<VerifyReport, CommandError> {
        let (answer, receiver) = oneshot::channel();
        self.jobs.send(Job::Verify { answer }).map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?;
        receiver.await.map_err(|_| CommandError::Unavailable { message: STOPPED.into() })?
    }
}

type Pending = (Command, oneshot::Sender<Result<Outcome, CommandError>>);

fn run(
    store: Arc<Store>,
    receiver: mpsc::Receiver<Job>,
    head: watch::Sender<u64>,
    recent: Arc<super::tail::RecentEvents>,
) {
    let mut batch: Vec<Pending> = Vec::new();
    let mut last_batch = 0;
    let take = |job: Job, batch: &mut Vec<Pending>| match job {
        Job::Command { command, answer } => batch.push((*command, answer)),
        Job::Rebuild { answer } => {
            commit_batch(&store, batch, &head, &recent);
            let _ = answer.send(store.rebuild().map_err(unavailable));
        }
        Job::Verify { answer } => {
            commit_batch(&store, batch, &head, &recent);
            let _ = answer.send(store.verify().map_err(unavailable));
        }
    };
    while let Ok(job) = receiver.recv() {
        take(job, &mut batch);
        while batch.len() < MAX_BATCH_JOBS {
            let Ok(job) = receiver.try_recv() else { break };
            take(job, &mut batch);
        }
        let deadline = Instant::now() + GATHER;
        while last_batch >= GATHER_FROM && batch.len() < last_batch.min(MAX_BATCH_JOBS) {
            let Ok(job) = receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) else { break };
            take(job, &mut batch);
        }
        last_batch = batch.len();
        commit_batch(&store, &mut batch, &head, &recent);
    }
}

fn commit_batch(
    store: &Store,
    batch: &mut Vec<Pending>,
    head: &watch::Sender<u64>,
    recent: &super::tail::RecentEvents,
) {
    if batch.is_empty() {
        return;
    }
    let jobs = std::mem::take(batch);
    let mut outcomes: Vec<Result<Outcome, CommandError>> = Vec::with_capacity(jobs.len());
    let mut appended = Vec::new();
    let result = store.transact(now_ms(), |appender| {
        for (command, _) in &jobs {
            match command::decide(appender.view(), command, appender.time_ms()) {
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
    });
    match result {
        Ok(new_head) => {
            // Into the tails' ring before anyone hears of them (an answered caller may read the
            // log at once) and before the head moves (woken tails find them there).
            recent.push(appended);
            for ((_, answer), outcome) in jobs.into_iter().zip(outcomes) {
                let _ = answer.send(outcome);
            }
            head.send_if_modified(|current| {
                let moved = *current != new_head;
                *current = new_head;
                moved
            });
        }
        Err(error) => {
            tracing::error!("batch of {} commands not stored: {error}", jobs.len());
            let message = describe_storage_failure(&error);
            for (_, answer) in jobs {
                let _ = answer.send(Err(CommandError::Unavailable { message: message.clone() }));
            }
        }
    }
}

fn describe_storage_failure(error: &StoreError) -> String {
    format!("not stored: {error}")
}
