//! Registered agents: port allocation, per-agent endpoints, liveness.
//!
//! **The inbox belongs to the agent, not to the port.** An agent's id is `synapse-<type>-<port>`
//! from the port it first got. When it leaves (exit, crash, deregistration) with messages still
//! queued or requests not yet answered (its reply targets: they show the senders' words and let
//! it answer as that agent), its id keeps them (projection `departed_agents`): no other agent
//! is given that id —
//! allocation skips the port, and an explicit `--port` for it is refused with the reason —
//! until an agent of the same type is started again with the same explicit `--name` (by the
//! user: the admin key, or a peer of the broker's uid not inside another agent — see
//! `http::caller`; anyone else is refused), which takes the id
//! and its queue back, even on another port (its id then keeps the old port's number). Queues
//! nobody takes back within the hold time (`SYNAPSE_INBOX_HOLD_SECONDS`, default 24 h) expire:
//! the waiting tasks fail with the reason and `inbox_expired` frees the id. An id whose
//! agent left with nothing pending is free at once.
//!
//! While an agent is registered the broker serves its A2A endpoints on the agent's port
//! (127.0.0.1) and on `$SYNAPSE_UDS_DIR/<agent_id>.sock`, and stops serving them when the agent
//! goes. Each server has its own stop channel, held in [`AgentServers`].

use super::BrokerState;
use super::command::{Command, CommandError, Outcome, RegisterRequest, hash_secret, is_pid_alive};
use super::process;
use crate::http::caller::RegistrationProof;
use crate::store::AgentRecord;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Port ranges of the built-in profiles (SPEC §1).
pub fn port_range(agent_type: &str) -> Option<(u16, u16)> {
    Some(match agent_type {
        "claude" => (8100, 8109),
        "gemini" => (8110, 8119),
        "codex" => (8120, 8129),
        "opencode" => (8130, 8139),
        "copilot" => (8140, 8149),
        "dummy" => (8190, 8199),
        _ => return None,
    })
}

/// The most ports a registration's own range may span: room for any team of agents, and a
/// typo cannot make the broker try thousands of binds.
const PORT_RANGE_SPAN_MAX: u16 = 1000;

/// A registration's own port range (its profile's), refused unless `1 <= low <= high` and it
/// spans at most [`PORT_RANGE_SPAN_MAX`] ports.
fn checked_port_range((low, high): (u16, u16)) -> Result<(u16, u16), CommandError> {
    if low == 0 || low > high || high - low >= PORT_RANGE_SPAN_MAX {
        return Err(CommandError::bad(format!(
            "port_range [{low}, {high}] is not usable: it must be [low, high] with 1 <= low <= high and at most {PORT_RANGE_SPAN_MAX} ports (fix the profile's port_range, or pass a port)"
        )));
    }
    Ok((low, high))
}

/// Running per-agent servers, by agent id.
#[derive(Default)]
pub struct AgentServers {
    servers: Mutex<HashMap<String, watch::Sender<bool>>>,
}

impl AgentServers {
    fn insert(&self, agent_id: &str, stop: watch::Sender<bool>) {
        if let Ok(mut servers) = self.servers.lock()
            && let Some(previous) = servers.insert(agent_id.to_string(), stop)
        {
            previous.send_replace(true);
        }
    }

    fn stop(&self, agent_id: &str) -> bool {
        match self.servers.lock().ok().and_then(|mut servers| servers.remove(agent_id)) {
            Some(stop) => {
                stop.send_replace(true);
                true
            }
            None => false,
        }
    }

    fn ids(&self) -> Vec<String> {
        self.servers.lock().map(|servers| servers.keys().cloned().collect()).unwrap_or_default()
    }
}

/// What registration returns to the agent (the secret is shown only here, once).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Registration {
    pub agent: AgentRecord,
    pub secret: String,
    pub socket: String,
    pub endpoint: String,
}

/// The body of `POST /agents`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    pub agent_type: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    pub pid: u32,
    #[serde(default)]
    pub working_dir: String,
    /// A fixed port; 0 lets the system choose; absent takes the first free port of the
    /// profile's range.
    #[serde(default)]
    pub port: Option<u16>,
    /// `[low, high]`: the ports to try when no port is given (the profile's); absent takes the
    /// built-in range of the agent type.
    #[serde(default)]
    pub port_range: Option<(u16, u16)>,
}

