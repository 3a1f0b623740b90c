//! The status reporter: keeps the broker told of READY / PROCESSING / WAITING (and the note
//! that says why queued messages wait) as the screen changes.
//!
//! Invariants: only the reporter keeps what it last reported, so no update can be lost to
//! another task's; a READY it posts is marked with the write it was decided after
//! (`ReportOrder`), and a ticket's acknowledgement waits while a READY decided before that
//! ticket's write is on its way, so such a READY never lands in the log after the
//! acknowledgement; after an acknowledgement (which records PROCESSING) it reports the current
//! status again; STARTING is never reported.

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
        // Decided in one step against the watcher counting a write; a READY to post stays
        // marked with the writes counted before it until its answer.
        let (now, recheck, again, post) = shared.report_order.decide(|| {
            let (status, recheck) = shared.screen.lock().status(Instant::now());
            let again = shared.report_again.swap(false, std::sync::atomic::Ordering::SeqCst);
            let now = (status, shared.note());
            let post = status != AgentStatus::Starting && (again || reported.as_ref() != Some(&now));
            ((now, recheck, again, post), post && status == AgentStatus::Ready)
        });
        if post {
            let update = api::StatusUpdate { status: now.0, note: now.1.clone() };
            let answered = client.set_status(&shared.agent_id, &update).await;
            shared.report_order.posted();
            match answered {
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
