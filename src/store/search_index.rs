//! The history search index: for each word of the tasks' texts, the tasks that contain it, so a
//! search reads a few posting lists instead of decoding every task.
//!
//! It is derived data, like the projections, but kept off the acknowledgement path: writing
//! a word index in the writer's transaction cost the write path four times its throughput (the
//! notes of issue 5), so an indexer catches up with the log in steps of its own
//! ([`Store::index_history_step`], run by the broker after writes settle and in batches).
//! A search combines what is indexed with the events the indexer has not reached yet, so it
//! always sees everything acknowledged, and checks every candidate against the real text: the
//! index only narrows the tasks to read, it never decides a match.
//!
//! Each task is also filed under a word for its conversation ([`context_word`]: a control
//! character, which no word of a text holds, and one of 4,096 hashes of its context id), which
//! `history thread` reads ([`Store::thread_of`]).
//!
//! Layout (log-structured, so a step writes a fresh table instead of touching a page per word
//! all over one big tree): each step writes one *segment*, a table of its own with rows
//! `word → posting list` where a posting is the task's `created_seq` (ascending, delta-varint
//! encoded); a merged segment's table is dropped whole. Words are lowercased
//! char by char, like the search's case-insensitive match. A new segment is merged with the
//! newer end of the older ones while they are no larger than it together, so the number of
//! segments stays logarithmic in the number of postings and each posting is rewritten a
//! logarithmic number of times; segments stop growing at about a million postings, so that
//! no merge holds the writer long.

use super::history::{HistoryRecord, Keyword, Logic, Query, newest_first, thread_records, visit_task_words};
use super::projection::{LIVE, ReadProjections};
use super::{LOG, Store, StoreError, last_seq};
use crate::event::{Envelope, Event};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;

pub(super) const INDEX_META: TableDefinition<&str, u64> = TableDefinition::new("history_index_meta");
/// Segment id → number of postings in it.
const SEGMENTS: TableDefinition<u64, u64> = TableDefinition::new("history_index_segments");

/// Indexed tasks by last update, `(updated_ms, created_seq)`, newest last: a search for
/// common words walks it from the newest end and stops once `limit` records are found that
/// no older task can displace.
const RECENCY: TableDefinition<(u64, u64), ()> = TableDefinition::new("history_index_recency");
/// created_seq → the updated_ms under which the task is in [`RECENCY`], and the task's id (so
/// that a search finds the task without decoding its `task_created` event).
const UPDATED: TableDefinition<u64, (u64, &str)> = TableDefinition::new("history_index_tasks");

/// The name of a segment's table (word → posting list).
fn segment_table(id: u64) -> String {
    format!("history_index_segment_{id}")
}

fn words_of(name: &str) -> TableDefinition<'_, &'static str, &'static [u8]> {
    TableDefinition::new(name)
}

fn segment_ids(segments: &impl ReadableTable<u64, u64>) -> Result<Vec<(u64, u64)>, StoreError> {
    let mut ids = Vec::new();
    for row in segments.iter()? {
        let (id, size) = row?;
        ids.push((id.value(), size.value()));
    }
    Ok(ids)
}

/// Every task changed by an event up to this sequence number is in the index.
const INDEXED_THROUGH: &str = "indexed_through";
/// [`INDEXED_THROUGH`] as written by this version of the indexer, whose words include each
/// task's conversation ([`context_word`], one of 4,096). A build that indexes otherwise (an older
/// one, or a newer one that changes the words again) moves `indexed_through` and not this key,
/// so when the two differ at open the index is not this build's and is indexed again.
pub(super) const INDEXED_THROUGH_BY_THIS_VERSION: &str = "indexed_through_v3";
const NEXT_SEGMENT: &str = "next_segment";

/// Events read by one indexing step at most when catching up in one go.
pub const INDEX_STEP_EVENTS: usize = 20_000;
/// A merge stops growing a segment past this many postings: the merge is written in one
/// transaction, during which the broker's writer waits (about 35 ms per million postings
/// measured). Past it, segments are left as they are: a few more lookups per search.
const MAX_MERGED_POSTINGS: u64 = 1_000_000;
/// Unindexed events a search reads itself at most; with more (an indexer far behind, just
/// after a rebuild) it scans every task instead, which is slower but as exact.
pub(super) const TAIL_LIMIT: usize = 20_000;

