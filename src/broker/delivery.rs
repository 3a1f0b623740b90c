//! The delivery worker: follows the log into the webhook outbox and the external agents' list,
//! and posts the webhook deliveries that are due (see [`super::webhooks`] for the outbox, the
//! secrets and the retry rule).
//!
//! Every attempt's outcome goes back into the log through the writer before the outbox forgets
//! it is in flight, so a restart resumes where delivery stopped. Targets are reached only
//! through [`super::outbound`] with the broker's policy at the time of the attempt.
//!
//! Both projections live in memory. So that a start need not replay the whole log into them
//! (seconds at ten million events, while requests that read them wait), the worker saves them
//! in the store every [`SNAPSHOT_EVERY`] events, with the event they reflect, and a start
//! replays only the log after that.

use super::BrokerState;
use super::command::Command;
use super::outbound;
use super::tail;
use super::webhooks::{self, Delivery, Outbox, PostResult, SecretSource, WebhookCommand, Webhooks};
use crate::api::External;
use crate::store::Store;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// How long one delivery attempt may take once connected.
const ATTEMPT_TIMEOUT: Duration = outbound::READ_TIMEOUT;

/// Attempts under way at once, at most: each holds a socket for up to [`ATTEMPT_TIMEOUT`], and
/// a burst of events for many hooks (or receivers that hang) opened one per delivery, until
/// the broker ran out of file descriptors for its own clients. The others wait for a slot.
pub const MAX_ATTEMPTS_AT_ONCE: usize = 32;

/// The name of the worker's snapshot in the store.
const SNAPSHOT: &str = "delivery";
/// The snapshot's shape and meaning. A build that keeps other fields, or applies an event
/// differently, changes it: the snapshot of another build is set aside and the log replayed
/// from its first event.
///
/// 2 (2026-11-27): an unverified sender's message is kept for its reply only when it expects
/// one, and until its sender's task ends. 3 (2026-11-27): the push configs of the last 1,000
/// tasks that ended are kept, not all. 4 (2026-11-27): a push config set after its task ended
/// counts among those, and one that replaces another gives up the other's secret files; a
/// webhook registered again for its URL takes over the old registration's pending deliveries.
/// 5 (2026-11-27): a finished delivery keeps no body.
const SNAPSHOT_VERSION: u32 = 5;
/// Events applied between two snapshots, so a start replays at most about this many (about
/// 0.1 s: the whole log replayed at 1.75 s per million events in `scale`).
/// `SYNAPSE_DELIVERY_SNAPSHOT_EVERY` sets another number (the tests take one at
/// every change).
const SNAPSHOT_EVERY: u64 = 65_536;

/// How long the worker waits before it reads the log, or records an attempt, again after the
/// store refused.
const READ_RETRY: Duration = Duration::from_secs(1);

fn snapshot_every() -> u64 {
    std::env::var("SYNAPSE_DELIVERY_SNAPSHOT_EVERY")
        .ok()
        .and_then(|every| every.parse().ok())
        .filter(|every| *every > 0)
        .unwrap_or(SNAPSHOT_EVERY)
}

/// What a snapshot holds: both projections as of event `through` (the outbox borrowed when it
/// is written, owned when it is read).
#[derive(Serialize, Deserialize)]
struct Snapshot<O> {
    version: u32,
    through: u64,
    outbox: O,
    externals: Vec<External>,
}

/// A snapshot's version, read before the rest (whose shape depends on it).
#[derive(Deserialize)]
struct SnapshotVersion {
    version: u32,
}

/// A snapshot of both projections as of event `through`.
pub fn encode_snapshot(
    through: u64,
    outbox: &Outbox,
    externals: Vec<External>,
) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    // Named fields: a reader of another version still finds `version`.
    rmp_serde::to_vec_named(&Snapshot { version: SNAPSHOT_VERSION, through, outbox, externals })
}

