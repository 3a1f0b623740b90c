//! The daemon: the broker's start-up and stop, composing `broker` (store, writer, background
//! tasks) and `http` (routers and servers) above both. Only the CLI (`synapse broker start`)
//! runs it.
//!
//! Order that must hold: the home is private and the sockets are bound before anything is
//! served; the broker's info file is written only once its port is known and the agents'
//! endpoints are restored, and removed as soon as a stop begins; on stop the servers end first,
//! then the agents' endpoints, then the writer (after it answered everything queued).
//!
//! Threads: the multi-threaded runtime (two workers) serves the TCP port, the agents' endpoints
//! and the background tasks; the broker's Unix socket has a thread and a runtime of its own
//! ([`serve_unix`]); the writer has its thread (`broker::writer`).

use crate::broker::{self, BrokerState};
use crate::config::Paths;
use crate::http::{self, HttpState};
use crate::store::Store;
use anyhow::Context;
use std::sync::Arc;

/// Tests only: while the file this names exists, the log's file cannot grow, as on a full disk.
const DISK_FULL_SWITCH_VARIABLE: &str = "SYNAPSE_TEST_DISK_FULL_FILE";

/// Another broker of this home has its database open (the one that runs, starting or
/// stopping): said apart, so a client that started this one waits for that one.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AlreadyRunning(pub String);

/// Runs the broker in the foreground until it is stopped (signal or `synapse broker stop`).
pub async fn run(paths: Paths) -> anyhow::Result<()> {
    paths.own_home()?;
    // Up to SYNAPSE_HTTP_MAX_CONNECTIONS connections on TCP and as many on the Unix socket, and
    // the refusals beyond: the usual soft limit of 1,024 files ran out first, and then every
    // accept failed (a flood on both transports held `synapse send` for seconds).
    let limits = http::server::ConnectionLimits::from_env();
    let wanted = u64::try_from(limits.max_connections).unwrap_or(u64::MAX).saturating_mul(2).saturating_add(1024);
    match crate::process::raise_open_files_limit(wanted) {
        Some(files) if files < wanted => tracing::warn!(
            "this process may open {files} files, fewer than the {wanted} its connection limits need (SYNAPSE_HTTP_MAX_CONNECTIONS, ulimit -n)"
        ),
        Some(_) => {}
        None => tracing::warn!("cannot read this process's limit of open files"),
    }
    crate::private_files::own_dir(&paths.uds_dir)
        .with_context(|| format!("cannot use {} for the broker's sockets", paths.uds_dir.display()))?;
    // A home made by an older version (or by hand) may be readable by others: the log and the
    // terminal logs hold every message. Before the log is opened (a replay may take seconds, in
    // which another user could open a file still readable to them and keep it).
    match crate::private_files::tighten_home(&paths.home) {
        Ok(0) => {}
        Ok(changed) => tracing::warn!("{}: removed group/other access from {changed} entries", paths.home.display()),
        Err(error) => tracing::warn!("cannot restrict the permissions of {}: {error}", paths.home.display()),
    }
    // Fault-injection tests make the disk look full while this file exists (see store::fault).
    let disk_full_switch = std::env::var_os(DISK_FULL_SWITCH_VARIABLE).map(std::path::PathBuf::from);
    let store =
        Store::open_with_disk_full_switch(&paths.database(), disk_full_switch.as_deref()).map_err(
            |error| match error {
                crate::store::StoreError::AlreadyOpen { .. } => anyhow::Error::new(AlreadyRunning(error.to_string())),
                other => other.into(),
            },
        )?;
    // This broker owns the home now: a deliberate stop of the previous one is over, and
    // wrappers waiting for a broker may connect.
    crate::trust::clear_stopped(&paths.home)
        .with_context(|| format!("cannot remove {}", paths.home.join(crate::trust::STOPPED_MARKER).display()))?;

    let socket_path = paths.broker_socket();
    // Served by a runtime of its own (`serve_unix`).
    let unix = http::server::bind_unix_std(&socket_path)?;
    let tcp = tokio::net::TcpListener::bind(("127.0.0.1", paths.broker_port)).await.map_err(|error| {
        anyhow::anyhow!(
            "cannot listen on 127.0.0.1:{}: {error}. Set SYNAPSE_BROKER_PORT to a free port",
            paths.broker_port
        )
    })?;
    let port = tcp.local_addr()?.port();

    let (state, writer_thread) = BrokerState::start(store, paths.clone())?;
    state.port.store(port, std::sync::atomic::Ordering::Relaxed);
    let served = HttpState::new(state.clone(), tokio::runtime::Handle::current());
    http::agent_endpoints::restore(&served).await;

    let router = http::broker_router(served.clone());
    let stop_signal = || {
        let mut stop = state.shutdown.subscribe();
        async move {
            let _ = stop.wait_for(|stopping| *stopping).await;
        }
    };
    let limits = served.connection_limits.clone();
    let (unix_server, serve_socket) =
        serve_unix(unix, router.clone(), limits.clone(), stop_signal(), state.clone()).await?;

    let info_path = paths.broker_info();
    crate::private_files::write(&info_path, serde_json::to_vec_pretty(&state.info())?)
        .with_context(|| format!("cannot write {}", info_path.display()))?;
    // A client that has an answer may read broker.json (`broker start`, then the port in it):
    // the socket answers once the file is there.
    let _ = serve_socket.send(());
    tracing::info!("broker {} listening on {} and 127.0.0.1:{port}", broker::VERSION, socket_path.display());

    // A client that finds this file naming the process at the socket skips the version
    // handshake (`client::info_file_names`): the file goes as soon as the broker begins to stop
    // (and only then), so a command that comes then asks, finds no broker answering, and starts
    // the next one.
    let mut stopping = state.shutdown.subscribe();
    tokio::spawn(async move {
        let _ = stopping.wait_for(|stopping| *stopping).await;
        let _ = std::fs::remove_file(&info_path);
    });
    spawn_signal_handler(state.clone());
    broker::spawn_liveness_sweeper(state.clone());
    broker::delivery::spawn(state.clone());
    broker::indexer::spawn(state.clone());

    http::server::serve(tcp, router, limits, stop_signal()).await;
    let socket_failure = match tokio::task::spawn_blocking(move || unix_server.join()).await {
        Ok(Ok(Ok(()))) => None,
        Ok(Ok(Err(error))) => Some(error),
        // The panic's own message went to stderr (the panic hook).
        Ok(Err(_)) | Err(_) => Some(anyhow::anyhow!("the server of the broker's socket panicked")),
    };

    broker::agents::stop_all(&state).await;
    let _ = std::fs::remove_file(&socket_path);
    // Dropping the last handle ends the writer after it has answered everything queued.
    drop(served);
    drop(state);
    let _ = tokio::task::spawn_blocking(move || writer_thread.join()).await;
    if let Some(error) = socket_failure {
        tracing::error!("broker stopped: {error:#}");
        return Err(error);
    }
    tracing::info!("broker stopped");
    Ok(())
}

