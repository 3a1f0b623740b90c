//! The history view (SPEC §4): one record per task and side (what an agent sent, what it
//! received), derived from the tasks projection, so that keeping history costs nothing on the
//! write path. `history_pruned` moves a cut-off: records last updated before it leave the view.
//!
//! Search matches keywords as typed, from the start of a word: a keyword matches a record when
//! its input or output holds the keyword where a word starts (for a keyword that starts with
//! punctuation, where its first word does), with the keyword's letters and digits on the
//! text's letters and digits and its other characters on others (case-insensitive unless asked
//! otherwise; case is folded char by char, so that folding a text folds each of its words). So
//! `pars` matches `Parser` and not `reparse`, `foo-bar` matches `foo-bar` and `foo-barn` and not
//! `foo bar`, and each word of a keyword is, in the text, a whole word (the last one a word's
//! start) of the same folded letters: what lets the index find the candidates by the keyword's
//! words. A keyword without a letter or digit matches nothing (the API refuses it).
//! [`ReadProjections::search_history`] scans every task and is the definition;
//! [`super::search_index`] answers the same from a word index.

use super::StoreError;
use super::projection::{PRUNED_BEFORE, Projections, ReadProjections};
use super::records::TaskRecord;
use crate::event::{Direction, Envelope, Event, Part};
use redb::ReadableTable;

/// One side of one exchange: the record the history view keeps is the one the API answers.
pub use crate::api::HistoryRecord;

/// Lowercases char by char (unlike `str::to_lowercase`, which treats a final sigma apart), so
/// that `lowercase(a + b) == lowercase(a) + lowercase(b)`: a word that starts with a keyword
/// still does once both are folded, which the index relies on.
pub fn lowercase(text: &str) -> String {
    text.chars().flat_map(char::to_lowercase).collect()
}

/// The words of a text: its runs of letters and digits.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|word| !word.is_empty())
}

/// Does `text` hold `keyword` (the search's definition of a match, see the module's doc)?
pub fn text_matches(text: &str, keyword: &str, case_sensitive: bool) -> bool {
    Keyword::new(keyword, case_sensitive).is_in(&Classified::new(text, case_sensitive))
}

/// A text folded by [`lowercase`] (unless the search is case-sensitive), and for each of its
/// bytes whether it belongs to a word: whether the character it comes from, as written, is a
/// letter or digit. Folding may turn a letter into a letter and a mark (`İ`), so the folded
/// text's own characters do not say where its words are.
struct Classified<'a> {
    text: std::borrow::Cow<'a, str>,
    in_word: Vec<bool>,
}

impl Classified<'_> {
    fn new(text: &str, case_sensitive: bool) -> Classified<'_> {
        if text.is_ascii() {
            let in_word = text.bytes().map(|byte| byte.is_ascii_alphanumeric()).collect();
            let text = if case_sensitive || !text.bytes().any(|byte| byte.is_ascii_uppercase()) {
                std::borrow::Cow::Borrowed(text)
            } else {
                std::borrow::Cow::Owned(text.to_ascii_lowercase())
            };
            return Classified { text, in_word };
        }
        let mut folded = String::with_capacity(text.len());
        let mut in_word = Vec::with_capacity(text.len());
        for c in text.chars() {
            let before = folded.len();
            if case_sensitive {
                folded.push(c);
            } else {
                folded.extend(c.to_lowercase());
            }
            in_word.resize(folded.len(), c.is_alphanumeric());
            debug_assert!(folded.len() > before);
        }
        Classified { text: std::borrow::Cow::Owned(folded), in_word }
    }

    /// Where the text's words start, in bytes.
    fn word_starts(&self) -> impl Iterator<Item = usize> + '_ {
        let in_word = &self.in_word;
        (0..in_word.len()).filter(move |&at| in_word[at] && (at == 0 || !in_word[at - 1]))
    }
}

