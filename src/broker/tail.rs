//! Tails: read the log from a cursor, then follow new events, with no gap and no repeat.
//!
//! A tail reads from its cursor up to the head, then waits for the head to move past the cursor
//! and reads again. `watch::Receiver::wait_for` checks the current head before sleeping, so an
//! event committed between the read and the wait is never missed. Every tail also watches the
//! shutdown flag, so streams end when the broker stops.

use super::BrokerState;
use crate::event::Envelope;
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock, RwLock};

/// Newest events kept in memory for the tails (lossy by design: older ones are read from the
/// store).
const RECENT_EVENTS: usize = 8192;
/// ... and at most this many bytes of their texts (the newest batch, what one commit stored, is
/// kept whatever its size: the tails its commit wakes share it).
/// Counted in events alone, the ring held every long message of its last 8,192 events: in
/// `tools/bench storage` (five 16 MB messages and replies) the broker grew by about 100 MB per
/// exchange and kept it.
const RECENT_TEXT_BYTES: usize = 4 << 20;

/// An event as tails see it: shared by every tail, its JSON made once.
#[derive(Debug)]
pub struct TailEvent {
    pub envelope: Envelope,
    json: OnceLock<String>,
    sse: OnceLock<String>,
}

impl TailEvent {
    pub fn new(envelope: Envelope) -> TailEvent {
        TailEvent { envelope, json: OnceLock::new(), sse: OnceLock::new() }
    }

    /// The envelope as one JSON object (what `/events` sends), made on first use.
    pub fn json(&self) -> &str {
        self.json.get_or_init(|| serde_json::to_string(&self.envelope.to_json()).unwrap_or_default())
    }

    /// The event as one server-sent event (`id:` = sequence number), made on first use.
    pub fn sse_frame(&self) -> &str {
        self.sse.get_or_init(|| {
            format!("id: {}\nevent: {}\ndata: {}\n\n", self.envelope.seq, self.envelope.event.kind(), self.json())
        })
    }
}

impl std::ops::Deref for TailEvent {
    type Target = Envelope;
    fn deref(&self) -> &Envelope {
        &self.envelope
    }
}

/// The newest committed events, pushed by the writer before it moves the head, so that a
/// thousand tails woken by one commit share one copy instead of each reading the store.
#[derive(Default)]
pub struct RecentEvents {
    ring: RwLock<Ring>,
}

#[derive(Default)]
struct Ring {
    events: VecDeque<Arc<TailEvent>>,
    /// The sum of their [`Event::text_bytes`](crate::event::Event::text_bytes).
    text_bytes: usize,
}

impl RecentEvents {
    pub fn push(&self, envelopes: Vec<Envelope>) {
        // A send's long text is in two events of its batch (`task_created`, `message_sent`) and
        // the batch ends with a short one: keeping only the newest event let the long ones leave
        // at once, and every tail then read and encoded them from the store on its own.
        let batch = envelopes.len().max(1);
        let Ok(mut ring) = self.ring.write() else { return };
        let ring = &mut *ring;
        // The ring holds consecutive events only (`after` counts on it): events that do not
        // follow its last (a batch the reopened store took back from its write-ahead log was
        // never pushed) start it again, and the tails read the store before them.
        if let (Some(last), Some(first)) = (ring.events.back(), envelopes.first())
            && first.seq != last.seq + 1
        {
            ring.events.clear();
            ring.text_bytes = 0;
        }
        for envelope in envelopes {
            ring.text_bytes += envelope.event.text_bytes();
            ring.events.push_back(Arc::new(TailEvent::new(envelope)));
        }
        while ring.events.len() > RECENT_EVENTS || (ring.text_bytes > RECENT_TEXT_BYTES && ring.events.len() > batch) {
            let Some(oldest) = ring.events.pop_front() else { break };
            ring.text_bytes = ring.text_bytes.saturating_sub(oldest.event.text_bytes());
        }
    }

    /// Up to `limit` events after `cursor`, when the ring covers them (None: read the store).
    fn after(&self, cursor: u64, limit: usize) -> Option<Vec<Arc<TailEvent>>> {
        let ring = self.ring.read().ok()?;
        let ring = &ring.events;
        let first = ring.front()?.seq;
        if first > cursor.saturating_add(1) {
            return None;
        }
        let skip = usize::try_from(cursor.saturating_add(1).saturating_sub(first)).ok()?;
        Some(ring.iter().skip(skip).take(limit).cloned().collect())
    }
}

