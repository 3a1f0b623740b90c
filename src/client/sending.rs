//! Sending a message and waiting for its reply, with the rules every sender follows: the CLI's
//! `synapse send` and the MCP server's `send` tool go through here, so both retry and wait
//! alike.
//!
//! Invariants: a send is retried only when the connection closed under it or its answer did
//! not come in time, and always with the same idempotency key, so a send the broker had already
//! decided is answered, never made twice; one that still fails says it may have been sent, and
//! under which key. Waiting never changes the task: a wait that runs out leaves it open.

use super::{Client, ClientError};
use crate::api::{ReplyRequest, SendAnswer, SendRequest};
use crate::config::Paths;
use crate::event::{TaskState, short_id};
use std::time::{Duration, Instant};

/// How many times a send is tried when the connection breaks under the request or its answer
/// does not come in time.
const SEND_ATTEMPTS: u32 = 3;

/// A send whose request reached the broker, or may have, and whose answer never came: the
/// broker may have made it. Sent again with the same key, it is made at most once.
#[derive(Debug, thiserror::Error)]
#[error("{cause:#}; the message may have been sent")]
pub struct SendUncertain {
    pub key: String,
    /// Why the last try failed (in the message already, so not a `source`: printed once).
    pub cause: anyhow::Error,
}

/// How many times a wait for a reply goes on over a new connection after its own broke.
const WAIT_RECONNECTS: u32 = 3;

/// The longest single wait request (the broker answers at the latest then, and the wait is
/// asked again until the limit, if any).
const UNLIMITED_WAIT_SLICE: Duration = Duration::from_secs(600);

/// Why waiting for a reply gave none.
#[derive(Debug, thiserror::Error)]
pub enum ReplyWaitError {
    /// The limit passed; the task stays open and the reply may still come.
    #[error("no reply within {seconds} s; task {task_id} ({}) stays open", short_id(task_id))]
    TimedOut { task_id: String, seconds: u64 },
    /// The task was canceled (by either side, or the user): no reply will come.
    #[error("task {} was canceled{}: no reply will come", short_id(task_id), reason.as_deref().map(|why| format!(" ({why})")).unwrap_or_default())]
    Canceled { task_id: String, reason: Option<String> },
    /// The task became final (failed, ...) without a reply text.
    #[error("task {} ended {state} without a reply", short_id(task_id))]
    EndedWithoutReply { task_id: String, state: TaskState },
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The wait's connection broke and no broker could be reached again.
    #[error("the connection broke while waiting for the reply: {0:#}")]
    Reconnect(anyhow::Error),
}

/// A request made at most once by its idempotency key: a send or a reply.
pub trait Keyed: Clone {
    fn key(&mut self) -> &mut Option<String>;
    /// Makes the request once on `client`.
    fn post(&self, client: &mut Client) -> impl Future<Output = Result<SendAnswer, ClientError>>;
}

impl Keyed for SendRequest {
    fn key(&mut self) -> &mut Option<String> {
        &mut self.idempotency_key
    }

    fn post(&self, client: &mut Client) -> impl Future<Output = Result<SendAnswer, ClientError>> {
        client.send(self)
    }
}

impl Keyed for ReplyRequest {
    fn key(&mut self) -> &mut Option<String> {
        &mut self.idempotency_key
    }

    fn post(&self, client: &mut Client) -> impl Future<Output = Result<SendAnswer, ClientError>> {
        client.reply(self)
    }
}

