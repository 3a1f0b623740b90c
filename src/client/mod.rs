//! The CLI's connection to the broker: HTTP/1.1 over the broker's Unix socket (TCP on
//! 127.0.0.1 as a fallback), and starting the broker when none runs.
//!
//! Autostart (the atuin pattern): probe the socket; if nothing answers, take the start-up lock
//! (`$SYNAPSE_HOME/broker.start.lock`), probe again (another command may have started it
//! meanwhile), spawn `synapse broker` detached with its output in `broker.log`, and wait until
//! it answers its health check. The health answer carries the version: a broker of another
//! version is reported, never silently used.
//!
//! Every call has a time limit ([`Timeout`]): connecting and each request within
//! `SYNAPSE_CLIENT_TIMEOUT_MS` (default 30 s, 0 = none). A request that is itself a wait (a
//! `wait_ms` / `timeout_ms` query: inbox long polls, `send --wait`) gets that wait on top, and a
//! followed event stream (`follow=true`) has no limit once the broker has answered (it sends
//! keep-alives); so a broker that accepts and never answers cannot hang a command.

mod sending;

pub use sending::{ReplyWaitError, SendUncertain};

use crate::api::{self, BrokerInfo, ErrorBody, Outcome};
use crate::config::Paths;
use anyhow::{Context, anyhow, bail};
use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::{Duration, Instant};

/// How long a command waits for a broker it started to answer.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// The exit status of a broker that found the database held by another broker of the home.
pub const ALREADY_RUNNING_EXIT: i32 = 3;

/// How long connecting, or one request, may take by default.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The limit on one call: `SYNAPSE_CLIENT_TIMEOUT_MS` (0 = none), else [`DEFAULT_CALL_TIMEOUT`].
pub fn call_timeout() -> Option<Duration> {
    match std::env::var("SYNAPSE_CLIENT_TIMEOUT_MS").ok().and_then(|ms| ms.trim().parse::<u64>().ok()) {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => Some(DEFAULT_CALL_TIMEOUT),
    }
}

/// The broker did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error(
    "timed out after {} ms waiting for the broker ({what}); it may be overloaded or stuck. Set SYNAPSE_CLIENT_TIMEOUT_MS to wait longer (0 = no limit), or restart it with 'synapse broker stop'",
    limit.as_millis()
)]
pub struct Timeout {
    pub limit: Duration,
    pub what: String,
}

/// Runs `future` within `limit` (none: no limit); a late answer becomes a [`Timeout`].
async fn within<T>(
    limit: Option<Duration>,
    what: impl FnOnce() -> String,
    future: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match limit {
        None => future.await,
        Some(limit) => match tokio::time::timeout(limit, future).await {
            Ok(result) => result,
            Err(_) => Err(Timeout { limit, what: what() }.into()),
        },
    }
}

/// The longest wait a request asks the broker for (`wait_ms=` or `timeout_ms=` in its query).
fn requested_wait(path: &str) -> Duration {
    let Some((_, query)) = path.split_once('?') else { return Duration::ZERO };
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(name, _)| matches!(*name, "wait_ms" | "timeout_ms"))
        .filter_map(|(_, value)| value.parse::<u64>().ok())
        .map(Duration::from_millis)
        .max()
        .unwrap_or(Duration::ZERO)
}

/// The limit for a request to `path`: the call limit plus the wait it asks for.
fn limit_for(path: &str) -> Option<Duration> {
    call_timeout().map(|limit| limit.saturating_add(requested_wait(path)))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An open connection to the broker (or to one agent's endpoint).
pub struct Client {
    sender: Sender,
    secret: Option<String>,
}

/// Why a call to the broker failed. Callers branch on it: a connection that closed under a
/// send is retried with the same idempotency key, a 404 / 409 tells a wrapper its agent is gone.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The broker could not be reached, or the connection broke during the call.
    #[error("{doing}")]
    Unreachable {
        doing: &'static str,
        #[source]
        source: hyper::Error,
    },
    /// The broker did not answer within the call limit.
    #[error(transparent)]
    Timeout(#[from] Timeout),
    /// A non-2xx answer: the status and the body's message.
    #[error("{message}")]
    Http { status: StatusCode, message: String, body: Option<ErrorBody> },
    /// A 2xx answer that is not the JSON the contract says.
    #[error("the broker's answer to {what} is not understood")]
    BadAnswer {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// The request could not be made (a body that cannot be encoded, a bad path).
    #[error("cannot make the request {what}: {reason}")]
    Request { what: String, reason: String },
}

/// What [`ClientError::Unreachable`] says when the connection closed under a request (the
/// request may have been decided: only an idempotent one may be sent again).
const CLOSED: &str = "the broker closed the connection";
/// ... and when it closed while the answer was read (the request was decided then, most likely).
const READING: &str = "reading the broker's answer";

impl ClientError {
    /// The answer's status, for an HTTP error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Did the connection close while the request was out, or its answer coming in (so it may
    /// have been decided)?
    pub fn is_connection_closed(&self) -> bool {
        matches!(self, ClientError::Unreachable { doing, .. } if *doing == CLOSED || *doing == READING)
    }
}

/// A connection, and the pid of the process at its other end when the kernel names it (a Unix
/// socket's listener).
type Connected = (Sender, Option<u32>);

async fn connect_unix(paths: &Paths) -> std::io::Result<Connected> {
    connect_socket(&paths.broker_socket()).await
}

async fn connect_socket(socket: &std::path::Path) -> std::io::Result<Connected> {
    let stream = tokio::net::UnixStream::connect(socket).await?;
    // Secrets and messages go only to a broker of this user: the kernel names the other end.
    let peer = stream.peer_cred()?;
    let owner = peer.uid();
    if owner != crate::private_files::my_uid() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {owner}, not by you: refusing to talk to it (set SYNAPSE_UDS_DIR to a directory of yours)",
                socket.display()
            ),
        ));
    }
    let pid = peer.pid().and_then(|pid| u32::try_from(pid).ok());
    Ok((handshake(TokioIo::new(stream)).await?, pid))
}

async fn connect_tcp(port: u16) -> std::io::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    // Whoever listens on the port gets the request (an agent's secret, for a wrapper) and
    // decides what is typed into its terminal: a port another user took after the broker
    // died is refused, as another user's socket is. The broker's end of the connection shows
    // its owner in `/proc/net/tcp`.
    match crate::process::loopback_tcp_socket(stream.local_addr()?, stream.peer_addr()?) {
        Some(socket) if socket.uid == crate::private_files::my_uid() => {}
        found => {
            let who = found
                .map_or_else(|| "a process that cannot be traced".to_string(), |socket| format!("uid {}", socket.uid));
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("the broker's TCP port {port} is served by {who}, not by this user: nothing was sent"),
            ));
        }
    }
    stream.set_nodelay(true)?;
    handshake(TokioIo::new(stream)).await
}

async fn handshake<T>(io: T) -> std::io::Result<Sender>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io).await.map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Connects over the Unix socket, or TCP when the socket cannot be reached, within the call limit.
async fn connect_any(paths: &Paths) -> std::io::Result<Connected> {
    match call_timeout() {
        None => connect_any_now(paths).await,
        Some(limit) => tokio::time::timeout(limit, connect_any_now(paths)).await.unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("timed out after {} ms connecting to the broker", limit.as_millis()),
            ))
        }),
    }
}

