//! Tails: read the log from a cursor, then follow new events, with no gap and no repeat.
//!
//! A tail reads from its cursor up to the head, then waits for the head to move past the cursor
//! and reads again. `watch::Receiver::wait_for` checks the current head before sleeping, so an
//! event committed between the read and the wait is never missed. Every tail also watches the
//! shutdown flag, so streams end when the broker stops.

use super::BrokerState;
use crate::event::Envelope;
use std::sync::Arc;

/// Events read per store access.
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
pub async fn next_batch(state: &Arc<BrokerState>, cursor: u64, follow: bool) -> Result<Vec<Envelope>, TailEnd> {
    let mut head = state.head.clone();
    let mut shutdown = state.shutdown.subscribe();
    loop {
        if *shutdown.borrow() {
            return Err(TailEnd::Shutdown);
        }
        let events = state.store.read_after(cursor, TAIL_BATCH).map_err(|error| TailEnd::Failed(error.to_string()))?;
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
pub async fn wait_past(state: &Arc<BrokerState>, cursor: u64) -> bool {
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
