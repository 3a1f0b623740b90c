//! The history projection (SPEC §4): one record per task and side (what an agent sent, what it
//! received), with a word index so that searching a million records does not decode them all.
//!
//! Search matches words by prefix: a keyword matches a record when a word of its input or
//! output starts with it (case-insensitive unless asked otherwise). The index holds lowercase
//! words; a case-sensitive search checks its candidates' text.

use super::StoreError;
use super::projection::{Projections, ReadProjections};
use super::records;
use crate::event::{Envelope, Event, TaskState};
use redb::ReadableTable;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

pub const SIDE_RECEIVED: u8 = 0;
pub const SIDE_SENT: u8 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRecord {
    pub task_id: String,
    /// "sent" or "received".
    pub side: String,
    pub agent: String,
    pub peer: String,
    pub input: String,
    #[serde(default)]
    pub output: String,
    pub status: TaskState,
    pub priority: u8,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// Lowercase words of `text` (letters and digits), at most 64 bytes each.
pub fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty() && word.len() <= 64)
        .map(str::to_lowercase)
        .collect()
}

/// Does `text` have a word starting with `keyword` (the search's definition of a match)?
pub fn text_matches(text: &str, keyword: &str, case_sensitive: bool) -> bool {
    text.split(|c: char| !c.is_alphanumeric()).filter(|word| !word.is_empty()).any(|word| {
        if case_sensitive {
            word.starts_with(keyword)
        } else {
            word.to_lowercase().starts_with(&keyword.to_lowercase())
        }
    })
}

fn side_name(side: u8) -> &'static str {
    if side == SIDE_SENT { "sent" } else { "received" }
}

