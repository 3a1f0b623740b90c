//! Who is calling: the user, an agent (proved by its secret), or an anonymous caller.
//!
//! The rule (issue 12):
//! - a request carrying an agent's secret (`x-synapse-agent-secret`) acts as that agent and
//!   only as it — even when it also carries the admin key;
//! - otherwise the admin key (an API key, when auth is on), or the broker's Unix socket with the
//!   peer's uid (from the kernel, `SO_PEERCRED`) equal to the broker's, is **the user**: the CLI
//!   typed in a plain shell; so is the dashboard page in the user's browser (loopback TCP from
//!   the broker's uid, with the broker's own `Origin` and the page key);
//! - anything else (a TCP caller without a key, a stale secret, a process below an agent's
//!   wrapper that left the agent's secret out, a peer that has exited or cannot be read) is
//!   **anonymous**: it may send messages and read what is public, never act for an agent.
//!
//! "Below a wrapper" is read from the peer's lineage taken when the connection is accepted
//! (so a parent exiting later changes nothing) and compared with the wrappers' recorded pids
//! and start times (registrations whose peer was the registered process).
//!
//! The peer's credentials are attached to every request on a Unix socket by
//! [`PeerCredentials`] (axum's connect info), so handlers see what the kernel says rather than
//! what the request claims.

use super::{ApiError, AppState, SECRET_HEADER};
use crate::broker::command::Actor;
use crate::process::{self, ProcessStamp};
use crate::secret::hash_secret;
use crate::store::AgentRecord;
use axum::extract::FromRequestParts;
use axum::extract::connect_info::ConnectInfo;
use axum::http::{HeaderMap, StatusCode, request::Parts};
use std::sync::Arc;

/// The other end of a Unix-socket connection, as the kernel reports it.
#[derive(Debug, Clone)]
pub struct PeerCredentials {
    pub uid: u32,
    /// The peer's pid when the kernel gives it (always on Linux).
    pub pid: Option<u32>,
    /// The peer and its ancestors, read when the connection was accepted (see
    /// [`process::lineage`]): a parent that exits later cannot hide that the peer was inside an
    /// agent. None when the peer was already gone or unreadable.
    pub lineage: Option<Arc<[ProcessStamp]>>,
}

impl PeerCredentials {
    /// What the kernel says of the other end of `stream`, and the peer's lineage now.
    pub fn of(stream: &tokio::net::UnixStream) -> PeerCredentials {
        match stream.peer_cred() {
            Ok(credentials) => {
                let pid = credentials.pid().and_then(|pid| u32::try_from(pid).ok());
                PeerCredentials { uid: credentials.uid(), pid, lineage: pid.and_then(process::lineage).map(Arc::from) }
            }
            // Unknown credentials prove nothing: a uid no one has.
            Err(_) => PeerCredentials { uid: u32::MAX, pid: None, lineage: None },
        }
    }

    /// Is this peer the user: a process of the broker's uid, still the very process that
    /// connected, and not below a registered agent's wrapper? A peer whose pid is gone (it
    /// connected, handed the connection to a child and exited) or unreadable is not.
    fn is_the_user(&self, agents: &[AgentRecord]) -> bool {
        if self.uid != broker_uid() {
            return false;
        }
        let Some(lineage) = &self.lineage else { return false };
        let Some(peer) = lineage.first() else { return false };
        if !peer.is_running() {
            return false;
        }
        // The wrapper itself (lineage[0]) was started by the user; what runs below it is the
        // agent's.
        let inside_an_agent = lineage[1..]
            .iter()
            .any(|stamp| agents.iter().any(|agent| agent.wrapper && stamp.is(agent.pid, agent.pid_start)));
        !inside_an_agent
    }
}

/// The broker's effective uid.
pub fn broker_uid() -> u32 {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe {
        libc::geteuid()
    }
}

/// The caller of a request (see the module documentation for the rule).
#[derive(Debug, Clone)]
pub enum Caller {
    User,
    Agent(Box<AgentRecord>),
    Anonymous,
}

