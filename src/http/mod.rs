//! HTTP: the routers of the broker's API and of each agent's A2A endpoints, and the state every
//! handler shares.
//!
//! Layout: [`error`] (the one error type, whose body is `api::ErrorBody`), [`extract`] (bodies,
//! queries, the agent a path names, secrets), [`broker_api`] (the broker's own REST API),
//! [`a2a_rest`], [`a2a_card`], [`jsonrpc`] and [`subscribe`] (A2A: REST, cards, JSON-RPC and
//! streams), and one file per feature (webhooks, externals, file safety, history, the dashboard);
//! [`guard`], [`auth`] and [`caller`] judge requests ([`origin`]: this machine's hosts and
//! origins); [`wire`] turns projection rows into `api` answers. Handlers translate only: every decision is a
//! broker command's.
//!
//! The same handlers serve an agent's endpoints at the root of its own port and socket (the
//! agent fixed by [`FixedAgent`]) and on the broker under `/agents/{agent}/...`.
//! Bad input is always a 4xx JSON error, never a 500 or a panic.

pub mod a2a_card;
pub mod a2a_rest;
pub mod agent_endpoints;
pub mod agent_tasks;
pub mod auth;
pub mod broker_api;
pub mod caller;
pub mod dashboard;
pub mod error;
pub mod externals;
pub mod extract;
pub mod file_safety;
pub mod guard;
pub mod history;
pub mod jsonrpc;
pub mod keys;
pub mod openapi;
pub mod origin;
pub mod server;
pub mod subscribe;
pub mod webhooks;
pub mod wire;

pub use error::{ApiError, ApiResult};
pub use extract::{FixedAgent, Scope};

use crate::broker::BrokerState;
use crate::broker::command;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use std::sync::Arc;
use std::time::Duration;

/// Request bodies above this are refused with 413 (a message may be up to 16 MiB of text; JSON
/// escaping can add a little).
pub const MAX_BODY_BYTES: usize = command::MAX_MESSAGE_BYTES + (64 << 10);

/// The refusal of a body over [`MAX_BODY_BYTES`]. It names the message bound too: a message
/// under it can still make a body over the bound, since JSON writes each quote, backslash and
/// newline as two bytes and other control characters as six.
pub fn body_too_large() -> String {
    format!(
        "the request body is over {MAX_BODY_BYTES} bytes. A message may hold {} bytes of text, but \
         as JSON each quote, backslash and newline takes two bytes and other control characters \
         six, so a message with many of them must be shorter",
        command::MAX_MESSAGE_BYTES
    )
}

/// Header carrying an agent's secret for requests made on its behalf.
pub use crate::api::SECRET_HEADER;

/// Longest a long-poll or wait may last.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// What every handler shares: the broker, and what only HTTP needs (authentication, request
/// rules, connection limits), read once when the daemon starts serving. Derefs to the broker's
/// state, which handlers mostly read.
pub struct HttpState {
    pub broker: Arc<BrokerState>,
    /// API-key authentication, from the home's security settings at start.
    pub auth: Arc<auth::AuthConfig>,
    /// Host / Origin / content-type rules of every HTTP server, read from the environment at start.
    pub request_rules: guard::RequestRules,
    /// Idle timeout and connection limit shared by every HTTP server of this broker.
    pub connection_limits: Arc<server::ConnectionLimits>,
    /// The broker's multi-threaded runtime. The broker's Unix socket is served on a thread of
    /// its own (see `daemon`), so a request there that starts something lasting, an agent's
    /// endpoints, starts it here.
    pub runtime: tokio::runtime::Handle,
    /// Turns of [`long_read`]: at most two run at once.
    long_reads: Arc<tokio::sync::Semaphore>,
    /// One push config set at a time: its count is checked against the cap on the delivery
    /// worker's projection, which the next setter must see with the config before counting.
    pub push_config_turn: tokio::sync::Mutex<()>,
    /// One external agent added or removed at a time: whether an alias is taken is read from
    /// the delivery worker's projection, which the next caller must see with the change.
    pub externals_turn: tokio::sync::Mutex<()>,
}