/// What a search does with each posting list it reads: go on to the next, or stop.
type ListVisitor<'a> = dyn FnMut(&[u8]) -> Result<ControlFlow<()>, StoreError> + 'a;

/// How a search weighs reading posting lists against walking the tasks newest first.
#[derive(Debug, Clone, Copy)]
pub struct SearchTuning {
    /// Bytes of posting lists from which a keyword counts as common: its lists are not read
    /// before a walk of the newest tasks has had its chance (each posting takes at least a byte,
    /// so this many bytes may be as many tasks).
    pub common_posting_bytes: usize,
    /// How long that walk may take before it gives up and the lists are read after all, in
    /// task reads (passing a task that is no candidate counts as a thirtieth of one).
    pub walk_budget: usize,
}

impl Default for SearchTuning {
    /// A common word's lists from 64 KiB (tens of thousands of tasks: a few ms to decode,
    /// sort and intersect, and growing with the log); a walk of at most 2,000 tasks (a few ms,
    /// whatever the log's size). Measured with `synapse-bench scale`: two words of every
    /// record took 7.7 ms at 100k events and 119 ms at 10M when every list was read.
    fn default() -> SearchTuning {
        SearchTuning { common_posting_bytes: 64 * 1024, walk_budget: 2_000 }
    }
}

/// Where the indexer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IndexProgress {
    pub indexed_through: u64,
    pub head: u64,
    pub segments: u64,
}

impl IndexProgress {
    pub fn caught_up(&self) -> bool {
        self.indexed_through >= self.head
    }
}

/// Creates the index tables (at open) so that read transactions find them. An index another
/// build has written to (one that keeps other words) is emptied, and indexed again from the
/// first event; searches scan meanwhile, as after a rebuild.
pub(super) fn create_tables(txn: &WriteTransaction) -> Result<(), StoreError> {
    let ours = {
        let meta = txn.open_table(INDEX_META)?;
        let through = meta_value(&meta, INDEXED_THROUGH)?;
        meta.get(INDEXED_THROUGH_BY_THIS_VERSION)?.map(|value| value.value()) == Some(through)
    };
    txn.open_table(SEGMENTS)?;
    txn.open_table(RECENCY)?;
    txn.open_table(UPDATED)?;
    if !ours {
        clear(txn)?;
    }
    Ok(())
}

/// Empties the index (a rebuild renumbers tasks): the indexer starts again from the first event.
pub(super) fn clear(txn: &WriteTransaction) -> Result<(), StoreError> {
    let mut segments = txn.open_table(SEGMENTS)?;
    for (id, _) in segment_ids(&segments)? {
        txn.delete_table(words_of(&segment_table(id)))?;
    }
    segments.retain(|_, _| false)?;
    txn.open_table(RECENCY)?.retain(|_, _| false)?;
    txn.open_table(UPDATED)?.retain(|_, _| false)?;
    let mut meta = txn.open_table(INDEX_META)?;
    meta.retain(|_, _| false)?;
    meta.insert(INDEXED_THROUGH_BY_THIS_VERSION, 0)?;
    Ok(())
}

/// The word under which the index keeps a task's conversation (`history thread`): a control
/// character, which no word of a text holds (words are runs of letters and digits), then the
/// top 12 bits of a hash of the context id in hex. So 4,096 such words at most, each shared by
/// many conversations: what the index finds is checked against the task. A word per
/// conversation (a 32-bit hash) cost `http-send` about a tenth of its throughput (medians of 13
/// alternated runs: 22.3k against 24.7k sends/s without the word; 24.8k, of 7, with 4,096).
pub(super) fn context_word(context_id: &str) -> String {
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let hash =
        context_id.bytes().fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
    format!("\u{1}{:03x}", hash >> 20)
}