/// A search keyword, ready to be looked for (see the module's doc for what matches).
#[derive(Debug, Clone)]
pub struct Keyword {
    /// The keyword as typed, as a [`Classified`] text: folded unless case-sensitive.
    text: String,
    in_word: Vec<bool>,
    /// The bytes of `text` before its first word.
    lead: usize,
    /// Its words, lowercased: what the index is asked for (each is the start of a word of
    /// every text the keyword matches).
    words: Vec<String>,
}

impl Keyword {
    pub fn new(typed: &str, case_sensitive: bool) -> Keyword {
        let Classified { text, in_word } = Classified::new(typed, case_sensitive);
        let lead = in_word.iter().position(|&in_word| in_word).unwrap_or(in_word.len());
        let mut words: Vec<String> = words(typed).map(lowercase).collect();
        words.sort_unstable();
        words.dedup();
        Keyword { text: text.into_owned(), in_word, lead, words }
    }

    /// The keyword's words, lowercased, without repeats; none for a keyword without a letter or
    /// digit, which matches nothing.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// Does the keyword sit in `text` with its first word at the word starting at byte `start`?
    fn is_at(&self, text: &Classified<'_>, start: usize) -> bool {
        let Some(from) = start.checked_sub(self.lead) else { return false };
        let to = from + self.text.len();
        // The same bytes, and a word's bytes on a word's: byte for byte, so the keyword's
        // characters sit on the text's.
        text.text.as_bytes().get(from..to) == Some(self.text.as_bytes()) && text.in_word[from..to] == self.in_word[..]
    }

    fn is_in(&self, text: &Classified<'_>) -> bool {
        !self.words.is_empty() && text.word_starts().any(|start| self.is_at(text, start))
    }

    /// The typed keywords, ready, without those that are the same once folded.
    pub(super) fn all(typed: &[String], case_sensitive: bool) -> Vec<Keyword> {
        let mut keywords: Vec<Keyword> = Vec::with_capacity(typed.len());
        for keyword in typed.iter().map(|keyword| Keyword::new(keyword, case_sensitive)) {
            if !keywords.iter().any(|known| known.text == keyword.text && known.in_word == keyword.in_word) {
                keywords.push(keyword);
            }
        }
        keywords
    }
}

/// `word` as [`lowercase`] folds it, without copying a word that is already lowercase ASCII
/// (most words of most texts) and without a char-by-char fold of an ASCII one; `buffer` holds a
/// folded copy.
fn fold_word<'a>(word: &'a str, buffer: &'a mut String) -> &'a str {
    if !word.is_ascii() {
        buffer.clear();
        buffer.extend(word.chars().flat_map(char::to_lowercase));
        return buffer;
    }
    if !word.bytes().any(|byte| byte.is_ascii_uppercase()) {
        return word;
    }
    buffer.clear();
    buffer.push_str(word);
    buffer.make_ascii_lowercase();
    buffer
}

/// The searchable text of a task: its message, its follow-ups (A2A multi-turn), then its
/// output.
fn searchable_text(task: &TaskRecord) -> String {
    let mut text = task.message.joined_text();
    for follow_up in &task.follow_ups {
        text.push('\n');
        text.push_str(&follow_up.message.joined_text());
    }
    text.push('\n');
    text.push_str(&output_of(task));
    text
}

/// Calls `visit` with each lowercased word of a task's searchable text, repeats included (the
/// index posts a task once per word). Parts are joined with newlines, so no word spans two of
/// them.
pub fn visit_task_words(task: &TaskRecord, mut visit: impl FnMut(&str)) {
    let message = task.message.parts.iter();
    let follow_ups = task.follow_ups.iter().flat_map(|follow_up| follow_up.message.parts.iter());
    let output = task.artifacts.iter().flat_map(|artifact| artifact.parts.iter());
    let mut buffer = String::new();
    for part in message.chain(follow_ups).chain(output) {
        let Part::Text { text } = part else { continue };
        for word in words(text) {
            visit(fold_word(word, &mut buffer));
        }
    }
}

