//! The broker: owns the store, the writer thread and the background tasks (liveness sweeper,
//! webhook delivery, history indexer); [`BrokerState`] is what they share.
//!
//! The broker knows nothing of HTTP: `http` serves it and `daemon` starts both. One broker per
//! `SYNAPSE_HOME`: redb's file lock makes a second one fail at once (`StoreError::AlreadyOpen`).
//! Shutdown travels by a watch channel that every stream and server selects on, so a stop ends
//! open streams promptly instead of waiting for them.

pub mod agents;
pub mod command;
pub mod delivery;
pub mod externals;
pub mod file_safety;
pub mod indexer;
pub mod outbound;
pub mod tail;
#[cfg(test)]
pub(crate) mod test_support;
pub mod webhooks;
pub mod writer;

use crate::api::BrokerInfo;
use crate::config::Paths;
use crate::event::SCHEMA_VERSION;
use crate::store::Store;
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
pub use writer::WriterHandle;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How often the broker checks that registered agents' processes still run.
const LIVENESS_INTERVAL: Duration = Duration::from_secs(2);
/// How often old long-message files are looked for (also at the broker's start).
const MESSAGE_FILE_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);
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
            build: crate::config::BUILD_ID.to_string(),
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

    /// Waits until the delivery worker has applied the log up to its head as it is now, or the
    /// broker stops. The webhook outbox and the external agents' list are its projections, in
    /// memory, built again after every start (from its last snapshot and the log after it): a
    /// request that reads them waits for this first, or it could answer from a list not yet
    /// rebuilt.
    pub async fn delivery_current(&self) {
        let head = *self.head.borrow();
        self.webhooks.caught_up(head, self.shutdown.subscribe()).await;
    }

    pub fn request_shutdown(&self) {
        self.shutdown.send_replace(true);
        self.store.stop_indexing();
    }

    pub fn is_stopping(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Deregisters agents whose process has gone (heartbeat by pid liveness), expires held
/// inboxes and, once per `IDEMPOTENCY_EXPIRY_INTERVAL`, old idempotency keys.
pub fn spawn_liveness_sweeper(state: Arc<BrokerState>) {
    let hold = agents::inbox_hold();
    tokio::spawn(async move {
        let mut stop = state.shutdown.subscribe();
        let mut idempotency_expired_at: Option<std::time::Instant> = None;
        let mut message_files_swept_at: Option<std::time::Instant> = None;
        let message_file_lifetime = crate::config::message_file_lifetime();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(LIVENESS_INTERVAL) => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
            agents::prune_dead(&state).await;
            agents::expire_held_inboxes(&state, hold).await;
            if let Some(lifetime) = message_file_lifetime
                && message_files_swept_at.is_none_or(|at| at.elapsed() >= MESSAGE_FILE_SWEEP_INTERVAL)
            {
                message_files_swept_at = Some(std::time::Instant::now());
                // Not awaited: a home holding many files (one from before this sweep) must hold
                // neither this loop nor a stop, which the removal watches between files.
                let home = state.paths.home.clone();
                let stopping = state.shutdown.subscribe();
                tokio::task::spawn_blocking(move || {
                    let removed = crate::config::remove_old_message_files(&home, lifetime, || *stopping.borrow());
                    if removed > 0 {
                        tracing::info!(
                            "removed {removed} long-message file(s) older than {} days",
                            lifetime.as_secs() / 86_400
                        );
                    }
                });
            }
            // What long reads freed goes back to the system (a few ms, off the runtime).
            if crate::process::memory_to_release()
                && let Ok((before, after)) =
                    tokio::task::spawn_blocking(crate::process::release_free_memory_measured).await
            {
                tracing::debug!("free memory handed back after long reads: resident {before} → {after} kB");
            }
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
