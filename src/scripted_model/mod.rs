//! A scripted model server: just enough of four model APIs for the real coding CLIs to run end to
//! end against 127.0.0.1, answering by a fixed script ([`script`]) instead of a model.
//!
//! Layout:
//! - [`script`]: what to answer, decided from the last turn and the offered tools (pure).
//! - [`record`]: every request kept in memory (served at `GET /_synapse/requests`) and appended
//!   to the `--log` file, one JSON line each.
//! - [`anthropic`], [`responses`], [`chat`], [`gemini`]: one module per API: read a request into
//!   a [`script::Turn`] and tools, encode the [`script::Action`] as that API's (streaming) answer.
//!
//! `synapse scripted-model [--port 0] [--log FILE]` prints `{"port":N}` once listening and
//! serves until killed. Unknown paths are recorded and answered 404 with a JSON body, so a new
//! CLI version calling something new shows up in the record instead of failing silently.

pub mod anthropic;
pub mod chat;
pub mod clis;
pub mod gemini;
pub mod record;
pub mod responses;
pub mod script;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use record::Recorder;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_stream::Stream;

/// Largest request body accepted (the CLIs send their whole conversation every turn).
pub const MAX_REQUEST_BYTES: usize = 64 << 20;

/// Shared state: the record and the count of slow answers still streaming.
#[derive(Debug, Default)]
pub struct ModelState {
    pub recorder: Recorder,
    /// Slow answers whose client is still connected (a guard per stream keeps it true).
    pub slow_streams: AtomicUsize,
    /// Slow answers the client went away from before their last chunk (an interrupted turn).
    pub slow_streams_cut: AtomicUsize,
}

pub type SharedState = Arc<ModelState>;

/// The router over all four APIs and the record.
pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/chat/completions", post(chat::completions))
        .route("/v1/models", get(chat::models))
        .route("/models", get(chat::models))
        .route("/v1beta/models/{action}", post(gemini::model_action))
        .route("/v1/models/{action}", post(gemini::model_action))
        .route("/_synapse/requests", get(requests))
        .route("/_synapse/slow_streams", get(slow_streams))
        .fallback(unknown)
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(state)
}

/// Binds 127.0.0.1:`port`, prints `{"port":N}` and serves until SIGTERM / SIGINT.
pub fn run(port: u16, log: Option<PathBuf>) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let recorder = Recorder::new(log)?;
        let state = Arc::new(ModelState { recorder, ..ModelState::default() });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{}", json!({"port": port}))?;
            stdout.flush()?;
        }
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await?;
        Ok(0)
    })
}

/// `GET /_synapse/requests`: every request recorded so far, oldest first.
async fn requests(State(state): State<SharedState>) -> Json<Value> {
    Json(Value::Array(state.recorder.all()))
}

/// `GET /_synapse/slow_streams`: `{"active": N, "cut": M}`, slow answers still streaming to a
/// client, and those whose client left before the end.
async fn slow_streams(State(state): State<SharedState>) -> Json<Value> {
    Json(json!({
        "active": state.slow_streams.load(Ordering::SeqCst),
        "cut": state.slow_streams_cut.load(Ordering::SeqCst),
    }))
}

/// Anything else: recorded (api `unknown`) and answered 404 with a JSON error.
async fn unknown(State(state): State<SharedState>, method: axum::http::Method, uri: Uri, body: Bytes) -> Response {
    let body = record::parse_body(&body);
    state.recorder.push(record::Entry {
        api: "unknown",
        path: format!("{method} {uri}"),
        model: None,
        has_tools: false,
        last_user_text: None,
        action: "not_found",
        tool: None,
        body: &body,
    });
    tracing::info!("scripted model: unknown request {method} {uri}");
    let message = format!("the scripted model does not serve {method} {}", uri.path());
    (StatusCode::NOT_FOUND, Json(json!({"error": {"type": "not_found_error", "message": message}}))).into_response()
}

/// The pieces of a text answer: one piece, or for [`script::Action::Slow`] a piece every
/// [`script::SLOW_CHUNK_INTERVAL`], or for [`script::Action::Late`] one piece after
/// [`script::LATE_WAIT`]. The stream ends early when dropped (the client went away); while a slow
/// or late one lives it counts in [`ModelState::slow_streams`].
pub fn text_pieces(state: SharedState, action: &script::Action) -> impl Stream<Item = String> + Send + 'static {
    let single = match action {
        script::Action::Text(text) => Some(text.clone()),
        script::Action::Slow | script::Action::Late => None,
        _ => Some(script::DEFAULT_TEXT.to_string()),
    };
    let late = matches!(action, script::Action::Late);
    async_stream::stream! {
        match single {
            Some(text) => yield text,
            None if late => {
                let mut guard = SlowGuard::new(state);
                tokio::time::sleep(script::LATE_WAIT).await;
                guard.finished = true;
                yield script::DEFAULT_TEXT.to_string();
            }
            None => {
                let mut guard = SlowGuard::new(state);
                for index in 0..script::SLOW_CHUNKS {
                    if index > 0 {
                        tokio::time::sleep(script::SLOW_CHUNK_INTERVAL).await;
                    }
                    yield format!("tick {index}. ");
                }
                guard.finished = true;
            }
        }
    }
}

/// Counts a slow stream as active for as long as it lives, and as cut when it is dropped
/// before its last chunk.
struct SlowGuard {
    state: SharedState,
    finished: bool,
}

impl SlowGuard {
    fn new(state: SharedState) -> SlowGuard {
        state.slow_streams.fetch_add(1, Ordering::SeqCst);
        SlowGuard { state, finished: false }
    }
}

impl Drop for SlowGuard {
    fn drop(&mut self) {
        self.state.slow_streams.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.state.slow_streams_cut.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// One SSE frame: an optional `event:` line and one `data:` line.
pub fn sse_frame(event: Option<&str>, data: &Value) -> Bytes {
    match event {
        Some(event) => Bytes::from(format!("event: {event}\ndata: {data}\n\n")),
        None => Bytes::from(format!("data: {data}\n\n")),
    }
}

/// A `text/event-stream` response over a stream of frames.
pub fn sse_response(stream: impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A rough token count (4 bytes a token), for usage fields.
pub fn token_estimate(body: &Value) -> u64 {
    (body.to_string().len() / 4).max(1) as u64
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A fresh id with this prefix (`msg_`, `call_`, ...).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// One model request answered by script: decides the action, records the request with it, and
/// turns the answer to a CLI-internal request (no tools) into text fitting `schema`, the response
/// format it asked for.
pub fn decide_and_record(
    state: &ModelState,
    api: &'static str,
    path: String,
    model: &str,
    body: &Value,
    (turn, tools): (script::Turn, Vec<script::Tool>),
    schema: Option<&Value>,
) -> script::Action {
    let action = script::decide(&turn, &tools);
    state.recorder.push(record::Entry {
        api,
        path,
        model: Some(model.to_string()),
        has_tools: !tools.is_empty(),
        last_user_text: turn.new_user_text(),
        action: action.label(),
        tool: match &action {
            script::Action::ToolCall { tool, .. } => Some(tool.clone()),
            _ => None,
        },
        body,
    });
    match action {
        script::Action::Internal => script::Action::Text(internal_text(schema)),
        other => other,
    }
}

/// The text of an answer to a CLI-internal request: JSON fitting `schema` when one was asked
/// for, else [`script::DEFAULT_TEXT`].
pub fn internal_text(schema: Option<&Value>) -> String {
    match schema {
        Some(schema) => script::example_value(schema).to_string(),
        None => script::DEFAULT_TEXT.to_string(),
    }
}
