//! The accept loop of every HTTP server of the broker (its TCP port and Unix socket, each agent's
//! port and socket): HTTP/1.1 connections with an idle timeout and a connection limit.
//!
//! - **Idle timeout** (`SYNAPSE_HTTP_IDLE_TIMEOUT_MS`, default 60 s): a connection with no request
//!   in flight for that long is closed. A request is in flight from its headers until its response
//!   body has been sent, so an SSE stream or a long poll (which have their own keep-alives and
//!   deadlines) is never cut; a client that opens connections and sends nothing, or half a
//!   request, is.
//! - **Header and body timeouts** (`SYNAPSE_HTTP_HEADER_TIMEOUT_MS`, default 10 s;
//!   `SYNAPSE_HTTP_BODY_TIMEOUT_MS`, default 30 s): a request's headers must arrive within the
//!   first, counted from when the connection waits for them (so it also bounds a keep-alive
//!   connection waiting for its next request), and its body within the second, counted from
//!   its headers; otherwise the connection is closed (headers) or the request fails with 400
//!   (body) and ends. So slow clients trickling requests cannot hold every slot.
//! - **Connection limit** (`SYNAPSE_HTTP_MAX_CONNECTIONS`, default 512): open connections are
//!   counted per transport for the whole broker (TCP and Unix sockets apart, so a flood on the
//!   loopback ports cannot lock the user's CLI out of its socket). A connection beyond the limit
//!   gets a 503 JSON answer and is closed, rather than waiting unseen behind the others.
//! - **Write stall** (`SYNAPSE_HTTP_WRITE_STALL_MS`, default 60 s): a TCP connection whose client
//!   reads nothing of its answer for that long (every write waits for room in its socket) is
//!   dropped. An event stream to a client that never reads held a copy of each batch (a 16 MB
//!   message twice) and a connection slot for as long as the client liked. Not on the Unix
//!   sockets, which only the user's own processes reach: `synapse events | less` reads as fast
//!   as its pager, which may wait for the user for minutes.
//! - **Shutdown**: when `stop` resolves the listener closes, every connection is asked to finish
//!   its current response and close, and `serve` returns once all have. A connection still open
//!   after a grace period (`SYNAPSE_HTTP_CLOSING_GRACE_MS`, default 5 s) is dropped: a client
//!   that asks for answers and never reads them would otherwise keep the broker from ever
//!   exiting (streams and long polls end by themselves when the broker stops).

use crate::http::ApiError;
use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, watch};

/// How a request reached the broker, for the request rules (`guard`). Inserted into every
/// request's extensions; TCP requests also get `ConnectInfo<SocketAddr>` (authentication).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp { peer: SocketAddr },
}

const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_WRITE_STALL: Duration = Duration::from_secs(60);
const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Refusals being written at once; beyond this a refused connection is closed without an answer.
const MAX_REFUSALS_IN_PROGRESS: usize = 64;
/// How long a connection may take to finish its answer once the broker has begun to stop (well
/// within the 20 s `synapse broker stop` waits).
const DEFAULT_CLOSING_GRACE: Duration = Duration::from_secs(5);
/// How long a refusal may take (writing the answer, then reading what the client sent so that
/// closing does not reset the connection before the answer is read).
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// The broker-wide connection budget, shared by all its servers.
#[derive(Debug)]
pub struct ConnectionLimits {
    pub idle_timeout: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub write_stall: Duration,
    pub closing_grace: Duration,
    pub max_connections: usize,
    tcp_slots: Arc<Semaphore>,
    unix_slots: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
}

/// A positive number from the environment, at most `MAX_SETTING` (a larger one would overflow
/// what it sizes: a semaphore of 2^62 permits panics).
fn env_number(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .filter(|value| *value > 0)
        .map(|value: u64| value.min(MAX_SETTING))
}

/// The largest value of a connection setting: a day in milliseconds, and far more connections
/// than a process has file descriptors.
const MAX_SETTING: u64 = 86_400_000;