impl Projections<'_> {
    fn history_record(&self, task_id: &str, side: u8) -> Result<Option<HistoryRecord>, StoreError> {
        self.history.get((task_id, side))?.map(|row| records::decode(row.value())).transpose()
    }

    fn put_history(&mut self, record: &HistoryRecord, side: u8, new_text: &str) -> Result<(), StoreError> {
        self.history.insert((record.task_id.as_str(), side), records::encode(record).as_slice())?;
        for word in words(new_text) {
            self.history_words.insert((word.as_str(), record.task_id.as_str(), side), [].as_slice())?;
        }
        Ok(())
    }

    fn remove_history(&mut self, record: &HistoryRecord, side: u8) -> Result<(), StoreError> {
        self.history.remove((record.task_id.as_str(), side))?;
        for word in words(&record.input).union(&words(&record.output)) {
            self.history_words.remove((word.as_str(), record.task_id.as_str(), side))?;
        }
        Ok(())
    }

    /// The history part of applying an event. Pure, like the rest of `apply`.
    pub(super) fn apply_history(&mut self, envelope: &Envelope) -> Result<(), StoreError> {
        let time_ms = envelope.time_ms;
        match &envelope.event {
            Event::MessageSent { task_id, from, to, priority, sender_task_id, text, .. } => {
                let sender = from.clone().unwrap_or_else(|| "anonymous".to_string());
                let received = HistoryRecord {
                    task_id: task_id.clone(),
                    side: side_name(SIDE_RECEIVED).into(),
                    agent: to.clone(),
                    peer: sender.clone(),
                    input: text.clone(),
                    output: String::new(),
                    status: TaskState::Submitted,
                    priority: *priority,
                    created_ms: time_ms,
                    updated_ms: time_ms,
                };
                self.put_history(&received, SIDE_RECEIVED, text)?;
                let sent = HistoryRecord {
                    task_id: sender_task_id.clone().unwrap_or_else(|| task_id.clone()),
                    side: side_name(SIDE_SENT).into(),
                    agent: sender,
                    peer: to.clone(),
                    status: if sender_task_id.is_some() { TaskState::Working } else { TaskState::Submitted },
                    ..received
                };
                self.put_history(&sent, SIDE_SENT, text)?;
            }
            Event::TaskStateChanged { task_id, state, artifacts, .. } => {
                let added: Vec<String> = artifacts
                    .iter()
                    .flat_map(|artifact| artifact.parts.iter())
                    .filter_map(|part| match part {
                        crate::event::Part::Text { text } => Some(text.clone()),
                        _ => None,
                    })
                    .collect();
                let added = added.join("\n");
                for side in [SIDE_RECEIVED, SIDE_SENT] {
                    if let Some(mut record) = self.history_record(task_id, side)? {
                        record.status = *state;
                        if !added.is_empty() {
                            if !record.output.is_empty() {
                                record.output.push('\n');
                            }
                            record.output.push_str(&added);
                        }
                        record.updated_ms = time_ms;
                        self.put_history(&record, side, &added)?;
                    }
                }
            }
            Event::TaskCanceled { task_id, .. } => {
                for side in [SIDE_RECEIVED, SIDE_SENT] {
                    if let Some(mut record) = self.history_record(task_id, side)? {
                        record.status = TaskState::Canceled;
                        record.updated_ms = time_ms;
                        self.put_history(&record, side, "")?;
                    }
                }
            }
            Event::HistoryPruned { before_ms, .. } => {
                let mut old = Vec::new();
                for row in self.history.iter()? {
                    let (key, value) = row?;
                    let record: HistoryRecord = records::decode(value.value())?;
                    if record.updated_ms < *before_ms {
                        old.push((record, key.value().1));
                    }
                }
                for (record, side) in old {
                    self.remove_history(&record, side)?;
                }
            }
            _ => {}
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
    /// Every history record (optionally of one agent), newest first.
    pub fn history_records(&self, agent: Option<&str>) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut found = Vec::new();
        for row in self.history.iter()? {
            let (_, value) = row?;
            let record: HistoryRecord = records::decode(value.value())?;
            if agent.is_none_or(|agent| record.agent == agent) {
                found.push(record);
            }
        }
        found.sort_by(|left, right| right.updated_ms.cmp(&left.updated_ms).then(left.task_id.cmp(&right.task_id)));
        Ok(found)
    }

    /// The records of tasks whose id starts with `prefix`.
    pub fn history_of_task(&self, prefix: &str) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut found = Vec::new();
        for row in self.history.range((prefix, 0u8)..)? {
            let (key, value) = row?;
            if !key.value().0.starts_with(prefix) {
                break;
            }
            found.push(records::decode(value.value())?);
        }
        Ok(found)
    }

    /// Records matching the keywords (word prefixes), newest first, at most `limit`.
    pub fn search_history(
        &self,
        keywords: &[String],
        logic: Logic,
        case_sensitive: bool,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut combined: Option<BTreeSet<(String, u8)>> = None;
        for keyword in keywords {
            let lowered = keyword.to_lowercase();
            let mut keys = BTreeSet::new();
            for row in self.history_words.range((lowered.as_str(), "", 0u8)..)? {
                let (key, _) = row?;
                let (word, task_id, side) = key.value();
                if !word.starts_with(&lowered) {
                    break;
                }
                keys.insert((task_id.to_string(), side));
            }
            combined = Some(match (combined, logic) {
                (None, _) => keys,
                (Some(previous), Logic::Or) => previous.union(&keys).cloned().collect(),
                (Some(previous), Logic::And) => previous.intersection(&keys).cloned().collect(),
            });
        }
        let mut found = Vec::new();
        for (task_id, side) in combined.unwrap_or_default() {
            let Some(row) = self.history.get((task_id.as_str(), side))? else { continue };
            let record: HistoryRecord = records::decode(row.value())?;
            if agent.is_some_and(|agent| record.agent != agent) {
                continue;
            }
            if case_sensitive {
                let text = format!("{}\n{}", record.input, record.output);
                let hits = keywords.iter().filter(|keyword| text_matches(&text, keyword, true)).count();
                let ok = match logic {
                    Logic::Or => hits > 0,
                    Logic::And => hits == keywords.len(),
                };
                if !ok {
                    continue;
                }
            }
            found.push(record);
        }
        found.sort_by(|left, right| right.updated_ms.cmp(&left.updated_ms).then(left.task_id.cmp(&right.task_id)));
        found.truncate(limit);
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use proptest::prelude::*;

    const VOCABULARY: [&str; 8] = ["Alpha", "beta", "gamma", "Delta", "alphabet", "BETAMAX", "zeta", "eta"];

    fn sent(task: usize, from: &str, to: &str, text: String) -> Event {
        Event::MessageSent {
            task_id: format!("{task:08x}-0000-4000-8000-000000000000"),
            from: Some(from.into()),
            to: to.into(),
            priority: 3,
            response_expected: false,
            sender_task_id: None,
            in_reply_to: None,
            text,
            parts: Vec::new(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn indexed_search_finds_exactly_what_a_naive_filter_finds(
            messages in prop::collection::vec((prop::collection::vec(0..VOCABULARY.len(), 1..5), any::<bool>()), 1..30),
            keywords in prop::collection::vec((0..VOCABULARY.len(), 1..5usize), 1..3),
            and in any::<bool>(),
            case_sensitive in any::<bool>(),
        ) {
            let store = Store::open_with_backend(redb::backends::InMemoryBackend::new()).unwrap();
            let events: Vec<Event> = messages
                .iter()
                .enumerate()
                .map(|(index, (words, to_bob))| {
                    let text = words.iter().map(|w| VOCABULARY[*w]).collect::<Vec<_>>().join(" ");
                    sent(index, "alice", if *to_bob { "bob" } else { "carol" }, text)
                })
                .collect();
            store.transact(1, |appender| appender.append(None, events)).unwrap();
            // Keywords are prefixes of vocabulary words, in varied case.
            let keywords: Vec<String> = keywords
                .iter()
                .map(|(word, length)| VOCABULARY[*word].chars().take(*length).collect())
                .collect();
            let logic = if and { Logic::And } else { Logic::Or };
            let found = store
                .read(|view| view.search_history(&keywords, logic, case_sensitive, Some("bob"), usize::MAX))
                .unwrap();
            let all = store.read(|view| view.history_records(Some("bob"))).unwrap();
            let naive: Vec<&HistoryRecord> = all
                .iter()
                .filter(|record| {
                    let text = format!("{}\n{}", record.input, record.output);
                    let hits = keywords.iter().filter(|k| text_matches(&text, k, case_sensitive)).count();
                    if and { hits == keywords.len() } else { hits > 0 }
                })
                .collect();
            let found_ids: Vec<&str> = found.iter().map(|r| r.task_id.as_str()).collect();
            let naive_ids: Vec<&str> = naive.iter().map(|r| r.task_id.as_str()).collect();
            prop_assert_eq!(found_ids, naive_ids);
        }
    }

    #[test]
    fn each_message_gives_a_sent_and_a_received_record_that_follow_the_task() {
        let store = Store::open_with_backend(redb::backends::InMemoryBackend::new()).unwrap();
        store
            .transact(1, |appender| appender.append(None, vec![sent(1, "alice", "bob", "Hello there".into())]))
            .unwrap();
        let task = format!("{:08x}-0000-4000-8000-000000000000", 1);
        store
            .transact(2, |appender| {
                appender.append(
                    None,
                    vec![Event::TaskStateChanged {
                        task_id: task.clone(),
                        state: TaskState::Completed,
                        artifacts: vec![crate::event::Artifact::text("General Kenobi")],
                        error: None,
                    }],
                )
            })
            .unwrap();
        let records = store.read(|view| view.history_of_task(&task[..8])).unwrap();
        assert_eq!(records.len(), 2);
        assert!(records.iter().all(|r| r.status == TaskState::Completed && r.output == "General Kenobi"));
        let found = store.read(|view| view.search_history(&["kenobi".into()], Logic::Or, false, None, 10)).unwrap();
        assert_eq!(found.len(), 2, "output words are indexed too");
        store
            .transact(3, |appender| {
                appender.append(None, vec![Event::HistoryPruned { before_ms: 3, max_size_mb: None }])
            })
            .unwrap();
        assert!(store.read(|view| view.history_records(None)).unwrap().is_empty());
        assert!(
            store.read(|view| view.search_history(&["hello".into()], Logic::Or, false, None, 10)).unwrap().is_empty()
        );
        assert!(store.verify().unwrap().differences.is_empty());
    }
}