fn output_of(task: &TaskRecord) -> String {
    let texts: Vec<&str> = task
        .artifacts
        .iter()
        .flat_map(|artifact| artifact.parts.iter())
        .filter_map(|part| match part {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n")
}

/// The agent of a record whose task has no owner (or no peer).
const ANONYMOUS: &str = "anonymous";

/// The history records of one task: its owner's side, and for a message that expected no
/// reply (no sender task exists) the sender's side too.
pub fn records_of(task: &TaskRecord) -> Vec<HistoryRecord> {
    let anonymous = || ANONYMOUS.to_string();
    let base = HistoryRecord {
        task_id: task.id.clone(),
        side: String::new(),
        agent: task.owner.clone().unwrap_or_else(anonymous),
        peer: task.peer.clone().unwrap_or_else(anonymous),
        input: task.message.joined_text(),
        output: output_of(task),
        status: task.state,
        priority: task.priority,
        created_ms: task.created_ms,
        updated_ms: task.updated_ms,
    };
    match task.direction {
        Direction::Outgoing => vec![HistoryRecord { side: "sent".into(), ..base }],
        Direction::Incoming if task.sender_task_id.is_none() => vec![
            HistoryRecord { side: "received".into(), ..base.clone() },
            HistoryRecord { side: "sent".into(), agent: base.peer.clone(), peer: base.agent.clone(), ..base },
        ],
        Direction::Incoming => vec![HistoryRecord { side: "received".into(), ..base }],
    }
}

/// A conversation's records, oldest first (a message before its reply; at the same time, the
/// sent side before the received one).
pub(super) fn thread_records(tasks: &[TaskRecord]) -> Vec<HistoryRecord> {
    let mut records: Vec<HistoryRecord> = tasks.iter().flat_map(records_of).collect();
    records.sort_by(|left, right| {
        left.created_ms.cmp(&right.created_ms).then(right.side.cmp(&left.side)).then(left.task_id.cmp(&right.task_id))
    });
    records
}

pub(super) fn newest_first(records: &mut [HistoryRecord]) {
    records.sort_by(|left, right| {
        right.updated_ms.cmp(&left.updated_ms).then(left.task_id.cmp(&right.task_id)).then(left.side.cmp(&right.side))
    });
}

impl Projections<'_> {
    /// The history part of applying an event. Pure, like the rest of `apply`.
    pub(super) fn apply_history(&mut self, envelope: &Envelope) -> Result<(), StoreError> {
        if let Event::HistoryPruned { before_ms, .. } = &envelope.event {
            let current = self.history_meta.get(PRUNED_BEFORE)?.map_or(0, |value| value.value());
            self.history_meta.insert(PRUNED_BEFORE, current.max(*before_ms))?;
        }
        Ok(())
    }
}

/// How several keywords combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logic {
    Or,
    And,
}

impl ReadProjections {
    pub(super) fn pruned_before(&self) -> Result<u64, StoreError> {
        Ok(self.history_meta.get(PRUNED_BEFORE)?.map_or(0, |value| value.value()))
    }

    /// Every history record (optionally of one agent), newest first.
    pub fn history_records(&self, agent: Option<&str>) -> Result<Vec<HistoryRecord>, StoreError> {
        self.newest_history_records(agent, usize::MAX)
    }

