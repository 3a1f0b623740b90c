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
//! While an agent is registered its A2A endpoints are served on the agent's port (127.0.0.1)
//! and on `$SYNAPSE_UDS_DIR/<agent_id>.sock` (by `http::agent_endpoints`, which also binds the
//! port at registration), and stop when the agent goes: each server's stop switch is held in
//! [`AgentServers`], which deregistration here flips.

use super::BrokerState;
use super::command::{Command, CommandError};
use crate::process::{self, is_pid_alive};
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
pub fn checked_port_range((low, high): (u16, u16)) -> Result<(u16, u16), CommandError> {
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
    /// Records the stop switch of the endpoints now serving `agent_id` (stopping any previous).
    pub fn insert(&self, agent_id: &str, stop: watch::Sender<bool>) {
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

    /// Is `agent_id` served now by other endpoints than those `ours` (a receiver of their stop
    /// switch) belongs to: the agent registered again under the same id?
    pub fn serves_another(&self, agent_id: &str, ours: &watch::Receiver<bool>) -> bool {
        self.servers
            .lock()
            .ok()
            .and_then(|servers| servers.get(agent_id).map(|current| !current.subscribe().same_channel(ours)))
            .unwrap_or(false)
    }

    fn ids(&self) -> Vec<String> {
        self.servers.lock().map(|servers| servers.keys().cloned().collect()).unwrap_or_default()
    }
}

/// Deregisters `agent_id` (only the registration of process `registration`, when given) and
/// stops its servers once that is stored: a refused deregistration leaves the servers of the
/// agent that holds the id now.
pub async fn deregister(
    state: &BrokerState,
    agent_id: &str,
    reason: &str,
    registration: Option<(u32, Option<u64>)>,
) -> Result<(), CommandError> {
    let command = Command::Deregister { agent_id: agent_id.to_string(), reason: reason.to_string(), registration };
    state.writer.submit(command).await?;
    state.agent_servers.stop(agent_id);
    Ok(())
}

/// Deregisters every agent whose process is gone; returns the ports they held.
pub async fn prune_dead(state: &Arc<BrokerState>) -> Vec<u16> {
    let Ok(agents) = state.store.read(|view| view.agents()) else { return Vec::new() };
    let mut ports = Vec::new();
    for agent in agents.into_iter().filter(|agent| !is_agent_alive(agent)) {
        tracing::info!("{} (pid {}) is gone; deregistering", agent.agent_id, agent.pid);
        let _ = deregister(state, &agent.agent_id, "process gone", Some((agent.pid, agent.pid_start))).await;
        ports.push(agent.port);
    }
    // A wrapper killed before it could remove its session files: they go with it.
    if !ports.is_empty() {
        crate::config::remove_abandoned(&state.paths.home);
    }
    ports
}

/// Is the agent's process still the one that registered? Its pid runs and, when the start
/// time was recorded, started at that time (a reused pid belongs to another process).
pub fn is_agent_alive(agent: &AgentRecord) -> bool {
    is_pid_alive(agent.pid) && same_process(agent.pid_start, || process::start_ticks(agent.pid))
}

/// Does a running pid still hold the process that registered, given the start time recorded
/// then and a way to read it now? Only a start time read and found different says no: one
/// that cannot be read (the broker out of file descriptors, a restricted `/proc`) is no proof
/// of death, and taking it for one deregistered every live agent, locks and all.
fn same_process(recorded: Option<u64>, now: impl FnOnce() -> Option<u64>) -> bool {
    recorded.is_none_or(|start| now().is_none_or(|now| now == start))
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
    let now = crate::time::now_ms();
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

/// Stops every per-agent server (broker shutdown).
pub async fn stop_all(state: &Arc<BrokerState>) {
    for agent_id in state.agent_servers.ids() {
        state.agent_servers.stop(&agent_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The old endpoints of an agent registered again under its id see that they are not the
    /// current ones (and leave the socket file at their path, now the new endpoints').
    #[test]
    fn endpoints_replaced_under_the_same_id_know_they_are_not_the_current_ones() {
        let servers = AgentServers::default();
        let (first, _) = watch::channel(false);
        let first_switch = first.subscribe();
        servers.insert("a", first);
        assert!(!servers.serves_another("a", &first_switch));
        let (second, _) = watch::channel(false);
        let second_switch = second.subscribe();
        servers.insert("a", second);
        assert!(*first_switch.borrow(), "the first endpoints were told to stop");
        assert!(servers.serves_another("a", &first_switch));
        assert!(!servers.serves_another("a", &second_switch));
        assert!(servers.stop("a"));
        assert!(!servers.serves_another("a", &first_switch), "deregistered: no one serves the id");
    }

    #[test]
    fn only_a_start_time_read_and_found_different_is_another_process() {
        assert!(same_process(None, || Some(5)), "nothing recorded: the pid decides");
        assert!(same_process(Some(5), || Some(5)));
        assert!(!same_process(Some(5), || Some(6)), "a reused pid");
        assert!(same_process(Some(5), || None), "unreadable is no proof of death");
    }

    #[test]
    fn this_process_is_alive_and_a_different_start_time_is_not_it() {
        let pid = std::process::id();
        let start = process::start_ticks(pid);
        assert!(start.is_some());
        assert!(same_process(start, || process::start_ticks(pid)));
        assert!(!same_process(start.map(|ticks| ticks + 1), || process::start_ticks(pid)));
    }
}