/// The tasks whose searchable text or state an event may change, each with whether its words
/// may change: an event that carries a text. One that only moves a task on (its state, a
/// ticket, a cancel) changes where it stands in recency, not what it is found by.
fn touched_tasks(event: &Event) -> impl Iterator<Item = (&str, bool)> {
    let (first, second, reworded): (Option<&String>, Option<&String>, bool) = match event {
        Event::TaskCreated { task_id, .. } => (Some(task_id), None, true),
        Event::TaskStateChanged { task_id, artifacts, reply_of, .. } => {
            (Some(task_id), None, !artifacts.is_empty() || reply_of.is_some())
        }
        Event::ReverseTicketIssued { task_id, .. } | Event::TaskCanceled { task_id, .. } => {
            (Some(task_id), None, false)
        }
        Event::MessageSent { task_id, sender_task_id, .. }
        | Event::ReplyPosted { task_id, sender_task_id, .. }
        | Event::TaskContinued { task_id, sender_task_id, .. } => (Some(task_id), sender_task_id.as_ref(), true),
        _ => (None, None, false),
    };
    first.into_iter().chain(second).map(move |task_id| (task_id.as_str(), reworded))
}

fn encode_postings(postings: &[u64]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(postings.len() * 2);
    let mut previous = 0u64;
    for &posting in postings {
        let mut delta = posting - previous;
        previous = posting;
        loop {
            let low = (delta & 0x7f) as u8;
            delta >>= 7;
            if delta == 0 {
                bytes.push(low);
                break;
            }
            bytes.push(low | 0x80);
        }
    }
    bytes
}

fn decode_postings(bytes: &[u8], into: &mut Vec<u64>) -> Result<(), StoreError> {
    let malformed = || StoreError::Corrupt("history index: malformed posting list".into());
    let mut previous = 0u64;
    let mut delta = 0u64;
    let mut shift = 0u32;
    for &byte in bytes {
        if shift > 63 {
            return Err(malformed());
        }
        delta |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            previous = previous.checked_add(delta).ok_or_else(malformed)?;
            into.push(previous);
            delta = 0;
            shift = 0;
        } else {
            shift += 7;
        }
    }
    if shift != 0 { Err(malformed()) } else { Ok(()) }
}

fn sort_postings(segment: &mut HashMap<String, Vec<u64>>) -> u64 {
    let mut total = 0;
    for postings in segment.values_mut() {
        postings.sort_unstable();
        postings.dedup();
        total += postings.len() as u64;
    }
    total
}

/// The tasks changed by events the indexer has not reached (a query reads whatever they hold
/// now), or None when there are more than [`TAIL_LIMIT`] such events: the query then scans.
/// Sequence numbers have no gaps, so the tail's length is known before reading it.
fn unindexed_tail(txn: &redb::ReadTransaction) -> Result<Option<BTreeSet<String>>, StoreError> {
    let indexed_through = meta_value(&txn.open_table(INDEX_META)?, INDEXED_THROUGH)?;
    let log = txn.open_table(LOG)?;
    let head = last_seq(&log)?;
    if head.saturating_sub(indexed_through) > TAIL_LIMIT as u64 {
        return Ok(None);
    }
    let mut tail = BTreeSet::new();
    for row in log.range(indexed_through + 1..)? {
        let (_, bytes) = row?;
        tail.extend(touched_tasks(&Envelope::decode(bytes.value())?.event).map(|(task_id, _)| task_id.to_string()));
    }
    Ok(Some(tail))
}

fn meta_value(meta: &impl ReadableTable<&'static str, u64>, key: &str) -> Result<u64, StoreError> {
    Ok(meta.get(key)?.map_or(0, |value| value.value()))
}

