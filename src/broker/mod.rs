//! The broker daemon: owns the store, the writer thread, the HTTP servers and the agents'
//! per-agent endpoints.
//!
//! One broker per `SYNAPSE_HOME`: redb's file lock makes a second one fail at once
//! (`StoreError::AlreadyOpen`). Shutdown travels by a watch channel that every stream and
//! server selects on, so a stop ends open streams promptly instead of waiting for them.

pub mod agents;
pub mod command;
pub mod delivery;
pub mod externals;
pub mod file_safety;
pub mod indexer;
pub mod outbound;
pub mod tail;
pub mod webhooks;
pub mod writer;

use crate::config::{BrokerInfo, Paths};
use crate::event::SCHEMA_VERSION;
use crate::store::Store;
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
pub use writer::WriterHandle;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Tests only: while the file this names exists, the log's file cannot grow, as on a full disk.
const DISK_FULL_SWITCH_VARIABLE: &str = "SYNAPSE_TEST_DISK_FULL_FILE";

/// How often the broker checks that registered agents' processes still run.
const LIVENESS_INTERVAL: Duration = Duration::from_secs(2);
/// How often the sweeper asks the writer to expire idempotency keys past their 24 h window: a
/// key may outlive its window by this much (decide ignores it by then), and the log gains at
/// most one `idempotency_keys_expired` per interval.
const IDEMPOTENCY_EXPIRY_INTERVAL: Duration = Duration::from_secs(3600);

/// Everything the broker's tasks share. Cloned as `Arc<BrokerState>`.
pub struct BrokerState {
    pub store: Arc<Store>,
    pub writer: WriterHandle,
    pub head: watch::Receiver<u64>,
    /// The newest events, shared by the tails.
    pub recent: Arc<tail::RecentEvents>,
    /// Whether the writer can store (reported by `/broker/health`).
    pub write_health: Arc<writer::WriteHealth>,
    pub shutdown: watch::Sender<bool>,
    pub paths: Paths,
    /// The TCP port the broker listens on (resolved when 0 was asked for).
    pub port: std::sync::atomic::AtomicU16,
    pub agent_servers: agents::AgentServers,
    /// The webhook outbox (a projection of the log kept in memory by its worker).
    pub webhooks: webhooks::Webhooks,
    /// External agents (kept in memory by the same worker).
    pub externals: externals::Externals,
    /// Wakes the history indexer when the index changed without the head moving (a rebuild).
    pub index_wake: tokio::sync::Notify,
    /// API-key authentication, from the home's security settings at start.
    pub auth: Arc<crate::http::auth::AuthConfig>,
    /// Host / Origin / content-type rules of every HTTP server, read from the environment at start.
    pub request_rules: crate::http::guard::RequestRules,
    /// Idle timeout and connection limit shared by every HTTP server of this broker.
    pub connection_limits: Arc<crate::http::server::ConnectionLimits>,
    /// The home's security settings (`broker-settings.json`), read once at start.
    pub trust: crate::trust::TrustSettings,
}

impl BrokerState {
    /// Starts the writer over an opened store (used by the daemon, tests and benchmarks).
    pub fn start(store: Store, paths: Paths) -> anyhow::Result<(Arc<BrokerState>, std::thread::JoinHandle<()>)> {
        // Security comes from the home, never from the environment of whoever started us.
        let trust = crate::trust::TrustSettings::load(&paths.home)?;
        let store = Arc::new(store);
        let (head_sender, head) = watch::channel(store.head()?);
        let recent = Arc::new(tail::RecentEvents::default());
        let write_health = Arc::new(writer::WriteHealth::default());
        let (writer, thread) = WriterHandle::start(store.clone(), head_sender, recent.clone(), write_health.clone())
            .context("cannot start the writer thread")?;
        let (shutdown, _) = watch::channel(false);
        let state = Arc::new(BrokerState {
            store,
            writer,
            head,
            recent,
            write_health,
            shutdown,
            paths,
            port: std::sync::atomic::AtomicU16::new(0),
            agent_servers: agents::AgentServers::default(),
            auth: Arc::new(crate::http::auth::AuthConfig::from_trust(&trust)),
            request_rules: crate::http::guard::RequestRules::from_env(),
            connection_limits: Arc::new(crate::http::server::ConnectionLimits::from_env()),
            trust,
            webhooks: webhooks::Webhooks::default(),
            externals: externals::Externals::default(),
            index_wake: tokio::sync::Notify::new(),
        });
        Ok((state, thread))
    }

    pub fn info(&self) -> BrokerInfo {
        let write_failure = self.write_health.failure();
        BrokerInfo {
            healthy: write_failure.is_none(),
            write_failure,
            pid: std::process::id(),
            version: VERSION.to_string(),
            schema: SCHEMA_VERSION,
            home: self.paths.home.display().to_string(),
            socket: self.paths.broker_socket().display().to_string(),
            port: self.port.load(std::sync::atomic::Ordering::Relaxed),
            head: *self.head.borrow(),
        }
    }