impl Caller {
    /// Who acts, for decisions in the writer.
    pub fn actor(&self) -> Actor {
        match self {
            Caller::User => Actor::User,
            Caller::Agent(agent) => Actor::Agent(agent.agent_id.clone()),
            Caller::Anonymous => Actor::Anonymous,
        }
    }

    pub fn is_user(&self) -> bool {
        matches!(self, Caller::User)
    }

    /// May this caller act as `agent_id`? The user may act for any agent; an agent only for
    /// itself.
    pub fn may_act_as(&self, agent_id: &str) -> bool {
        match self {
            Caller::User => true,
            Caller::Agent(agent) => agent.agent_id == agent_id,
            Caller::Anonymous => false,
        }
    }

    /// Refuses with 403 unless the caller may act as `agent_id`.
    pub fn require_act_as(&self, agent_id: &str, what: &str) -> Result<(), ApiError> {
        if self.may_act_as(agent_id) {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            match self {
                Caller::Agent(agent) => {
                    format!("{} may not {what} as {agent_id}: an agent acts only as itself", agent.agent_id)
                }
                _ => format!(
                    "to {what} as {agent_id}, run the command inside that agent (its secret in {SECRET_HEADER}), or as the user (the CLI over the broker's Unix socket, or the admin key)"
                ),
            },
        ))
    }
}

/// Does the request carry the admin key? Only when auth is on (there is no key otherwise).
pub fn has_admin_key(state: &AppState, headers: &HeaderMap) -> bool {
    state.auth.enabled && super::keys::presented_key(headers).is_some_and(|key| state.auth.accepts(key))
}

/// The peer credentials of a Unix-socket request (None over TCP).
pub fn peer_of(parts: &Parts) -> Option<PeerCredentials> {
    parts.extensions.get::<ConnectInfo<PeerCredentials>>().map(|ConnectInfo(peer)| peer.clone())
}

/// Is this the dashboard in the user's browser: over loopback TCP from a socket of the broker's
/// uid, from the page the broker serves (its own `Origin`, which a browser sets and no page of
/// another origin can), showing the page key (`synapse dashboard` put it in the page's address)?
/// The origin alone is not enough: a page another user served on the broker's port while the
/// broker was stopped is at that origin too, and its script goes on running in the user's
/// browser once the broker has the port. A process of the user could send all of this by hand;
/// it could just as well use the Unix socket as the user.
fn is_the_users_browser(state: &AppState, parts: &Parts) -> bool {
    let Some(socket) = parts.extensions.get::<process::TcpSocket>() else { return false };
    if !state.auth.page.key_is_shown_in(&parts.headers) {
        return false;
    }
    let broker_port = state.port.load(std::sync::atomic::Ordering::Relaxed);
    let own_origin = parts
        .headers
        .get(axum::http::header::ORIGIN)
        .and_then(|origin| origin.to_str().ok())
        .is_some_and(|origin| super::origin::is_broker_origin(origin, broker_port));
    if !(socket.uid == broker_uid() && own_origin) {
        return false;
    }
    // The same rule as on the Unix socket: a process inside an agent (below a wrapper) is not
    // the user, whatever Origin it writes. The process holding the caller's socket, and its
    // ancestors, are read from /proc (only for requests that claim the broker's own Origin).
    let Some(pid) = process::socket_holder(socket.inode) else { return false };
    let credentials =
        PeerCredentials { uid: broker_uid(), pid: Some(pid), lineage: process::lineage(pid).map(Arc::from) };
    state.store.read(|view| view.agents()).is_ok_and(|agents| credentials.is_the_user(&agents))
}