/// Registers an agent: finds and binds a port, records the registration, serves its endpoints.
///
/// The registration must prove its pid: over the Unix socket the registered process is the
/// peer itself, one of its ancestors or its child (a wrapper registers itself; `synapse agent
/// register --pid $PPID` its caller); with the admin key any live process. A live agent's name
/// or id is never taken by another pid (409, decided by the writer), and the process's start
/// time is recorded so a reused pid is never mistaken for the agent.
pub async fn register(
    state: &Arc<BrokerState>,
    body: RegisterBody,
    proof: RegistrationProof,
) -> Result<Registration, CommandError> {
    if body.pid == 0 {
        return Err(CommandError::bad("pid must be the agent's process id (not 0)"));
    }
    if !is_pid_alive(body.pid) {
        return Err(CommandError::bad(format!("process {} is not running", body.pid)));
    }
    if !proof.admin_key
        && let Some(peer) = proof.peer
        && !process::is_related(peer, body.pid)
    {
        return Err(CommandError::forbidden(format!(
            "Error: process {peer} may not register process {}: an agent registers itself, an ancestor or its child, never an unrelated process (the admin key may register any)",
            body.pid
        )));
    }
    let pid_start = process::start_ticks(body.pid);
    let range = match body.port_range {
        Some(range) => Some(checked_port_range(range)?),
        None => port_range(&body.agent_type),
    };
    let candidates: Vec<u16> = match body.port {
        Some(port) => vec![port],
        None => match range {
            Some((low, high)) => (low..=high).collect(),
            None => {
                return Err(CommandError::bad(format!(
                    "Unknown agent type '{}' has no port range: pass a port (0 lets the system choose)",
                    body.agent_type
                )));
            }
        },
    };
    let taken: Vec<u16> = state
        .store
        .read(|view| view.agents())
        .map_err(|error| CommandError::Unavailable { message: error.to_string() })?
        .into_iter()
        .filter(|agent| agent.pid != body.pid && is_pid_alive(agent.pid))
        .map(|agent| agent.port)
        .collect();
    // A dead agent's endpoints may still hold the port (an agent restarted after a crash):
    // deregister it and let its server go before binding.
    let releasing = prune_dead(state).await;
    let secret = uuid::Uuid::new_v4().simple().to_string();
    let mut last_error = None;
    for port in candidates.iter().copied() {
        if port != 0 && taken.contains(&port) {
            continue;
        }
        // An explicit port may still be held by the server of an agent pruned a moment ago.
        let may_be_releasing = releasing.contains(&port) || (port != 0 && body.port == Some(port));
        let listener = match bind_port(port, may_be_releasing).await {
            Ok(listener) => listener,
            Err(error) => {
                last_error = Some(format!("port {port}: {error}"));
                continue;
            }
        };
        let port =
            listener.local_addr().map_err(|error| CommandError::Unavailable { message: error.to_string() })?.port();
        let request = RegisterRequest {
            agent_type: body.agent_type.clone(),
            name: body.name.clone(),
            role: body.role.clone(),
            pid: body.pid,
            working_dir: body.working_dir.clone(),
            port,
            secret_hash: hash_secret(&secret),
            pid_start,
            wrapper: proof.peer == Some(body.pid),
            by_user: proof.by_user,
        };
        match state.writer.submit(Command::RegisterAgent(request)).await {
            Ok(Outcome::Registered { agent }) => {
                let socket = serve(state, &agent, listener).map_err(|error| CommandError::Unavailable {
                    message: format!("registered, but cannot serve the agent's endpoints: {error}"),
                })?;
                return Ok(Registration {
                    endpoint: format!("http://127.0.0.1:{}", agent.port),
                    agent,
                    secret,
                    socket,
                });
            }
            Ok(_) => return Err(CommandError::Unavailable { message: "unexpected answer to registration".into() }),
            // A port taken (by a live agent, or by the id of a departed agent's queue): try the
            // next one. A name taken is final.
            Err(CommandError::Conflict { message }) if body.port.is_none() && message.starts_with("port ") => {
                last_error = Some(message);
            }
            Err(error) => return Err(error),
        }
    }
    Err(match (body.port, range) {
        (None, Some((low, high))) => CommandError::conflict(format!(
            "All ports of the {} range {low}-{high} are taken{}",
            body.agent_type,
            last_error.map(|e| format!(" (last: {e})")).unwrap_or_default()
        )),
        _ => CommandError::conflict(format!(
            "Port {} is not available: {}",
            body.port.unwrap_or_default(),
            last_error.unwrap_or_else(|| "taken by another agent".into())
        )),
    })
}