    /// Which targets outgoing requests (webhooks, external agents) may reach now: private ones
    /// per the home's settings, never this broker's own port or its agents' ports. When the
    /// agents cannot be read, local targets are refused altogether (fail closed).
    pub fn outbound_policy(&self) -> outbound::Policy {
        let broker_port = self.port.load(std::sync::atomic::Ordering::Relaxed);
        match self.store.read(|view| view.agents()) {
            Ok(agents) => outbound::Policy {
                allow_private: self.trust.outbound_allow_private,
                own_ports: std::iter::once(broker_port).chain(agents.iter().map(|agent| agent.port)).collect(),
            },
            Err(error) => {
                tracing::warn!("cannot read the agents' ports ({error}); refusing local targets");
                outbound::Policy { allow_private: false, own_ports: vec![broker_port] }
            }
        }
    }

    pub fn request_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub fn is_stopping(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Creates a directory (and parents) readable only by the user.
fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    crate::private_files::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// Binds a Unix socket at `path`, removing a stale socket file left by a dead process. Fails
/// when something is listening there.
pub fn bind_unix(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
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
    tokio::net::UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))
}

/// Runs the broker in the foreground until it is stopped (signal or `synapse broker stop`).
pub async fn run(paths: Paths) -> anyhow::Result<()> {
    create_private_dir(&paths.home)?;
    crate::private_files::own_dir(&paths.uds_dir)
        .with_context(|| format!("cannot use {} for the broker's sockets", paths.uds_dir.display()))?;
    // Fault-injection tests make the disk look full while this file exists (see store::fault).
    let disk_full_switch = std::env::var_os(DISK_FULL_SWITCH_VARIABLE).map(std::path::PathBuf::from);
    let store = Store::open_with_disk_full_switch(&paths.database(), disk_full_switch.as_deref())?;
    // A home made by an older version (or by hand) may be readable by others: the log and the
    // terminal logs hold every message.
    match crate::private_files::tighten_home(&paths.home) {
        Ok(0) => {}
        Ok(changed) => tracing::warn!("{}: removed group/other access from {changed} entries", paths.home.display()),
        Err(error) => tracing::warn!("cannot restrict the permissions of {}: {error}", paths.home.display()),
    }
    // This broker owns the home now: a deliberate stop of the previous one is over, and
    // wrappers waiting for a broker may connect.
    crate::trust::clear_stopped(&paths.home)
        .with_context(|| format!("cannot remove {}", paths.home.join(crate::trust::STOPPED_MARKER).display()))?;

    let socket_path = paths.broker_socket();
    let unix = bind_unix(&socket_path)?;
    let tcp = tokio::net::TcpListener::bind(("127.0.0.1", paths.broker_port)).await.map_err(|error| {
        anyhow::anyhow!(
            "cannot listen on 127.0.0.1:{}: {error}. Set SYNAPSE_BROKER_PORT to a free port",
            paths.broker_port
        )
    })?;
    let port = tcp.local_addr()?.port();

    let (state, writer_thread) = BrokerState::start(store, paths.clone())?;
    state.port.store(port, std::sync::atomic::Ordering::Relaxed);
    agents::restore(&state).await;

    let info_path = paths.broker_info();
    crate::private_files::write(&info_path, serde_json::to_vec_pretty(&state.info())?)
        .with_context(|| format!("cannot write {}", info_path.display()))?;
    tracing::info!("broker {} listening on {} and 127.0.0.1:{port}", VERSION, socket_path.display());

    spawn_signal_handler(state.clone());
    spawn_liveness_sweeper(state.clone());
    delivery::spawn(state.clone());
    indexer::spawn(state.clone());

    let router = crate::http::broker_router(state.clone());
    let stop_signal = || {
        let mut stop = state.shutdown.subscribe();
        async move {
            let _ = stop.wait_for(|stopping| *stopping).await;
        }
    };
    let limits = state.connection_limits.clone();
    tokio::join!(
        crate::http::server::serve(unix, router.clone(), limits.clone(), stop_signal()),
        crate::http::server::serve(tcp, router, limits, stop_signal()),
    );

    agents::stop_all(&state).await;
    let _ = std::fs::remove_file(&socket_path);
    let _ = std::fs::remove_file(&info_path);
    // Dropping the last handle ends the writer after it has answered everything queued.
    drop(state);
    let _ = tokio::task::spawn_blocking(move || writer_thread.join()).await;
    tracing::info!("broker stopped");
    Ok(())
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
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
            _ = stop.wait_for(|stopping| *stopping) => return,
        }
        state.request_shutdown();
    });
}

/// Deregisters agents whose process has gone (heartbeat by pid liveness), expires held
/// inboxes and, once per [`IDEMPOTENCY_EXPIRY_INTERVAL`], old idempotency keys.
fn spawn_liveness_sweeper(state: Arc<BrokerState>) {
    let hold = agents::inbox_hold();
    tokio::spawn(async move {
        let mut stop = state.shutdown.subscribe();
        let mut idempotency_expired_at: Option<std::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(LIVENESS_INTERVAL) => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
            agents::prune_dead(&state).await;
            agents::expire_held_inboxes(&state, hold).await;
            if idempotency_expired_at.is_none_or(|at| at.elapsed() >= IDEMPOTENCY_EXPIRY_INTERVAL) {
                idempotency_expired_at = Some(std::time::Instant::now());
                // The writer appends the event only when a key is past its window.
                if let Err(error) = state.writer.submit(command::Command::ExpireIdempotencyKeys).await {
                    tracing::warn!("cannot expire idempotency keys: {error}");
                }
            }
        }
    });
}