/// Determines the caller of a request.
pub fn caller_of(state: &AppState, parts: &Parts) -> Result<Caller, ApiError> {
    if let Some(value) = parts.headers.get(SECRET_HEADER) {
        let Ok(secret) = value.to_str() else { return Ok(Caller::Anonymous) };
        let digest = hash_secret(secret);
        let agents = state.store.read(|view| view.agents())?;
        // A stale or wrong secret makes the caller anonymous, never the user.
        return Ok(
            match agents
                .into_iter()
                .find(|agent| crate::secret::constant_time_eq(agent.secret_hash.as_bytes(), digest.as_bytes()))
            {
                Some(agent) => Caller::Agent(Box::new(agent)),
                None => Caller::Anonymous,
            },
        );
    }
    if has_admin_key(state, &parts.headers) {
        return Ok(Caller::User);
    }
    if is_the_users_browser(state, parts) {
        return Ok(Caller::User);
    }
    if let Some(peer) = peer_of(parts)
        && peer.uid == broker_uid()
    {
        // A process inside an agent (below a wrapper that registered itself) that left its
        // secret out is not the user: it gets no more rights than it had with the secret.
        // Registrations made for another process (a test, `agent register --pid`) are not
        // wrappers and do not count.
        let agents = state.store.read(|view| view.agents())?;
        return Ok(if peer.is_the_user(&agents) { Caller::User } else { Caller::Anonymous });
    }
    Ok(Caller::Anonymous)
}

/// Is the connection known to be the user's own: the Unix socket (in the user's private
/// directory), or loopback TCP from a socket of the user's? Another user, a caller whose socket
/// was not found, and one from another machine are not.
pub fn the_users_connection(extensions: &axum::http::Extensions) -> bool {
    match extensions.get::<crate::process::TcpSocket>() {
        Some(socket) => socket.uid == crate::private_files::my_uid(),
        None => extensions.get::<ConnectInfo<std::net::SocketAddr>>().is_none(),
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        caller_of(state, parts)
    }
}

/// The user, or a refusal: the extractor of the broker's control routes (stop the broker,
/// rebuild or clean up the log, webhooks, external agents). An agent, a process inside one, or
/// a caller over TCP without the admin key gets a 403 that says what is needed.
#[derive(Debug, Clone, Copy)]
pub struct TheUser;

impl FromRequestParts<AppState> for TheUser {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        // A browser (the dashboard page, or any script that runs at the broker's origin) sends,
        // reads and cancels as the user, and no more: stopping the broker, the log's admin,
        // webhooks and external agents stay with the CLI and the admin key.
        if parts.headers.contains_key(axum::http::header::ORIGIN) && !has_admin_key(state, &parts.headers) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "{} {} is not for a web page: run the synapse CLI from a plain shell, or send the admin key (X-API-Key)",
                    parts.method,
                    parts.uri.path()
                ),
            ));
        }
        let caller = caller_of(state, parts)?;
        if caller.is_user() {
            return Ok(TheUser);
        }
        let who = match &caller {
            Caller::Agent(agent) => format!("agent {}", agent.agent_id),
            _ => "an anonymous caller".to_string(),
        };
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} {} is for the user only, not for {who}: run the synapse CLI from a plain shell (the broker's Unix socket, outside any agent), or send the admin key (X-API-Key)",
                parts.method,
                parts.uri.path()
            ),
        ))
    }
}

/// How a registration proved its pid, for [`super::agent_endpoints::register`].
#[derive(Debug, Clone, Copy)]
pub struct RegistrationProof {
    /// The request carries the admin key: any live process may be registered.
    pub admin_key: bool,
    /// The pid of the peer, over the Unix socket with the broker's uid.
    pub peer: Option<u32>,
    /// The caller is the user (see [`caller_of`]): only the user takes back a departed
    /// agent's queue.
    pub by_user: bool,
}

impl FromRequestParts<AppState> for RegistrationProof {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let admin_key = has_admin_key(state, &parts.headers);
        let peer = peer_of(parts).filter(|peer| peer.uid == broker_uid()).and_then(|peer| peer.pid);
        let by_user = caller_of(state, parts)?.is_user();
        if admin_key || peer.is_some() {
            return Ok(RegistrationProof { admin_key, peer, by_user });
        }
        match peer_of(parts) {
            Some(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "only the broker's own user may register agents over its Unix socket",
            )),
            None => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "agents register over the broker's Unix socket (which proves the process), or with the admin key; a TCP request without it cannot prove which process it is",
            )),
        }
    }
}