    /// The newest `limit` history records (optionally of one agent), newest first, holding
    /// about twice `limit` of them at a time.
    pub fn newest_history_records(&self, agent: Option<&str>, limit: usize) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut newest = Newest::new(limit);
        self.visit_history_records(agent, |record| newest.push([record]))?;
        Ok(newest.into_records())
    }

    /// Calls `visit` with every history record (optionally of one agent) in no particular
    /// order, one task's at a time: what counts the records does not hold them all.
    pub fn visit_history_records(
        &self,
        agent: Option<&str>,
        mut visit: impl FnMut(HistoryRecord),
    ) -> Result<(), StoreError> {
        let cutoff = self.pruned_before()?;
        // A record's agent is its task's owner or peer ("anonymous" for none): only those tasks
        // have their texts read.
        self.visit_tasks(
            |task| {
                task.updated_ms >= cutoff
                    && agent.is_none_or(|agent| {
                        [&task.owner, &task.peer].iter().any(|side| side.as_deref().unwrap_or(ANONYMOUS) == agent)
                    })
            },
            |task| {
                for record in records_of(&task) {
                    if record.updated_ms >= cutoff && agent.is_none_or(|agent| record.agent == agent) {
                        visit(record);
                    }
                }
                Ok(())
            },
        )
    }

    /// The records of the tasks whose id starts with `prefix` and that have records after the
    /// cut-off: of eleven such tasks at most (more only make the prefix ambiguous).
    pub fn history_of_task(&self, prefix: &str) -> Result<Vec<HistoryRecord>, StoreError> {
        let cutoff = self.pruned_before()?;
        let tasks =
            self.tasks_with_prefix_where(prefix, |task| task.updated_ms >= cutoff, 11, usize::MAX)?.unwrap_or_default();
        Ok(tasks.iter().flat_map(records_of).filter(|record| record.updated_ms >= cutoff).collect())
    }

    /// The whole conversation a task belongs to (SPEC §4, seed 004): every task of its context
    /// (a message, its sender's task, the reply that completed them), as history records,
    /// oldest first. Like the other views it leaves out what a cleanup pruned: None when the
    /// task is unknown, pruned (as `history show` answers) or ambiguous among those left. The
    /// definition, by a scan of every task; [`Store::thread_of`](super::Store::thread_of)
    /// answers the same from the index.
    pub fn thread_of(&self, prefix: &str) -> Result<Option<Vec<HistoryRecord>>, StoreError> {
        let cutoff = self.pruned_before()?;
        let Some(task) = self.thread_task(prefix, cutoff)? else { return Ok(None) };
        self.thread_scan(&task.context_id, cutoff).map(Some)
    }

    /// The one task `prefix` names among those after the cut-off (the ones `history show`
    /// finds), if it names exactly one.
    pub(super) fn thread_task(&self, prefix: &str, cutoff: u64) -> Result<Option<TaskRecord>, StoreError> {
        let candidates =
            self.tasks_with_prefix_where(prefix, |task| task.updated_ms >= cutoff, 2, usize::MAX)?.unwrap_or_default();
        let Ok([task]) = <[TaskRecord; 1]>::try_from(candidates) else { return Ok(None) };
        Ok(Some(task))
    }

    /// The records of a conversation's tasks last updated at `cutoff` or later, oldest first,
    /// by a scan of every task (the texts of the conversation's only are read).
    pub(super) fn thread_scan(&self, context: &str, cutoff: u64) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut tasks = Vec::new();
        self.visit_tasks(
            |task| task.context_id == context && task.updated_ms >= cutoff,
            |task| {
                tasks.push(task);
                Ok(())
            },
        )?;
        Ok(thread_records(&tasks))
    }

    /// Records matching the keywords (see the module's doc), newest first, at most `limit`: the
    /// definition of a search, by a scan of every task.
    pub fn search_history(
        &self,
        keywords: &[String],
        logic: Logic,
        case_sensitive: bool,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let keywords = Keyword::all(keywords, case_sensitive);
        let query = Query { keywords: &keywords, logic, case_sensitive, agent, limit };
        let cutoff = self.pruned_before()?;
        let mut newest = Newest::new(limit);
        self.visit_tasks(
            |_| true,
            |task| {
                newest.push(query.records_of(&task, cutoff));
                Ok(())
            },
        )?;
        Ok(newest.into_records())
    }
}

/// The newest `limit` of the records pushed, holding at most about twice that many.
struct Newest {
    limit: usize,
    records: Vec<HistoryRecord>,
}

impl Newest {
    fn new(limit: usize) -> Newest {
        Newest { limit, records: Vec::new() }
    }

    fn push(&mut self, records: impl IntoIterator<Item = HistoryRecord>) {
        self.records.extend(records);
        if self.records.len() >= self.limit.saturating_mul(2).max(1024) {
            newest_first(&mut self.records);
            self.records.truncate(self.limit);
        }
    }

    fn into_records(mut self) -> Vec<HistoryRecord> {
        newest_first(&mut self.records);
        self.records.truncate(self.limit);
        self.records
    }
}