/// Serves the agent's endpoints on `listener` and on its Unix socket; returns the socket path.
fn serve(state: &Arc<BrokerState>, agent: &AgentRecord, listener: tokio::net::TcpListener) -> anyhow::Result<String> {
    let socket_path = state.paths.agent_socket(&agent.agent_id);
    let unix = super::bind_unix(&socket_path)?;
    let (stop, _) = watch::channel(false);
    let router = crate::http::agent_router(state.clone(), agent.agent_id.clone());
    let router_tcp = router.clone();
    let (tcp_signal, unix_signal) = (stop_signal(state, &stop), stop_signal(state, &stop));
    let cleanup_path = socket_path.clone();
    let limits = state.connection_limits.clone();
    tokio::spawn(async move {
        tokio::join!(
            crate::http::server::serve(unix, router, limits.clone(), unix_signal),
            crate::http::server::serve(listener, router_tcp, limits, tcp_signal),
        );
        let _ = std::fs::remove_file(&cleanup_path);
    });
    state.agent_servers.insert(&agent.agent_id, stop);
    Ok(socket_path.display().to_string())
}

fn stop_signal(
    state: &Arc<BrokerState>,
    stop: &watch::Sender<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut agent_stop = stop.subscribe();
    let mut broker_stop = state.shutdown.subscribe();
    async move {
        tokio::select! {
            _ = agent_stop.wait_for(|stopping| *stopping) => {}
            _ = broker_stop.wait_for(|stopping| *stopping) => {}
        }
    }
}

/// Deregisters an agent and stops its endpoints.
pub async fn deregister(state: &Arc<BrokerState>, agent_id: &str, reason: &str) -> Result<(), CommandError> {
    let result =
        state.writer.submit(Command::Deregister { agent_id: agent_id.to_string(), reason: reason.to_string() }).await;
    state.agent_servers.stop(agent_id);
    result.map(|_| ())
}

/// Deregisters every agent whose process is gone; returns the ports they held.
pub async fn prune_dead(state: &Arc<BrokerState>) -> Vec<u16> {
    let Ok(agents) = state.store.read(|view| view.agents()) else { return Vec::new() };
    let mut ports = Vec::new();
    for agent in agents.into_iter().filter(|agent| !is_agent_alive(agent)) {
        tracing::info!("{} (pid {}) is gone; deregistering", agent.agent_id, agent.pid);
        let _ = deregister(state, &agent.agent_id, "process gone").await;
        ports.push(agent.port);
    }
    ports
}

/// Is the agent's process still the one that registered? Its pid runs and, when the start
/// time was recorded, started at that time (a reused pid belongs to another process).
pub fn is_agent_alive(agent: &AgentRecord) -> bool {
    is_pid_alive(agent.pid) && agent.pid_start.is_none_or(|start| process::start_ticks(agent.pid) == Some(start))
}

/// Binds 127.0.0.1:`port`. A port just released by a stopped agent server is retried briefly
/// while that server shuts down.
async fn bind_port(port: u16, releasing: bool) -> std::io::Result<tokio::net::TcpListener> {
    let attempts = if releasing { 100 } else { 1 };
    let mut last = None;
    for _ in 0..attempts {
        match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(listener) => return Ok(listener),
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("cannot bind")))
}

/// How long a departed agent's queue waits for it (`SYNAPSE_INBOX_HOLD_SECONDS`, default 24 h).
pub fn inbox_hold() -> std::time::Duration {
    std::env::var("SYNAPSE_INBOX_HOLD_SECONDS")
        .ok()
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map_or(INBOX_HOLD_DEFAULT, std::time::Duration::from_secs)
}

pub const INBOX_HOLD_DEFAULT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Expires the queues of departed agents held longer than `hold` (asks the writer only when
/// one is due, so an idle broker appends nothing).
pub async fn expire_held_inboxes(state: &Arc<BrokerState>, hold: std::time::Duration) {
    let hold_ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
    let now = super::writer::now_ms();
    let due = state.store.read(|view| {
        for departed in view.departed_agents()? {
            if now >= departed.departed_ms.saturating_add(hold_ms) && view.pending_for(&departed.agent_id)? > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    });
    if due.unwrap_or(false)
        && let Err(error) = state.writer.submit(Command::ExpireInboxes { hold_ms }).await
    {
        tracing::warn!("cannot expire held inboxes: {error}");
    }
}

/// At broker start: serve the endpoints of agents that are still alive, prune the others.
pub async fn restore(state: &Arc<BrokerState>) {
    prune_dead(state).await;
    let Ok(agents) = state.store.read(|view| view.agents()) else { return };
    for agent in agents {
        match tokio::net::TcpListener::bind(("127.0.0.1", agent.port)).await {
            Ok(listener) => {
                if let Err(error) = serve(state, &agent, listener) {
                    tracing::warn!("cannot serve {}'s endpoints again: {error}", agent.agent_id);
                }
            }
            Err(error) => tracing::warn!("cannot listen on {}'s port {} again: {error}", agent.agent_id, agent.port),
        }
    }
}

/// Stops every per-agent server (broker shutdown).
pub async fn stop_all(state: &Arc<BrokerState>) {
    for agent_id in state.agent_servers.ids() {
        state.agent_servers.stop(&agent_id);
    }
}
