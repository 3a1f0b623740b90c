//! `/history...`: the history views (SPEC §4).

use super::error::answer;
use super::extract::{Path, parse_body, parse_query};
use super::{ApiError, ApiResult, AppState, long_read};
use crate::api;
use crate::broker::command::{Command, Outcome};
use crate::event::{Event, TaskState};
use crate::store::history::{HistoryRecord, Logic};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::routing::{get, post};
use serde::Deserialize;
use std::collections::BTreeMap;

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/history", get(list))
        .route("/history/search", get(search))
        .route("/history/stats", get(stats))
        .route("/history/cleanup", post(cleanup))
        .route("/history/{id}", get(show))
        .route("/threads/{id}", get(thread))
}

const MAX_LIMIT: usize = 1_000_000;

fn limit(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(limit) if (1..=MAX_LIMIT).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::bad(format!("limit must be between 1 and {MAX_LIMIT} (got {limit})"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

async fn list(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let query: ListQuery = parse_query(uri.query())?;
    let limit = limit(query.limit, 50)?;
    let agent = super::extract::agent_filter(&state, query.agent)?;
    long_read(&state, move |store| {
        answer(&api::HistoryRecords { records: store.recent_history(agent.as_deref(), limit)? })
    })
    .await
}

async fn show(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let reference = crate::broker::command::validate_task_ref(&id)?;
    // A short prefix may name many tasks.
    long_read(&state, move |store| {
        let records = store.read(|view| view.history_of_task(&reference))?;
        let tasks: std::collections::BTreeSet<&str> = records.iter().map(|record| record.task_id.as_str()).collect();
        match tasks.len() {
            0 => Err(ApiError::not_found(format!("Task {reference} not found in the history"))),
            1 => answer(&api::HistoryRecords { records }),
            // Eleven at most are read (`history_of_task`).
            count => {
                let candidates = tasks.iter().take(10).map(|task| task.to_string()).collect();
                let count = if count > 10 { "more than 10".to_string() } else { count.to_string() };
                Err(ApiError::bad(format!("Ambiguous task id '{reference}': {count} tasks start with it"))
                    .with_candidates(candidates))
            }
        }
    })
    .await
}

/// `GET /threads/{id}`: the conversation the task belongs to, oldest first.
async fn thread(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let reference = crate::broker::command::validate_task_ref(&id)?;
    // From the history index; by a scan of every task while the indexer is far behind.
    long_read(&state, move |store| {
        let records = store.thread_of(&reference)?.ok_or_else(|| {
            ApiError::not_found(format!("Task {reference} not found in the history (or the prefix is ambiguous)"))
        })?;
        answer(&api::HistoryRecords { records })
    })
    .await
}

/// `GET /history/search`'s query. The keywords come as `keyword`, repeated, each one whole
/// (commas and spaces included: what the CLI sends), or as `q`, split on commas (the first
/// form, kept for the callers that use it); both may be given.
#[derive(Default)]
struct SearchQuery {
    keywords: Vec<String>,
    logic: Option<String>,
    case_sensitive: Option<bool>,
    agent: Option<String>,
    limit: Option<usize>,
}

impl SearchQuery {
    fn parse(query: Option<&str>) -> Result<SearchQuery, ApiError> {
        // serde's query form has no repeated parameter: the pairs are read one by one.
        let pairs: Vec<(String, String)> = parse_query(query)?;
        let mut search = SearchQuery::default();
        for (name, value) in pairs {
            let invalid = |what: &str| ApiError::bad(format!("invalid query: {what}"));
            let once = |is_set: bool| if is_set { Err(invalid(&format!("duplicate field `{name}`"))) } else { Ok(()) };
            match name.as_str() {
                "keyword" => search.keywords.push(value),
                "q" => search.keywords.extend(value.split(',').map(str::to_string)),
                "logic" => {
                    once(search.logic.is_some())?;
                    search.logic = Some(value);
                }
                "case_sensitive" => {
                    once(search.case_sensitive.is_some())?;
                    let flag = value.parse().map_err(|_| invalid("case_sensitive must be true or false"))?;
                    search.case_sensitive = Some(flag);
                }
                "agent" => {
                    once(search.agent.is_some())?;
                    search.agent = Some(value);
                }
                "limit" => {
                    once(search.limit.is_some())?;
                    search.limit = Some(value.parse().map_err(|_| invalid("limit must be a whole number"))?);
                }
                other => {
                    return Err(invalid(&format!(
                        "unknown field `{other}`, expected one of `keyword`, `q`, `logic`, `case_sensitive`, \
                         `agent`, `limit`"
                    )));
                }
            }
        }
        Ok(search)
    }
}

/// The most keywords of one search, once repeats are left out: every candidate's text is
/// checked against each of them.
const MAX_SEARCH_KEYWORDS: usize = 32;
/// The longest keyword, in bytes.
const MAX_KEYWORD_BYTES: usize = 256;

/// The keywords of a search, trimmed, without repeats, checked: a bounded number of bounded
/// length (what a search costs grows with both), each with a letter or digit, since a search
/// finds words (see `store::history`).
fn search_keywords(typed: Vec<String>) -> Result<Vec<String>, ApiError> {
    let mut keywords: Vec<String> = Vec::new();
    for keyword in typed.iter().map(|keyword| keyword.trim()).filter(|keyword| !keyword.is_empty()) {
        if !keywords.iter().any(|known| known == keyword) {
            keywords.push(keyword.to_string());
        }
    }
    if keywords.is_empty() {
        return Err(ApiError::bad("give at least one keyword"));
    }
    if keywords.len() > MAX_SEARCH_KEYWORDS {
        return Err(ApiError::bad(format!(
            "too many keywords: a search takes at most {MAX_SEARCH_KEYWORDS} (got {} different ones)",
            keywords.len()
        )));
    }
    if let Some(keyword) = keywords.iter().find(|keyword| keyword.len() > MAX_KEYWORD_BYTES) {
        return Err(ApiError::bad(format!(
            "a keyword is at most {MAX_KEYWORD_BYTES} bytes long (got one of {} bytes)",
            keyword.len()
        )));
    }
    if let Some(keyword) = keywords.iter().find(|keyword| !keyword.chars().any(char::is_alphanumeric)) {
        return Err(ApiError::bad(format!(
            "keyword '{keyword}' has no letter or digit: a search finds words, so give each keyword at least one"
        )));
    }
    Ok(keywords)
}

async fn search(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let query = SearchQuery::parse(uri.query())?;
    let keywords = search_keywords(query.keywords)?;
    let logic = match query.logic.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("OR") => Logic::Or,
        Some("AND") => Logic::And,
        Some(other) => return Err(ApiError::bad(format!("logic must be OR or AND (got '{other}')"))),
    };
    let limit = limit(query.limit, 50)?;
    let case_sensitive = query.case_sensitive.unwrap_or(false);
    let agent = super::extract::agent_filter(&state, query.agent)?;
    long_read(&state, move |store| {
        answer(&api::HistoryRecords {
            records: store.search_history(&keywords, logic, case_sensitive, agent.as_deref(), limit)?,
        })
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsQuery {
    #[serde(default)]
    agent: Option<String>,
}

async fn stats(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let query: StatsQuery = parse_query(uri.query())?;
    let agent = super::extract::agent_filter(&state, query.agent)?;
    long_read(&state, move |store| {
        let mut stats = Stats::default();
        store.read(|view| view.visit_history_records(agent.as_deref(), |record| stats.count(&record)))?;
        stats.answer()
    })
    .await
}

/// What `history stats` counts, one record at a time.
#[derive(Default)]
struct Stats {
    total: usize,
    by_status: BTreeMap<String, usize>,
    by_agent: BTreeMap<String, BTreeMap<String, usize>>,
    text_bytes: usize,
    completed: usize,
    failed: usize,
    first: Option<u64>,
    last: Option<u64>,
}

impl Stats {
    fn count(&mut self, record: &HistoryRecord) {
        self.total += 1;
        *self.by_status.entry(record.status.to_string()).or_default() += 1;
        *self.by_agent.entry(record.agent.clone()).or_default().entry(record.side.clone()).or_default() += 1;
        self.text_bytes += record.input.len() + record.output.len();
        self.completed += usize::from(record.status == TaskState::Completed);
        self.failed += usize::from(record.status == TaskState::Failed);
        self.first = Some(self.first.map_or(record.created_ms, |first| first.min(record.created_ms)));
        self.last = Some(self.last.map_or(record.updated_ms, |last| last.max(record.updated_ms)));
    }

    fn answer(self) -> ApiResult {
        let Stats { total, by_status, by_agent, text_bytes: size, completed, failed, first, last } = self;
        let success_rate = (completed + failed > 0).then(|| completed as f64 / (completed + failed) as f64);
        answer(&api::HistoryStats {
            total,
            by_status,
            success_rate,
            by_agent,
            first: first.map(crate::time::rfc3339),
            last: last.map(crate::time::rfc3339),
            text_bytes: size,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CleanupBody {
    #[serde(default)]
    days: Option<i64>,
    #[serde(default)]
    max_size_mb: Option<i64>,
    #[serde(default)]
    dry_run: bool,
}

/// Records last updated before a cut-off leave the view: `days` ago, or the oldest ones beyond
/// `max_size_mb` of text (newest kept first). Appends one prune event unless `dry_run`.
async fn cleanup(
    State(state): State<AppState>,
    _user: super::caller::TheUser,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: CleanupBody = parse_body(body)?;
    let now = crate::time::now_ms();
    // The cut-off by age is known now; by size, once the records are read.
    let (by_age, budget) = match (body.days, body.max_size_mb) {
        (Some(days), None) if days > 0 => {
            (Some(now.saturating_sub(u64::try_from(days).unwrap_or(0).saturating_mul(86_400_000))), 0)
        }
        (None, Some(mb)) if mb > 0 => (None, u64::try_from(mb).unwrap_or(0).saturating_mul(1 << 20)),
        (Some(_), Some(_)) => return Err(ApiError::bad("give --days or --max-size, not both")),
        (None, None) => return Err(ApiError::bad("give --days N or --max-size MB")),
        _ => return Err(ApiError::bad("--days and --max-size must be positive")),
    };
    let (before_ms, removed) = long_read(&state, move |store| {
        if let Some(before_ms) = by_age {
            let mut removed = 0;
            store.read(|view| {
                view.visit_history_records(None, |record| removed += usize::from(record.updated_ms < before_ms))
            })?;
            return Ok((before_ms, removed));
        }
        // By size, the newest records are kept while their text fits the budget. Per time of
        // last update: how many records, and how many bytes of text.
        let mut by_time: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
        store.read(|view| {
            view.visit_history_records(None, |record| {
                let (count, bytes) = by_time.entry(record.updated_ms).or_default();
                *count += 1;
                *bytes += (record.input.len() + record.output.len()) as u64;
            })
        })?;
        let mut used = 0u64;
        let newest_removed = by_time.iter().rev().find(|(_, (_, bytes))| {
            used += bytes;
            used > budget
        });
        let before_ms = newest_removed.map_or(0, |(&updated_ms, _)| updated_ms + 1);
        Ok((before_ms, by_time.range(..before_ms).map(|(_, &(count, _))| count).sum::<usize>()))
    })
    .await?;
    if body.dry_run || removed == 0 {
        return answer(&api::HistoryCleanupAnswer {
            would_remove: Some(removed),
            removed: 0,
            before: crate::time::rfc3339(before_ms),
        });
    }
    let event = Event::HistoryPruned { before_ms, max_size_mb: body.max_size_mb.and_then(|mb| u64::try_from(mb).ok()) };
    match state.writer.submit(Command::Prune(event)).await? {
        Outcome::Appended { .. } => {}
        _ => return Err(ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "unexpected answer")),
    }
    answer(&api::HistoryCleanupAnswer { would_remove: None, removed, before: crate::time::rfc3339(before_ms) })
}
