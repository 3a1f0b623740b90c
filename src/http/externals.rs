//! `/external`: add (discovering the agent card), list, info, send, remove (SPEC §6).

use super::error::answer;
use super::extract::{Path, parse_body};
use super::{ApiError, ApiResult, AppState};
use crate::api;
use crate::broker::command::{Command, ExternalReplyRequest, ExternalSendRequest, Outcome};
use crate::broker::externals::{ExternalCommand, alias_from_name};
use crate::broker::outbound;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
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
        .route("/external-replies/tasks/send", post(reply))
        .route("/external-replies/tasks/send-priority", post(reply))
}

/// Where external agents post their replies: the `sender_endpoint` of the user's messages to
/// them (A2A `POST <endpoint>/tasks/send`, as a Python Synapse agent answers). The reply token
/// it names is the proof; no key or secret is asked (see `http::auth`).
pub const REPLIES_PATH: &str = "/external-replies";

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
            state.webhooks.caught_up(seq, state.shutdown.subscribe()).await;
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
    // Paths are appended to it (`/tasks/send`, `/.well-known/agent.json`): after a query or a
    // fragment they would be part of that, and every request would miss.
    if url.contains(['?', '#']) {
        return Err(ApiError::bad(format!(
            "Invalid URL '{url}': an external agent's URL is its base address, without a query ('?') or fragment ('#')"
        )));
    }
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
    // Checked and added in one turn: two adds of one alias at once both found it free, and
    // the last one's agent replaced the first's without a word.
    let _turn = state.externals_turn.lock().await;
    state.delivery_current().await;
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
    state.delivery_current().await;
    answer(&api::ExternalList { externals: state.externals.list() })
}

async fn known(state: &AppState, alias: &str) -> Result<crate::broker::externals::External, ApiError> {
    state.delivery_current().await;
    state.externals.get(alias).ok_or_else(|| ApiError::not_found(format!("No external agent '{alias}'")))
}

async fn info(State(state): State<AppState>, _user: super::caller::TheUser, Path(alias): Path<String>) -> ApiResult {
    answer(&api::ExternalAnswer { external: Some(known(&state, &alias).await?) })
}

async fn remove(State(state): State<AppState>, _user: super::caller::TheUser, Path(alias): Path<String>) -> ApiResult {
    let _turn = state.externals_turn.lock().await;
    known(&state, &alias).await?;
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
    let external = known(&state, &alias).await?;
    let response_expected = body.response_expected.unwrap_or(body.wait_seconds.is_some());
    let mut metadata = json!({"response_expected": response_expected});
    // A reply is expected: the user's own task waits for it, and the message names a random
    // reply token (the log keeps its SHA-256) and this broker's reply endpoint, where the
    // remote agent posts its answer naming the token (as a Python Synapse agent does).
    let waiting = if response_expected {
        let token = crate::secret::random_token();
        let request = ExternalSendRequest {
            alias: alias.clone(),
            text: body.text.clone(),
            priority: body.priority.unwrap_or(crate::broker::command::default_priority()),
            reply_token_sha256: crate::secret::hash_secret(&token),
        };
        let task = match state.writer.submit(Command::SendExternal(request)).await? {
            Outcome::Task { task } => task,
            _ => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer")),
        };
        let port = state.port.load(std::sync::atomic::Ordering::Relaxed);
        metadata["response_mode"] = json!("wait");
        metadata["sender_task_id"] = json!(token);
        metadata["sender"] = json!({
            "sender_id": USER_SENDER_ID,
            "sender_name": "Synapse user",
            "sender_endpoint": format!("http://127.0.0.1:{port}{REPLIES_PATH}"),
        });
        Some((task.id, token))
    } else {
        None
    };
    let message = json!({
        "message": {"role": "user", "parts": [{"type": "text", "text": body.text}]},
        "metadata": metadata,
    });
    let reply_task_id = waiting.as_ref().map(|(task_id, _)| task_id.clone());
    let sent = deliver(&state, &alias, &external, &body, message).await;
    let task = match sent {
        Ok(task) => task,
        Err(Undelivered { error, may_have_arrived: true }) => {
            // The remote may have it: the task goes on waiting for a reply (which its token
            // still completes), and the user is told not to count on either outcome.
            let waits = match &waiting {
                Some((task_id, _)) => {
                    format!("; task {task_id} waits for its reply (synapse cancel {task_id} stops waiting)")
                }
                None => String::new(),
            };
            // A send that waits for the reply waits for it still: if the message arrived, the
            // reply comes with its token.
            if let (Some(seconds), Some((task_id, token))) = (body.wait_seconds, &waiting) {
                let limit = Duration::from_secs(seconds.clamp(1, FOLLOW_SECONDS_MAX));
                let policy = state.outbound_policy();
                let mut followed = wait_for_reply(&state, &policy, &external.url, "", task_id, token, limit).await?;
                if followed.timed_out != Some(true) {
                    followed.reply_task_id = reply_task_id;
                    return answer(&followed);
                }
            }
            return Err(ApiError::new(
                error.status(),
                format!(
                    "{}: the message may have arrived{waits}; sending it again may deliver it twice",
                    error.message()
                ),
            ));
        }
        Err(Undelivered { error, may_have_arrived: false }) => {
            if let Some((task_id, _)) = &waiting {
                let failed =
                    Command::ExternalSendFailed { task_id: task_id.clone(), error: error.message().to_string() };
                if let Err(error) = state.writer.submit(failed).await {
                    tracing::warn!("cannot mark the external message {task_id} failed: {error}");
                }
            }
            return Err(error);
        }
    };
    let Some(seconds) = body.wait_seconds else {
        return answer(&api::ExternalSent { task, timed_out: None, reply_task_id });
    };
    let limit = Duration::from_secs(seconds.clamp(1, FOLLOW_SECONDS_MAX));
    let remote_id = task.as_ref().and_then(|task| task.id.clone()).unwrap_or_default();
    let policy = state.outbound_policy();
    let mut followed = match &waiting {
        // Following the remote's stream depends on the remote alone: a stopping broker ends it
        // (as it ends the wait for a reply), not up to a day later.
        None => {
            let mut stopping = state.shutdown.subscribe();
            tokio::select! {
                followed = follow(&policy, &external.url, &remote_id, limit) => followed?,
                _ = stopping.wait_for(|stopping| *stopping) => {
                    return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the broker is shutting down"));
                }
            }
        }
        Some((task_id, token)) => {
            wait_for_reply(&state, &policy, &external.url, &remote_id, task_id, token, limit).await?
        }
    };
    followed.reply_task_id = reply_task_id;
    answer(&followed)
}