impl Client {
    /// `POST /send` or `POST /reply`, tried again (up to [`SEND_ATTEMPTS`] times, on a new
    /// connection) when the connection closed under it or its answer did not come within the
    /// call limit. A request without an idempotency key gets one first. The new connection
    /// starts a broker as the first one did: `respect_stop` never starts one the user stopped on
    /// purpose ([`Client::connect_unless_stopped`]). When the last try fails too,
    /// [`SendUncertain`].
    pub async fn send_retrying<R: Keyed>(
        &mut self,
        paths: &Paths,
        request: &R,
        respect_stop: bool,
    ) -> anyhow::Result<SendAnswer> {
        let mut request = request.clone();
        let key = request.key().get_or_insert_with(crate::ids::new_id).clone();
        let uncertain = |cause: anyhow::Error| SendUncertain { key: key.clone(), cause };
        let mut attempt = 1;
        let mut timed_out = false;
        loop {
            match request.post(self).await {
                Ok(answer) => return Ok(answer),
                // The request may have been decided before the connection broke or while its
                // answer was late: the same key makes the retry answer that send instead of
                // making a second one. A late answer is waited for once more only: a broker
                // that is merely slow gets a second call limit, a stuck one is not waited on
                // three times over.
                Err(error) if error.is_connection_closed() || matches!(error, ClientError::Timeout(_)) => {
                    let late = matches!(error, ClientError::Timeout(_));
                    if attempt >= SEND_ATTEMPTS || (late && timed_out) {
                        return Err(uncertain(error.into()).into());
                    }
                    timed_out |= late;
                    attempt += 1;
                    if late {
                        tracing::info!("no answer to the send yet: trying again with idempotency key {key}");
                    } else {
                        tracing::debug!("send: {error:#}; trying again with idempotency key {key}");
                    }
                    self.reconnect(paths, respect_stop).await.map_err(uncertain)?;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// A new connection in place of this one, made under the `respect_stop` rule and keeping
    /// the secret this one carried.
    async fn reconnect(&mut self, paths: &Paths, respect_stop: bool) -> anyhow::Result<()> {
        let secret = self.secret.take();
        *self = Client::connect_with(paths, true, respect_stop).await?;
        if let Some(secret) = secret {
            self.set_secret(secret);
        }
        Ok(())
    }

    /// Blocks until the task is final (the broker answers when the log says so) and gives the
    /// reply's text. `seconds` = 0: no limit; otherwise they count from `started` (the send's
    /// start: a send that took long, retried, leaves less to wait, so that the whole call keeps
    /// within what its caller was promised, a CLI's tool timeout for one). A wait whose
    /// connection breaks (the broker restarting) goes on over a new one, made under the
    /// `respect_stop` rule as in [`Client::send_retrying`]: waiting changes nothing, and the
    /// reply may still come.
    pub async fn wait_for_reply(
        &mut self,
        paths: &Paths,
        respect_stop: bool,
        task_id: &str,
        seconds: u64,
        started: Instant,
    ) -> Result<String, ReplyWaitError> {
        let limit = (seconds > 0).then(|| Duration::from_secs(seconds));
        let mut reconnects = 0;
        loop {
            // One wait request lasts a slice at most: a limit of years (`--wait 18446744073709551615`)
            // overflowed the request's milliseconds, after the message was sent.
            let slice = match limit {
                Some(limit) => limit.saturating_sub(started.elapsed()).min(UNLIMITED_WAIT_SLICE),
                None => UNLIMITED_WAIT_SLICE,
            };
            let answer = match self.wait_task(task_id, slice).await {
                Ok(answer) => answer,
                Err(error @ ClientError::Unreachable { .. }) if reconnects < WAIT_RECONNECTS => {
                    reconnects += 1;
                    tracing::info!("waiting for the reply: {error:#}; waiting again on a new connection");
                    self.reconnect(paths, respect_stop).await.map_err(ReplyWaitError::Reconnect)?;
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            if !answer.timed_out {
                let state = answer.task.status;
                return match answer.reply {
                    Some(reply) if state == TaskState::Completed => Ok(reply),
                    _ if state == TaskState::Canceled => {
                        Err(ReplyWaitError::Canceled { task_id: task_id.to_string(), reason: answer.task.error })
                    }
                    _ => Err(ReplyWaitError::EndedWithoutReply { task_id: task_id.to_string(), state }),
                };
            }
            if limit.is_some_and(|limit| started.elapsed() >= limit) {
                return Err(ReplyWaitError::TimedOut { task_id: task_id.to_string(), seconds });
            }
        }
    }
}