/// Serves the broker's Unix socket (the CLI, the wrappers, `synapse mcp`) until `stop`, on a
/// thread with a current-thread runtime of its own: a connection is accepted and answered on
/// the thread that epoll woke, where the multi-threaded runtime hands each new connection to a
/// worker it must wake first. Measured against serving it there (tools/README, "round-trip"):
/// `round_trip_p50_ms` and `cli_send_median_ms` about 0.1 ms lower, `http_sends_per_s` the same.
/// Should the thread end otherwise (it cannot start its runtime, a panic), the broker stops:
/// without its socket no command reaches it.
///
/// Returns once the socket is registered with the thread's runtime (its failure to start is
/// this function's error), with the sender that lets it answer: connections wait in the
/// listener's backlog until then (`run` sends once `broker.json` is written), and dropping the
/// sender ends the thread without serving.
async fn serve_unix(
    listener: std::os::unix::net::UnixListener,
    router: axum::Router,
    limits: Arc<http::server::ConnectionLimits>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    state: Arc<BrokerState>,
) -> anyhow::Result<(std::thread::JoinHandle<anyhow::Result<()>>, tokio::sync::oneshot::Sender<()>)> {
    /// Stops the broker when the thread ends, however it ends.
    struct StopBroker(Arc<BrokerState>);
    impl Drop for StopBroker {
        fn drop(&mut self) {
            self.0.request_shutdown();
        }
    }
    let (started, serving) = tokio::sync::oneshot::channel::<()>();
    let (serve, told_to_serve) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("synapse-socket".into())
        .spawn(move || {
            let _stop_broker = StopBroker(state);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the runtime of the broker's socket")?;
            runtime.block_on(async move {
                let listener =
                    tokio::net::UnixListener::from_std(listener).context("cannot serve the broker's socket")?;
                let _ = started.send(());
                if told_to_serve.await.is_ok() {
                    http::server::serve(listener, router, limits, stop).await;
                }
                Ok(())
            })
        })
        .context("cannot start the thread of the broker's socket")?;
    if serving.await.is_err() {
        // The thread ended before its socket was registered: its result says why.
        return Err(match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(Err(error))) => error,
            _ => anyhow::anyhow!("the server of the broker's socket panicked"),
        });
    }
    Ok((thread, serve))
}

fn spawn_signal_handler(state: Arc<BrokerState>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut terminate), Ok(mut interrupt)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            tracing::warn!("cannot install signal handlers; stop the broker with 'synapse broker stop'");
            return;
        };
        let mut stop = state.shutdown.subscribe();
        tokio::select! {
            _ = terminate.recv() => {
                tracing::info!("SIGTERM: stopping");
                state.request_shutdown();
            }
            _ = interrupt.recv() => {
                tracing::info!("SIGINT: stopping");
                state.request_shutdown();
            }
            _ = stop.wait_for(|stopping| *stopping) => {}
        }
        // Stopping, however it began: the signals stay caught for the rest of the process, so
        // another one is the user's "do not wait" (a second Ctrl-C), not lost. Exiting now loses
        // nothing acknowledged: the write-ahead log holds it, as after a crash. The state goes
        // first: the writer ends only once every holder of it has.
        drop(state);
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::warn!("a signal while stopping: exiting now (what was acknowledged is in the log)");
        std::process::exit(1);
    });
}