/// The projections of `bytes` and the event they reflect, or why they cannot be used. `head`
/// is the log's last event: a snapshot past it belongs to another log.
pub fn decode_snapshot(bytes: &[u8], head: u64) -> Result<(u64, Outbox, Vec<External>), String> {
    let version = rmp_serde::from_slice::<SnapshotVersion>(bytes)
        .map_err(|error| format!("it cannot be read ({error})"))?
        .version;
    if version != SNAPSHOT_VERSION {
        return Err(format!("it is of version {version}, this build writes {SNAPSHOT_VERSION}"));
    }
    let snapshot: Snapshot<Outbox> =
        rmp_serde::from_slice(bytes).map_err(|error| format!("it cannot be read ({error})"))?;
    if snapshot.through > head {
        return Err(format!("it reflects event {}, past the log's last ({head})", snapshot.through));
    }
    Ok((snapshot.through, snapshot.outbox, snapshot.externals))
}

/// The last snapshot, if there is one this build can use; otherwise the log is replayed from
/// its first event (and why is logged).
fn load_snapshot(store: &Store) -> Option<(u64, Outbox, Vec<External>)> {
    let loaded = store.snapshot(SNAPSHOT).and_then(|bytes| Ok((bytes, store.head()?)));
    let (bytes, head) = match loaded {
        Ok((Some(bytes), head)) => (bytes, head),
        Ok((None, _)) => return None,
        Err(error) => {
            tracing::warn!("the delivery worker cannot read its snapshot ({error}); it replays the log");
            return None;
        }
    };
    match decode_snapshot(&bytes, head) {
        Ok((through, outbox, externals)) => {
            tracing::info!(
                "delivery worker: resumed from its snapshot at event {through} ({} events to replay)",
                head - through
            );
            Some((through, outbox, externals))
        }
        Err(why) => {
            tracing::warn!("delivery worker: its snapshot is set aside, {why}; it replays the log");
            None
        }
    }
}

/// The delivery worker: follows the log into the outbox (and the external agents' list) and
/// delivers what is due. `Webhooks::caught_up` waits for it.
pub fn spawn(state: Arc<BrokerState>) {
    tokio::spawn(async move {
        let store = state.store.clone();
        let restored = tokio::task::spawn_blocking(move || load_snapshot(&store)).await.ok().flatten();
        let mut cursor = 0;
        if let Some((through, outbox, externals)) = restored {
            *state.webhooks.lock() = outbox;
            state.externals.restore(externals);
            cursor = through;
        }
        let every = snapshot_every();
        let mut saved = cursor;
        let mut in_flight: HashSet<(String, u32)> = HashSet::new();
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_ATTEMPTS_AT_ONCE));
        let freed = Arc::new(tokio::sync::Notify::new());
        let mut shutdown = state.shutdown.subscribe();
        loop {
            loop {
                let batch = match tail::next_batch(&state, cursor, false).await {
                    Ok(batch) => batch,
                    Err(tail::TailEnd::Shutdown) => return,
                    // The store is being reopened after a failed write, say: the worker waits
                    // and reads again (ending would leave every request that waits for it
                    // waiting until the broker stops).
                    Err(tail::TailEnd::Failed(reason)) => {
                        tracing::warn!("delivery worker: cannot read the log ({reason}); reading again in a second");
                        tokio::select! {
                            _ = tokio::time::sleep(READ_RETRY) => continue,
                            _ = shutdown.wait_for(|stopping| *stopping) => return,
                        }
                    }
                };
                if batch.is_empty() {
                    break;
                }
                let mut outbox = state.webhooks.lock();
                for envelope in &batch {
                    outbox.apply(envelope);
                    // The same tail keeps the external agents' projection.
                    state.externals.apply(envelope);
                    cursor = envelope.seq;
                }
            }
            state.webhooks.cursor.send_replace(cursor);
            let now = crate::time::now_ms();
            let (due, unused) = {
                let mut outbox = state.webhooks.lock();
                in_flight.retain(|(id, attempts)| Webhooks::is_awaited(&outbox, id, *attempts));
                (outbox.due(now, &in_flight, slots.available_permits()), outbox.take_unused_secrets())
            };
            let undeleted: Vec<String> =
                unused.into_iter().filter(|reference| !webhooks::delete_secret(&state.paths.home, reference)).collect();
            if !undeleted.is_empty() {
                // Tried again at the next pass; a snapshot keeps them retired meanwhile.
                let mut outbox = state.webhooks.lock();
                for reference in undeleted {
                    outbox.retire_again(reference);
                }
            }
            let mut saturated = false;
            for (delivery, secret) in due {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    // The rest stay due: tried once an attempt under way ends.
                    saturated = true;
                    break;
                };
                in_flight.insert((delivery.delivery_id.clone(), delivery.attempts));
                let state = state.clone();
                let freed = freed.clone();
                let mut stop = state.shutdown.subscribe();
                tokio::spawn(async move {
                    // A stop ends the attempt where it is (its holder of the broker's state
                    // would keep the writer from ending until the receiver answered): not
                    // recorded, so the delivery is made again after the restart.
                    let result = tokio::select! {
                        result = post(&state, &delivery, secret.as_ref()) => result,
                        _ = stop.wait_for(|stopping| *stopping) => return,
                    };
                    let attempt = webhooks::record(&delivery, result, crate::time::now_ms());
                    record_attempt(&state, attempt).await;
                    drop(slot);
                    freed.notify_one();
                });
            }
            // Every slot taken: the deliveries still due (only as many were copied as could
            // start) wait for one.
            saturated |= slots.available_permits() == 0;
            // The next attempt due that is not under way (one under way is awaited by its
            // record, which moves the head). With every slot taken, the due ones wait for a
            // slot instead (their time has come: waiting for it would be a busy loop).
            let next = if saturated { None } else { state.webhooks.lock().next_due(&in_flight) };
            if cursor >= saved.saturating_add(every) {
                save_snapshot(&state, cursor).await;
                // After a failure too: the next try comes after as many events again.
                saved = cursor;
            }
            let wait = next.map(|at| Duration::from_millis(at.saturating_sub(now)));
            tokio::select! {
                moved = tail::wait_past(&state, cursor) => if !moved { return },
                _ = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600))), if wait.is_some() => {}
                _ = freed.notified(), if saturated => {}
                _ = shutdown.wait_for(|stopping| *stopping) => return,
            }
        }
    });
}

