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

use crate::config::{BrokerInfo, Paths};
use anyhow::{Context, anyhow, bail};
use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::time::{Duration, Instant};

/// How long a command waits for a broker it started to answer.
const START_TIMEOUT: Duration = Duration::from_secs(15);

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
    future: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
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

/// An open connection to the broker.
pub struct Client {
    sender: Sender,
    secret: Option<String>,
}

/// A non-2xx answer from the broker.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiFailure {
    pub status: StatusCode,
    pub message: String,
    pub body: Value,
}

async fn connect_unix(paths: &Paths) -> std::io::Result<Sender> {
    let stream = tokio::net::UnixStream::connect(paths.broker_socket()).await?;
    // Secrets and messages go only to a broker of this user: the kernel names the other end.
    let owner = stream.peer_cred()?.uid();
    if owner != crate::private_files::my_uid() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {owner}, not by you: refusing to talk to it (set SYNAPSE_UDS_DIR to a directory of yours)",
                paths.broker_socket().display()
            ),
        ));
    }
    handshake(TokioIo::new(stream)).await
}

async fn connect_tcp(port: u16) -> std::io::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
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
async fn connect_any(paths: &Paths) -> std::io::Result<Sender> {
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

async fn connect_any_now(paths: &Paths) -> std::io::Result<Sender> {
    match connect_unix(paths).await {
        Ok(sender) => Ok(sender),
        // Another user's socket where ours should be: no other way in is tried.
        Err(unix_error) if unix_error.kind() == std::io::ErrorKind::PermissionDenied => Err(unix_error),
        Err(unix_error) => {
            // broker.json outlives a killed broker, and its port may by now belong to another
            // process (another home's broker, an agent): only a live broker's port is tried.
            let port = std::fs::read(paths.broker_info())
                .ok()
                .and_then(|bytes| serde_json::from_slice::<BrokerInfo>(&bytes).ok())
                .filter(|info| info.port != 0 && crate::process::is_pid_alive(info.pid))
                .map(|info| info.port);
            match port {
                Some(port) => connect_tcp(port).await.map_err(|_| unix_error),
                None => Err(unix_error),
            }
        }
    }
}

/// Tries to reach a broker just started before giving up.
const CONNECT_ATTEMPTS: u64 = 5;

/// The running broker is another version than this synapse.
#[derive(Debug, thiserror::Error)]
#[error(
    "the running broker is version {running} (pid {pid}), this synapse is {}. Run 'synapse broker stop' and try again",
    crate::broker::VERSION
)]
pub struct VersionMismatch {
    running: String,
    pid: u32,
}

