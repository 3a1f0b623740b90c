//! `/file-safety/...`: locks, modification records, checks (SPEC §5).

use super::caller::Caller;
use super::error::answer;
use super::extract::{parse_body, parse_query};
use super::{ApiError, ApiResult, AppState};
use crate::api;
use crate::broker::command::{Command, CommandError, Outcome};
use crate::broker::file_safety::{self, FileCommand, LOCK_DEFAULT_DURATION_SECONDS};
use crate::event::ChangeType;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use std::time::Duration;

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/file-safety/status", get(status))
        .route("/file-safety/locks", get(locks))
        .route("/file-safety/lock", post(lock))
        .route("/file-safety/unlock", post(unlock))
        .route("/file-safety/history", get(history))
        .route("/file-safety/recent", get(recent))
        .route("/file-safety/record", post(record))
        .route("/file-safety/validate", post(validate))
        .route("/file-safety/cleanup", post(cleanup))
}

/// Largest `limit` accepted.
const MAX_LIMIT: usize = 10_000;

fn limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(50),
        Some(limit) if (1..=MAX_LIMIT).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::bad(format!("limit must be between 1 and {MAX_LIMIT} (got {limit})"))),
    }
}

fn path(raw: &str) -> Result<String, ApiError> {
    file_safety::canonical(raw).map_err(ApiError::bad)
}

/// Where `raw` resolves now ([`path`]), and the other names of that file a lock may be kept
/// under ([`file_safety::aliases`]).
fn names(state: &AppState, raw: &str) -> Result<(String, Vec<String>), ApiError> {
    let resolved = path(raw)?;
    let locks = state.store.read(|view| view.locks())?;
    let aliases = file_safety::aliases(raw, &resolved, locks.into_iter().map(|lock| lock.path));
    Ok((resolved, aliases))
}

async fn submit(state: &AppState, command: FileCommand) -> Result<u64, CommandError> {
    match state.writer.submit(Command::FileSafety(command)).await? {
        Outcome::Appended { seq } => Ok(seq),
        _ => Err(CommandError::Unavailable { message: "unexpected answer from the writer".into() }),
    }
}