impl HttpState {
    pub fn new(broker: Arc<BrokerState>, runtime: tokio::runtime::Handle) -> Arc<HttpState> {
        Arc::new(HttpState {
            runtime,
            long_reads: Arc::new(tokio::sync::Semaphore::new(2)),
            auth: Arc::new(auth::AuthConfig::from_trust(&broker.trust)),
            request_rules: guard::RequestRules::from_trust(&broker.trust),
            connection_limits: Arc::new(server::ConnectionLimits::from_env()),
            push_config_turn: tokio::sync::Mutex::new(()),
            externals_turn: tokio::sync::Mutex::new(()),
            broker,
        })
    }
}

impl std::ops::Deref for HttpState {
    type Target = BrokerState;
    fn deref(&self) -> &BrokerState {
        &self.broker
    }
}

type AppState = Arc<HttpState>;

/// Runs a read that may take long (every history record or task, a search that reads the events
/// the index has not reached, every file modification) and what it answers on a blocking
/// thread, at most two at a time: the broker's Unix socket is served by one thread
/// (`daemon::serve_unix`), which meanwhile answers the other commands and delivers to the agents.
async fn long_read<T: Send + 'static>(
    state: &AppState,
    read: impl FnOnce(&crate::store::Store) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    on_a_blocking_thread(&state.long_reads, state.store.clone(), move |store| read(store)).await
}

/// [`long_read`]'s work: `work` runs on a blocking thread once it has one of `turns`, which it
/// keeps until it ends, also when the caller has gone. A panic in it answers 503.
async fn on_a_blocking_thread<R: Send + 'static, T: Send + 'static>(
    turns: &Arc<tokio::sync::Semaphore>,
    resource: R,
    work: impl FnOnce(&R) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let unavailable = || ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "the read failed; try again");
    let turn = turns.clone().acquire_owned().await.map_err(|_| unavailable())?;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let done = work(&resource);
        crate::process::note_large_work();
        done
    })
    .await
    .unwrap_or_else(|_| Err(unavailable()))
}

/// The broker's own API (its Unix socket and TCP port).
pub fn broker_router(state: AppState) -> Router {
    Router::new()
        .route("/broker/health", get(broker_api::health))
        .route("/openapi.json", get(openapi::document))
        .route("/broker/shutdown", post(broker_api::shutdown))
        .route("/events", get(broker_api::events))
        .route("/admin/rebuild", post(broker_api::rebuild))
        .route("/admin/verify", post(broker_api::verify))
        .route("/admin/index", get(broker_api::index_progress).post(broker_api::index_history))
        .route("/agents", get(broker_api::list_agents).post(broker_api::register))
        .route("/agents/{agent}", axum::routing::delete(broker_api::deregister).post(jsonrpc::handle))
        .route("/agents/{agent}/", post(jsonrpc::handle))
        .route("/agents/{agent}/inbox", get(broker_api::inbox))
        .route("/agents/{agent}/inbox/{ticket}/ack", post(broker_api::ack))
        .route("/agents/{agent}/tasks/{id}/update", post(agent_tasks::update_task))
        .route("/agents/{agent}/status", get(broker_api::agent_status).post(broker_api::set_status))
        .route("/send", post(broker_api::send))
        .route("/reply", post(broker_api::reply))
        .route("/tasks/{id}", get(broker_api::global_task))
        .route("/tasks/{id}/wait", get(broker_api::wait_task))
        .merge(webhooks::routes())
        .merge(externals::routes())
        .merge(file_safety::routes())
        .merge(history::routes())
        .merge(dashboard::routes())
        .nest("/agents/{agent}", a2a_routes())
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(state.auth.clone(), auth::check))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::check))
        .with_state(state)
}

/// One agent's endpoints (its port and its socket).
pub fn agent_router(state: AppState, agent_id: String) -> Router {
    a2a_routes()
        .route("/", post(jsonrpc::handle))
        .route("/status", get(broker_api::agent_status))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::Extension(FixedAgent(agent_id)))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(Arc::new(state.auth.for_an_agent()), auth::check))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::check))
        .with_state(state)
}