/// The broker was stopped on purpose (`synapse broker stop`) and none has been started since;
/// an agent wrapper waits for one instead of starting it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the broker for SYNAPSE_HOME={home} was stopped on purpose; waiting until one is started ('synapse broker start')"
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
    pub async fn connect(paths: &Paths, autostart: bool) -> anyhow::Result<Client> {
        Client::connect_with(paths, autostart, false).await
    }

    /// For agent wrappers: like `connect(paths, true)`, but never starts a broker that was
    /// stopped on purpose ([`StoppedOnPurpose`]: the caller waits and tries again).
    pub async fn connect_unless_stopped(paths: &Paths) -> anyhow::Result<Client> {
        Client::connect_with(paths, true, true).await
    }

    async fn connect_with(paths: &Paths, autostart: bool, respect_stop: bool) -> anyhow::Result<Client> {
        let secret = std::env::var("SYNAPSE_AGENT_SECRET").ok().filter(|s| !s.is_empty());
        if let Ok(sender) = connect_any(paths).await {
            let mut client = Client { sender, secret: secret.clone() };
            match client.check_version().await {
                Ok(()) => return Ok(client),
                // A broker that holds the connection without answering is stuck, not absent:
                // starting another one would only fail on its socket.
                Err(error)
                    if !autostart
                        || error.downcast_ref::<VersionMismatch>().is_some()
                        || error.downcast_ref::<Timeout>().is_some() =>
                {
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
                let sender = connect_any(paths).await.with_context(|| {
                    format!("the broker started but {} does not answer", paths.broker_socket().display())
                })?;
                let mut client = Client { sender, secret: secret.clone() };
                client.check_version().await?;
                anyhow::Ok(client)
            }
            .await;
            match result {
                Ok(client) => return Ok(client),
                Err(error)
                    if attempt >= CONNECT_ATTEMPTS
                        || error.downcast_ref::<VersionMismatch>().is_some()
                        || error.downcast_ref::<Timeout>().is_some() =>
                {
                    return Err(error);
                }
                Err(error) => {
                    tracing::debug!("connecting to the new broker: {error:#}; trying again");
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
            }
        }
    }

    /// Only connects: None when no broker runs.
    pub async fn try_connect(paths: &Paths) -> Option<Client> {
        let sender = connect_any(paths).await.ok()?;
        // Inside an agent the agent's secret goes along, as with `connect`: the broker then
        // knows the caller is that agent, not the user (who alone may stop the broker).
        let secret = std::env::var("SYNAPSE_AGENT_SECRET").ok().filter(|s| !s.is_empty());
        Some(Client { sender, secret })
    }

    async fn check_version(&mut self) -> anyhow::Result<()> {
        let info: BrokerInfo = serde_json::from_value(self.broker_info().await?)
            .context("the broker's health answer is not understood")?;
        if info.version != crate::broker::VERSION {
            return Err(VersionMismatch { running: info.version, pid: info.pid }.into());
        }
        Ok(())
    }

    /// Sends `secret` with every request (the wrapper acting as its agent).
    pub fn set_secret(&mut self, secret: String) {
        self.secret = Some(secret);
    }

    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    pub async fn get(&mut self, path: &str) -> anyhow::Result<Value> {
        self.request(Method::GET, path, None).await
    }

    /// `GET /broker/health`: the broker's info, also when it answers 503 because it cannot
    /// store at the moment (`healthy: false`). It runs and serves reads then, so the version
    /// handshake and the readiness probe accept it.
    pub async fn broker_info(&mut self) -> anyhow::Result<Value> {
        match self.get("/broker/health").await {
            Ok(info) => Ok(info),
            Err(error) => match error.downcast::<ApiFailure>() {
                Ok(failure)
                    if failure.status == StatusCode::SERVICE_UNAVAILABLE && failure.body.get("pid").is_some() =>
                {
                    Ok(failure.body)
                }
                Ok(failure) => Err(failure.into()),
                Err(error) => Err(error),
            },
        }
    }

    pub async fn post(&mut self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.request(Method::POST, path, Some(body)).await
    }

    pub async fn delete(&mut self, path: &str) -> anyhow::Result<Value> {
        self.request(Method::DELETE, path, None).await
    }

    fn build(&self, method: Method, path: &str, body: Option<&Value>) -> anyhow::Result<Request<Full<Bytes>>> {
        // A loopback name: the broker refuses other hosts (a browser page's DNS rebinding).
        let mut builder = Request::builder().method(method).uri(path).header("host", "localhost");
        if let Some(key) = api_key() {
            builder = builder.header("x-api-key", key);
        }
        if let Some(secret) = &self.secret {
            builder = builder.header(crate::http::SECRET_HEADER, secret);
        }
        let bytes = match body {
            Some(body) => {
                builder = builder.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(body)?)
            }
            None => Bytes::new(),
        };
        Ok(builder.body(Full::new(bytes))?)
    }

    /// One request; a non-2xx answer becomes an [`ApiFailure`] error carrying the message.
    pub async fn request(&mut self, method: Method, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let request = self.build(method.clone(), path, body)?;
        let sender = &mut self.sender;
        let (status, bytes) =
            within(limit_for(path), || format!("{method} {}", path.split('?').next().unwrap_or(path)), async move {
                let response = sender.send_request(request).await.context("the broker closed the connection")?;
                let status = response.status();
                let bytes = response.into_body().collect().await.context("reading the broker's answer")?.to_bytes();
                anyhow::Ok((status, bytes))
            })
            .await?;
        let value: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        if status.is_success() {
            Ok(value)
        } else {
            let message = value
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("the broker answered {status}: {value}"));
            Err(ApiFailure { status, message, body: value }.into())
        }
    }

    /// Opens a server-sent-event stream; `on_event` gets each event's `data` until it returns
    /// false or the stream ends.
    ///
    /// The broker must answer within the call limit; after that a stream that is not followed
    /// (`follow=true`) must bring something (an event or a keep-alive) within the limit each time.
    pub async fn sse(&mut self, path: &str, mut on_event: impl FnMut(&str) -> bool) -> anyhow::Result<()> {
        let request = self.build(Method::GET, path, None)?;
        let limit = call_timeout();
        let what = || format!("GET {}", path.split('?').next().unwrap_or(path));
        let sender = &mut self.sender;
        let response = within(limit, what, async move {
            sender.send_request(request).await.context("the broker closed the connection")
        })
        .await?;
        let follows = path.contains("follow=true");
        let frame_limit = if follows { None } else { limit };
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = within(limit, what, async { Ok(body.collect().await?.to_bytes()) }).await?;
            let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let message = value.get("message").and_then(Value::as_str).unwrap_or("request failed").to_string();
            return Err(ApiFailure { status, message, body: value }.into());
        }
        let mut buffer: Vec<u8> = Vec::new();
        while let Some(frame) = within(frame_limit, what, async { Ok(body.frame().await) }).await? {
            let frame = frame.context("the event stream broke")?;
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
    crate::private_files::create_dir(&paths.home).with_context(|| format!("cannot create {}", paths.home.display()))?;
    let lock_path = paths.start_lock();
    let lock =
        crate::private_files::open_write(&lock_path).with_context(|| format!("cannot open {}", lock_path.display()))?;
    let lock = tokio::task::spawn_blocking(move || lock.lock().map(|_| lock))
        .await?
        .with_context(|| format!("cannot take the start-up lock {}", lock_path.display()))?;
    // Another command may have started it while we waited for the lock.
    if connect_any(paths).await.is_ok() {
        return Ok(());
    }
    if respect_stop {
        refuse_if_stopped(paths)?;
    }
    let exe = std::env::current_exe().context("cannot find the synapse executable")?;
    let log_path = paths.broker_log();
    let log =
        crate::private_files::open_append(&log_path).with_context(|| format!("cannot open {}", log_path.display()))?;
    let log_err = log.try_clone()?;
    let mut command = std::process::Command::new(exe);
    // `--autostarted`: this client's environment does not decide the broker's security.
    command.arg("broker").arg("--autostarted").stdin(std::process::Stdio::null()).stdout(log).stderr(log_err);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().context("cannot start the broker")?;
    let started = Instant::now();
    let mut delay = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last: Vec<&str> = log_text.lines().rev().take(3).collect();
            let last: Vec<&str> = last.into_iter().rev().collect();
            bail!("the broker exited at start ({status}): {}", last.join(" | "));
        }
        // Ready means answering its health check, not only accepting connections.
        if answers_health(paths).await {
            break;
        }
        if started.elapsed() > START_TIMEOUT {
            bail!("the broker did not answer within {} s; see {}", START_TIMEOUT.as_secs(), log_path.display());
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
    drop(lock);
    // The child is detached (own process group); it is reaped by init when this CLI exits.
    std::mem::forget(child);
    Ok(())
}

/// Does the broker on the Unix socket answer `GET /broker/health`?
async fn answers_health(paths: &Paths) -> bool {
    let Ok(sender) = connect_unix(paths).await else { return false };
    let mut client = Client { sender, secret: None };
    client.broker_info().await.is_ok()
}

/// Asks the broker to stop and waits until it has (its socket stops answering).
pub async fn stop_broker(paths: &Paths) -> anyhow::Result<Option<u32>> {
    let Some(mut client) = Client::try_connect(paths).await else { return Ok(None) };
    let answer = client.post("/broker/shutdown", &Value::Null).await?;
    let pid = answer.get("pid").and_then(Value::as_u64).and_then(|pid| u32::try_from(pid).ok());
    drop(client);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        let gone = match pid {
            Some(pid) => !crate::process::is_pid_alive(pid),
            None => connect_unix(paths).await.is_err(),
        };
        if gone {
            return Ok(pid);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(anyhow!("the broker (pid {pid:?}) did not stop within 20 s"))
}