/// Stores the outcome of a delivery's attempt. The delivery stays under way (not posted again)
/// until its record is stored, so a refusal (the store being reopened, a full disk) is tried
/// again until the broker stops.
async fn record_attempt(state: &BrokerState, attempt: webhooks::Attempt) {
    let mut shutdown = state.shutdown.subscribe();
    loop {
        let command = Command::Webhook(WebhookCommand::RecordAttempt(attempt.clone()));
        let Err(error) = state.writer.submit(command).await else { return };
        tracing::warn!(
            "delivery worker: cannot record attempt {} of {} ({error}); trying again in a second",
            attempt.attempt,
            attempt.delivery_id
        );
        tokio::select! {
            _ = tokio::time::sleep(READ_RETRY) => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
    }
}

/// Saves both projections as of event `through` (the worker has applied the log up to it and
/// nothing else applies events).
async fn save_snapshot(state: &Arc<BrokerState>, through: u64) {
    let bytes = match encode_snapshot(through, &state.webhooks.lock(), state.externals.list()) {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::warn!("the delivery worker cannot encode its snapshot ({error})");
            return;
        }
    };
    let store = state.store.clone();
    match tokio::task::spawn_blocking(move || store.save_snapshot(SNAPSHOT, &bytes)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!("the delivery worker cannot save its snapshot ({error})");
            // A failed commit leaves the database refused until the writer reopens it.
            if error.refuses_until_reopened() {
                state.writer.report_storage_failure(format!("delivery snapshot: {error}"));
            }
        }
        Err(error) => {
            tracing::error!("the delivery worker's snapshot failed ({error})");
            // A panic inside redb may leave the database refused, as a failed commit does.
            if error.is_panic() {
                state.writer.report_storage_failure(format!("delivery snapshot: the save failed ({error})"));
            }
        }
    }
}