fn a2a_routes() -> Router<AppState> {
    Router::new()
        .route("/.well-known/agent.json", get(a2a_card::synapse_card))
        .route("/.well-known/agent-card.json", get(a2a_card::agent_card))
        .route("/tasks/send", post(a2a_rest::tasks_send))
        .route("/tasks/send-priority", post(a2a_rest::tasks_send_priority))
        .route("/tasks/create", post(a2a_rest::tasks_create))
        .route("/tasks", get(a2a_rest::tasks_list))
        .route("/tasks/{id}", get(a2a_rest::agent_task))
        .route("/tasks/{id}/cancel", post(a2a_rest::tasks_cancel))
        .route("/tasks/{id}/subscribe", get(subscribe::subscribe))
        .route("/reply-stack/list", get(a2a_rest::reply_stack_list))
        .route("/reply-stack/get", get(a2a_rest::reply_stack_get))
        .route("/reply-stack/pop", get(a2a_rest::reply_stack_get))
        .nest(jsonrpc::http_json::BASE_PATH, jsonrpc::http_json::routes())
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}

/// A path that exists asked with a method it does not take (added after every route: it applies
/// to the routes there are when it is set).
async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, format!("this endpoint does not take {method}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use std::sync::mpsc;
    use tokio::sync::Semaphore;

    /// A read that says it has started, then waits until it is let go.
    fn blocking_read(
        started: tokio::sync::mpsc::UnboundedSender<u32>,
        number: u32,
    ) -> (mpsc::Sender<()>, impl FnOnce(&()) -> Result<u32, ApiError> + Send + 'static) {
        let (release, released) = mpsc::channel::<()>();
        let read = move |_: &()| {
            let _ = started.send(number);
            let _ = released.recv();
            Ok(number)
        };
        (release, read)
    }

    #[tokio::test]
    async fn at_most_two_long_reads_run_at_once_and_a_turn_is_kept_until_its_read_ends() {
        let turns = Arc::new(Semaphore::new(2));
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let mut releases = Vec::new();
        let mut callers = Vec::new();
        for number in 1..=3 {
            let (release, read) = blocking_read(started.clone(), number);
            releases.push(release);
            let turns = turns.clone();
            callers.push(tokio::spawn(async move { on_a_blocking_thread(&turns, (), read).await }));
        }
        let first_two = [starts.recv().await, starts.recv().await];
        assert_eq!(turns.available_permits(), 0);
        // The third cannot have a turn while both are taken.
        let waiting = (1..=3).find(|number| !first_two.contains(&Some(*number))).unwrap();
        assert!(starts.try_recv().is_err(), "a third read started while two ran");

        // One ends: the third starts.
        let ending = first_two[0].unwrap();
        releases[ending as usize - 1].send(()).unwrap();
        assert_eq!(starts.recv().await, Some(waiting));
        for release in &releases {
            let _ = release.send(());
        }
        let mut answers = Vec::new();
        for caller in callers {
            answers.push(caller.await.unwrap().unwrap());
        }
        answers.sort();
        assert_eq!(answers, [1, 2, 3]);

        // A caller that goes away leaves its read running, and the read keeps its turn.
        let (release, read) = blocking_read(started.clone(), 4);
        let caller = tokio::spawn({
            let turns = turns.clone();
            async move { on_a_blocking_thread(&turns, (), read).await }
        });
        assert_eq!(starts.recv().await, Some(4));
        caller.abort();
        assert!(caller.await.unwrap_err().is_cancelled());
        assert_eq!(turns.available_permits(), 1, "the read still runs, with its turn");
        release.send(()).unwrap();
        let both = tokio::time::timeout(Duration::from_secs(30), turns.acquire_many(2)).await;
        assert!(both.is_ok(), "the turn comes back when the read ends");
    }

    #[tokio::test]
    async fn a_read_that_panics_answers_503_and_gives_its_turn_back() {
        let turns = Arc::new(Semaphore::new(2));
        let answer: Result<(), ApiError> = on_a_blocking_thread(&turns, (), |_: &()| panic!("a bug in a read")).await;
        let status = answer.unwrap_err().into_response().status();
        assert_eq!(status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(turns.available_permits(), 2);
    }
}