async fn connect_any_now(paths: &Paths) -> std::io::Result<Connected> {
    match connect_unix(paths).await {
        Ok(connected) => Ok(connected),
        // Another user's socket where ours should be: no other way in is tried.
        Err(unix_error) if unix_error.kind() == std::io::ErrorKind::PermissionDenied => Err(unix_error),
        Err(unix_error) => {
            // broker.json outlives a killed broker, and its port may by now belong to another
            // process (another home's broker, an agent): only a live broker's port is tried.
            let port = broker_info_file(paths)
                .filter(|info| info.port != 0 && crate::process::is_pid_alive(info.pid))
                .map(|info| info.port);
            match port {
                Some(port) => match connect_unix(paths).await {
                    // The socket once more first: a broker binds it before it writes broker.json,
                    // so one that has just started (after the first try, before the file was
                    // read) is reached there. Over TCP the broker cannot tell which process
                    // calls, and a wrapper cannot register (seen once in a loaded suite run,
                    // where two commands started the broker together).
                    Ok(connected) => Ok(connected),
                    Err(again) if again.kind() == std::io::ErrorKind::PermissionDenied => Err(again),
                    Err(again) => {
                        // Said: why the socket failed explains what follows.
                        tracing::warn!(
                            "cannot connect to {} ({again}); using the broker's TCP port {port}",
                            paths.broker_socket().display()
                        );
                        connect_tcp(port).await.map(|sender| (sender, None)).map_err(|tcp| {
                            // Another user's port is said; otherwise why the socket failed is.
                            if tcp.kind() == std::io::ErrorKind::PermissionDenied {
                                tracing::warn!("{tcp}");
                                tcp
                            } else {
                                again
                            }
                        })
                    }
                },
                None => Err(unix_error),
            }
        }
    }
}

/// Does the broker's info file (`broker.json`, written once it serves, removed as soon as it
/// begins to stop) name `pid` as a broker of this version, and does that process still run?
/// `pid` is what the kernel says listens on the socket, so the file speaks for the broker this
/// connection reaches. A broker killed with SIGKILL leaves the file behind, and its socket
/// accepts connections (then resets them) until its last thread has gone, after its main
/// thread shows as a zombie: the health check finds that out, as it did before.
fn info_file_names(paths: &Paths, pid: u32) -> bool {
    broker_info_file(paths).is_some_and(|info| info.pid == pid && info.version == api::VERSION && of_this_build(&info))
        && crate::process::is_pid_alive(pid)
}

/// Is the broker of this process's build (or older than builds being reported)?
fn of_this_build(info: &BrokerInfo) -> bool {
    info.build.is_empty() || info.build == crate::config::BUILD_ID
}

/// Whether this process says so when the broker runs another build of this version (the
/// `synapse` commands do; an agent's wrapper, which draws the terminal, does not).
static WARN_OF_OTHER_BUILDS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This process's commands say on stderr, once, when the broker runs another build.
pub fn warn_of_other_builds() {
    WARN_OF_OTHER_BUILDS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A broker of this version but another build (one reinstalled while it ran) serves on: the
/// API of one version is the same. Said once, so the user knows which code answers.
fn note_other_build(info: &BrokerInfo) {
    if of_this_build(info) {
        return;
    }
    tracing::info!("the broker (pid {}) runs build {}, this process {}", info.pid, info.build, crate::config::BUILD_ID);
    if WARN_OF_OTHER_BUILDS.swap(false, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "Warning: the running broker (pid {}) is another build of synapse {} than this command; to run this build's broker: 'synapse broker stop', then 'synapse broker start' (agents reconnect to it)",
            info.pid,
            api::VERSION
        );
    }
}

/// The broker's info file (`broker.json`), when it is there and readable.
fn broker_info_file(paths: &Paths) -> Option<BrokerInfo> {
    std::fs::read(paths.broker_info()).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

/// Tries to reach a broker just started before giving up.
const CONNECT_ATTEMPTS: u64 = 5;

/// The running broker is another version than this synapse.
#[derive(Debug, thiserror::Error)]
#[error(
    "the running broker is version {running} (pid {pid}), this synapse is {}. Run 'synapse broker stop' and try again",
    api::VERSION
)]
pub struct VersionMismatch {
    running: String,
    pid: u32,
}

/// The broker at this home's socket serves another home (two homes share the default socket
/// folder): its log is not this home's, nor its settings.
#[derive(Debug, thiserror::Error)]
#[error(
    "the broker at {socket} serves SYNAPSE_HOME={theirs}, not {ours}: give each home its own socket folder (SYNAPSE_UDS_DIR)"
)]
pub struct HomeMismatch {
    socket: String,
    theirs: String,
    ours: String,
}

/// A handshake's failure that trying again (or starting a broker) does not mend: a broker of
/// another version or home, or one that holds the connection without answering (stuck).
fn is_final(error: &anyhow::Error) -> bool {
    error.downcast_ref::<VersionMismatch>().is_some()
        || error.downcast_ref::<HomeMismatch>().is_some()
        || error.downcast_ref::<Timeout>().is_some()
}

/// Refuses a broker that serves another home than `paths`'s.
pub fn ensure_home(paths: &Paths, info: &BrokerInfo) -> anyhow::Result<()> {
    if same_home(&info.home, &paths.home) {
        return Ok(());
    }
    Err(HomeMismatch {
        socket: paths.broker_socket().display().to_string(),
        theirs: info.home.clone(),
        ours: paths.home.display().to_string(),
    }
    .into())
}

/// Do `theirs` (as a broker reports its home) and `ours` name one directory? Compared resolved
/// (symbolic links, `..`), else as written. A home whose path is not UTF-8 is reported with
/// replacement characters (the answer is JSON), so it is compared in that form.
fn same_home(theirs: &str, ours: &std::path::Path) -> bool {
    let resolved = std::fs::canonicalize(ours);
    let ours_resolved = resolved.as_deref().unwrap_or(ours);
    let theirs_path = std::path::Path::new(theirs);
    let same = match std::fs::canonicalize(theirs_path) {
        Ok(theirs) => theirs == ours_resolved,
        Err(_) => theirs_path == ours_resolved,
    };
    // The broker reports the home as its command line gave it (made absolute, not resolved), in
    // JSON: a name that is not UTF-8 comes with replacement characters, and either spelling of
    // ours may be its. Two homes whose names differ only in such bytes are not told apart.
    same || ((ours.to_str().is_none() || ours_resolved.to_str().is_none())
        && (ours.to_string_lossy() == theirs || ours_resolved.to_string_lossy() == theirs))
}

/// The broker was stopped on purpose (`synapse broker stop`) and none has been started since;
/// an agent wrapper waits for one instead of starting it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the broker for SYNAPSE_HOME={home} was stopped on purpose ('synapse broker stop'): an agent does not start it again; start it with 'synapse broker start'"
)]
pub struct StoppedOnPurpose {
    home: String,
}

fn refuse_if_stopped(paths: &Paths) -> anyhow::Result<()> {
    if crate::trust::is_stopped_on_purpose(&paths.home) {
        return Err(StoppedOnPurpose { home: paths.home.display().to_string() }.into());
    }
    Ok(())
}

impl Client {
    /// Connects to the running broker, starting one when `autostart` is set and none runs.
    /// Inside an agent (`SYNAPSE_AGENT_ID`: its CLI's commands and MCP server) a broker stopped
    /// on purpose is not started again: the user stopped it (to upgrade it, say), and an agent
    /// at work would restart the old one behind their back.
    pub async fn connect(paths: &Paths, autostart: bool) -> anyhow::Result<Client> {
        Client::connect_with(paths, autostart, inside_an_agent()).await
    }

    /// `synapse broker start`: connects, starting a broker even when the last one was stopped
    /// on purpose (that is what the command is for), inside an agent too.
    pub async fn connect_starting(paths: &Paths) -> anyhow::Result<Client> {
        Client::connect_with(paths, true, false).await
    }