impl ConnectionLimits {
    pub fn new(idle_timeout: Duration, max_connections: usize) -> ConnectionLimits {
        ConnectionLimits {
            idle_timeout,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            write_stall: DEFAULT_WRITE_STALL,
            closing_grace: DEFAULT_CLOSING_GRACE,
            max_connections,
            tcp_slots: Arc::new(Semaphore::new(max_connections)),
            unix_slots: Arc::new(Semaphore::new(max_connections)),
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS_IN_PROGRESS)),
        }
    }

    /// Reads `SYNAPSE_HTTP_IDLE_TIMEOUT_MS`, `SYNAPSE_HTTP_HEADER_TIMEOUT_MS`,
    /// `SYNAPSE_HTTP_BODY_TIMEOUT_MS`, `SYNAPSE_HTTP_WRITE_STALL_MS`, `SYNAPSE_HTTP_CLOSING_GRACE_MS` and
    /// `SYNAPSE_HTTP_MAX_CONNECTIONS` (once, at start).
    pub fn from_env() -> ConnectionLimits {
        let mut limits = ConnectionLimits::new(
            env_number("SYNAPSE_HTTP_IDLE_TIMEOUT_MS").map_or(DEFAULT_IDLE_TIMEOUT, Duration::from_millis),
            env_number("SYNAPSE_HTTP_MAX_CONNECTIONS")
                .and_then(|max| usize::try_from(max).ok())
                .unwrap_or(DEFAULT_MAX_CONNECTIONS),
        );
        limits.header_timeout =
            env_number("SYNAPSE_HTTP_HEADER_TIMEOUT_MS").map_or(DEFAULT_HEADER_TIMEOUT, Duration::from_millis);
        limits.body_timeout =
            env_number("SYNAPSE_HTTP_BODY_TIMEOUT_MS").map_or(DEFAULT_BODY_TIMEOUT, Duration::from_millis);
        limits.write_stall =
            env_number("SYNAPSE_HTTP_WRITE_STALL_MS").map_or(DEFAULT_WRITE_STALL, Duration::from_millis);
        limits.closing_grace =
            env_number("SYNAPSE_HTTP_CLOSING_GRACE_MS").map_or(DEFAULT_CLOSING_GRACE, Duration::from_millis);
        limits
    }
}

/// A listener the loop can serve: TCP or Unix.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept_one(&self) -> impl std::future::Future<Output = std::io::Result<(Self::Io, Transport)>> + Send;
    fn slots(limits: &ConnectionLimits) -> Arc<Semaphore>;
    /// The peer's credentials (Unix sockets): who registers and who is the user.
    fn peer_credentials(_io: &Self::Io) -> Option<super::caller::PeerCredentials> {
        None
    }
    /// The other end's socket of a loopback TCP connection (from `/proc/net/tcp*`).
    fn tcp_peer(_io: &Self::Io) -> Option<TcpSocket> {
        None
    }
}

use crate::process::TcpSocket;

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Io, Transport)> {
        let (stream, peer) = self.accept().await?;
        // Small requests and answers: waiting to fill a packet only adds latency.
        let _ = stream.set_nodelay(true);
        Ok((stream, Transport::Tcp { peer }))
    }
    fn slots(limits: &ConnectionLimits) -> Arc<Semaphore> {
        limits.tcp_slots.clone()
    }
    fn tcp_peer(io: &Self::Io) -> Option<TcpSocket> {
        crate::process::loopback_tcp_socket(io.local_addr().ok()?, io.peer_addr().ok()?)
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Io, Transport)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, Transport::Unix))
    }
    fn slots(limits: &ConnectionLimits) -> Arc<Semaphore> {
        limits.unix_slots.clone()
    }
    fn peer_credentials(io: &Self::Io) -> Option<super::caller::PeerCredentials> {
        Some(super::caller::PeerCredentials::of(io))
    }
}

