//! The status reporter: keeps the broker told of READY / PROCESSING / WAITING (and the note
//! that says why queued messages wait) as the screen changes.
//!
//! Invariants: only the reporter keeps what it last reported, so no update can be lost to
//! another task's; it decides and posts under the report gate, so a READY seen before a ticket
//! was written never lands in the log after that ticket's acknowledgement; after an
//! acknowledgement (which records PROCESSING) it reports the current status again; STARTING is
//! never reported.

use super::Shared;
use super::connection::{Backoff, connect, is_gone};
use crate::api;
use crate::event::AgentStatus;
use std::sync::Arc;
use std::time::Instant;

/// Keeps the broker told of READY / PROCESSING / WAITING as the screen changes.
pub(super) async fn report_status(shared: Arc<Shared>) {
    let mut client = connect(&shared.paths, &shared.secret).await;
    let mut changes = shared.screen.subscribe();
    let mut reported: Option<(AgentStatus, Option<String>)> = None;
    let mut backoff = Backoff::default();
    let mut warned_gone = false;
    loop {
        changes.borrow_and_update();
        // No ticket is between its write and its acknowledgement while this is held.
        let gate = shared.report_gate.lock().await;
        let (status, recheck) = shared.screen.lock().status(Instant::now());
        let again = shared.report_again.swap(false, std::sync::atomic::Ordering::SeqCst);
        let now = (status, shared.note());
        if status != AgentStatus::Starting && (again || reported.as_ref() != Some(&now)) {
            let update = api::StatusUpdate { status: now.0, note: now.1.clone() };
            match client.set_status(&shared.agent_id, &update).await {
                Ok(_) => {
                    reported = Some(now);
                    backoff.reset();
                    warned_gone = false;
                }
                Err(error) => {
                    if is_gone(&error) && !std::mem::replace(&mut warned_gone, true) {
                        tracing::warn!(
                            "the broker no longer knows agent {} (deregistered?): messages cannot reach it; retrying",
                            shared.agent_id
                        );
                    } else {
                        tracing::debug!("status report failed: {error:#}");
                    }
                    if again {
                        shared.report_again.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    backoff.wait().await;
                    client = connect(&shared.paths, &shared.secret).await;
                    continue;
                }
            }
        }
        drop(gate);
        match recheck {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), changes.changed()).await;
            }
            None => {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}