/// What a search asks for (see [`ReadProjections::search_history`]).
#[derive(Clone, Copy)]
pub(super) struct Query<'a> {
    pub keywords: &'a [Keyword],
    pub logic: Logic,
    pub case_sensitive: bool,
    pub agent: Option<&'a str>,
    pub limit: usize,
}

impl Query<'_> {
    /// The records of one task that the search keeps (not pruned, of the agent, matching the
    /// keywords).
    pub(super) fn records_of(&self, task: &TaskRecord, cutoff: u64) -> Vec<HistoryRecord> {
        let mut records = records_of(task);
        records.retain(|record| record.updated_ms >= cutoff && self.agent.is_none_or(|agent| record.agent == agent));
        if records.is_empty() {
            return records;
        }
        // No keyword: nothing for OR, everything for AND (`history list`), without reading
        // the text.
        let matched =
            if self.keywords.is_empty() { self.logic == Logic::And } else { self.text_matches(&searchable_text(task)) };
        if !matched {
            records.clear();
        }
        records
    }

    /// Does `text` match the keywords by the query's logic? Every keyword is looked for in the
    /// same pass over the text's word starts: a long text is read once, not once per keyword.
    fn text_matches(&self, text: &str) -> bool {
        // A keyword without a word matches nothing.
        let mut unfound: Vec<&Keyword> = self.keywords.iter().filter(|keyword| !keyword.words.is_empty()).collect();
        if unfound.is_empty() || self.logic == Logic::And && unfound.len() < self.keywords.len() {
            return false;
        }
        let text = Classified::new(text, self.case_sensitive);
        for start in text.word_starts() {
            let before = unfound.len();
            unfound.retain(|keyword| !keyword.is_at(&text, start));
            if unfound.len() < before && (self.logic == Logic::Or || unfound.is_empty()) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::TaskState;
    use crate::store::Store;

    #[test]
    fn a_word_folds_as_lowercase_folds_it_with_or_without_a_copy() {
        let mut buffer = String::new();
        for word in ["already", "Mixed", "UPPER", "x9Z", "Straße", "ΟΔΟΣ", "İstanbul", "ǅemal", "Σ", "ÀB"] {
            assert_eq!(fold_word(word, &mut buffer), lowercase(word), "{word}");
        }
        // The buffer of a word folded earlier is never taken for the next one.
        assert_eq!(fold_word("ABC", &mut buffer), "abc");
        assert_eq!(fold_word("def", &mut buffer), "def");
        assert!(text_matches("the Quick BROWN fox", "brown", false));
        assert!(!text_matches("the Quick BROWN fox", "brown", true));
        assert!(text_matches("ΟΔΟΣ ahead", "οδο", false));
    }

    fn sent(task: usize, from: &str, to: &str, text: &str, response: bool) -> Vec<Event> {
        let id = format!("{task:08x}-0000-4000-8000-000000000000");
        let sender_task = response.then(|| format!("{task:08x}-1111-4000-8000-000000000000"));
        let mut events = Vec::new();
        if let Some(sender_task) = &sender_task {
            events.push(Event::TaskCreated {
                task_id: sender_task.clone(),
                owner: Some(from.into()),
                context_id: "c".into(),
                direction: Direction::Outgoing,
                peer: Some(to.into()),
                state: TaskState::Working,
                message: crate::event::Message::text(crate::event::Role::User, text),
                priority: 3,
                response_expected: true,
                sender_task_id: None,
                in_reply_to: None,
                peer_task_id: Some(id.clone()),
                message_in: None,
            });
        }
        events.push(Event::TaskCreated {
            task_id: id,
            owner: Some(to.into()),
            context_id: "c".into(),
            direction: Direction::Incoming,
            peer: Some(from.into()),
            state: TaskState::Submitted,
            message: crate::event::Message::text(crate::event::Role::User, text),
            priority: 3,
            response_expected: response,
            sender_task_id: sender_task,
            in_reply_to: None,
            peer_task_id: None,
            message_in: None,
        });
        events
    }

    #[test]
    fn each_message_is_seen_from_both_sides_and_prune_hides_old_records() {
        let store = Store::open_with_backend(redb::backends::InMemoryBackend::new()).unwrap();
        store.transact(1, |appender| appender.append(None, sent(1, "alice", "bob", "Hello there", true))).unwrap();
        store.transact(2, |appender| appender.append(None, sent(2, "alice", "bob", "fyi only", false))).unwrap();
        let all = store.read(|view| view.history_records(None)).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(store.read(|view| view.history_records(Some("alice"))).unwrap().len(), 2);
        assert!(all.iter().filter(|r| r.side == "sent").all(|r| r.agent == "alice" && r.peer == "bob"));
        let found = store.read(|view| view.search_history(&["HELL".into()], Logic::Or, false, None, 10)).unwrap();
        assert_eq!(found.len(), 2);
        assert!(
            store.read(|view| view.search_history(&["HELL".into()], Logic::Or, true, None, 10)).unwrap().is_empty()
        );
        store
            .transact(5, |appender| {
                appender.append(None, vec![Event::HistoryPruned { before_ms: 2, max_size_mb: None }])
            })
            .unwrap();
        assert_eq!(store.read(|view| view.history_records(None)).unwrap().len(), 2, "records of time 1 are gone");
        assert!(store.verify().unwrap().differences.is_empty());
    }

    #[test]
    fn the_newest_records_are_kept_while_few_are_held() {
        let record = |n: u64| HistoryRecord {
            task_id: format!("{n:08}"),
            side: "sent".into(),
            agent: "alice".into(),
            peer: "bob".into(),
            input: String::new(),
            output: String::new(),
            status: TaskState::Completed,
            priority: 3,
            created_ms: 0,
            // Times repeat, and come in no order.
            updated_ms: (n * 7919) % 1000,
        };
        let mut all: Vec<HistoryRecord> = (0..5000).map(record).collect();
        newest_first(&mut all);
        for limit in [0, 1, 10, 700, 4999, 5000, 6000] {
            let mut newest = Newest::new(limit);
            for n in 0..5000 {
                newest.push([record(n)]);
                assert!(newest.records.len() <= limit.saturating_mul(2).max(1024));
            }
            let kept = newest.into_records();
            assert_eq!(kept, all[..limit.min(5000)], "limit {limit}");
        }
    }

    #[test]
    fn words_match_by_prefix_and_case_rules() {
        assert!(text_matches("The Parser, carefully", "pars", false));
        assert!(!text_matches("The Parser, carefully", "pars", true));
        assert!(text_matches("The Parser, carefully", "Pars", true));
        assert!(!text_matches("reparse", "pars", false), "prefixes of words, not substrings");
    }

    #[test]
    fn keywords_with_punctuation_and_spaces_match_as_typed_from_a_word_start() {
        let text = "Mail user@example.com about foo-bar, C++ and the hello parser (x.rs)";
        for keyword in
            ["user@example.com", "USER@EX", "foo-bar", "foo-ba", "C++", "c++ and", "hello parser", ".rs)", "@example"]
        {
            assert!(text_matches(text, keyword, false), "{keyword}");
        }
        for keyword in ["foo bar", "foo--bar", "ser@example", "hello  parser", "C+++", "example.org", "--", ""] {
            assert!(!text_matches(text, keyword, false), "{keyword}");
        }
        assert!(text_matches(text, "C++", true));
        assert!(!text_matches(text, "c++", true));
        // Folding İ gives a letter and a mark: the mark is still part of the word.
        assert!(text_matches("İstanbul", "İst", false));
        assert!(!text_matches("İstanbul", "i\u{307}st", false), "a letter and a mark typed apart are two words");
        let keyword = Keyword::new("Foo-bar, foo!", false);
        assert_eq!(keyword.words(), ["bar", "foo"]);
        assert!(Keyword::new("--", false).words().is_empty());
        let typed = ["Foo".to_string(), "foo".into(), "FOO".into(), "foo".into()];
        assert_eq!(Keyword::all(&typed, false).len(), 1, "the same once folded");
        assert_eq!(Keyword::all(&typed, true).len(), 3);
    }
}