/// Serves `router` on `listener` until `stop` resolves and every connection has closed.
pub async fn serve<L: Accept>(
    listener: L,
    router: Router,
    limits: Arc<ConnectionLimits>,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    let slots = L::slots(&limits);
    // Closing: `true` asks every connection to finish; `closed()` tells when all have.
    let (closing, closing_receiver) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (io, transport) = tokio::select! {
            accepted = listener.accept_one() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: wait a little instead of spinning.
                    tracing::warn!("cannot accept a connection: {error}");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                        _ = &mut stop => break,
                    }
                }
            },
            _ = &mut stop => break,
        };
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let connection = Connection {
                    router: router.clone(),
                    transport,
                    peer: L::peer_credentials(&io),
                    tcp_peer: L::tcp_peer(&io),
                    idle_timeout: limits.idle_timeout,
                    header_timeout: limits.header_timeout,
                    body_timeout: limits.body_timeout,
                    write_stall: limits.write_stall,
                    closing_grace: limits.closing_grace,
                    closing: closing_receiver.clone(),
                };
                tokio::spawn(async move {
                    connection.run(io).await;
                    drop(slot);
                });
            }
            Err(_) => {
                if let Ok(permit) = limits.refusals.clone().try_acquire_owned() {
                    let max = limits.max_connections;
                    tokio::spawn(async move {
                        refuse(io, max).await;
                        drop(permit);
                    });
                }
            }
        }
    }
    drop(listener);
    drop(closing_receiver);
    closing.send_replace(true);
    closing.closed().await;
}

/// Answers 503 on a connection beyond the limit, then closes it.
async fn refuse<I: AsyncRead + AsyncWrite + Unpin>(mut io: I, max: usize) {
    let error = ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "too many open connections (limit {max}, SYNAPSE_HTTP_MAX_CONNECTIONS): this one is refused; try again when others have closed"
        ),
    );
    let body = error.body_text();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        io.write_all(answer.as_bytes()).await?;
        io.shutdown().await?;
        // Read (and drop) what the client sends until it closes, so that closing with unread
        // data does not reset the connection before the client has read the answer.
        let mut sink = [0u8; 4096];
        let mut total = 0usize;
        while total < 64 << 10 {
            match io.read(&mut sink).await? {
                0 => break,
                count => total += count,
            }
        }
        std::io::Result::Ok(())
    })
    .await;
}

/// Counts the requests in flight on one connection; each [`InFlight`] is one.
#[derive(Clone)]
struct Activity(Arc<watch::Sender<usize>>);

/// One request in flight: from its headers until its response body is dropped (sent, or the
/// connection gone).
struct InFlight(Activity);