    /// For agent wrappers: like `connect(paths, true)`, but never starts a broker that was
    /// stopped on purpose ([`StoppedOnPurpose`]: the caller waits and tries again).
    pub async fn connect_unless_stopped(paths: &Paths) -> anyhow::Result<Client> {
        Client::connect_with(paths, true, true).await
    }

    /// [`Client::connect`] with the stop rule chosen: `respect_stop` never starts a broker
    /// stopped on purpose.
    pub async fn connect_with(paths: &Paths, autostart: bool, respect_stop: bool) -> anyhow::Result<Client> {
        let secret = std::env::var("SYNAPSE_AGENT_SECRET").ok().filter(|s| !s.is_empty());
        if let Ok((sender, peer)) = connect_any(paths).await {
            let mut client = Client { sender, secret: secret.clone() };
            // The broker's info file names the process at the socket's other end, of this
            // version: its health check would say no more (one round trip saved per command).
            if peer.is_some_and(|pid| info_file_names(paths, pid)) {
                return Ok(client);
            }
            match client.check_version(paths).await {
                Ok(()) => return Ok(client),
                // A broker that holds the connection without answering is stuck, not absent:
                // starting another one would only fail on its socket.
                Err(error) if !autostart || is_final(&error) => {
                    return Err(error);
                }
                // A broker that accepted the connection and then dropped it (stopping, or a
                // stale socket): start one if none answers, as below.
                Err(error) => tracing::debug!("the broker did not answer: {error:#}"),
            }
        }
        if !autostart {
            bail!("no broker is running for SYNAPSE_HOME={}", paths.home.display());
        }
        if respect_stop {
            refuse_if_stopped(paths)?;
        }
        start_broker_unless(paths, respect_stop).await?;
        // The broker has answered its health check; a connection it resets now (seen under
        // heavy load, about once in forty restarts) is tried again rather than reported.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = async {
                let (sender, _) = connect_any(paths).await.with_context(|| {
                    format!("the broker started but {} does not answer", paths.broker_socket().display())
                })?;
                let mut client = Client { sender, secret: secret.clone() };
                client.check_version(paths).await?;
                anyhow::Ok(client)
            }
            .await;
            match result {
                Ok(client) => return Ok(client),
                Err(error) if attempt >= CONNECT_ATTEMPTS || is_final(&error) => {
                    return Err(error);
                }
                Err(error) => {
                    tracing::debug!("connecting to the new broker: {error:#}; trying again");
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
            }
        }
    }

    /// [`Client::connect_unless_stopped`], tried again until a broker answers: for what lives
    /// across a broker's restart (a wrapper, a followed event stream). A broker stopped on
    /// purpose is waited for, never started; one that crashed is started again. A broker of
    /// another version or home is waited out too (a wrapper keeps its CLI running meanwhile).
    pub async fn connect_when_available(paths: &Paths) -> Client {
        // Never an error without `refuse_other`: the loop only satisfies the types.
        loop {
            if let Ok(client) = Client::wait_for_broker(paths, false).await {
                return client;
            }
        }
    }

    /// [`Client::connect_when_available`], but a broker of another version or another home is
    /// an error (`events --follow`: waiting would print nothing, for good, without a word).
    pub async fn connect_when_available_unless_other(paths: &Paths) -> anyhow::Result<Client> {
        Client::wait_for_broker(paths, true).await
    }

    async fn wait_for_broker(paths: &Paths, refuse_other: bool) -> anyhow::Result<Client> {
        let mut delay = Duration::from_millis(20);
        let mut said = false;
        loop {
            match Client::connect_unless_stopped(paths).await {
                Ok(client) => return Ok(client),
                Err(error)
                    if refuse_other
                        && (error.downcast_ref::<VersionMismatch>().is_some()
                            || error.downcast_ref::<HomeMismatch>().is_some()) =>
                {
                    return Err(error);
                }
                // Said once: the wait may be long (until someone starts a broker).
                Err(error) if !said => {
                    said = true;
                    tracing::warn!("cannot reach the broker ({error:#}); retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(error) => {
                    tracing::debug!("cannot reach the broker ({error:#}); retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// A connection to the Unix socket at `socket` (the broker's or an agent's), without the
    /// version handshake: for the benchmarks, which start the broker themselves.
    pub async fn at_socket(socket: &std::path::Path) -> std::io::Result<Client> {
        Ok(Client { sender: connect_socket(socket).await?.0, secret: None })
    }

    /// Only connects: None when no broker runs.
    pub async fn try_connect(paths: &Paths) -> Option<Client> {
        Client::try_connect_saying_how(paths).await.map(|(client, _)| client)
    }

    /// [`Client::try_connect`], and the process at the other end of the Unix socket, as the
    /// kernel names it (None over the TCP port that `broker.json` names).
    async fn try_connect_saying_how(paths: &Paths) -> Option<(Client, Option<u32>)> {
        let (sender, unix_peer) = connect_any(paths).await.ok()?;
        // Inside an agent the agent's secret goes along, as with `connect`: the broker then
        // knows the caller is that agent, not the user (who alone may stop the broker).
        Some((Client { sender, secret: client_secret() }, unix_peer))
    }

    /// Is the broker at the other end one this synapse may use: this version, serving this home?
    async fn check_version(&mut self, paths: &Paths) -> anyhow::Result<()> {
        let info = match self.health().await {
            Ok(info) => info,
            // Kept apart: the caller does not start another broker beside a stuck one.
            Err(ClientError::Timeout(timeout)) => return Err(timeout.into()),
            Err(error) => return Err(error.into()),
        };
        // Another home's broker first: stopping it would not help this home.
        ensure_home(paths, &info)?;
        if info.version != api::VERSION {
            return Err(VersionMismatch { running: info.version, pid: info.pid }.into());
        }
        note_other_build(&info);
        Ok(())
    }

    /// Sends `secret` with every request (the wrapper acting as its agent).
    pub fn set_secret(&mut self, secret: String) {
        self.secret = Some(secret);
    }

    /// Stops sending a secret (the next requests are the user's, or anonymous).
    pub fn clear_secret(&mut self) {
        self.secret = None;
    }

    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    // ---- the broker -----------------------------------------------------------------------

    /// `GET /broker/health`: the broker's info, also when it answers 503 because it cannot
    /// store at the moment (`healthy: false`). It runs and serves reads then, so the version
    /// handshake and the readiness probe accept it.
    pub async fn health(&mut self) -> Result<BrokerInfo, ClientError> {
        let what = "GET /broker/health";
        let (status, bytes) = self.exchange(Method::GET, "/broker/health", None).await?;
        if status == StatusCode::SERVICE_UNAVAILABLE
            && let Ok(info) = serde_json::from_slice::<BrokerInfo>(&bytes)
        {
            return Ok(info);
        }
        answer(what, status, &bytes)
    }

    /// `GET /dashboard/page-key` (the user only): the dashboard page's key.
    pub async fn page_key(&mut self) -> Result<api::PageKey, ClientError> {
        self.call(Method::GET, "/dashboard/page-key", None::<&()>).await
    }

    /// `POST /broker/shutdown` (the user only).
    pub async fn shutdown(&mut self) -> Result<api::Stopping, ClientError> {
        self.call(Method::POST, "/broker/shutdown", None::<&()>).await
    }

    /// `POST /admin/rebuild`: drops the projections and replays the log.
    pub async fn rebuild(&mut self) -> Result<api::RebuildReport, ClientError> {
        self.call(Method::POST, "/admin/rebuild", None::<&()>).await
    }

    /// `POST /admin/verify`: replays into scratch tables and compares.
    pub async fn verify(&mut self) -> Result<api::VerifyReport, ClientError> {
        self.call(Method::POST, "/admin/verify", None::<&()>).await
    }

    /// `GET /admin/index`: how far the history index has come.
    pub async fn index_progress(&mut self) -> Result<api::IndexProgress, ClientError> {
        self.call(Method::GET, "/admin/index", None::<&()>).await
    }

    /// `POST /admin/index`: brings the history index up to the newest event.
    pub async fn index_history(&mut self) -> Result<api::IndexProgress, ClientError> {
        self.call(Method::POST, "/admin/index", None::<&()>).await
    }

    /// `GET /events`: each event's JSON (an `event::Envelope`) to `on_event` until it returns
    /// false or the stream ends (`follow`: it keeps following new events).
    pub async fn events(
        &mut self,
        after: u64,
        follow: bool,
        agent: Option<&str>,
        kinds: Option<&str>,
        on_event: impl FnMut(&str) -> bool,
    ) -> Result<(), ClientError> {
        let mut path = format!("/events?after={after}&follow={follow}");
        if let Some(agent) = agent {
            path.push_str(&format!("&agent={}", percent_encode(agent)));
        }
        if let Some(kinds) = kinds {
            path.push_str(&format!("&kind={}", percent_encode(kinds)));
        }
        self.sse(&path, on_event).await
    }

    // ---- agents ---------------------------------------------------------------------------

    /// `POST /agents`.
    pub async fn register(&mut self, request: &api::RegisterRequest) -> Result<api::Registration, ClientError> {
        self.call(Method::POST, "/agents", Some(request)).await
    }

    /// `DELETE /agents/{agent}` (with the agent's secret).
    pub async fn deregister(&mut self, agent_id: &str) -> Result<api::Deregistered, ClientError> {
        self.call(Method::DELETE, &format!("/agents/{}", percent_encode(agent_id)), None::<&()>).await
    }

    /// `GET /agents`: the running agents.
    pub async fn agents(&mut self) -> Result<api::AgentList, ClientError> {
        self.call(Method::GET, "/agents", None::<&()>).await
    }

    /// `GET /agents/{agent}/status`.
    pub async fn agent_status(&mut self, agent_id: &str) -> Result<api::AgentStatusView, ClientError> {
        self.call(Method::GET, &format!("/agents/{}/status", percent_encode(agent_id)), None::<&()>).await
    }

    /// `POST /agents/{agent}/status` (with the agent's secret).
    pub async fn set_status(&mut self, agent_id: &str, update: &api::StatusUpdate) -> Result<Outcome, ClientError> {
        self.call(Method::POST, &format!("/agents/{}/status", percent_encode(agent_id)), Some(update)).await
    }

    /// `GET /agents/{agent}/inbox`: at most `limit` tickets (the broker's default: 100),
    /// waiting up to `wait_ms` for one when the inbox is empty.
    pub async fn inbox(
        &mut self,
        agent_id: &str,
        wait_ms: u64,
        limit: Option<usize>,
    ) -> Result<api::Inbox, ClientError> {
        let limit = limit.map(|limit| format!("&limit={limit}")).unwrap_or_default();
        self.call(
            Method::GET,
            &format!("/agents/{}/inbox?wait_ms={wait_ms}{limit}", percent_encode(agent_id)),
            None::<&()>,
        )
        .await
    }

    /// `POST /agents/{agent}/inbox/{ticket}/ack`: the ticket was written (with the agent's secret).
    pub async fn ack(
        &mut self,
        agent_id: &str,
        ticket: u64,
        how: Option<crate::event::Delivery>,
    ) -> Result<Outcome, ClientError> {
        let path = format!("/agents/{}/inbox/{ticket}/ack{}", percent_encode(agent_id), how_query('?', how));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// `POST /agents/{agent}/inbox/{ticket}/ack?next=true`: acknowledges the ticket and answers
    /// with the first `limit` tickets of the inbox as they stand once that is stored.
    pub async fn ack_then_inbox(
        &mut self,
        agent_id: &str,
        ticket: u64,
        how: Option<crate::event::Delivery>,
        limit: usize,
    ) -> Result<api::AckAndInbox, ClientError> {
        let path = format!(
            "/agents/{}/inbox/{ticket}/ack?next=true&limit={limit}{}",
            percent_encode(agent_id),
            how_query('&', how)
        );
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// `GET /agents/{agent}/reply-stack/list`: the senders waiting for this agent's reply.
    pub async fn reply_targets(&mut self, agent_id: &str) -> Result<api::ReplyTargets, ClientError> {
        self.call(Method::GET, &format!("/agents/{}/reply-stack/list", percent_encode(agent_id)), None::<&()>).await
    }

    /// `POST /agents/{agent}/tasks/{id}/update`: the agent moves a task it received.
    pub async fn update_task(
        &mut self,
        agent_id: &str,
        task_id: &str,
        update: &api::TaskUpdate,
    ) -> Result<api::TaskAnswer, ClientError> {
        let path = format!("/agents/{}/tasks/{}/update", percent_encode(agent_id), percent_encode(task_id));
        self.call(Method::POST, &path, Some(update)).await
    }

    // ---- messages and tasks ---------------------------------------------------------------

    /// `POST /send`.
    pub async fn send(&mut self, request: &api::SendRequest) -> Result<api::SendAnswer, ClientError> {
        self.call(Method::POST, "/send", Some(request)).await
    }

    /// `POST /reply`.
    pub async fn reply(&mut self, request: &api::ReplyRequest) -> Result<api::SendAnswer, ClientError> {
        self.call(Method::POST, "/reply", Some(request)).await
    }

    /// `GET /tasks/{id}` (full id or prefix).
    pub async fn task(&mut self, task_id: &str) -> Result<api::TaskAnswer, ClientError> {
        self.call(Method::GET, &format!("/tasks/{}", percent_encode(task_id)), None::<&()>).await
    }

    /// `GET /tasks/{id}/wait`: once the task is final, or when `timeout` has passed.
    pub async fn wait_task(&mut self, task_id: &str, timeout: Duration) -> Result<api::TaskWait, ClientError> {
        let path = format!("/tasks/{}/wait?timeout_ms={}", percent_encode(task_id), timeout.as_millis());
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `POST /agents/{agent}/tasks/{id}/cancel`.
    pub async fn cancel(&mut self, agent_id: &str, task_id: &str) -> Result<api::TaskAnswer, ClientError> {
        let path = format!("/agents/{}/tasks/{}/cancel", percent_encode(agent_id), percent_encode(task_id));
        self.call(Method::POST, &path, None::<&()>).await
    }

    // ---- history --------------------------------------------------------------------------

    /// `GET /history`: the newest records first.
    pub async fn history(&mut self, agent: Option<&str>, limit: usize) -> Result<api::HistoryRecords, ClientError> {
        self.call(Method::GET, &format!("/history?limit={limit}{}", agent_filter("&", agent)), None::<&()>).await
    }

    /// `GET /history/{id}`: the records of one task.
    pub async fn history_of_task(&mut self, task_id: &str) -> Result<api::HistoryRecords, ClientError> {
        self.call(Method::GET, &format!("/history/{}", percent_encode(task_id)), None::<&()>).await
    }

    /// `GET /threads/{id}`: the conversation a task belongs to, oldest first.
    pub async fn thread(&mut self, task_id: &str) -> Result<api::HistoryRecords, ClientError> {
        self.call(Method::GET, &format!("/threads/{}", percent_encode(task_id)), None::<&()>).await
    }

    /// `GET /history/search`.
    pub async fn search_history(
        &mut self,
        keywords: &[String],
        logic: &str,
        case_sensitive: bool,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<api::HistoryRecords, ClientError> {
        // One `keyword` each, so that a comma stays inside its keyword.
        let keywords: String = keywords.iter().map(|keyword| format!("&keyword={}", percent_encode(keyword))).collect();
        let path = format!(
            "/history/search?logic={}&case_sensitive={case_sensitive}&limit={limit}{keywords}{}",
            percent_encode(logic),
            agent_filter("&", agent)
        );
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET /history/stats`.
    pub async fn history_stats(&mut self, agent: Option<&str>) -> Result<api::HistoryStats, ClientError> {
        self.call(Method::GET, &format!("/history/stats{}", agent_filter("?", agent)), None::<&()>).await
    }

    /// `POST /history/cleanup`.
    pub async fn cleanup_history(
        &mut self,
        request: &api::HistoryCleanup,
    ) -> Result<api::HistoryCleanupAnswer, ClientError> {
        self.call(Method::POST, "/history/cleanup", Some(request)).await
    }

    // ---- file safety ----------------------------------------------------------------------

    /// `GET /file-safety/status`.
    pub async fn file_safety_status(&mut self) -> Result<api::FileSafetyStatus, ClientError> {
        self.call(Method::GET, "/file-safety/status", None::<&()>).await
    }

    /// `GET /file-safety/locks`.
    pub async fn locks(&mut self, agent: Option<&str>) -> Result<api::Locks, ClientError> {
        self.call(Method::GET, &format!("/file-safety/locks{}", agent_filter("?", agent)), None::<&()>).await
    }

    /// `POST /file-safety/lock`.
    pub async fn lock(&mut self, request: &api::LockRequest) -> Result<api::Locked, ClientError> {
        // The broker waits up to `wait_seconds` for the file to be free before it answers: the
        // call must not give up first (the lock could then be taken after all, for a caller
        // told it was not).
        let wait = Duration::from_secs(request.wait_seconds.unwrap_or(0));
        self.call_waiting(wait, Method::POST, "/file-safety/lock", Some(request)).await
    }

    /// `POST /file-safety/unlock`.
    pub async fn unlock(&mut self, request: &api::UnlockRequest) -> Result<api::Unlocked, ClientError> {
        self.call(Method::POST, "/file-safety/unlock", Some(request)).await
    }

    /// `GET /file-safety/history`: a file's modifications, newest first.
    pub async fn file_history(&mut self, path: &str, limit: usize) -> Result<api::Modifications, ClientError> {
        let query = format!("/file-safety/history?path={}&limit={limit}", percent_encode(path));
        self.call(Method::GET, &query, None::<&()>).await
    }

    /// `GET /file-safety/recent`: every file's recent modifications.
    pub async fn recent_modifications(
        &mut self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<api::Modifications, ClientError> {
        let query = format!("/file-safety/recent?limit={limit}{}", agent_filter("&", agent));
        self.call(Method::GET, &query, None::<&()>).await
    }

    /// `POST /file-safety/record`.
    pub async fn record_modification(&mut self, request: &api::RecordRequest) -> Result<api::Recorded, ClientError> {
        self.call(Method::POST, "/file-safety/record", Some(request)).await
    }

    /// `POST /file-safety/validate`.
    pub async fn validate_write(&mut self, request: &api::ValidateRequest) -> Result<api::Validation, ClientError> {
        self.call(Method::POST, "/file-safety/validate", Some(request)).await
    }

    /// `POST /file-safety/cleanup`.
    pub async fn cleanup_file_safety(
        &mut self,
        request: &api::FileCleanup,
    ) -> Result<api::FileCleanupAnswer, ClientError> {
        self.call(Method::POST, "/file-safety/cleanup", Some(request)).await
    }

    // ---- external agents ------------------------------------------------------------------

    /// `POST /external`.
    pub async fn add_external(&mut self, request: &api::AddExternal) -> Result<api::ExternalAnswer, ClientError> {
        self.call(Method::POST, "/external", Some(request)).await
    }

    /// `GET /external`.
    pub async fn externals(&mut self) -> Result<api::ExternalList, ClientError> {
        self.call(Method::GET, "/external", None::<&()>).await
    }

    /// `GET /external/{alias}`.
    pub async fn external(&mut self, alias: &str) -> Result<api::ExternalAnswer, ClientError> {
        self.call(Method::GET, &format!("/external/{}", percent_encode(alias)), None::<&()>).await
    }

    /// `POST /external/{alias}/send`.
    pub async fn send_external(
        &mut self,
        alias: &str,
        request: &api::ExternalSend,
    ) -> Result<api::ExternalSent, ClientError> {
        // The broker follows the remote task for up to `wait_seconds` before it answers.
        let wait = Duration::from_secs(request.wait_seconds.unwrap_or(0));
        let path = format!("/external/{}/send", percent_encode(alias));
        self.call_waiting(wait, Method::POST, &path, Some(request)).await
    }

    /// `DELETE /external/{alias}`.
    pub async fn remove_external(&mut self, alias: &str) -> Result<(), ClientError> {
        let _: api::Removed =
            self.call(Method::DELETE, &format!("/external/{}", percent_encode(alias)), None::<&()>).await?;
        Ok(())
    }

    // ---- the transport --------------------------------------------------------------------

    fn build(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Request<Full<Bytes>>, ClientError> {
        // An empty argument (`synapse history show ""`) leaves an empty segment, which no
        // endpoint has: the broker would answer "no such endpoint".
        if path.split('?').next().unwrap_or(path).split('/').skip(1).any(str::is_empty) {
            return Err(ClientError::Request {
                what: what_of(&method, path),
                reason: "an id or name given for it is empty".into(),
            });
        }
        // A loopback name: the broker refuses other hosts (a browser page's DNS rebinding).
        let mut builder = Request::builder().method(method.clone()).uri(path).header("host", "localhost");
        if let Some(key) = api_key() {
            builder = builder.header(api::API_KEY_HEADER, key);
        }
        if let Some(secret) = &self.secret {
            builder = builder.header(api::SECRET_HEADER, secret);
        }
        let bytes = match body {
            Some(body) => {
                builder = builder.header("content-type", "application/json");
                Bytes::from(body)
            }
            None => Bytes::new(),
        };
        builder
            .body(Full::new(bytes))
            .map_err(|error| ClientError::Request { what: what_of(&method, path), reason: error.to_string() })
    }

    /// One request and its whole answer, within the call limit (plus the wait it asks for).
    async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        self.exchange_within(limit_for(path), method, path, body).await
    }

    /// [`Client::exchange`] with its own time limit (None: none).
    async fn exchange_within(
        &mut self,
        limit: Option<Duration>,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let request = self.build(method.clone(), path, body)?;
        let sender = &mut self.sender;
        within(limit, || what_of(&method, path), async move {
            // hyper takes a request only once the connection is idle again: right after the
            // previous answer was read it may still be finishing it ("connection was not ready").
            sender.ready().await.map_err(|source| ClientError::Unreachable { doing: CLOSED, source })?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|source| ClientError::Unreachable { doing: CLOSED, source })?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|source| ClientError::Unreachable { doing: READING, source })?
                .to_bytes();
            Ok((status, bytes))
        })
        .await
    }

    /// One request with a JSON body (if any) and a JSON answer of type `T`; a non-2xx answer
    /// is a [`ClientError::Http`] carrying the body's message.
    async fn call<T: DeserializeOwned>(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        self.call_within(limit_for(path), method, path, body).await
    }

    /// [`Client::call`] for a request whose wait is in its body: the call limit plus `wait`.
    async fn call_waiting<T: DeserializeOwned>(
        &mut self,
        wait: Duration,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        self.call_within(call_timeout().map(|limit| limit.saturating_add(wait)), method, path, body).await
    }

    /// [`Client::call`] within `limit` (None: none).
    async fn call_within<T: DeserializeOwned>(
        &mut self,
        limit: Option<Duration>,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let what = what_of(&method, path);
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|error| ClientError::Request { what: what.clone(), reason: error.to_string() })?;
        let (status, bytes) = self.exchange_within(limit, method, path, body).await?;
        answer(&what, status, &bytes)
    }

    /// Opens a server-sent-event stream; `on_event` gets each event's `data` until it returns
    /// false or the stream ends.
    ///
    /// The broker must answer within the call limit; after that a stream that is not followed
    /// (`follow=true`) must bring something (an event or a keep-alive) within the limit each time.
    async fn sse(&mut self, path: &str, mut on_event: impl FnMut(&str) -> bool) -> Result<(), ClientError> {
        let request = self.build(Method::GET, path, None)?;
        let limit = call_timeout();
        let what = || what_of(&Method::GET, path);
        let sender = &mut self.sender;
        let response = within(limit, what, async move {
            sender.ready().await.map_err(|source| ClientError::Unreachable { doing: CLOSED, source })?;
            sender.send_request(request).await.map_err(|source| ClientError::Unreachable { doing: CLOSED, source })
        })
        .await?;
        let follows = path.contains("follow=true");
        let frame_limit = if follows { None } else { limit };
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = within(limit, what, async {
                body.collect()
                    .await
                    .map(|collected| collected.to_bytes())
                    .map_err(|source| ClientError::Unreachable { doing: READING, source })
            })
            .await?;
            let body = serde_json::from_slice::<ErrorBody>(&bytes).ok();
            let message = body.as_ref().map_or_else(|| "request failed".to_string(), |body| body.message.clone());
            return Err(ClientError::Http { status, message, body });
        }
        let mut buffer: Vec<u8> = Vec::new();
        while let Some(frame) = within(frame_limit, what, async { Ok(body.frame().await) }).await? {
            let frame = frame.map_err(|source| ClientError::Unreachable { doing: "the event stream broke", source })?;
            let Some(data) = frame.data_ref() else { continue };
            buffer.extend_from_slice(data);
            while let Some(end) = find_event_end(&buffer) {
                let event: Vec<u8> = buffer.drain(..end.1).collect();
                let text = String::from_utf8_lossy(&event[..end.0]);
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if !data.is_empty() && !on_event(&data.join("\n")) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// `METHOD /path` without the query, for messages.
fn what_of(method: &Method, path: &str) -> String {
    format!("{method} {}", path.split('?').next().unwrap_or(path))
}

/// The answer `bytes` as `T` when `status` is a success, else the error it carries.
fn answer<T: DeserializeOwned>(what: &str, status: StatusCode, bytes: &[u8]) -> Result<T, ClientError> {
    if status.is_success() {
        return serde_json::from_slice(bytes)
            .map_err(|source| ClientError::BadAnswer { what: what.to_string(), source });
    }
    let body = serde_json::from_slice::<ErrorBody>(bytes).ok();
    let message = match &body {
        Some(body) => body.message.clone(),
        // Not the broker's error shape (a proxy, a crash): shown as it came.
        None => {
            let shown = serde_json::from_slice::<serde_json::Value>(bytes)
                .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()));
            format!("the broker answered {status}: {shown}")
        }
    };
    Err(ClientError::Http { status, message, body })
}

/// `<separator>agent=<agent>` when an agent is given.
fn agent_filter(separator: &str, agent: Option<&str>) -> String {
    agent.map(|agent| format!("{separator}agent={}", percent_encode(agent))).unwrap_or_default()
}

/// `<separator>how=<how>` when the acknowledgement says how the ticket reached the CLI.
fn how_query(separator: char, how: Option<crate::event::Delivery>) -> String {
    how.map(|how| format!("{separator}how={how}")).unwrap_or_default()
}

/// Percent-encodes a path segment or query value.
pub fn percent_encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, PATH_SEGMENT).to_string()
}

/// What stays as it is in a path segment or query value: RFC 3986's unreserved characters, and
/// `,` (kind lists); everything else is percent-encoded.
const PATH_SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b',');

/// The API key the CLI sends when auth is on: `SYNAPSE_API_KEY`, else the first of
/// `SYNAPSE_API_KEYS`.
fn api_key() -> Option<String> {
    std::env::var("SYNAPSE_API_KEY").ok().filter(|key| !key.trim().is_empty()).or_else(|| {
        std::env::var("SYNAPSE_API_KEYS")
            .ok()?
            .split(',')
            .map(str::trim)
            .find(|key| !key.is_empty())
            .map(str::to_string)
    })
}

/// Position of the blank line ending the first SSE event: (end of event, end of separator).
fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    buffer.windows(2).position(|pair| pair == b"\n\n").map(|at| (at, at + 2))
}

/// Starts a broker in the background and waits until it answers.
pub async fn start_broker(paths: &Paths) -> anyhow::Result<()> {
    start_broker_unless(paths, false).await
}

/// Starts a broker unless `respect_stop` and the last one was stopped on purpose (checked again
/// under the start-up lock, so a stop that lands meanwhile is seen).
async fn start_broker_unless(paths: &Paths, respect_stop: bool) -> anyhow::Result<()> {
    // Nothing is written into a home of another user (the broker would refuse it anyway).
    paths.own_home()?;
    let lock_path = paths.start_lock();
    let lock =
        crate::private_files::open_write(&lock_path).with_context(|| format!("cannot open {}", lock_path.display()))?;
    // Another command holding the lock is starting a broker: its start is waited for, as long
    // as a start may take and at least the call limit (a holder that hangs, stopped with Ctrl-Z
    // say, is not waited for forever).
    let patience = call_timeout().map(|limit| limit.max(START_TIMEOUT + Duration::from_secs(5)));
    let waiting_since = Instant::now();
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => {
                if answers_health(paths).await {
                    return Ok(());
                }
                if let Some(limit) = patience
                    && waiting_since.elapsed() >= limit
                {
                    bail!(
                        "another synapse command has been starting the broker for {} ms and still holds {}; no broker answers. Set SYNAPSE_CLIENT_TIMEOUT_MS to wait longer (0 = no limit)",
                        limit.as_millis(),
                        lock_path.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(std::fs::TryLockError::Error(error)) => {
                return Err(error).with_context(|| format!("cannot take the start-up lock {}", lock_path.display()));
            }
        }
    }
    // Another command may have started it while we waited for the lock.
    if connect_any(paths).await.is_ok() {
        return Ok(());
    }
    if respect_stop {
        refuse_if_stopped(paths)?;
    }
    // The user starts a broker (`broker start`, or a command typed outside any agent): the
    // deliberate stop is over now, not only once the new broker has opened the log. Until then
    // (a long replay) agents' commands would be told it was stopped on purpose; now they wait
    // for it like any command. Done under the start-up lock, and undone under it when no broker
    // came of it (none could be started, or it exited): agents, their wrappers perhaps of an
    // older build, must not start one in its stead. Not undone when the broker was started but
    // did not answer in time: it may yet, and then the stop is over.
    let ended_stop = !respect_stop && crate::trust::is_stopped_on_purpose(&paths.home);
    if ended_stop {
        crate::trust::clear_stopped(&paths.home)
            .with_context(|| format!("cannot remove {}", paths.home.join(crate::trust::STOPPED_MARKER).display()))?;
    }
    let child = match launch(paths, respect_stop).await {
        Ok(child) => child,
        Err(Launch { error, broker_may_run }) => {
            if ended_stop
                && !broker_may_run
                && let Err(marking) = crate::trust::mark_stopped(&paths.home)
            {
                tracing::warn!("cannot record the deliberate stop again in {}: {marking}", paths.home.display());
            }
            return Err(error);
        }
    };
    drop(lock);
    // The broker runs in its own process group and outlives this process, but until this
    // process exits it is our child: a wrapper that started it would otherwise keep it as a
    // `<defunct>` zombie once it stops. A thread waits for it (init reaps it after we exit).
    let reaper = std::thread::Builder::new().name("broker-reaper".into()).spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    if let Err(error) = reaper {
        tracing::debug!("cannot start a thread to reap the broker: {error}");
    }
    Ok(())
}

/// Why [`launch`] failed, and whether a broker it started may still come up (it did not answer
/// within [`START_TIMEOUT`], but runs).
struct Launch {
    error: anyhow::Error,
    broker_may_run: bool,
}

impl<E: Into<anyhow::Error>> From<E> for Launch {
    fn from(error: E) -> Launch {
        Launch { error: error.into(), broker_may_run: false }
    }
}

/// Starts the broker (under the start-up lock) and waits until it answers its health check.
async fn launch(paths: &Paths, respect_stop: bool) -> Result<std::process::Child, Launch> {
    let exe = crate::config::synapse_exe().context("cannot find the synapse executable")?;
    let log_path = paths.broker_log();
    let log =
        crate::private_files::open_append(&log_path).with_context(|| format!("cannot open {}", log_path.display()))?;
    let log_err = log.try_clone()?;
    // What this start adds to the log is after here: an earlier failure's lines are not this
    // one's (they were quoted as if they were).
    let log_from = log.metadata().map_or(0, |meta| meta.len());
    let spawn = || -> anyhow::Result<std::process::Child> {
        let mut command = std::process::Command::new(&exe);
        // `--autostarted`: this client's environment does not decide the broker's security.
        command
            .arg("broker")
            .arg("--autostarted")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log_err.try_clone()?);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.spawn().context("cannot start the broker")
    };
    let mut child = spawn()?;
    let started = Instant::now();
    let mut delay = Duration::from_millis(1);
    // The pause before starting again after a refusal: 50 ms, doubling up to 1 s.
    let mut respawn_pause = Duration::from_millis(50);
    loop {
        if let Some(status) = child.try_wait()? {
            // Another broker has the database: one still stopping (its socket closed first), or
            // one still replaying the log at its start. Wait for it to answer, or to let go.
            if status.code() == Some(ALREADY_RUNNING_EXIT) && started.elapsed() < START_TIMEOUT {
                let answered = answers_within(paths, respawn_pause).await;
                respawn_pause = (respawn_pause * 2).min(Duration::from_secs(1));
                if answered {
                    break;
                }
                // Stopped on purpose meanwhile (the holder was stopping): not started again.
                if respect_stop {
                    refuse_if_stopped(paths)?;
                }
                child = spawn()?;
                continue;
            }
            let log_bytes = std::fs::read(&log_path).unwrap_or_default();
            let log_text =
                String::from_utf8_lossy(log_bytes.get(usize::try_from(log_from).unwrap_or(0)..).unwrap_or_default());
            let last: Vec<&str> = log_text.lines().rev().take(3).collect();
            let last: Vec<&str> = last.into_iter().rev().collect();
            return Err(anyhow!("the broker exited at start ({status}): {}", last.join(" | ")).into());
        }
        // Ready means answering its health check, not only accepting connections.
        if answers_health(paths).await {
            break;
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(Launch {
                error: anyhow!(
                    "the broker did not answer within {} s; see {}",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                ),
                broker_may_run: true,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
    Ok(child)
}

/// Does the broker on the Unix socket answer `GET /broker/health` within `pause`?
async fn answers_within(paths: &Paths, pause: Duration) -> bool {
    let until = Instant::now() + pause;
    while Instant::now() < until {
        if answers_health(paths).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Does the broker on the Unix socket answer `GET /broker/health`?
async fn answers_health(paths: &Paths) -> bool {
    let Ok((sender, _)) = connect_unix(paths).await else { return false };
    let mut client = Client { sender, secret: None };
    client.health().await.is_ok()
}

/// Asks the broker to stop and waits until it has (its socket stops answering). A broker that
/// does not answer (stuck, or stopped with SIGSTOP) is stopped by signal: see [`terminate`].
pub async fn stop_broker(paths: &Paths) -> anyhow::Result<Option<u32>> {
    let Some((mut client, socket_peer)) = Client::try_connect_saying_how(paths).await else { return Ok(None) };
    // The process at the socket's other end, as it is now: a later process given its pid is
    // never signalled.
    let peer = socket_peer.and_then(crate::process::ProcessStamp::of);
    // Another home's broker at this home's socket is not this home's to stop. (A broker of
    // another version is: stopping it is how one moves to this version.)
    let health = bounded(client.health(), "GET /broker/health").await;
    match &health {
        Ok(info) => ensure_home(paths, info)?,
        // Over TCP (the socket does not answer): the port `broker.json` names.
        Err(ClientError::Timeout(timeout)) if socket_peer.is_none() => {
            bail!(
                "{timeout}: the broker named by {} does not answer on its TCP port, and its Unix socket {} cannot be reached; nothing stopped",
                paths.broker_info().display(),
                paths.broker_socket().display()
            );
        }
        // The TCP port of a `broker.json` left by a killed broker whose pid another process now
        // has: whatever listens there (another server of the user's) is not asked to shut down.
        Err(error) if socket_peer.is_none() => {
            tracing::warn!(
                "{} names a broker that does not answer on the Unix socket, and the TCP port it names does not answer as a broker ({error}): nothing stopped",
                paths.broker_info().display()
            );
            return Ok(None);
        }
        Err(_) => {}
    }
    let answered = match health {
        Err(ClientError::Timeout(timeout)) => Err(timeout),
        _ => match bounded(client.shutdown(), "POST /broker/shutdown").await {
            Ok(stopping) => Ok(stopping.pid),
            Err(ClientError::Timeout(timeout)) => Err(timeout),
            Err(error) => return Err(error.into()),
        },
    };
    drop(client);
    let pid = match answered {
        Ok(pid) => pid,
        Err(timeout) => {
            let Some(peer) = peer else { return Err(timeout.into()) };
            terminate(paths, peer, &timeout).await?;
            return Ok(Some(peer.pid));
        }
    };
    if wait_until(STOP_GRACE, || !crate::process::is_pid_alive(pid)).await {
        return Ok(Some(pid));
    }
    // It accepted the stop and then did not end (a long admin command, a connection kept open
    // with the closing grace set long): the process at the socket, this home's broker (it
    // answered as such), is ended by signal. A signal while it stops ends it at once; what it
    // acknowledged is in its write-ahead log.
    let Some(peer) = peer.filter(|peer| peer.pid == pid) else {
        bail!("the broker (pid {pid}) did not stop within {} s", STOP_GRACE.as_secs())
    };
    tracing::warn!(
        "the broker (pid {pid}) did not stop within {} s of accepting the stop; stopping it with SIGTERM",
        STOP_GRACE.as_secs()
    );
    end_by_signal(peer, || {}).await?;
    Ok(Some(pid))
}

/// How long a broker that accepted `POST /broker/shutdown` has to stop before it is signalled.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// A call of `broker stop`, within the call limit, or [`DEFAULT_CALL_TIMEOUT`] when it is off
/// (`SYNAPSE_CLIENT_TIMEOUT_MS=0`): a stuck broker is stopped by signal, not waited for.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, ClientError>>,
    what: &str,
) -> Result<T, ClientError> {
    let limit = call_timeout().unwrap_or(DEFAULT_CALL_TIMEOUT);
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(ClientError::Timeout(Timeout { limit, what: what.to_string() })))
}

/// Does this process run inside an agent (`SYNAPSE_AGENT_ID`: its CLI's commands, its MCP
/// server)?
pub fn inside_an_agent() -> bool {
    std::env::var_os("SYNAPSE_AGENT_ID").is_some_and(|id| !id.is_empty())
}

/// The secret of the agent this process runs inside, if any.
fn client_secret() -> Option<String> {
    std::env::var("SYNAPSE_AGENT_SECRET").ok().filter(|s| !s.is_empty())
}

/// Stops the broker that holds the Unix socket and did not answer (`peer`: the process the
/// kernel names at the socket's other end, of this user, as it was when we connected): recorded
/// as a deliberate stop (as `POST /broker/shutdown` does), then SIGTERM with SIGCONT (a stopped
/// process handles it), and SIGKILL if it is still there after [`TERMINATE_GRACE`]. Every
/// acknowledged event is already durable, so even the SIGKILL loses nothing.
///
/// Only this home's broker: `broker.json` must name that process (another home's broker may hold
/// a socket of a shared socket folder), and only from a plain shell (inside an agent the broker
/// would refuse to stop). Each signal goes to that very process, never to a later one given its
/// pid.
async fn terminate(paths: &Paths, peer: crate::process::ProcessStamp, timeout: &Timeout) -> anyhow::Result<()> {
    let pid = peer.pid;
    let refuse = |why: String| {
        anyhow!("{timeout}; the process at {} (pid {pid}) {why}: nothing stopped", paths.broker_socket().display())
    };
    if inside_an_agent() || client_secret().is_some() {
        return Err(refuse(
            "is not stopped by signal from inside an agent: run 'synapse broker stop' from a plain shell".into(),
        ));
    }
    if signal_target(pid).is_none() {
        return Err(refuse("cannot be told apart (its pid is not visible here)".into()));
    }
    if broker_info_file(paths).is_none_or(|info| info.pid != pid) {
        return Err(refuse(format!(
            "is not named by {}: it may be another home's broker (give each home its own SYNAPSE_UDS_DIR), or one already stopping",
            paths.broker_info().display()
        )));
    }
    tracing::warn!("{timeout}; stopping the broker (pid {pid}) with SIGTERM");
    // Recorded before the signal, as the broker does before its socket closes (wrappers must
    // not start another meanwhile), and taken back if the signal cannot be sent.
    if let Err(error) = crate::trust::mark_stopped(&paths.home) {
        tracing::warn!("cannot record the deliberate stop in {}: {error}", paths.home.display());
    }
    end_by_signal(peer, || {
        let _ = crate::trust::clear_stopped(&paths.home);
    })
    .await
}

/// A pid that may be signalled: not 0 or 1 (a group or init), not this process.
fn signal_target(pid: u32) -> Option<i32> {
    i32::try_from(pid).ok().filter(|&target| target > 1 && pid != std::process::id())
}

/// Ends the broker process `peer` (this very process, never a later one given its pid): SIGTERM
/// with SIGCONT (a stopped process handles it), and SIGKILL if it is still there after
/// [`TERMINATE_GRACE`]. An error when it cannot be signalled (`unsent` is called first when
/// the SIGTERM could not be sent) or outlives the SIGKILL.
async fn end_by_signal(peer: crate::process::ProcessStamp, unsent: impl FnOnce()) -> anyhow::Result<()> {
    let pid = peer.pid;
    let Some(target) = signal_target(pid) else {
        unsent();
        bail!("the broker (pid {pid}) cannot be told apart (its pid is not visible here): nothing stopped")
    };
    let send = |signal: i32| -> anyhow::Result<bool> {
        if !peer.is_running() {
            return Ok(false);
        }
        if !crate::process::signal(target, signal) {
            let error = std::io::Error::last_os_error();
            if peer.is_running() {
                bail!("cannot signal the broker (pid {pid}): {error}");
            }
        }
        Ok(true)
    };
    let delivered = match send(libc::SIGTERM) {
        Ok(delivered) => delivered,
        Err(error) => {
            unsent();
            return Err(error);
        }
    };
    if delivered {
        send(libc::SIGCONT)?;
    }
    if wait_until(TERMINATE_GRACE, || !peer.is_running()).await {
        return Ok(());
    }
    tracing::warn!(
        "the broker (pid {pid}) did not stop within {} s of SIGTERM; sending SIGKILL",
        TERMINATE_GRACE.as_secs()
    );
    send(libc::SIGKILL)?;
    if wait_until(Duration::from_secs(5), || !peer.is_running()).await {
        return Ok(());
    }
    bail!("the broker (pid {pid}) is still there after SIGKILL")
}

/// How long a broker that did not answer has to stop after SIGTERM before SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(10);

/// Waits until `gone` says so (checked every 10 ms), at most `limit`.
async fn wait_until(limit: Duration, gone: impl Fn() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if gone() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gone()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_home_whose_path_is_not_utf8_is_its_brokers_home() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join(std::ffi::OsStr::from_bytes(b"home-\xff"));
        std::fs::create_dir(&home).unwrap();
        let reported = std::fs::canonicalize(&home).unwrap().to_string_lossy().into_owned();
        assert!(reported.contains('\u{fffd}'), "{reported}");
        assert!(super::same_home(&reported, &home));
        let other = dir.path().join("home-other");
        std::fs::create_dir(&other).unwrap();
        assert!(!super::same_home(&reported, &other));
        assert!(!super::same_home(&other.to_string_lossy(), &home));
        assert!(super::same_home(&other.to_string_lossy(), &other.join("..").join("home-other")));
        // Reached through a link (the broker reports the home as given, not resolved).
        let link = dir.path().join(std::ffi::OsStr::from_bytes(b"link-\xfe"));
        std::os::unix::fs::symlink(&home, &link).unwrap();
        assert!(super::same_home(&link.to_string_lossy(), &link));
        // A link whose name is not UTF-8 to a home whose name is, started through another link.
        let plain = dir.path().join("plain-home");
        std::fs::create_dir(&plain).unwrap();
        let odd_link = dir.path().join(std::ffi::OsStr::from_bytes(b"odd-\xfd"));
        std::os::unix::fs::symlink(&plain, &odd_link).unwrap();
        let plain_link = dir.path().join("plain-link");
        std::os::unix::fs::symlink(&plain, &plain_link).unwrap();
        assert!(super::same_home(&plain_link.to_string_lossy(), &odd_link));
    }

    /// An answer cut short (the broker killed while writing it) means the request was most
    /// likely decided: a send is tried again with its key, like one whose connection closed
    /// before the answer. It was a plain failure, and a user sending again made a second message.
    #[test]
    fn an_answer_cut_short_counts_as_a_connection_closed_under_the_request() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
            let broker = tokio::spawn(async move {
                let mut theirs = theirs;
                let mut request = vec![0_u8; 4096];
                let _ = theirs.read(&mut request).await.unwrap();
                theirs
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"task\"",
                    )
                    .await
                    .unwrap();
                // Gone with the rest of its answer unwritten.
            });
            let sender = super::handshake(hyper_util::rt::TokioIo::new(ours)).await.unwrap();
            let mut client = super::Client { sender, secret: None };
            let request = crate::api::SendRequest::new("bob", "hi");
            let error = client.send(&request).await.unwrap_err();
            broker.await.unwrap();
            assert!(error.is_connection_closed(), "{error:#}");
        });
    }

    #[test]
    fn a_path_segment_keeps_unreserved_characters_and_encodes_the_rest() {
        assert_eq!(super::percent_encode("a b/é,-_.~?#%"), "a%20b%2F%C3%A9,-_.~%3F%23%25");
    }
}