/// Events read per store access (and at most about [`RECENT_TEXT_BYTES`] of their texts).
const TAIL_BATCH: usize = 1024;

/// Which events a tail wants.
#[derive(Debug, Clone, Default)]
pub struct TailFilter {
    pub agent: Option<String>,
    pub kinds: Vec<String>,
}

impl TailFilter {
    pub fn matches(&self, envelope: &Envelope) -> bool {
        let agent_ok = match &self.agent {
            Some(agent) => {
                envelope.event.agents().contains(&agent.as_str()) || envelope.actor.as_deref() == Some(agent)
            }
            None => true,
        };
        agent_ok && (self.kinds.is_empty() || self.kinds.iter().any(|kind| kind == envelope.event.kind()))
    }
}

/// Why a tail ended.
#[derive(Debug)]
pub enum TailEnd {
    Shutdown,
    Failed(String),
}

/// Reads the next events after `cursor`; when `follow` is set and there are none, waits for
/// new ones. Returns an empty batch only when not following and caught up.
pub async fn next_batch(state: &BrokerState, cursor: u64, follow: bool) -> Result<Vec<Arc<TailEvent>>, TailEnd> {
    let mut head = state.head.clone();
    let mut shutdown = state.shutdown.subscribe();
    loop {
        if *shutdown.borrow() {
            return Err(TailEnd::Shutdown);
        }
        let events = match state.recent.after(cursor, TAIL_BATCH) {
            // Nothing in the ring after the cursor while the head is past it: events the ring
            // never got (the store took a batch back from its write-ahead log when it reopened),
            // read from the store, or a follower would go round without ever waiting.
            Some(events) if !events.is_empty() || *head.borrow() <= cursor => events,
            // On a blocking thread: the broker's Unix socket is served by one thread, and a
            // stream catching up with a long log (or filtering all of it, `?kind=` that matches
            // nothing) held every other command behind it for seconds.
            _ => {
                let store = state.store.clone();
                tokio::task::spawn_blocking(move || {
                    let read = store.read_after_within(cursor, TAIL_BATCH, RECENT_TEXT_BYTES);
                    crate::process::note_large_work();
                    read
                })
                .await
                .map_err(|_| TailEnd::Failed("the read of the log failed".to_string()))?
                .map_err(|error| TailEnd::Failed(error.to_string()))?
                .into_iter()
                .map(|envelope| Arc::new(TailEvent::new(envelope)))
                .collect()
            }
        };
        if !events.is_empty() || !follow {
            return Ok(events);
        }
        tokio::select! {
            moved = head.wait_for(|head| *head > cursor) => {
                if moved.is_err() {
                    return Err(TailEnd::Shutdown);
                }
            }
            _ = shutdown.wait_for(|stopping| *stopping) => return Err(TailEnd::Shutdown),
        }
    }
}