/// The name a message from the user gives as its sender (`metadata.sender.sender_id`).
const USER_SENDER_ID: &str = "synapse-user";

/// A message the remote agent is not known to have taken.
struct Undelivered {
    error: ApiError,
    /// The request was on its way when it failed (a timeout, a lost connection): the remote
    /// may have taken it. Otherwise it surely did not (unreachable, or it refused).
    may_have_arrived: bool,
}

impl From<ApiError> for Undelivered {
    fn from(error: ApiError) -> Undelivered {
        Undelivered { error, may_have_arrived: false }
    }
}

/// Posts `message` to the external agent; answers the remote task it created, if it said.
async fn deliver(
    state: &AppState,
    alias: &str,
    external: &crate::broker::externals::External,
    body: &SendBody,
    message: Value,
) -> Result<Option<api::RemoteTask>, Undelivered> {
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
        outbound::exchange(&policy, hyper::Method::POST, &url, &[], Some(message.to_string().into_bytes()), limit())
            .await
            .map_err(|failure| Undelivered {
                error: unreachable(failure.message),
                may_have_arrived: failure.may_have_arrived,
            })?;
    if remote.status == 404 && url.contains("/tasks/send-priority") {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("{alias} takes no priority ({url} answered 404): send without -p"),
        )
        .into());
    }
    let sent = serde_json::from_slice::<Value>(&remote.body);
    // A gateway's 504 says nothing of whether the agent behind it took the message (a 502 says
    // the gateway could not reach it).
    if remote.status == 504 {
        return Err(Undelivered {
            error: ApiError::new(StatusCode::BAD_GATEWAY, format!("{url} answered {} (a gateway)", remote.status)),
            may_have_arrived: true,
        });
    }
    if !(200..300).contains(&remote.status) {
        let said = sent.as_ref().ok().and_then(|sent| sent.get("message")).and_then(Value::as_str);
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("{alias} refused the message ({}): {}", remote.status, said.unwrap_or("refused")),
        )
        .into());
    }
    // Taken (2xx). An answer cut at the size limit, or not JSON, only hides the remote's task:
    // the message is there, and a reply still comes with its token.
    match sent {
        Ok(sent) => Ok(remote_task(sent.get("task").cloned().unwrap_or(Value::Null))),
        Err(error) => {
            tracing::warn!("{url} took the message but its answer is unreadable: {error}");
            Ok(None)
        }
    }
}

