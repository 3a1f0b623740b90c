//! Keeps the history search index up with the log, off the writer's path: after events
//! arrive it lets a burst settle, then indexes it in steps of its own transactions
//! ([`crate::store::search_index`]). Searches never wait for it: they read the events it has
//! not reached yet themselves.

use super::BrokerState;
use std::sync::Arc;
use std::time::Duration;

/// How long a burst of events may go on before the indexer takes it (one step, one segment).
const SETTLE: Duration = Duration::from_millis(250);
/// Events per step: each step's transaction makes the writer wait (a few ms per thousand
/// events), so the broker takes small ones and lets the writer in between.
const STEP_EVENTS: usize = 4_096;
/// Pause after a failed step (a full disk, say) before trying again.
const RETRY: Duration = Duration::from_secs(5);

pub fn spawn(state: Arc<BrokerState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut head = state.head.clone();
        let mut stop = state.shutdown.subscribe();
        let mut trimmed_through = 0;
        // A step that panics again and again (a bug of ours, not the disk) reports once, not
        // a reopen every `RETRY`.
        let mut panic_reported = false;
        loop {
            let store = state.store.clone();
            let pause = match tokio::task::spawn_blocking(move || store.index_history_step(STEP_EVENTS)).await {
                Err(error) => {
                    tracing::error!("history index step failed ({error}); searches read the log until it works");
                    // A panic inside redb may leave the database refused, as a failed commit
                    // does: the writer reopens it now rather than at its next batch.
                    if error.is_panic() && !panic_reported {
                        panic_reported = true;
                        state.writer.report_storage_failure(format!("history index: the step failed ({error})"));
                    }
                    RETRY
                }
                Ok(Ok(progress)) if !progress.caught_up() => {
                    panic_reported = false;
                    // A stopping broker's step gives up without indexing (`stop_indexing`).
                    if state.is_stopping() {
                        return;
                    }
                    continue;
                }
                Ok(Ok(progress)) => {
                    panic_reported = false;
                    // A step that reached the head was committed without an fsync (one that
                    // found nothing to index committed nothing; the wake costs the writer a look).
                    state.writer.index_stepped();
                    // Caught up after indexing something: what the steps allocated goes back
                    // to the system.
                    if progress.indexed_through > trimmed_through {
                        trimmed_through = progress.indexed_through;
                        crate::process::release_free_memory();
                    }
                    tokio::select! {
                        moved = head.wait_for(|seq| *seq > progress.head) => if moved.is_err() { return },
                        // A rebuild empties the index without moving the head.
                        _ = state.index_wake.notified() => {}
                        _ = stop.wait_for(|stopping| *stopping) => return,
                    }
                    SETTLE
                }
                Ok(Err(error)) => {
                    tracing::warn!("history index: {error}; searches read the log until it catches up");
                    // A failed commit leaves the database refused until the writer reopens it.
                    if error.refuses_until_reopened() {
                        state.writer.report_storage_failure(format!("history index: {error}"));
                    }
                    RETRY
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The indexer's step that reaches the head is committed without an fsync, and the writer,
    /// asleep with nothing of its own left to make durable, must still checkpoint it.
    #[tokio::test]
    async fn the_writer_makes_the_indexers_last_step_durable_while_nothing_else_is_written() {
        let (_dir, state) = crate::broker::test_support::broker_with_an_agent().await;
        let store = &state.store;
        // The writer's own idle checkpoint, before there is an indexer.
        wait("the writer's checkpoint", || !store.checkpoint_pending()).await;
        spawn(state.clone());
        wait("the index to reach the head", || store.index_progress().unwrap().caught_up()).await;
        wait("the index step to be made durable", || !store.checkpoint_pending()).await;
    }

    /// A stopping broker waits for the indexer's step (seconds on texts of megabytes): a step
    /// under way once the broker stops gives up without indexing, and the indexer ends.
    #[tokio::test]
    async fn a_stopping_broker_s_indexer_ends_without_indexing() {
        let (_dir, state) = crate::broker::test_support::broker_with_an_agent().await;
        let head = state.store.index_progress().unwrap().head;
        assert!(head > 0);
        state.request_shutdown();
        let indexer = spawn(state.clone());
        tokio::time::timeout(Duration::from_secs(20), indexer).await.expect("the indexer never ended").unwrap();
        let progress = state.store.index_progress().unwrap();
        assert_eq!((progress.indexed_through, progress.head), (0, head));
    }

    /// Waits until `done` says so (checked every 5 ms); fails after 20 s.
    async fn wait(what: &str, done: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