/// Waits until the head is past `cursor` (or shutdown); returns false on shutdown.
pub async fn wait_past(state: &BrokerState, cursor: u64) -> bool {
    let mut head = state.head.clone();
    let mut shutdown = state.shutdown.subscribe();
    if *shutdown.borrow() {
        return false;
    }
    tokio::select! {
        moved = head.wait_for(|head| *head > cursor) => moved.is_ok(),
        _ = shutdown.wait_for(|stopping| *stopping) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{AgentStatus, Event};

    fn envelopes(seqs: std::ops::RangeInclusive<u64>) -> Vec<Envelope> {
        seqs.map(|seq| Envelope {
            v: 1,
            seq,
            time_ms: seq,
            actor: None,
            event: Event::AgentStatusChanged { agent_id: "a".into(), status: AgentStatus::Ready, note: None },
        })
        .collect()
    }

    fn seqs(events: Option<Vec<Arc<TailEvent>>>) -> Option<Vec<u64>> {
        events.map(|events| events.iter().map(|event| event.seq).collect())
    }

    fn replies(seqs: std::ops::RangeInclusive<u64>, bytes: usize) -> Vec<Envelope> {
        seqs.map(|seq| Envelope {
            v: 1,
            seq,
            time_ms: seq,
            actor: None,
            event: Event::ReplyPosted {
                task_id: format!("task-{seq}"),
                sender_task_id: None,
                from: "b".into(),
                to: None,
                text: "x".repeat(bytes),
                idempotency_key: None,
            },
        })
        .collect()
    }

    /// Long texts leave the ring once it holds `RECENT_TEXT_BYTES` of them (the tails read
    /// them from the store), but the newest batch stays, however long.
    #[test]
    fn the_ring_holds_a_bounded_amount_of_text() {
        let recent = RecentEvents::default();
        let quarter = RECENT_TEXT_BYTES / 4;
        recent.push(replies(1..=3, quarter));
        assert_eq!(seqs(recent.after(0, 10)), Some(vec![1, 2, 3]));
        recent.push(replies(4..=6, quarter));
        assert_eq!(seqs(recent.after(1, 10)), None, "2 left with 1: 5 and 6 made it more than the bound");
        assert_eq!(seqs(recent.after(2, 10)), Some(vec![3, 4, 5, 6]));
        recent.push(replies(7..=7, RECENT_TEXT_BYTES * 2));
        assert_eq!(seqs(recent.after(6, 10)), Some(vec![7]), "the newest stays");
        assert_eq!(seqs(recent.after(5, 10)), None);
        recent.push(envelopes(8..=9));
        assert_eq!(seqs(recent.after(7, 10)), Some(vec![8, 9]), "and leaves with the next");
        // A send's batch: its text twice, then a short event. All of it stays.
        let mut send = replies(10..=11, RECENT_TEXT_BYTES);
        send.extend(envelopes(12..=12));
        recent.push(send);
        assert_eq!(seqs(recent.after(9, 10)), Some(vec![10, 11, 12]), "the newest batch stays whole");
        assert_eq!(seqs(recent.after(8, 10)), None);
        recent.push(envelopes(13..=13));
        assert_eq!(seqs(recent.after(12, 10)), Some(vec![13]));
        assert_eq!(seqs(recent.after(9, 10)), None, "and leaves with the next");
        // Short events are not held back by what the long ones counted.
        recent.push(replies(14..=16, quarter));
        assert_eq!(seqs(recent.after(11, 10)), Some(vec![12, 13, 14, 15, 16]));
        recent.push(replies(20..=20, 10));
        assert_eq!(seqs(recent.after(19, 10)), Some(vec![20]), "a new start counts from nothing");
        recent.push(replies(21..=23, quarter));
        assert_eq!(seqs(recent.after(19, 10)), Some(vec![20, 21, 22, 23]));
    }

    /// Events in the store that the ring never got (a batch the store took back from its
    /// write-ahead log when it reopened) are read from the store. With the ring ending before
    /// the head, a tail found nothing after its cursor: one following went round again at once,
    /// the head being past its cursor (a core busy for good), and one not following took
    /// itself for caught up.
    #[tokio::test]
    async fn a_tail_reads_from_the_store_what_the_ring_never_got() {
        let (_dir, state) = crate::broker::test_support::broker_with_an_agent().await;
        for status in [AgentStatus::Ready, AgentStatus::Processing] {
            let command = crate::broker::command::Command::SetStatus {
                agent_id: "synapse-dummy-40001".into(),
                status,
                note: None,
            };
            state.writer.submit(command).await.unwrap();
        }
        let head = *state.head.borrow();
        assert!(head >= 3, "{head}");
        // The ring as such a reopen leaves it: it ends before the head.
        *state.recent.ring.write().unwrap() = Ring::default();
        state.recent.push(state.store.read_after(0, 1).unwrap());
        let expected: Vec<u64> = (2..=head).collect();
        let batch = next_batch(&state, 1, false).await.unwrap();
        assert_eq!(batch.iter().map(|event| event.seq).collect::<Vec<_>>(), expected);
        let following = tokio::time::timeout(std::time::Duration::from_secs(20), next_batch(&state, 1, true));
        let batch = following.await.expect("the follower never read the store").unwrap();
        assert_eq!(batch.iter().map(|event| event.seq).collect::<Vec<_>>(), expected);
    }

    /// Events that do not follow the ring's last start it again: a tail never skips the ones
    /// between (a batch taken back from the write-ahead log by a reopen was never pushed).
    #[test]
    fn the_ring_holds_consecutive_events_only() {
        let recent = RecentEvents::default();
        recent.push(envelopes(1..=3));
        assert_eq!(seqs(recent.after(1, 10)), Some(vec![2, 3]));
        recent.push(envelopes(6..=7));
        assert_eq!(seqs(recent.after(3, 10)), None, "4 and 5 are read from the store");
        assert_eq!(seqs(recent.after(5, 10)), Some(vec![6, 7]));
        recent.push(envelopes(8..=8));
        assert_eq!(seqs(recent.after(6, 10)), Some(vec![7, 8]));
    }
}
