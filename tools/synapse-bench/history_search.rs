//! `history-search`: two keywords over 1,000,000 history records.
//!
//! Builds the history (deterministic texts, so runs compare) in a store of this process, then
//! times keyword searches and the newest-first lists (`history_*`).

use crate::common::{BenchDir, Samples, history_word, result, splitmix};
use anyhow::{Result, bail};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use synapse::event::{Direction, Event, Message, Role, TaskState};
use synapse::store::Store;

/// Messages written (each gives a sent and a received record).
const HISTORY_MESSAGES: u64 = 500_000;
const HISTORY_BATCH: u64 = 10_000;
/// Distinct words the generated texts draw from, and words per text.
const HISTORY_VOCABULARY: u64 = 20_000;
const HISTORY_WORDS_PER_TEXT: u64 = 8;
/// Timed searches (alternating OR and AND).
const HISTORY_SEARCHES: usize = 20;

pub fn run() -> Result<()> {
    use synapse::store::history::Logic;
    let dir = BenchDir::new("history-search")?;
    let database = dir.paths().database();
    let store = Store::open(&database)?;
    let building = Instant::now();
    let mut random = 42u64;
    let time_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64);
    let mut written = 0u64;
    let mut batch = 0u64;
    while written < HISTORY_MESSAGES {
        let count = HISTORY_BATCH.min(HISTORY_MESSAGES - written);
        let events: Vec<Event> = (0..count)
            .map(|offset| {
                let n = written + offset;
                let mut words: Vec<String> = (0..HISTORY_WORDS_PER_TEXT)
                    .map(|_| history_word(splitmix(&mut random) % HISTORY_VOCABULARY))
                    .collect();
                // One common word per text, in a tenth of all records each.
                words.push(format!("topic{}", n % 10));
                let text = words.join(" ");
                // A message that expected no reply: its receiver's task gives both history
                // records (sent and received).
                Event::TaskCreated {
                    task_id: format!("task-{n:07}"),
                    owner: Some(format!("agent-{}", (n + 1) % 8)),
                    context_id: "bench".into(),
                    direction: Direction::Incoming,
                    peer: Some(format!("agent-{}", n % 8)),
                    state: TaskState::Submitted,
                    message: Message::text(Role::User, text),
                    priority: 3,
                    response_expected: false,
                    sender_task_id: None,
                    in_reply_to: None,
                    peer_task_id: None,
                    message_in: None,
                }
            })
            .collect();
        store.transact(time_ms + batch, |appender| appender.append(Some("bench"), events))?;
        written += count;
        batch += 1;
    }
    println!(
        "built {} history records ({HISTORY_MESSAGES} messages, {HISTORY_WORDS_PER_TEXT} of {HISTORY_VOCABULARY} words each) in {:.2} s",
        2 * HISTORY_MESSAGES,
        building.elapsed().as_secs_f64()
    );
    let last = store.read(|view| view.history_of_task(&format!("task-{:07}", HISTORY_MESSAGES - 1)))?;
    if last.len() != 2 {
        bail!("the last message has {} history records, expected 2 (sent and received)", last.len());
    }
    // The broker's indexer does this in the background, in steps, after writes settle.
    let indexing = Instant::now();
    let progress = store.index_history()?;
    let indexing = indexing.elapsed().as_secs_f64();
    println!("indexed {} events in {indexing:.2} s ({} segments)", progress.indexed_through, progress.segments);
    result("history_index_events_per_s", progress.indexed_through as f64 / indexing, 0, "events/s");

    let mut durations = Vec::with_capacity(HISTORY_SEARCHES);
    let mut found_total = 0usize;
    for search in 0..HISTORY_SEARCHES {
        let keywords = vec![
            history_word(splitmix(&mut random) % HISTORY_VOCABULARY),
            history_word(splitmix(&mut random) % HISTORY_VOCABULARY),
        ];
        let logic = if search % 2 == 0 { Logic::Or } else { Logic::And };
        let started = Instant::now();
        let found = store.search_history(&keywords, logic, false, None, 50)?;
        durations.push(started.elapsed());
        found_total += found.len();
        if search < 2 {
            // The index only narrows what is read: it must answer what the full scan answers.
            let scanned = store.read(|view| view.search_history(&keywords, logic, false, None, 50))?;
            if scanned != found {
                bail!("the indexed search for {keywords:?} differs from the scan");
            }
        }
    }
    let samples = Samples::new(durations);
    println!(
        "{HISTORY_SEARCHES} searches (two keywords, OR and AND, limit 50), {found_total} records found: {}",
        samples.summary()
    );
    result("history_search_p50_ms", samples.median(), 3, "ms");

    // Not a target: common words match a tenth of the records each.
    let mut durations = Vec::new();
    for search in 0..4u64 {
        let keywords = vec![format!("topic{search}"), format!("topic{}", (search + 1) % 10)];
        let logic = if search % 2 == 0 { Logic::Or } else { Logic::And };
        let started = Instant::now();
        store.search_history(&keywords, logic, false, None, 50)?;
        durations.push(started.elapsed());
    }
    println!("4 searches for two common words (each in 100,000 records): {}", Samples::new(durations).summary());

    // Not a target: `history list` (the newest 50 records) walks the index by last update.
    let mut durations = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        let listed = store.recent_history(None, 50)?;
        durations.push(started.elapsed());
        if listed.len() != 50 {
            bail!("history list gave {} records, expected 50", listed.len());
        }
    }
    println!("4 lists of the newest 50 records: {}", Samples::new(durations).summary());
    Ok(())
}