/// One POST; Ok(status, note) or Err(network error, refused target, unreadable secret).
async fn post(state: &BrokerState, delivery: &Delivery, secret: Option<&SecretSource>) -> PostResult {
    let mut headers =
        vec![("x-synapse-event", delivery.event.clone()), ("x-synapse-event-id", delivery.delivery_id.clone())];
    if let Some(source) = secret {
        let secret = webhooks::read_secret(&state.paths.home, source)?;
        let signature = crate::secret::to_hex(&webhooks::hmac_sha256(secret.as_bytes(), delivery.body.as_bytes()));
        headers.push(("x-synapse-signature", format!("sha256={signature}")));
    }
    // A push notification authenticates as its config says (A2A: the client's token, and the
    // credentials under their scheme).
    if let Some(push) = &delivery.push {
        let read = |reference: &String| {
            webhooks::read_secret(&state.paths.home, &SecretSource::File(reference.clone()))
                .map(|text| text.trim_end_matches(['\r', '\n']).to_string())
        };
        if let Some(token) = &push.token_ref {
            headers.push(("x-a2a-notification-token", read(token)?));
        }
        if let (Some(scheme), Some(credentials)) = (&push.scheme, &push.credentials_ref) {
            headers.push(("authorization", format!("{scheme} {}", read(credentials)?)));
        }
    }
    let answer = outbound::request(
        &state.outbound_policy(),
        hyper::Method::POST,
        &delivery.url,
        &headers,
        Some(delivery.body.clone().into_bytes()),
        ATTEMPT_TIMEOUT,
    )
    .await?;
    let note = answer.truncated.then(|| {
        format!(
            "only the start of the answer's body was read (it is longer than {} bytes, or its end was lost)",
            outbound::BODY_LIMIT_BYTES
        )
    });
    Ok((answer.status, note))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::externals::Externals;
    use crate::broker::webhooks::tests::{from_outside, state_changed};
    use crate::event::{Envelope, Event, TaskState};

    fn attempt(delivery_id: &str, webhook_id: &str, attempt: u32, status: u16, retry: bool) -> Event {
        Event::WebhookDeliveryAttempted {
            delivery_id: delivery_id.into(),
            webhook_id: webhook_id.into(),
            event: "task.completed".into(),
            attempt,
            status: Some(status),
            error: None,
            next_attempt_ms: retry.then_some(99_000),
        }
    }

    /// Every kind of event either projection applies, in an order that uses what came before.
    fn log() -> Vec<Envelope> {
        let events = vec![
            Event::WebhookRegistered {
                webhook_id: "aaaaaaaa-1".into(),
                url: "http://127.0.0.1:1/".into(),
                events: vec!["task.completed".into(), "task.replied".into()],
                secret: None,
                secret_ref: Some("0123abcd".into()),
            },
            Event::ExternalAgentAdded {
                alias: "far".into(),
                url: "http://127.0.0.1:2/".into(),
                name: "Far".into(),
                description: Some("an agent elsewhere".into()),
            },
            state_changed("t1", TaskState::Completed),
            attempt("aaaaaaaa-3", "aaaaaaaa-1", 1, 503, true),
            Event::PushConfigSet {
                task_id: "t2".into(),
                config_id: "c".into(),
                context_id: "ctx".into(),
                url: "http://127.0.0.1:3/".into(),
                token_ref: Some("0456".into()),
                auth_scheme: Some("Bearer".into()),
                credentials_ref: Some("0789".into()),
                task_ended: false,
            },
            state_changed("t2", TaskState::Working),
            from_outside("t3", Some("t3-sender")),
            Event::ExternalAgentAdded {
                alias: "near".into(),
                url: "http://127.0.0.1:4/".into(),
                name: "Near".into(),
                description: None,
            },
            state_changed("t1", TaskState::Completed),
            attempt("aaaaaaaa-3", "aaaaaaaa-1", 2, 200, false),
            from_outside("t4", Some("t4-sender")),
            Event::ReplyPosted {
                task_id: "t3".into(),
                sender_task_id: Some("t3-sender".into()),
                from: "bob".into(),
                to: None,
                text: "back to you".into(),
                idempotency_key: None,
            },
            state_changed("t2", TaskState::Completed),
            Event::PushConfigSet {
                task_id: "t2".into(),
                config_id: "late".into(),
                context_id: "ctx".into(),
                url: "http://127.0.0.1:3/".into(),
                token_ref: Some("0abc".into()),
                auth_scheme: None,
                credentials_ref: None,
                task_ended: true,
            },
            state_changed("t4-sender", TaskState::Canceled),
            Event::ExternalAgentRemoved { alias: "far".into() },
            attempt("aaaaaaaa-9", "aaaaaaaa-1", 1, 404, false),
            Event::PushConfigDeleted { task_id: "t2".into(), config_id: "c".into() },
            Event::WebhookRemoved { webhook_id: String::new(), url: "http://127.0.0.1:1/".into() },
        ];
        events
            .into_iter()
            .enumerate()
            .map(|(at, event)| Envelope { v: 1, seq: at as u64 + 1, time_ms: 5_000 + at as u64, actor: None, event })
            .collect()
    }

    /// Both projections, whole, as comparable values: the outbox's fields as its snapshot writes
    /// them, and as `Debug` shows them (every field, so that one the snapshot left out would
    /// differ here).
    fn view(outbox: &Outbox, externals: &Externals) -> (serde_json::Value, String, Vec<External>) {
        (serde_json::to_value(outbox).unwrap(), format!("{outbox:?}"), externals.list())
    }

    #[test]
    fn a_snapshot_taken_anywhere_and_the_log_after_it_give_what_the_whole_log_gives() {
        let log = log();
        let (mut outbox, externals) = (Outbox::default(), Externals::default());
        for envelope in &log {
            outbox.apply(envelope);
            externals.apply(envelope);
        }
        let whole = view(&outbox, &externals);
        assert_eq!(whole.2.len(), 1, "one external agent is left");

        // Each part of the outbox is held by some snapshot below.
        let mut held = std::collections::BTreeSet::new();
        let head = log.len() as u64;
        for at in 0..=log.len() {
            let (mut before, before_externals) = (Outbox::default(), Externals::default());
            for envelope in &log[..at] {
                before.apply(envelope);
                before_externals.apply(envelope);
            }
            let bytes = encode_snapshot(at as u64, &before, before_externals.list()).unwrap();
            let (through, mut outbox, list) = decode_snapshot(&bytes, head).unwrap();
            assert_eq!(through, at as u64);
            let externals = Externals::default();
            externals.restore(list);
            let restored = view(&outbox, &externals);
            assert_eq!(restored, view(&before, &before_externals), "the snapshot at {at} restores");
            for (part, value) in restored.0.as_object().unwrap() {
                if value.as_object().is_some_and(|map| !map.is_empty())
                    || value.as_array().is_some_and(|list| !list.is_empty())
                {
                    held.insert(part.clone());
                }
            }
            for envelope in &log[at..] {
                outbox.apply(envelope);
                externals.apply(envelope);
            }
            assert_eq!(view(&outbox, &externals), whole, "a snapshot at event {at}, then the rest");
        }
        let parts = [
            "ended_push",
            "ended_push_at",
            "external_replies",
            "external_reply_senders",
            "finished",
            "hooks",
            "pending",
            "push",
            "retired_secrets",
        ];
        assert_eq!(held, parts.into_iter().map(str::to_string).collect(), "the log exercises every part");
    }

    #[test]
    fn a_snapshot_of_another_version_past_the_log_or_unreadable_is_set_aside() {
        let bytes = encode_snapshot(7, &Outbox::default(), vec![]).unwrap();
        assert!(decode_snapshot(&bytes, 7).is_ok());
        let past = decode_snapshot(&bytes, 6).map(|_| ()).unwrap_err();
        assert!(past.contains("past the log's last (6)"), "{past}");

        #[derive(serde::Serialize)]
        struct Other {
            version: u32,
            through: u64,
        }
        let other = rmp_serde::to_vec_named(&Other { version: SNAPSHOT_VERSION + 1, through: 1 }).unwrap();
        let why = decode_snapshot(&other, 7).map(|_| ()).unwrap_err();
        assert!(why.contains(&format!("version {}", SNAPSHOT_VERSION + 1)), "{why}");
        for garbage in [&b""[..], b"\xff\x00garbage", &bytes[..bytes.len() / 2]] {
            let why = decode_snapshot(garbage, 7).map(|_| ()).unwrap_err();
            assert!(why.contains("cannot be read"), "{why}");
        }
    }
}