impl Activity {
    fn begin(&self) -> InFlight {
        self.0.send_modify(|count| *count += 1);
        InFlight(self.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        (self.0).0.send_modify(|count| *count = count.saturating_sub(1));
    }
}

/// Resolves once no request has been in flight for `idle`.
async fn idle_for(activity: &mut watch::Receiver<usize>, idle: Duration) {
    loop {
        if activity.wait_for(|count| *count == 0).await.is_err() {
            return std::future::pending().await;
        }
        match tokio::time::timeout(idle, activity.changed()).await {
            Err(_) => return,
            Ok(Ok(())) => continue,
            Ok(Err(_)) => return std::future::pending().await,
        }
    }
}

struct Connection {
    router: Router,
    transport: Transport,
    peer: Option<super::caller::PeerCredentials>,
    tcp_peer: Option<TcpSocket>,
    idle_timeout: Duration,
    header_timeout: Duration,
    body_timeout: Duration,
    write_stall: Duration,
    closing_grace: Duration,
    closing: watch::Receiver<bool>,
}

/// A connection's transport that notes since when its writes have waited for room (the client
/// reading nothing): `None` while they go through.
struct StallWatch<I> {
    inner: I,
    stalled_since: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

impl<I> StallWatch<I> {
    fn note<T>(&self, poll: std::task::Poll<T>) -> std::task::Poll<T> {
        let mut stalled = self.stalled_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if poll.is_pending() {
            stalled.get_or_insert_with(tokio::time::Instant::now);
        } else {
            *stalled = None;
        }
        poll
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for StallWatch<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffer: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(context, buffer)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for StallWatch<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(context, bytes);
        self.note(poll)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffers: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write_vectored(context, buffers);
        self.note(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_flush(context);
        self.note(poll)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(context)
    }
}

/// A request body that fails when it has not fully arrived by its deadline (see the module
/// documentation): the handler reading it gets an error and answers, so the request ends.
struct DeadlineBody {
    inner: Incoming,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl hyper::body::Body for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_frame(context) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(Into::into))),
            Poll::Pending => match this.deadline.as_mut().poll(context) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "the request body did not arrive within {} ms (SYNAPSE_HTTP_BODY_TIMEOUT_MS)",
                    this.timeout.as_millis()
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Connection {
    async fn run<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, io: I) {
        let (sender, mut activity_receiver) = watch::channel(0usize);
        let activity = Activity(Arc::new(sender));
        let transport = self.transport;
        let peer = self.peer;
        let tcp_peer = self.tcp_peer;
        let body_timeout = self.body_timeout;
        let service = TowerToHyperService::new(self.router);
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let mut request = request.map(|inner| {
                Body::new(DeadlineBody {
                    inner,
                    deadline: Box::pin(tokio::time::sleep(body_timeout)),
                    timeout: body_timeout,
                })
            });
            request.extensions_mut().insert(transport);
            if let Some(peer) = &peer {
                request.extensions_mut().insert(ConnectInfo(peer.clone()));
            }
            if let Some(socket) = tcp_peer {
                request.extensions_mut().insert(socket);
            }
            if let Transport::Tcp { peer } = transport {
                request.extensions_mut().insert(ConnectInfo(peer));
            }
            let in_flight = activity.begin();
            let answer = hyper::service::Service::call(&service, request);
            async move {
                let response = answer.await?;
                // The count goes down when hyper drops the body, i.e. once it is sent.
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _still_in_flight = &in_flight;
                        frame
                    }))
                }))
            }
        });
        let stalled_since = Arc::new(std::sync::Mutex::new(None));
        let io = StallWatch { inner: io, stalled_since: stalled_since.clone() };
        let stalled_too_long = || {
            stalled_since
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some_and(|since| since.elapsed() >= self.write_stall)
        };
        let watch_stalls = matches!(transport, Transport::Tcp { .. });
        let mut stall_check = tokio::time::interval((self.write_stall / 4).max(Duration::from_millis(10)));
        stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        // Set when the connection was asked to close because it sat idle: one more idle period
        // and it is dropped even if the client never finishes a half-sent request.
        let mut idle_close_requested = false;
        let mut shutting_down = false;
        // Armed when the broker begins to stop (see the module documentation).
        let closing_grace = tokio::time::sleep(self.closing_grace);
        tokio::pin!(closing_grace);
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!("connection ended: {error}");
                    }
                    return;
                }
                _ = idle_for(&mut activity_receiver, self.idle_timeout), if !shutting_down => {
                    if idle_close_requested {
                        tracing::debug!("dropping a connection idle for twice {:?}", self.idle_timeout);
                        return;
                    }
                    idle_close_requested = true;
                    connection.as_mut().graceful_shutdown();
                }
                _ = self.closing.wait_for(|closing| *closing), if !shutting_down => {
                    shutting_down = true;
                    closing_grace.as_mut().reset(tokio::time::Instant::now() + self.closing_grace);
                    connection.as_mut().graceful_shutdown();
                }
                _ = stall_check.tick(), if watch_stalls => {
                    if stalled_too_long() {
                        tracing::debug!("dropping a connection whose client read nothing for {:?}", self.write_stall);
                        return;
                    }
                }
                _ = &mut closing_grace, if shutting_down => {
                    tracing::debug!("dropping a connection still answering {:?} after the broker began to stop", self.closing_grace);
                    return;
                }
            }
        }
    }
}

/// Binds a Unix socket at `path` (see [`bind_unix_std`]) in the current runtime.
pub fn bind_unix(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    tokio::net::UnixListener::from_std(bind_unix_std(path)?)
        .with_context(|| format!("cannot listen on {}", path.display()))
}

/// Binds a Unix socket at `path`, non-blocking, removing a stale socket file left by a dead
/// process. Fails when something is listening there.
pub fn bind_unix_std(path: &std::path::Path) -> anyhow::Result<std::os::unix::net::UnixListener> {
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => anyhow::bail!(
                "another process is already listening on {} (another broker with the same SYNAPSE_UDS_DIR?). Stop it, or set SYNAPSE_UDS_DIR to another directory",
                path.display()
            ),
            Err(_) => {
                tracing::info!("removing stale socket {}", path.display());
                std::fs::remove_file(path).with_context(|| format!("cannot remove stale socket {}", path.display()))?;
            }
        }
    }
    let listener =
        std::os::unix::net::UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    listener.set_nonblocking(true).with_context(|| format!("cannot listen on {}", path.display()))?;
    Ok(listener)
}
