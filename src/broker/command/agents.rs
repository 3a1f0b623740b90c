//! Agents joining and leaving: registration (ids, ports, names, taking a departed agent's
//! queue back), status, deregistration, delivery acknowledgements, and expiring held queues.

use super::decision::{Answer, CommandError, Context, DecideError, Decision};
use super::requests::RegisterRequest;
use super::send::back_to_the_asker;
use crate::event::{AgentStatus, Delivery, Event, TaskState};
use crate::store::{CANCELED_UNWRITTEN_MS, DepartedAgent, Projections, StoreError, TicketKind};

pub fn agent_id_for(agent_type: &str, port: u16) -> String {
    format!("synapse-{agent_type}-{port}")
}

fn is_valid_agent_type(agent_type: &str) -> bool {
    !agent_type.is_empty()
        && agent_type.len() <= 32
        && agent_type.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Does `agent_id` still hold a departed agent's queue? Then it is that agent's until it is
/// started again with the same name, or the queue expires.
fn held_queue(view: &Projections<'_>, agent_id: &str) -> Result<Option<(DepartedAgent, usize)>, StoreError> {
    let Some(departed) = view.departed(agent_id)? else { return Ok(None) };
    let pending = view.pending_for(agent_id)?;
    Ok((pending > 0).then_some((departed, pending)))
}

/// The id an agent registering takes back: the id a departed agent of the same name and type
/// left with messages queued; without a name, that of a departed agent without one on the same
/// port (the id is made of the type and the port). An unnamed agent's queue could not be taken
/// back at all: starting it again on its port was refused for the queue, which then waited a
/// day to expire.
fn reclaimable_id(view: &Projections<'_>, request: &RegisterRequest) -> Result<Option<String>, StoreError> {
    let Some(name) = &request.name else {
        let agent_id = agent_id_for(&request.agent_type, request.port);
        let unnamed = held_queue(view, &agent_id)?.is_some_and(|(departed, _)| departed.name.is_none());
        return Ok(unnamed.then_some(agent_id));
    };
    for departed in view.departed_agents()? {
        if departed.name.as_ref() == Some(name)
            && departed.agent_type == request.agent_type
            && view.pending_for(&departed.agent_id)? > 0
        {
            return Ok(Some(departed.agent_id));
        }
    }
    Ok(None)
}

/// Drops the queues nobody took back in time: the tasks still waiting on them fail with a
/// visible reason (the sender's task too), then `inbox_expired` empties the inbox.
pub fn decide_expire_inboxes(view: &Projections<'_>, hold_ms: u64, now_ms: u64) -> Result<Decision, DecideError> {
    let mut expiring = Vec::new();
    for departed in view.departed_agents()? {
        if now_ms >= departed.departed_ms.saturating_add(hold_ms) && view.pending_for(&departed.agent_id)? > 0 {
            expiring.push(departed);
        }
    }
    let mut events = Vec::new();
    for departed in &expiring {
        let tickets = view.inbox(&departed.agent_id, usize::MAX)?;
        let reason = format!(
            "{}{} left with this message queued and was not started again (same --name) within {} s; the message was dropped",
            departed.agent_id,
            departed.name.as_ref().map(|name| format!(" ({name})")).unwrap_or_default(),
            hold_ms / 1000
        );
        // The messages queued and the requests received but not answered: each task once.
        let mut waiting: Vec<String> = tickets
            .iter()
            .filter(|ticket| ticket.kind == TicketKind::Message)
            .map(|ticket| ticket.task_id.clone())
            .collect();
        for target in view.reply_targets(&departed.agent_id)? {
            if !waiting.contains(&target.receiver_task_id) {
                waiting.push(target.receiver_task_id);
            }
        }
        for task_id in waiting {
            let Some(task) = view.task(&task_id)? else { continue };
            if task.state.is_final() {
                continue;
            }
            let failed = |task_id: &str| Event::TaskStateChanged {
                task_id: task_id.to_string(),
                state: TaskState::Failed,
                artifacts: Vec::new(),
                error: Some(reason.clone()),
                reply_of: None,
                as_message: false,
            };
            if let Some(sender_task) = view.open_outgoing_of(&task)?
                && !sender_task.state.is_final()
            {
                events.push(failed(&sender_task.id));
                // The asker learns it in its terminal, unless its own queue expires now too (this
                // queue's agent, or another one gone as long: its queue and its place are given
                // up in this same decision, and the ticket would wait under an id nobody holds).
                let asker_expires = |asker: &str| expiring.iter().any(|gone| gone.agent_id == asker);
                if !sender_task.owner.as_deref().is_some_and(asker_expires)
                    && let Ok(Some(ticket)) = back_to_the_asker(view, &sender_task, &departed.agent_id, 0)?
                {
                    events.push(ticket);
                }
            }
            events.push(failed(&task.id));
        }
        events.push(Event::InboxExpired {
            agent_id: departed.agent_id.clone(),
            reason,
            tickets: u64::try_from(tickets.len()).unwrap_or(u64::MAX),
        });
    }
    Ok(Decision { actor: None, events, answer: Answer::Appended })
}

/// Longest role an agent may register with.
const MAX_ROLE_CHARS: usize = 1000;
/// Longest working directory an agent may register with (Linux's `PATH_MAX`).
const MAX_WORKING_DIR_BYTES: usize = 4096;

pub fn decide_register(
    view: &Projections<'_>,
    request: &RegisterRequest,
    context: &Context<'_>,
) -> Result<Decision, DecideError> {
    if !is_valid_agent_type(&request.agent_type) {
        return Err(CommandError::bad(format!(
            "Invalid agent type '{}': use lowercase letters, digits and '_' (at most 32)",
            request.agent_type
        ))
        .into());
    }
    if request.port == 0 {
        return Err(CommandError::bad("Invalid port 0").into());
    }
    if let Some(name) = &request.name
        && (name.trim().is_empty()
            || name.len() > 64
            || name
                .chars()
                .any(|c| c.is_whitespace() || crate::escape::is_control(c) || crate::escape::is_invisible_format(c)))
    {
        return Err(CommandError::bad(format!(
            "Invalid name '{}': 1 to 64 bytes of UTF-8, no spaces, control or invisible formatting characters",
            crate::escape::visible_line(name)
        ))
        .into());
    }
    // Kept in every registration event and shown in lists: bounded (a 16 MiB body fitted).
    if request.role.as_ref().is_some_and(|role| role.chars().count() > MAX_ROLE_CHARS) {
        return Err(CommandError::bad(format!("Invalid role: at most {MAX_ROLE_CHARS} characters")).into());
    }
    // Shown in `synapse list` and on the dashboard, and given to the agent: one line of text.
    if let Some(role) = &request.role
        && role.chars().any(|c| crate::escape::is_control(c) || crate::escape::is_invisible_format(c))
    {
        return Err(CommandError::bad(format!(
            "Invalid role '{}': no control or invisible formatting characters",
            crate::escape::visible_line(role)
        ))
        .into());
    }
    if request.working_dir.len() > MAX_WORKING_DIR_BYTES {
        return Err(
            CommandError::bad(format!("Invalid working directory: at most {MAX_WORKING_DIR_BYTES} bytes")).into()
        );
    }
    if let Some(name) = &request.name
        && name.starts_with("synapse-")
    {
        return Err(CommandError::bad(format!(
            "Invalid name '{name}': names may not start with 'synapse-' (agent ids do)"
        ))
        .into());
    }
    // The inbox belongs to the agent: the same name takes its departed id (and its queue) back,
    // even on another port; no other agent gets an id that still holds someone's queue.
    let reclaimed = reclaimable_id(view, request)?;
    let resumes = reclaimed.is_some();
    let agent_id = match reclaimed {
        // Taking a queue back gives its messages (other agents' words) to the caller: only the
        // user, never a process inside another agent.
        Some(agent_id) if !request.by_user => {
            let again = match &request.name {
                Some(name) => format!("with --name {name}"),
                None => format!("on port {}", request.port),
            };
            return Err(CommandError::forbidden(format!(
                "{agent_id} left with messages queued; only the user takes them back: start the agent again {again} from a plain shell (not inside another agent), or register with the admin key"
            ))
            .into());
        }
        Some(agent_id) => agent_id,
        None => {
            let agent_id = agent_id_for(&request.agent_type, request.port);
            if let Some((departed, pending)) = held_queue(view, &agent_id)? {
                return Err(CommandError::conflict(format!(
                    "port {}: its id {agent_id} holds {pending} pending message(s) of {} which left (queued, or received and not answered); they wait for it to start again{} or expire",
                    request.port,
                    departed.name.as_deref().unwrap_or(agent_id.as_str()),
                    departed.name.as_ref().map(|name| format!(" with --name {name}")).unwrap_or_default(),
                ))
                .into());
            }
            agent_id
        }
    };
    let mut events = Vec::new();
    let agents = view.agents()?;
    for other in &agents {
        let alive = context.liveness.is_alive(other.pid);
        let same_slot = other.agent_id == agent_id || other.port == request.port;
        let same_name = request.name.is_some() && other.name == request.name;
        if !(same_slot || same_name) {
            continue;
        }
        if alive && other.pid != request.pid {
            let what = if same_slot {
                format!("port {}", request.port)
            } else {
                format!("name '{}'", other.name.as_deref().unwrap_or_default())
            };
            return Err(CommandError::conflict(format!(
                "{what} is taken by agent {} (pid {})",
                other.agent_id, other.pid
            ))
            .into());
        }
        let reason = if alive { "re-registered" } else { "process gone" };
        events.extend(departure(view, &other.agent_id, reason)?);
    }
    events.push(Event::AgentRegistered {
        agent_id: agent_id.clone(),
        agent_type: request.agent_type.clone(),
        name: request.name.clone(),
        role: request.role.clone(),
        pid: request.pid,
        port: request.port,
        working_dir: request.working_dir.clone(),
        secret_hash: request.secret_hash.clone(),
        pid_start: request.pid_start,
        wrapper: request.wrapper,
        resumes,
    });
    Ok(Decision { actor: Some(agent_id.clone()), events, answer: Answer::Registered { agent_id } })
}

pub fn decide_set_status(
    view: &Projections<'_>,
    agent_id: &str,
    status: AgentStatus,
    note: &Option<String>,
) -> Result<Decision, DecideError> {
    let Some(agent) = view.agent(agent_id)? else {
        return Err(CommandError::not_found(format!("Agent '{agent_id}' is not registered")).into());
    };
    let changed = agent.status != status || agent.status_note != *note;
    let events = if changed {
        vec![Event::AgentStatusChanged { agent_id: agent_id.to_string(), status, note: note.clone() }]
    } else {
        Vec::new()
    };
    Ok(Decision { actor: Some(agent_id.to_string()), events, answer: Answer::StatusSet { changed } })
}

pub fn decide_deregister(
    view: &Projections<'_>,
    agent_id: &str,
    reason: &str,
    registration: Option<(u32, Option<u64>)>,
) -> Result<Decision, DecideError> {
    let not_registered = || CommandError::not_found(format!("Agent '{agent_id}' is not registered"));
    let Some(agent) = view.agent(agent_id)? else {
        return Err(not_registered().into());
    };
    // Decided on an older read: the id was taken since by another process (an agent started
    // again on the same port or name while the sweeper worked through the dead ones).
    if registration.is_some_and(|meant| meant != (agent.pid, agent.pid_start)) {
        return Err(not_registered().into());
    }
    Ok(Decision {
        actor: Some(agent_id.to_string()),
        events: departure(view, agent_id, reason)?,
        answer: Answer::Deregistered,
    })
}

/// An agent leaving: its file locks are released first (SPEC §5: a lock whose holder is gone is
/// free). Left in place, they came back to life when an agent took the id again (same port or
/// name), held by an instance that knew nothing of them. Its inbox and reply targets stay, for
/// that agent to take back.
fn departure(view: &Projections<'_>, agent_id: &str, reason: &str) -> Result<Vec<Event>, DecideError> {
    let mut events: Vec<Event> = view
        .locks()?
        .into_iter()
        .filter(|lock| lock.agent_id == agent_id)
        .map(|lock| Event::FileLockReleased { path: lock.path, agent_id: lock.agent_id, forced: true })
        .collect();
    events.push(Event::AgentDeregistered { agent_id: agent_id.to_string(), reason: reason.to_string() });
    Ok(events)
}

/// The wrapper wrote ticket `ticket` into the agent's terminal: it leaves the inbox, the agent
/// is processing, and the task it carried is being worked on.
pub fn decide_ack_injection(
    view: &Projections<'_>,
    agent_id: &str,
    ticket: u64,
    how: Option<Delivery>,
    now_ms: u64,
) -> Result<Decision, DecideError> {
    let mut found = None;
    for priority in (1..=5).rev() {
        if let Some(entry) = view.ticket(agent_id, priority, ticket)? {
            found = Some(entry);
            break;
        }
    }
    let Some(entry) = found else {
        if let Some(decision) = canceled_on_its_way(view, agent_id, ticket, how, now_ms)? {
            return Ok(decision);
        }
        return Err(CommandError::not_found(format!(
            "Ticket {ticket} is not in {agent_id}'s inbox (already delivered?)"
        ))
        .into());
    };
    let mut events =
        vec![Event::TicketInjected { agent_id: agent_id.to_string(), ticket, priority: entry.priority, how }];
    // A ticket just written means the CLI is working on it (one not written, not).
    if how != Some(Delivery::Unwritten)
        && let Some(agent) = view.agent(agent_id)?
        && agent.status != AgentStatus::Processing
    {
        events.push(Event::AgentStatusChanged {
            agent_id: agent_id.to_string(),
            status: AgentStatus::Processing,
            note: None,
        });
    }
    // Written into the CLI, a message is being worked on; a one-way message (no reply expected)
    // is done: nothing more will happen to its task, and it must not stay `working` for ever.
    if entry.kind == TicketKind::Message
        && let Some(task) = view.task(&entry.task_id)?
        && task.state == TaskState::Submitted
    {
        events.push(Event::TaskStateChanged {
            task_id: task.id,
            state: if task.response_expected { TaskState::Working } else { TaskState::Completed },
            artifacts: Vec::new(),
            error: None,
            reply_of: None,
            as_message: false,
        });
    }
    Ok(Decision { actor: Some(agent_id.to_string()), events, answer: Answer::Injected { ticket } })
}

/// The acknowledgement of a message whose task was canceled on its way (after the wrapper took
/// it from the inbox to write, or a hook to hand over, before this acknowledgement): the CLI has
/// it and works on it, and nothing else will tell it to stop. It is told now, as a cancel tells
/// a CLI working on the task (`decide_cancel_task`): interrupted first (priority 5) when the
/// message began its work, else at priority 3. Not when it was not written into this CLI, nor
/// when the agent canceled it itself. None when the ticket was not one of those, or was canceled
/// more than [`CANCELED_UNWRITTEN_MS`] ago.
///
/// That the wrapper took the ticket before the cancel is its word, not checked: an agent's
/// own secret could acknowledge one it never took and be told (interrupted) for nothing. It
/// reaches only that agent's own record and inbox, as acknowledging any of its queued tickets
/// unwritten always could.
fn canceled_on_its_way(
    view: &Projections<'_>,
    agent_id: &str,
    ticket: u64,
    how: Option<Delivery>,
    now_ms: u64,
) -> Result<Option<Decision>, DecideError> {
    let Some(agent) = view.agent(agent_id)? else { return Ok(None) };
    let Some(canceled) = agent.canceled_unwritten.iter().find(|canceled| {
        canceled.ticket == ticket && canceled.canceled_ms.saturating_add(CANCELED_UNWRITTEN_MS) >= now_ms
    }) else {
        return Ok(None);
    };
    let mut events =
        vec![Event::TicketInjected { agent_id: agent_id.to_string(), ticket, priority: canceled.priority, how }];
    // As for any acknowledgement: one not written leaves the CLI as it was.
    if how != Some(Delivery::Unwritten) && agent.status != AgentStatus::Processing {
        events.push(Event::AgentStatusChanged {
            agent_id: agent_id.to_string(),
            status: AgentStatus::Processing,
            note: None,
        });
    }
    if how != Some(Delivery::Unwritten) && canceled.by != agent_id {
        let now = crate::store::begins_work(how, agent.status, canceled.response_expected, canceled.priority);
        events.push(Event::ReverseTicketIssued {
            agent_id: agent_id.to_string(),
            task_id: canceled.task_id.clone(),
            from: canceled.by.clone(),
            priority: if now { 5 } else { 3 },
        });
    }
    Ok(Some(Decision { actor: Some(agent_id.to_string()), events, answer: Answer::Injected { ticket } }))
}