/// Waits for the reply to the user's task `task_id`: the reply posted with its token, or the
/// remote task's own end when its event stream can be followed (another Synapse broker; a
/// Python agent has none), whichever comes first. A reply seen on the stream completes the
/// task with the token, so a later post of the same reply is refused: the reply counts once.
async fn wait_for_reply(
    state: &AppState,
    policy: &outbound::Policy,
    base: &str,
    remote_id: &str,
    task_id: &str,
    token: &str,
    limit: Duration,
) -> Result<api::ExternalSent, ApiError> {
    let deadline = tokio::time::Instant::now() + limit;
    let local = super::broker_api::wait_until_final(state, task_id, deadline);
    tokio::pin!(local);
    let remote = async {
        if remote_id.is_empty() {
            return None;
        }
        follow(policy, base, remote_id, limit).await.ok().filter(|followed| followed.timed_out == Some(false))
    };
    tokio::pin!(remote);
    let mut remote_done = false;
    loop {
        tokio::select! {
            waited = &mut local => return Ok(local_answer(remote_id, waited?.0)),
            followed = &mut remote, if !remote_done => {
                remote_done = true;
                let Some(followed) = followed else { continue };
                let remote_task = followed.task.clone().unwrap_or_default();
                // Only a stream that says how the task ended decides; otherwise (no state, or
                // completed with nothing to show) the reply may still be posted with the token.
                let command = match (remote_task.state.as_deref(), remote_task.reply_text()) {
                    (Some("completed"), Some(reply)) => Command::ExternalReply(ExternalReplyRequest {
                        reply_token: token.to_string(),
                        from: None,
                        text: reply.to_string(),
                    }),
                    (Some(state @ ("failed" | "canceled" | "rejected")), _) => Command::ExternalSendFailed {
                        task_id: task_id.to_string(),
                        error: format!("the remote task ended {state} without a reply"),
                    },
                    _ => continue,
                };
                // A reply posted meanwhile was first: the task says what happened. A reply the
                // writer refuses (empty, too large) fails the task with the reason, or the wait
                // would last to its deadline for a reply that has already come.
                let is_reply = matches!(command, Command::ExternalReply(_));
                if let Err(error) = state.writer.submit(command).await
                    && is_reply
                {
                    let failed = Command::ExternalSendFailed {
                        task_id: task_id.to_string(),
                        error: format!("the remote task's reply was refused: {error}"),
                    };
                    let _ = state.writer.submit(failed).await;
                }
            }
        }
    }
}

/// The user's task as the answer of a waited send: its state, and the reply as the artifact.
fn local_answer(remote_id: &str, task: crate::store::TaskRecord) -> api::ExternalSent {
    let reply = super::wire::reply_text(&task);
    let remote = api::RemoteTask {
        id: (!remote_id.is_empty()).then(|| remote_id.to_string()),
        state: Some(task.state.as_str().to_string()),
        artifacts: reply.map(|text| {
            vec![api::RemoteArtifact {
                parts: vec![api::RemotePart { text: Some(text), rest: Default::default() }],
                rest: Default::default(),
            }]
        }),
        status: task.error.map(Value::from),
        rest: Default::default(),
    };
    api::ExternalSent { task: Some(remote), timed_out: Some(!task.state.is_final()), reply_task_id: None }
}

#[derive(Deserialize)]
struct ReplyBody {
    message: super::a2a_rest::A2aMessage,
    #[serde(default)]
    metadata: Option<ReplyMetadata>,
}

#[derive(Deserialize, Default)]
struct ReplyMetadata {
    #[serde(default)]
    in_reply_to: Option<String>,
    #[serde(default)]
    sender: Option<ReplySender>,
}

#[derive(Deserialize, Default)]
struct ReplySender {
    #[serde(default)]
    sender_id: Option<String>,
}

/// `POST /external-replies/tasks/send[-priority]`: an external agent's reply to the user's
/// message, naming its reply token as `metadata.in_reply_to`. Anything else is refused.
async fn reply(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let body: ReplyBody = parse_body(body)?;
    let text = body.message.text()?;
    let metadata = body.metadata.unwrap_or_default();
    let Some(token) = metadata.in_reply_to.filter(|token| !token.is_empty()) else {
        return Err(ApiError::bad(
            "this endpoint takes replies to the user's messages only: metadata.in_reply_to must name the reply's token",
        ));
    };
    let request =
        ExternalReplyRequest { reply_token: token, from: metadata.sender.and_then(|sender| sender.sender_id), text };
    match state.writer.submit(Command::ExternalReply(request)).await? {
        Outcome::Task { task } => answer(&super::wire::task_answer(&task)),
        _ => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer")),
    }
}

