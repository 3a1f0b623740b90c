//! `/history...`: the history views (SPEC §4).

use super::error::answer;
use super::extract::{parse_body, parse_query};
use super::{ApiError, ApiResult, AppState, long_read};
use crate::api;
use crate::broker::command::{Command, Outcome};
use crate::event::{Event, TaskState};
use crate::store::history::{HistoryRecord, Logic};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
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
            _ => {
                let candidates = tasks.iter().map(|task| task.to_string()).collect();
                Err(ApiError::bad(format!("Ambiguous task id '{reference}': {} tasks start with it", tasks.len()))
                    .with_candidates(candidates))
            }
        }
    })
    .await
}

/// `GET /threads/{id}`: the conversation the task belongs to, oldest first.
async fn thread(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let reference = crate::broker::command::validate_task_ref(&id)?;
    // Finding a conversation's tasks reads every task.
    long_read(&state, move |store| {
        let records = store
            .read(|view| view.thread_of(&reference))?
            .ok_or_else(|| ApiError::not_found(format!("Task {reference} not found (or the prefix is ambiguous)")))?;
        answer(&api::HistoryRecords { records })
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchQuery {
    /// Keywords, comma-separated.
    q: String,
    #[serde(default)]
    logic: Option<String>,
    #[serde(default)]
    case_sensitive: Option<bool>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

async fn search(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let query: SearchQuery = parse_query(uri.query())?;
    let keywords: Vec<String> =
        query.q.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_string).collect();
    if keywords.is_empty() {
        return Err(ApiError::bad("give at least one keyword"));
    }
    let logic = match query.logic.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("OR") => Logic::Or,
        Some("AND") => Logic::And,
        Some(other) => return Err(ApiError::bad(format!("logic must be OR or AND (got '{other}')"))),
    };
    let limit = limit(query.limit, 50)?;
    let case_sensitive = query.case_sensitive.unwrap_or(false);
    let agent = super::extract::agent_filter(&state, query.agent.clone())?;
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
    long_read(&state, move |store| stats_of(&store.read(|view| view.history_records(agent.as_deref()))?)).await
}

fn stats_of(records: &[HistoryRecord]) -> ApiResult {
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_agent: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let mut size = 0usize;
    for record in records {
        *by_status.entry(record.status.to_string()).or_default() += 1;
        *by_agent.entry(record.agent.clone()).or_default().entry(record.side.clone()).or_default() += 1;
        size += record.input.len() + record.output.len();
    }
    let completed = records.iter().filter(|r| r.status == TaskState::Completed).count();
    let failed = records.iter().filter(|r| r.status == TaskState::Failed).count();
    let success_rate = (completed + failed > 0).then(|| completed as f64 / (completed + failed) as f64);
    let first = records.iter().map(|r| r.created_ms).min();
    let last = records.iter().map(|r| r.updated_ms).max();
    answer(&api::HistoryStats {
        total: records.len(),
        by_status,
        success_rate,
        by_agent,
        first: first.map(crate::time::rfc3339),
        last: last.map(crate::time::rfc3339),
        text_bytes: size,
    })
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
        let records = store.read(|view| view.history_records(None))?;
        let before_ms = by_age.unwrap_or_else(|| {
            let mut used = 0u64;
            for record in &records {
                used += (record.input.len() + record.output.len()) as u64;
                if used > budget {
                    return record.updated_ms + 1;
                }
            }
            0
        });
        Ok((before_ms, records.iter().filter(|record| record.updated_ms < before_ms).count()))
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
