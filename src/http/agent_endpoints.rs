//! Registration and the agents' own endpoints: binding an agent's port, recording the
//! registration through the writer, and serving its A2A routes on that port and on its socket
//! until it goes (`broker::agents` flips the stop switch kept in `AgentServers`).
//!
//! Invariant: the agent's servers are started before the registration is answered, so an
//! agent that hears its port can be reached on it at once.

use super::caller::RegistrationProof;
use super::{AppState, HttpState};
use crate::api;
use crate::broker::agents::{checked_port_range, port_range, prune_dead};
use crate::broker::command::{Command, CommandError, Outcome, RegisterRequest};
use crate::process::{self, is_pid_alive};
use crate::secret::hash_secret;
use crate::store::AgentRecord;
use tokio::sync::watch;

/// What a registration gives the agent (the secret is shown only here, once).
pub struct Registration {
    pub agent: AgentRecord,
    pub secret: String,
    pub socket: String,
    pub endpoint: String,
}

/// Registers an agent: finds and binds a port, records the registration, serves its endpoints.
///
/// The registration must prove its pid: over the Unix socket the registered process is the
/// peer itself, one of its ancestors or its child (a wrapper registers itself; `synapse agent
/// register --pid $PPID` its caller); with the admin key any live process. A live agent's name
/// or id is never taken by another pid (409, decided by the writer), and the process's start
/// time is recorded so a reused pid is never mistaken for the agent.
pub async fn register(
    state: &AppState,
    body: api::RegisterRequest,
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
            "process {peer} may not register process {}: an agent registers itself, an ancestor or its child, never an unrelated process (the admin key may register any)",
            body.pid
        )));
    }
    let pid_start = process::start_ticks(body.pid);
    let range = match body.port_range {
        Some(range) => Some(checked_port_range(range)?),
        None => port_range(&body.agent_type),
    };
    // No port asked for: the range's ports in turn, then any free port the system chooses, so
    // a full range (or a type without one) never stops an agent from starting (issue 14).
    let candidates: Vec<u16> = match body.port {
        Some(port) => vec![port],
        None => match range {
            Some((low, high)) => (low..=high).chain(std::iter::once(0)).collect(),
            None => vec![0],
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
    let releasing = prune_dead(&state.broker).await;
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
                    agent: *agent,
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

/// Serves the agent's endpoints on `listener` and on its Unix socket, on the broker's
/// multi-threaded runtime whichever server's request registered it; returns the socket path.
fn serve(state: &AppState, agent: &AgentRecord, listener: tokio::net::TcpListener) -> anyhow::Result<String> {
    let socket_path = state.paths.agent_socket(&agent.agent_id);
    let (stop, _) = watch::channel(false);
    let (tcp_signal, unix_signal) = (stop_signal(state, &stop), stop_signal(state, &stop));
    let ours = stop.subscribe();
    // Known as the id's endpoints before the socket is bound: endpoints of an earlier
    // registration that end after the bind see that the file at the path is not theirs.
    state.agent_servers.insert(&agent.agent_id, stop);
    // Both sockets are watched by that runtime's reactor: the listener may have been bound by a
    // request on the broker's Unix socket, served by a runtime of its own.
    let (unix, listener) = {
        let listener = listener.into_std()?;
        let _runtime = state.runtime.enter();
        (super::server::bind_unix(&socket_path)?, tokio::net::TcpListener::from_std(listener)?)
    };
    let router = super::agent_router(state.clone(), agent.agent_id.clone());
    let router_tcp = router.clone();
    let cleanup_path = socket_path.clone();
    let (cleanup_state, cleanup_id) = (state.clone(), agent.agent_id.clone());
    let limits = state.connection_limits.clone();
    state.runtime.spawn(async move {
        tokio::join!(
            super::server::serve(unix, router, limits.clone(), unix_signal),
            super::server::serve(listener, router_tcp, limits, tcp_signal),
        );
        // Unless the agent registered again under its id meanwhile: the file at the path is
        // then the new endpoints' socket (removing it sent the agent's callers to TCP).
        if !cleanup_state.agent_servers.serves_another(&cleanup_id, &ours) {
            let _ = std::fs::remove_file(&cleanup_path);
        }
    });
    Ok(socket_path.display().to_string())
}

fn stop_signal(
    state: &HttpState,
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

/// At broker start: serve the endpoints of agents that are still alive, prune the others.
pub async fn restore(state: &AppState) {
    prune_dead(&state.broker).await;
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
