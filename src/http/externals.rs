//! `/external`: add (discovering the agent card), list, info, send, remove (SPEC §6).

use super::error::answer;
use super::extract::parse_body;
use super::{ApiError, ApiResult, AppState};
use crate::api;
use crate::broker::command::{Command, Outcome};
use crate::broker::externals::{ExternalCommand, alias_from_name};
use crate::broker::outbound;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/external", get(list).post(add))
        .route("/external/{alias}", get(info).delete(remove))
        .route("/external/{alias}/send", post(send))
}

/// The longest a send may follow the remote task (`wait_seconds` is capped to it).
const FOLLOW_SECONDS_MAX: u64 = 24 * 60 * 60;

/// How long one request to an external agent may take (`SYNAPSE_EXTERNAL_TIMEOUT_MS`).
fn limit() -> Duration {
    Duration::from_millis(
        std::env::var("SYNAPSE_EXTERNAL_TIMEOUT_MS").ok().and_then(|ms| ms.parse().ok()).unwrap_or(10_000),
    )
}

fn unreachable(message: String) -> ApiError {
    let status = if message.contains("did not answer") { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
    ApiError::new(status, message)
}

/// Reads the agent card: `agent-card.json`, then `agent.json`.
async fn discover(policy: &outbound::Policy, base: &str) -> Result<(String, Option<String>), ApiError> {
    let mut last = String::new();
    for card in ["/.well-known/agent-card.json", "/.well-known/agent.json"] {
        let url = format!("{base}{card}");
        let answer =
            outbound::request(policy, hyper::Method::GET, &url, &[], None, limit()).await.map_err(unreachable)?;
        if answer.status != 200 {
            last = format!("{url} answered {}", answer.status);
            continue;
        }
        let card: Value = serde_json::from_slice(&answer.body).map_err(|error| {
            ApiError::new(StatusCode::BAD_GATEWAY, format!("malformed agent card at {url}: {error}"))
        })?;
        let name =
            card.get("name").and_then(Value::as_str).filter(|name| !name.trim().is_empty()).ok_or_else(|| {
                ApiError::new(StatusCode::BAD_GATEWAY, format!("malformed agent card at {url}: no name"))
            })?;
        return Ok((name.to_string(), card.get("description").and_then(Value::as_str).map(str::to_string)));
    }
    Err(ApiError::new(StatusCode::BAD_GATEWAY, format!("no agent card found: {last}")))
}

async fn appended(state: &AppState, command: ExternalCommand) -> Result<(), ApiError> {
    match state.writer.submit(Command::External(command)).await? {
        Outcome::Appended { seq } => {
            state.webhooks.caught_up(seq).await;
            Ok(())
        }
        _ => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    url: String,
    #[serde(default)]
    alias: Option<String>,
}

async fn add(
    State(state): State<AppState>,
    _user: super::caller::TheUser,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: AddBody = parse_body(body)?;
    let url = body.url.trim().trim_end_matches('/').to_string();
    outbound::parse_url(&url).map_err(|message| ApiError::bad(format!("Invalid URL {message}")))?;
    if let Some(alias) = &body.alias
        && !crate::broker::externals::is_valid_alias(alias)
    {
        return Err(ApiError::bad(format!("Invalid alias '{alias}': letters, digits, '-', '_' or '.', at most 64")));
    }
    let policy = state.outbound_policy();
    let (host, port, _) =
        outbound::parse_url(&url).map_err(|message| ApiError::bad(format!("Invalid URL {message}")))?;
    policy.resolve(&host, port).await.map_err(|reason| ApiError::bad(format!("URL {url} refused: {reason}")))?;
    let (name, description) = discover(&policy, &url).await?;
    let alias = body.alias.unwrap_or_else(|| alias_from_name(&name));
    if state.externals.get(&alias).is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("alias '{alias}' is taken; remove it first or choose --alias"),
        ));
    }
    appended(&state, ExternalCommand::Add { alias: alias.clone(), url, name, description }).await?;
    answer(&api::ExternalAnswer { external: state.externals.get(&alias) })
}

async fn list(State(state): State<AppState>, _user: super::caller::TheUser) -> ApiResult {
    answer(&api::ExternalList { externals: state.externals.list() })
}

fn known(state: &AppState, alias: &str) -> Result<crate::broker::externals::External, ApiError> {
    state.externals.get(alias).ok_or_else(|| ApiError::not_found(format!("No external agent '{alias}'")))
}

async fn info(State(state): State<AppState>, _user: super::caller::TheUser, Path(alias): Path<String>) -> ApiResult {
    answer(&api::ExternalAnswer { external: Some(known(&state, &alias)?) })
}