async fn status(State(state): State<AppState>) -> ApiResult {
    let (locks, modifications) = state.store.read(|view| view.file_safety_counts())?;
    answer(&api::FileSafetyStatus { locks, modifications })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentQuery {
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

async fn locks(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let mut query: AgentQuery = parse_query(uri.query())?;
    query.agent = super::extract::agent_filter(&state, query.agent)?;
    let now = crate::time::now_ms();
    let locks: Vec<_> = state
        .store
        .read(|view| view.locks())?
        .into_iter()
        .filter(|lock| query.agent.as_ref().is_none_or(|agent| &lock.agent_id == agent))
        .map(|lock| api::LockEntry { expired: lock.expires_ms <= now, lock })
        .collect();
    answer(&api::Locks { locks })
}

/// The longest intent of a lock or a record, and task id (characters).
const MAX_INTENT_CHARS: usize = 1000;
const MAX_TASK_ID_CHARS: usize = 200;

/// A lock's or a record's free text (`field`): shown by `synapse file-safety` and the dashboard
/// on the user's terminal and page, so one line without control characters, and not a book.
fn check_label(field: &str, value: Option<&str>, max_chars: usize) -> Result<(), ApiError> {
    let Some(value) = value else { return Ok(()) };
    if value.chars().count() > max_chars {
        return Err(ApiError::bad(format!("{field} is longer than {max_chars} characters")));
    }
    if value.chars().any(crate::escape::is_control) {
        return Err(ApiError::bad(format!("{field} contains a control character (a newline, an escape, ...)")));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LockBody {
    path: String,
    agent_id: String,
    #[serde(default)]
    duration_seconds: Option<u64>,
    #[serde(default)]
    intent: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    /// Wait up to this many seconds for the file to be free.
    #[serde(default)]
    wait_seconds: Option<u64>,
}

/// `POST /file-safety/lock`; with `wait_seconds`, a refused lock is tried again after each
/// new event in the log (a release) or when the holder's lock expires, not by polling.
async fn lock(State(state): State<AppState>, caller: Caller, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let mut body: LockBody = parse_body(body)?;
    check_label("intent", body.intent.as_deref(), MAX_INTENT_CHARS)?;
    check_label("task_id", body.task_id.as_deref(), MAX_TASK_ID_CHARS)?;
    body.agent_id = super::extract::agent_id(&state, &body.agent_id)?;
    caller.require_act_as(&body.agent_id, "lock files")?;
    let (path, aliases) = names(&state, &body.path)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(body.wait_seconds.unwrap_or(0).min(24 * 3600));
    loop {
        let cursor = *state.head.borrow();
        let command = FileCommand::Lock {
            path: path.clone(),
            aliases: aliases.clone(),
            agent_id: body.agent_id.clone(),
            duration_seconds: body.duration_seconds.unwrap_or(LOCK_DEFAULT_DURATION_SECONDS),
            intent: body.intent.clone(),
            task_id: body.task_id.clone(),
        };
        match submit(&state, command).await {
            Ok(_) => {
                let lock = state.store.read(|view| view.lock(&path))?;
                return answer(&api::Locked { locked: true, lock });
            }
            Err(CommandError::Conflict { message }) if tokio::time::Instant::now() < deadline => {
                let expires = state.store.read(|view| view.lock(&path))?.map(|lock| lock.expires_ms);
                let now = crate::time::now_ms();
                let until_expiry = expires.map(|at| Duration::from_millis(at.saturating_sub(now) + 1));
                let wake = match until_expiry {
                    Some(wait) => deadline.min(tokio::time::Instant::now() + wait),
                    None => deadline,
                };
                // A stopping broker ends the wait (trying again at once would spin until the
                // deadline, up to a day, and keep the broker from exiting).
                if let Ok(false) = tokio::time::timeout_at(wake, crate::broker::tail::wait_past(&state, cursor)).await {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("the broker is stopping, so the wait for {path} ended without the lock ({message})"),
                    ));
                }
                tracing::debug!("retrying lock of {path}: {message}");
            }
            Err(error) => return Err(error.into()),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnlockBody {
    path: String,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    force: bool,
}

/// An agent unlocks as itself (a force only for an expired or gone holder); the user may unlock
/// or force-unlock for any agent; an anonymous caller not at all.
async fn unlock(State(state): State<AppState>, caller: Caller, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let body: UnlockBody = parse_body(body)?;
    let (path, aliases) = names(&state, &body.path)?;
    let agent_id = match (&caller, body.agent_id) {
        (Caller::Agent(agent), None) => Some(agent.agent_id.clone()),
        (_, Some(agent_id)) => {
            let agent_id = super::extract::agent_id(&state, &agent_id)?;
            caller.require_act_as(&agent_id, "unlock files")?;
            Some(agent_id)
        }
        (Caller::User, None) => None,
        (Caller::Anonymous, None) => {
            caller.require_act_as("an agent", "unlock files")?;
            None
        }
    };
    let by_user = caller.is_user();
    let unlock = |path: &String| FileCommand::Unlock {
        path: path.clone(),
        agent_id: agent_id.clone(),
        force: body.force,
        by_user,
    };
    // Not locked where the path resolves now: perhaps under another name of the file, where a
    // lock taken before a link on its way appeared is kept (see `file_safety::aliases`).
    let mut outcome = submit(&state, unlock(&path)).await.map(|_| path);
    for alias in aliases {
        if !matches!(outcome, Err(CommandError::NotFound { .. })) {
            break;
        }
        outcome = submit(&state, unlock(&alias)).await.map(|_| alias);
    }
    answer(&api::Unlocked { unlocked: outcome? })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathQuery {
    path: String,
    #[serde(default)]
    limit: Option<usize>,
}

async fn history(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let query: PathQuery = parse_query(uri.query())?;
    let path = path(&query.path)?;
    let limit = limit(query.limit)?;
    let modifications = state.store.read(|view| view.modifications_of(&path, limit))?;
    answer(&api::Modifications { path: Some(path), modifications })
}

async fn recent(State(state): State<AppState>, uri: axum::http::Uri) -> ApiResult {
    let query: AgentQuery = parse_query(uri.query())?;
    let limit = limit(query.limit)?;
    let agent = super::extract::agent_filter(&state, query.agent)?;
    // Every modification is read and sorted.
    super::long_read(&state, move |store| {
        let modifications = store.read(|view| view.recent_modifications(agent.as_deref(), limit))?;
        answer(&api::Modifications { path: None, modifications })
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordBody {
    path: String,
    agent_id: String,
    task_id: String,
    #[serde(default)]
    change_type: Option<String>,
    #[serde(default)]
    intent: Option<String>,
}

async fn record(State(state): State<AppState>, caller: Caller, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let body: RecordBody = parse_body(body)?;
    check_label("intent", body.intent.as_deref(), MAX_INTENT_CHARS)?;
    check_label("task_id", Some(&body.task_id), MAX_TASK_ID_CHARS)?;
    let agent_id = super::extract::agent_id(&state, &body.agent_id)?;
    caller.require_act_as(&agent_id, "record file changes")?;
    let change_type = match body.change_type.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("MODIFY") => ChangeType::Modify,
        Some("CREATE") => ChangeType::Create,
        Some("DELETE") => ChangeType::Delete,
        Some(other) => {
            return Err(ApiError::bad(format!("unknown change type '{other}' (CREATE, MODIFY, DELETE)")));
        }
    };
    let path = path(&body.path)?;
    let command =
        FileCommand::Record { path: path.clone(), agent_id, task_id: body.task_id, change_type, intent: body.intent };
    submit(&state, command).await?;
    answer(&api::Recorded { recorded: path, change_type })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidateBody {
    path: String,
    agent_id: String,
}

async fn validate(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let body: ValidateBody = parse_body(body)?;
    let (path, aliases) = names(&state, &body.path)?;
    let now = crate::time::now_ms();
    let agent_id = super::extract::agent_id(&state, &body.agent_id)?;
    // A name nobody answers to (a typo) would otherwise be told ALLOWED.
    if state.store.read(|view| view.agent(&agent_id))?.is_none() {
        return Err(ApiError::not_found(format!("Agent '{agent_id}' is not registered")));
    }
    answer(&state.store.read(|view| file_safety::check(view, &path, &aliases, &agent_id, now))?)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CleanupBody {
    /// Keep modification records of the last `days` days (default 30).
    #[serde(default)]
    days: Option<i64>,
}

/// Releases expired locks and prunes old modification records: the user's to decide, as the
/// history's cleanup is (an agent or a TCP caller without the key gets 403).
async fn cleanup(
    State(state): State<AppState>,
    _user: super::caller::TheUser,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: CleanupBody = match &body {
        Ok(bytes) if bytes.is_empty() || bytes.as_ref() == b"null" => CleanupBody::default(),
        _ => parse_body(body)?,
    };
    let days = body.days.unwrap_or(30);
    let keep_days = u64::try_from(days)
        .ok()
        .filter(|days| *days > 0)
        .ok_or_else(|| ApiError::bad(format!("--days must be a positive number of days (got {days})")))?;
    let (locks_before, records_before) = state.store.read(|view| view.file_safety_counts())?;
    submit(&state, FileCommand::Cleanup { keep_days: Some(keep_days) }).await?;
    let (locks_after, records_after) = state.store.read(|view| view.file_safety_counts())?;
    answer(&api::FileCleanupAnswer {
        released: locks_before.saturating_sub(locks_after),
        pruned: records_before.saturating_sub(records_after),
    })
}