impl Store {
    /// Makes every history index step from now on, and the one under way, end without
    /// indexing anything (checked between tasks): a stopping broker waits for a step, which on
    /// texts of megabytes takes seconds. The next broker's indexer takes it again.
    pub fn stop_indexing(&self) {
        self.index_stopped.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Has [`Store::stop_indexing`] been called (a stopping broker)?
    pub fn indexing_stopped(&self) -> bool {
        self.index_stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Indexes the tasks changed by up to `max_events` events after the index's watermark, as
    /// one new segment (merged with small older ones), in a transaction of its own.
    pub fn index_history_step(&self, max_events: usize) -> Result<IndexProgress, StoreError> {
        // Its read transaction, too, may be cut off by a reopen (see `Store::reading`); its write
        // may fail on the storage, or find an earlier write failed (see `Store::explained`).
        self.explaining(|| self.take_index_step(max_events))
    }

    fn take_index_step(&self, max_events: usize) -> Result<IndexProgress, StoreError> {
        let _indexer = self.index_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let txn = self.db()?.begin_read()?;
        let meta = txn.open_table(INDEX_META)?;
        let from = meta_value(&meta, INDEXED_THROUGH)?;
        let log = txn.open_table(LOG)?;
        let head = last_seq(&log)?;
        let segments = segment_ids(&txn.open_table(SEGMENTS)?)?;
        let unchanged = IndexProgress { indexed_through: from, head, segments: segments.len() as u64 };
        if from >= head || self.indexing_stopped() {
            return Ok(unchanged);
        }

        // Each task the events touch, and whether any of them may have changed its words.
        let mut touched: BTreeMap<String, bool> = BTreeMap::new();
        let mut through = from;
        for row in log.range(from + 1..)?.take(max_events.max(1)) {
            let (seq, bytes) = row?;
            through = seq.value();
            let envelope = Envelope::decode(bytes.value())?;
            for (task_id, reworded) in touched_tasks(&envelope.event) {
                match touched.get_mut(task_id) {
                    Some(was) => *was |= reworded,
                    None => {
                        touched.insert(task_id.to_string(), reworded);
                    }
                }
            }
        }
        let projections = ReadProjections::open(&txn, &LIVE)?;
        let mut segment: HashMap<String, Vec<u64>> = HashMap::new();
        let mut updates = Vec::with_capacity(touched.len());
        for (task_id, &reworded) in &touched {
            if self.indexing_stopped() {
                return Ok(unchanged);
            }
            // Every task has its creation number: projections of an older shape are replayed
            // when the store is opened (`projection_version`).
            // A task whose words did not change has them posted already (a task's words only
            // grow, and the step of the event that added them posted them all): its row without
            // the texts it refers to is enough, which for a long text is most of the step's work.
            let task = if reworded { projections.task(task_id)? } else { projections.task_row(task_id)? };
            let Some(task) = task else { continue };
            updates.push((task.created_seq, task.updated_ms, task_id.as_str()));
            if !reworded {
                continue;
            }
            // A task's words come one after another: a word it repeats is posted once.
            let mut add = |word: &str| match segment.get_mut(word) {
                Some(postings) => {
                    if postings.last() != Some(&task.created_seq) {
                        postings.push(task.created_seq);
                    }
                }
                None => {
                    segment.insert(word.to_string(), vec![task.created_seq]);
                }
            };
            visit_task_words(&task, &mut add);
            add(&context_word(&task.context_id));
        }
        let mut size = sort_postings(&mut segment);

        // Merge with the newest older segments while each is no larger than what is merged.
        let mut merged = Vec::new();
        if size > 0 {
            for &(id, older) in segments.iter().rev() {
                if older > size || older + size > MAX_MERGED_POSTINGS {
                    break;
                }
                merged.push(id);
                size += older;
            }
        }
        if !merged.is_empty() {
            for &id in &merged {
                let name = segment_table(id);
                for row in txn.open_table(words_of(&name))?.iter()? {
                    let (word, postings) = row?;
                    let word = word.value();
                    let into = match segment.get_mut(word) {
                        Some(into) => into,
                        None => segment.entry(word.to_string()).or_default(),
                    };
                    decode_postings(postings.value(), into)?;
                }
            }
            size = sort_postings(&mut segment);
        }
        drop((meta, log, projections, txn));

        let mut txn = self.db()?.begin_write()?;
        // A step that reaches the head (the steady state: the burst that just settled) is
        // committed without an fsync on a store with a write-ahead log, and made durable by the
        // writer's next checkpoint. Durable, it was a checkpoint of its own in the middle of the
        // burst's traffic: a redb commit of every page changed since the last one, which held
        // the writer's next batch for as long (fdatasync 2.5-3.9 ms, every 250 ms, in
        // `tools/bench delivery`). A crash before the checkpoint takes the step back with the
        // watermark in the same commit, and the indexer takes it again. Steps of a catch-up
        // stay durable: pages freed by a commit without an fsync are not reused until a durable
        // one, and a catch-up merges many segments.
        let unsynced = self.wal.is_some() && through >= head;
        if unsynced {
            txn.set_durability(redb::Durability::None)?;
        }
        let segment_count;
        {
            let mut meta = txn.open_table(INDEX_META)?;
            if meta_value(&meta, INDEXED_THROUGH)? != from {
                // Only this indexer (holding the lock) moves the watermark; a rebuild takes the
                // lock too. Nothing to write if that ever changes.
                drop(meta);
                txn.abort()?;
                return Err(StoreError::Storage("history index: the watermark moved during a step".into()));
            }
            let mut segment_sizes = txn.open_table(SEGMENTS)?;
            for &id in &merged {
                segment_sizes.remove(id)?;
                txn.delete_table(words_of(&segment_table(id)))?;
            }
            if size > 0 {
                let id = meta_value(&meta, NEXT_SEGMENT)?;
                let mut rows: Vec<(String, Vec<u64>)> = segment.into_iter().collect();
                rows.sort_unstable_by(|left, right| left.0.cmp(&right.0));
                let name = segment_table(id);
                let mut words = txn.open_table(words_of(&name))?;
                for (word, postings) in &rows {
                    words.insert(word.as_str(), encode_postings(postings).as_slice())?;
                }
                segment_sizes.insert(id, size)?;
                meta.insert(NEXT_SEGMENT, id + 1)?;
            }
            let mut recency = txn.open_table(RECENCY)?;
            let mut updated = txn.open_table(UPDATED)?;
            for &(seq, updated_ms, task_id) in &updates {
                let before = updated.insert(seq, (updated_ms, task_id))?.map(|old| old.value().0);
                if before != Some(updated_ms) {
                    if let Some(before) = before {
                        recency.remove((before, seq))?;
                    }
                    recency.insert((updated_ms, seq), ())?;
                }
            }
            meta.insert(INDEXED_THROUGH, through)?;
            meta.insert(INDEXED_THROUGH_BY_THIS_VERSION, through)?;
            segment_count = segment_sizes.len()?;
        }
        txn.commit()?;
        if unsynced {
            self.index_unsynced.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(IndexProgress { indexed_through: through, head, segments: segment_count })
    }

    /// Runs indexing steps until the index has reached the head it saw, or until indexing is
    /// stopped (a stopping broker: its steps index nothing more, and waiting for the head would
    /// never end); then the progress so far, short of the head.
    pub fn index_history(&self) -> Result<IndexProgress, StoreError> {
        loop {
            let progress = self.index_history_step(INDEX_STEP_EVENTS)?;
            if progress.caught_up() || self.indexing_stopped() {
                return Ok(progress);
            }
        }
    }

    /// Where the indexer stands.
    pub fn index_progress(&self) -> Result<IndexProgress, StoreError> {
        self.reading(|txn| {
            let meta = txn.open_table(INDEX_META)?;
            let head = last_seq(&txn.open_table(LOG)?)?;
            Ok(IndexProgress {
                indexed_through: meta_value(&meta, INDEXED_THROUGH)?,
                head,
                segments: txn.open_table(SEGMENTS)?.len()?,
            })
        })
    }

    /// History records matching the keywords (see [`ReadProjections::search_history`] for the
    /// rules), newest first, at most `limit`. Reads the index and the events it has not reached;
    /// scans every task when the index cannot answer (an empty keyword, an indexer far behind).
    pub fn search_history(
        &self,
        keywords: &[String],
        logic: Logic,
        case_sensitive: bool,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        self.search_history_tuned(keywords, logic, case_sensitive, agent, limit, SearchTuning::default())
    }

    /// [`Store::search_history`] with a tuning of its own (tests: every path of the search).
    pub(super) fn search_history_tuned(
        &self,
        keywords: &[String],
        logic: Logic,
        case_sensitive: bool,
        agent: Option<&str>,
        limit: usize,
        tuning: SearchTuning,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let scan =
            |projections: &ReadProjections| projections.search_history(keywords, logic, case_sensitive, agent, limit);
        if keywords.is_empty() {
            return self.read(scan);
        }
        let prepared = Keyword::all(keywords, case_sensitive);
        // A text a keyword matches has a word starting with each of the keyword's words: the
        // candidates are the tasks with all the words of one keyword (OR), or of every keyword
        // (AND). A keyword without words matches nothing.
        let clauses: Vec<Vec<String>> = match logic {
            Logic::Or => {
                prepared.iter().filter(|keyword| !keyword.words().is_empty()).map(|k| k.words().to_vec()).collect()
            }
            Logic::And if prepared.iter().any(|keyword| keyword.words().is_empty()) => Vec::new(),
            Logic::And => {
                let mut words: Vec<String> = prepared.iter().flat_map(|keyword| keyword.words()).cloned().collect();
                words.sort_unstable();
                words.dedup();
                vec![words]
            }
        };
        if clauses.is_empty() {
            return Ok(Vec::new());
        }
        let query = Query { keywords: &prepared, logic, case_sensitive, agent, limit };
        self.indexed_query(Some(&clauses), &query, tuning, scan)
    }

    /// The newest history records (of one agent, or all), at most `limit`: `history list`
    /// without reading every task.
    pub fn recent_history(&self, agent: Option<&str>, limit: usize) -> Result<Vec<HistoryRecord>, StoreError> {
        let scan = |projections: &ReadProjections| projections.newest_history_records(agent, limit);
        // No keyword, AND: every record matches.
        let query = Query { keywords: &[], logic: Logic::And, case_sensitive: false, agent, limit };
        self.indexed_query(None, &query, SearchTuning::default(), scan)
    }

    /// The whole conversation of the task `prefix` names, without what a cleanup pruned (see
    /// [`ReadProjections::thread_of`]): the tasks the index keeps under its conversation's
    /// word, and those changed by events it has not reached; by a scan of every task when it is
    /// far behind.
    pub fn thread_of(&self, prefix: &str) -> Result<Option<Vec<HistoryRecord>>, StoreError> {
        self.reading(|txn| {
            let projections = ReadProjections::open(txn, &LIVE)?;
            let cutoff = projections.pruned_before()?;
            let Some(task) = projections.thread_task(prefix, cutoff)? else { return Ok(None) };
            let context = task.context_id.as_str();
            let Some(tail) = unindexed_tail(txn)? else { return projections.thread_scan(context, cutoff).map(Some) };
            let in_thread = |task: &super::TaskRecord| task.context_id == context && task.updated_ms >= cutoff;
            let word = context_word(context);
            let mut seqs = Vec::new();
            for (id, _) in segment_ids(&txn.open_table(SEGMENTS)?)? {
                if let Some(postings) = txn.open_table(words_of(&segment_table(id)))?.get(word.as_str())? {
                    decode_postings(postings.value(), &mut seqs)?;
                }
            }
            seqs.sort_unstable();
            seqs.dedup();
            let updated = txn.open_table(UPDATED)?;
            let mut tasks = Vec::new();
            for seq in seqs {
                let Some(row) = updated.get(seq)? else { continue };
                let (_, task_id) = row.value();
                // A task the tail changed is read from there; a stale number (a `task_created`
                // for an id that already existed renumbers it) is passed over.
                if !tail.contains(task_id) {
                    tasks.extend(projections.task_if(task_id, |task| task.created_seq == seq && in_thread(task))?);
                }
            }
            for task_id in &tail {
                tasks.extend(projections.task_if(task_id, in_thread)?);
            }
            Ok(Some(thread_records(&tasks)))
        })
    }

    /// Answers a query from the index: the tasks with a word starting with each prefix of one
    /// of the `clauses` (every task when None) plus those the indexer has not reached, checked
    /// against the query; `scan` when the index cannot answer.
    ///
    /// The candidates are a superset of the answer: every task read is checked against the
    /// query's real text ([`Query::records_of`]). So a common prefix's lists can be left
    /// unread: the other prefixes of its clause narrow the candidates; when a clause has only
    /// common prefixes, the newest tasks are walked unfiltered first, within
    /// `tuning.walk_budget`, and the lists are read only if that walk does not finish.
    fn indexed_query(
        &self,
        clauses: Option<&[Vec<String>]>,
        query: &Query<'_>,
        tuning: SearchTuning,
        scan: impl FnOnce(&ReadProjections) -> Result<Vec<HistoryRecord>, StoreError>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        self.reading(|txn| self.indexed_query_in(txn, clauses, query, tuning, scan))
    }

    /// [`Self::indexed_query`] in its read transaction.
    fn indexed_query_in(
        &self,
        txn: &redb::ReadTransaction,
        clauses: Option<&[Vec<String>]>,
        query: &Query<'_>,
        tuning: SearchTuning,
        scan: impl FnOnce(&ReadProjections) -> Result<Vec<HistoryRecord>, StoreError>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let Query { limit, .. } = *query;
        let projections = ReadProjections::open(txn, &LIVE)?;
        let Some(tail) = unindexed_tail(txn)? else { return scan(&projections) };

        let mut segments = Vec::new();
        for (id, _) in segment_ids(&txn.open_table(SEGMENTS)?)? {
            segments.push(txn.open_table(words_of(&segment_table(id)))?);
        }
        // Each posting list of a word starting with `prefix`, in every segment, until `visit`
        // says to stop.
        let visit_lists = |prefix: &str, visit: &mut ListVisitor<'_>| {
            for words in &segments {
                for row in words.range(prefix..)? {
                    let (word, value) = row?;
                    if !word.value().starts_with(prefix) {
                        break;
                    }
                    if visit(value.value())?.is_break() {
                        return Ok(());
                    }
                }
            }
            Ok::<_, StoreError>(())
        };
        // Whether the prefix's lists take `tuning.common_posting_bytes` or more (they are not
        // read past that).
        let is_common = |prefix: &str| -> Result<bool, StoreError> {
            let mut bytes = 0;
            visit_lists(prefix, &mut |list| {
                bytes += list.len();
                Ok(if bytes >= tuning.common_posting_bytes {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                })
            })?;
            Ok(bytes >= tuning.common_posting_bytes)
        };
        let postings_of = |prefix: &str| -> Result<Vec<u64>, StoreError> {
            let mut postings = Vec::new();
            visit_lists(prefix, &mut |list| decode_postings(list, &mut postings).map(ControlFlow::Continue))?;
            postings.sort_unstable();
            postings.dedup();
            Ok(postings)
        };
        // The tasks holding a word for every prefix of one of the clauses.
        let candidates = |clauses: &[Vec<&str>]| -> Result<Vec<u64>, StoreError> {
            let mut matching = Vec::new();
            for clause in clauses {
                let mut in_clause: Option<Vec<u64>> = None;
                for prefix in clause {
                    let postings = postings_of(prefix)?;
                    in_clause = Some(match in_clause {
                        None => postings,
                        Some(so_far) => so_far.into_iter().filter(|seq| postings.binary_search(seq).is_ok()).collect(),
                    });
                }
                matching.extend(in_clause.unwrap_or_default());
            }
            matching.sort_unstable();
            matching.dedup();
            Ok(matching)
        };

        let cutoff = projections.pruned_before()?;
        let keep = |task: &super::TaskRecord| query.records_of(task, cutoff);
        let mut from_tail = Vec::new();
        for task_id in &tail {
            if let Some(task) = projections.task(task_id)? {
                from_tail.extend(keep(&task));
            }
        }
        // An indexed task by its number, unless the tail has it (then it is read from there) or
        // the number is stale (a `task_created` for an id that already existed renumbers it).
        let updated = txn.open_table(UPDATED)?;
        let indexed_task = |seq: u64| -> Result<Option<super::TaskRecord>, StoreError> {
            let Some(row) = updated.get(seq)? else { return Ok(None) };
            let (_, task_id) = row.value();
            if tail.contains(task_id) {
                return Ok(None);
            }
            Ok(projections.task(task_id)?.filter(|task| task.created_seq == seq))
        };
        let recency = txn.open_table(RECENCY)?;
        // Newest first: once `limit` records are newer than the task at hand, no older task can
        // displace them (a task outside the tail is in RECENCY under its current updated_ms).
        // Records found so far that are strictly newer than the task at hand: the tail's (by
        // binary search) and the walk's (its records have their key's updated_ms, and keys
        // come in non-increasing order, so a count per key value is enough). None: the walk
        // cost more than `budget` task reads before it could end.
        let walk =
            |matching: Option<&[u64]>, budget: Option<usize>| -> Result<Option<Vec<HistoryRecord>>, StoreError> {
                let mut found = from_tail.clone();
                let mut tail_times: Vec<u64> = found.iter().map(|record| record.updated_ms).collect();
                tail_times.sort_unstable();
                let (mut walked_newer, mut walked_at_current, mut current) = (0usize, 0usize, u64::MAX);
                // In steps of the walk; reading a task costs about 30 (see `walks` below).
                let mut cost = 0usize;
                let allowed = budget.map(|budget| budget.saturating_mul(30));
                for row in recency.iter()?.rev() {
                    let (key, _) = row?;
                    let (updated_ms, seq) = key.value();
                    if updated_ms < current {
                        walked_newer += walked_at_current;
                        walked_at_current = 0;
                        current = updated_ms;
                    }
                    let tail_newer = tail_times.len() - tail_times.partition_point(|&time| time <= updated_ms);
                    if updated_ms < cutoff || walked_newer + tail_newer >= limit {
                        break;
                    }
                    let candidate = matching.is_none_or(|matching| matching.binary_search(&seq).is_ok());
                    cost += if candidate { 31 } else { 1 };
                    if allowed.is_some_and(|allowed| cost > allowed) {
                        return Ok(None);
                    }
                    if candidate && let Some(task) = indexed_task(seq)? {
                        let records = keep(&task);
                        walked_at_current += records.len();
                        found.extend(records);
                    }
                }
                Ok(Some(found))
            };

        // Reading every candidate costs about 30 times a step of the walk by recency; the walk
        // needs about limit × tasks / candidates steps (when most candidates match).
        let tasks = recency.len()?;
        let walks = |matching: &Option<Vec<u64>>| match matching {
            None => true,
            Some(matching) => {
                let candidates = matching.len() as u64;
                candidates > 0 && (limit as u64).saturating_mul(tasks) / candidates < 30 * candidates
            }
        };
        let done = |mut found: Vec<HistoryRecord>| {
            newest_first(&mut found);
            found.truncate(limit);
            found
        };
        let all: Vec<Vec<&str>> =
            clauses.unwrap_or_default().iter().map(|clause| clause.iter().map(String::as_str).collect()).collect();
        // The candidates, and whether they are only a loose superset of the answer (the tasks of
        // the rare prefixes of a clause with common ones: most of them may not match).
        let (mut matching, loose) = match clauses {
            // Every indexed task is a candidate.
            None => (None, false),
            Some(_) => {
                // Each clause's rare prefixes, up to a clause with none.
                let mut rare_clauses = Vec::new();
                let mut loose = false;
                let mut known: HashMap<&str, bool> = HashMap::new();
                for clause in &all {
                    let mut rare = Vec::new();
                    for &prefix in clause {
                        let common = match known.get(prefix) {
                            Some(&common) => common,
                            None => {
                                let common = is_common(prefix)?;
                                known.insert(prefix, common);
                                common
                            }
                        };
                        if !common {
                            rare.push(prefix);
                        }
                    }
                    if rare.is_empty() {
                        break;
                    }
                    loose |= rare.len() < clause.len();
                    rare_clauses.push(rare);
                }
                if rare_clauses.len() == all.len() {
                    // The rare prefixes' tasks; the text check sees to the common ones.
                    (Some(candidates(&rare_clauses)?), loose)
                } else if let Some(found) = walk(None, Some(tuning.walk_budget))? {
                    return Ok(done(found));
                } else {
                    (Some(candidates(&all)?), false)
                }
            }
        };
        if loose && walks(&matching) {
            // Few of the loose candidates may match, and then the walk would go through every
            // task: it gets the budget, and after it the exact candidates (every list) decide.
            if let Some(found) = walk(matching.as_deref(), Some(tuning.walk_budget))? {
                return Ok(done(found));
            }
            matching = Some(candidates(&all)?);
        }
        let found = if walks(&matching) {
            walk(matching.as_deref(), None)?.unwrap_or_default()
        } else {
            let mut found = from_tail;
            for &seq in matching.iter().flatten() {
                if let Some(task) = indexed_task(seq)? {
                    found.extend(keep(&task));
                }
            }
            found
        };
        Ok(done(found))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postings_round_trip() {
        for postings in [vec![], vec![1], vec![1, 2, 3, 200, 20_000, 1 << 40, u64::MAX]] {
            let mut decoded = Vec::new();
            decode_postings(&encode_postings(&postings), &mut decoded).unwrap();
            assert_eq!(decoded, postings);
        }
    }

    #[test]
    fn malformed_postings_are_an_error() {
        let mut decoded = Vec::new();
        assert!(decode_postings(&[0x80], &mut decoded).is_err());
        assert!(decode_postings(&[0xff; 11], &mut decoded).is_err());
    }
}