async fn remove(State(state): State<AppState>, _user: super::caller::TheUser, Path(alias): Path<String>) -> ApiResult {
    known(&state, &alias)?;
    appended(&state, ExternalCommand::Remove { alias: alias.clone() }).await?;
    answer(&api::Removed { removed: alias })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    text: String,
    /// Follow the remote task until it ends, at most this many seconds.
    #[serde(default)]
    wait_seconds: Option<u64>,
    #[serde(default)]
    priority: Option<u8>,
    #[serde(default)]
    response_expected: Option<bool>,
}

async fn send(
    State(state): State<AppState>,
    _user: super::caller::TheUser,
    Path(alias): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: SendBody = parse_body(body)?;
    if body.text.trim().is_empty() {
        return Err(ApiError::bad("the message is empty"));
    }
    if let Some(priority) = body.priority
        && !(1..=5).contains(&priority)
    {
        return Err(ApiError::bad(format!("priority must be between 1 and 5 (got '{priority}')")));
    }
    let external = known(&state, &alias)?;
    let message = json!({
        "message": {"role": "user", "parts": [{"type": "text", "text": body.text}]},
        "metadata": {"response_expected": body.response_expected.unwrap_or(body.wait_seconds.is_some())},
    });
    // An A2A message's metadata has no priority (SPEC §3): a Synapse agent takes it in the query
    // of its own endpoint, which only a priority other than the default needs, so a peer
    // without that endpoint still takes every other message.
    let url = match body.priority {
        Some(priority) if priority != crate::broker::command::default_priority() => {
            format!("{}/tasks/send-priority?priority={priority}", external.url)
        }
        _ => format!("{}/tasks/send", external.url),
    };
    let policy = state.outbound_policy();
    let remote =
        outbound::request(&policy, hyper::Method::POST, &url, &[], Some(message.to_string().into_bytes()), limit())
            .await
            .map_err(unreachable)?;
    if remote.status == 404 && url.contains("/tasks/send-priority") {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("{alias} takes no priority ({url} answered 404): send without -p"),
        ));
    }
    let sent: Value = serde_json::from_slice(&remote.body)
        .map_err(|error| ApiError::new(StatusCode::BAD_GATEWAY, format!("malformed answer from {url}: {error}")))?;
    if !(200..300).contains(&remote.status) {
        let reason = sent.get("message").and_then(Value::as_str).unwrap_or("refused");
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("{alias} refused the message ({}): {reason}", remote.status),
        ));
    }
    let task = remote_task(sent.get("task").cloned().unwrap_or(Value::Null));
    let Some(seconds) = body.wait_seconds else { return answer(&api::ExternalSent { task, timed_out: None }) };
    let task_id = task.as_ref().and_then(|task| task.id.clone()).unwrap_or_default();
    let limit = Duration::from_secs(seconds.clamp(1, FOLLOW_SECONDS_MAX));
    answer(&follow(&policy, &external.url, &task_id, limit).await?)
}

/// A remote agent's task (or status update) as the API passes it on: an object, whatever else
/// it holds; anything that is not an object is no task.
fn remote_task(value: Value) -> Option<api::RemoteTask> {
    serde_json::from_value(value).ok()
}

/// Follows the remote task's event stream until its final state, or the time runs out.
async fn follow(
    policy: &outbound::Policy,
    base: &str,
    task_id: &str,
    limit: Duration,
) -> Result<api::ExternalSent, ApiError> {
    use http_body_util::BodyExt;
    let url = format!("{base}/tasks/{task_id}/subscribe");
    let deadline = tokio::time::Instant::now() + limit;
    let response = outbound::stream(policy, &url, limit).await.map_err(unreachable)?;
    if response.status() != StatusCode::OK {
        return Err(ApiError::new(StatusCode::BAD_GATEWAY, format!("{url} answered {}", response.status())));
    }
    let mut body = response.into_body();
    let mut buffer = String::new();
    let mut last: Value = Value::Null;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Ok(api::ExternalSent { task: remote_task(last), timed_out: Some(true) }),
            Ok(None) => return Ok(api::ExternalSent { task: remote_task(last), timed_out: Some(false) }),
            Ok(Some(Err(error))) => return Err(ApiError::new(StatusCode::BAD_GATEWAY, format!("{url}: {error}"))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Some(data) = frame.data_ref() else { continue };
        buffer.push_str(&String::from_utf8_lossy(data));
        // One event may not grow without end (a stream that never sends a blank line).
        if buffer.len() > outbound::BODY_LIMIT_BYTES {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("{url}: an event longer than {} bytes", outbound::BODY_LIMIT_BYTES),
            ));
        }
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            for line in event.lines() {
                if let Some(data) = line.strip_prefix("data:")
                    && let Ok(value) = serde_json::from_str::<Value>(data.trim())
                {
                    last = value;
                }
            }
        }
    }
}