/// A remote agent's task (or status update) as the API passes it on: an object, whatever else
/// it holds; anything that is not an object is no task.
fn remote_task(value: Value) -> Option<api::RemoteTask> {
    serde_json::from_value(value).ok()
}

/// What stays as it is of a remote task id in a URL path: letters, digits, `-`, `_` and `~`
/// (a `.` too would let `..` be read as a step up).
const ID_SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'~');

/// Follows the remote task's event stream until its final state, or the time runs out.
async fn follow(
    policy: &outbound::Policy,
    base: &str,
    task_id: &str,
    limit: Duration,
) -> Result<api::ExternalSent, ApiError> {
    use http_body_util::BodyExt;
    // The remote's id, as one path segment (it could name another path of the remote host).
    let url = format!("{base}/tasks/{}/subscribe", percent_encoding::utf8_percent_encode(task_id, ID_SEGMENT));
    let deadline = tokio::time::Instant::now() + limit;
    let response = outbound::stream(policy, &url, limit).await.map_err(unreachable)?;
    if response.status() != StatusCode::OK {
        return Err(ApiError::new(StatusCode::BAD_GATEWAY, format!("{url} answered {}", response.status())));
    }
    let mut body = response.into_body();
    // Bytes, decoded an event at a time: a character split between two reads stays whole.
    let mut buffer: Vec<u8> = Vec::new();
    let mut last: Value = Value::Null;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Ok(api::ExternalSent { task: remote_task(last), timed_out: Some(true), reply_task_id: None });
            }
            Ok(None) => {
                // A last event without the blank line after it still counts.
                read_event_data(&buffer, &mut last);
                return Ok(api::ExternalSent { task: remote_task(last), timed_out: Some(false), reply_task_id: None });
            }
            Ok(Some(Err(error))) => return Err(ApiError::new(StatusCode::BAD_GATEWAY, format!("{url}: {error}"))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Some(data) = frame.data_ref() else { continue };
        buffer.extend_from_slice(data);
        while let Some(event) = take_event(&mut buffer) {
            read_event_data(&event, &mut last);
        }
        // One event may not grow without end (a stream that never sends a blank line).
        if buffer.len() > outbound::BODY_LIMIT_BYTES {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("{url}: an event longer than {} bytes", outbound::BODY_LIMIT_BYTES),
            ));
        }
    }
}

/// The first whole event of an SSE stream's bytes, taken out of `buffer`: up to a blank line,
/// whichever line ending the server uses (LF, CRLF or CR).
fn take_event(buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    let end = [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"]
        .iter()
        .filter_map(|blank| buffer.windows(blank.len()).position(|window| window == *blank).map(|at| at + blank.len()))
        .min()?;
    Some(buffer.drain(..end).collect())
}

/// Keeps in `last` the JSON of the last `data:` line of `event` that holds one.
fn read_event_data(event: &[u8], last: &mut Value) {
    for line in String::from_utf8_lossy(event).lines() {
        if let Some(data) = line.strip_prefix("data:")
            && let Ok(value) = serde_json::from_str::<Value>(data.trim())
        {
            *last = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remote's event stream read in pieces cut anywhere (inside a character too) gives the
    /// same last data as read whole, whatever its line endings; a last event without its blank
    /// line counts at the end. (Pieces were decoded one by one: a Japanese reply cut inside a
    /// character came out with U+FFFD, and CRLF streams were never split.)
    #[test]
    fn events_read_in_pieces_keep_their_characters_and_any_line_ending() {
        for ending in ["\n", "\r\n"] {
            let stream = format!(
                "event: status{ending}data: {{\"state\":\"working\"}}{ending}{ending}data: {{\"text\":\"日本語の返事\"}}{ending}"
            );
            let bytes = stream.as_bytes();
            for cut in 0..bytes.len() {
                let mut buffer = Vec::new();
                let mut last = Value::Null;
                for piece in [&bytes[..cut], &bytes[cut..]] {
                    buffer.extend_from_slice(piece);
                    while let Some(event) = take_event(&mut buffer) {
                        read_event_data(&event, &mut last);
                    }
                }
                read_event_data(&buffer, &mut last);
                assert_eq!(last, serde_json::json!({"text": "日本語の返事"}), "cut at {cut}, ending {ending:?}");
            }
        }
    }
}
