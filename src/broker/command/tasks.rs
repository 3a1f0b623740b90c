//! Tasks moved by hand: created ahead of a send, canceled, or updated by their receiver.

use super::checks::{check_sender, find_task, new_id, validate_text};
use super::decision::{Answer, CommandError, DecideError, Decision};
use super::requests::{Actor, UpdateTaskRequest, default_priority};
use super::send::back_to_the_asker;
use crate::event::{AgentStatus, Direction, Event, Message, TaskState, short_id};
use crate::store::{Projections, TaskRecord};

/// The agent that sent the message a task records (None: anonymous).
fn task_sender(task: &TaskRecord) -> Option<&str> {
    match task.direction {
        Direction::Incoming => task.peer.as_deref(),
        Direction::Outgoing => task.owner.as_deref(),
    }
}

/// The agent that received the message a task records.
fn task_receiver(task: &TaskRecord) -> Option<&str> {
    match task.direction {
        Direction::Incoming => task.owner.as_deref(),
        Direction::Outgoing => task.peer.as_deref(),
    }
}

/// Cancel rights: the user; the task's sender or receiver; anyone when the sender was
/// anonymous (an anonymous sender has nothing to prove itself with) — unless that sender was
/// the user, whose sends only the user (and the receiver) cancel.
/// `sent_by_user`: the message was the user's (recorded on the receiver's task, so the caller
/// looks it up for a sender's task).
fn may_cancel(task: &TaskRecord, sent_by_user: bool, actor: &Actor) -> bool {
    match actor {
        Actor::User => true,
        Actor::Agent(agent) => task_sender(task) == Some(agent.as_str()) || task_receiver(task) == Some(agent.as_str()),
        Actor::Anonymous => task_sender(task).is_none() && !sent_by_user,
    }
}

/// Refuses (403) an `actor` that may not cancel `task` (see [`may_cancel`]): its cancel, and
/// the push notification configs that follow it (A2A), are its parties' business. `by_user`:
/// [`sent_by_user_with`]; `what` says what is refused ("may be canceled").
pub fn check_party(task: &TaskRecord, by_user: bool, actor: &Actor, what: &str) -> Result<(), CommandError> {
    if may_cancel(task, by_user, actor) {
        return Ok(());
    }
    let sender = if by_user { "the user" } else { task_sender(task).unwrap_or("anonymous") };
    Err(CommandError::forbidden(format!(
        "task {} {what} only by its sender ({sender}), its receiver ({}) or the user",
        short_id(&task.id),
        task_receiver(task).unwrap_or("anonymous"),
    )))
}

/// Was the message of `task` sent by the user? The flag is on the receiver's task (and on the
/// task of a message to an external agent); the sender's task of an agent's message has it
/// on its peer.
fn sent_by_user(view: &Projections<'_>, task: &TaskRecord) -> Result<bool, DecideError> {
    sent_by_user_with(task, |peer| find_task(view, peer))
}

/// [`sent_by_user`] through any reader of the tasks: `find` looks up a task by its id.
pub fn sent_by_user_with<E>(
    task: &TaskRecord,
    find: impl FnOnce(&str) -> Result<Option<TaskRecord>, E>,
) -> Result<bool, E> {
    if task.sent_by_user {
        return Ok(true);
    }
    if task.direction != Direction::Outgoing || task.owner.is_some() {
        return Ok(false);
    }
    let Some(peer) = &task.peer_task_id else { return Ok(false) };
    Ok(find(peer)?.is_some_and(|receiver| receiver.sent_by_user))
}

/// An agent moves a task it received: its own task and the sender's task waiting on it change
/// together (all or nothing). Final tasks never change again; cancel has its own command.
pub fn decide_update_task(view: &Projections<'_>, request: &UpdateTaskRequest) -> Result<Decision, DecideError> {
    check_sender(view, Some(&request.agent_id), request.secret.as_deref())?;
    let Some(task) = find_task(view, &request.task_id)? else {
        return Err(CommandError::not_found(format!("Task {} not found", request.task_id)).into());
    };
    if task.owner.as_deref() != Some(request.agent_id.as_str()) || task.direction != Direction::Incoming {
        return Err(CommandError::forbidden(format!(
            "task {} was not sent to {}; only its receiver can change it",
            short_id(&task.id),
            request.agent_id
        ))
        .into());
    }
    if matches!(request.state, TaskState::Submitted | TaskState::Canceled) {
        return Err(CommandError::bad(format!(
            "an agent cannot move a task to {} (use working, input_required, completed or failed; cancel has its own request)",
            request.state
        ))
        .into());
    }
    if request.as_message && request.state != TaskState::Completed {
        return Err(CommandError::bad(format!(
            "an answer given as a message completes the task (state completed, not {})",
            request.state
        ))
        .into());
    }
    if task.state.is_final() {
        return Err(CommandError::conflict(format!(
            "task {} is already {}; nothing changed",
            short_id(&task.id),
            task.state
        ))
        .into());
    }
    let change = |task_id: &str| Event::TaskStateChanged {
        task_id: task_id.to_string(),
        state: request.state,
        artifacts: request.artifacts.clone(),
        error: request.error.clone(),
        reply_of: None,
        as_message: request.as_message,
    };
    let mut events = vec![change(&task.id)];
    if let Some(sender_task) = view.open_outgoing_of(&task)?
        && !sender_task.state.is_final()
    {
        events.push(change(&sender_task.id));
        // An agent that asked gets the end of its request in its terminal, as it gets a reply:
        // the result of a receiver that answers by updating its task (an A2A agent), or why the
        // request failed (its message could not be written, the receiver gave up). An asker
        // that cannot get it any more finds it in the task.
        if request.state.is_final()
            && let Ok(Some(ticket)) = back_to_the_asker(view, &sender_task, &request.agent_id, 0)?
        {
            events.push(ticket);
        }
    }
    Ok(Decision { actor: Some(request.agent_id.clone()), events, answer: Answer::Task { task_id: task.id } })
}

pub fn decide_create_task(
    view: &Projections<'_>,
    owner: &str,
    secret: Option<&str>,
    message: &Message,
    peer: &Option<String>,
) -> Result<Decision, DecideError> {
    check_sender(view, Some(owner), secret)?;
    validate_text(&message.joined_text())?;
    let task_id = new_id();
    Ok(Decision {
        actor: Some(owner.to_string()),
        events: vec![Event::TaskCreated {
            task_id: task_id.clone(),
            owner: Some(owner.to_string()),
            context_id: new_id(),
            direction: Direction::Outgoing,
            peer: peer.clone(),
            state: TaskState::Working,
            message: message.clone(),
            priority: default_priority(),
            response_expected: true,
            sender_task_id: None,
            in_reply_to: None,
            peer_task_id: None,
            message_in: None,
        }],
        answer: Answer::Task { task_id },
    })
}

pub fn decide_cancel_task(
    view: &Projections<'_>,
    task_id: &str,
    reason: &Option<String>,
    actor: &Actor,
) -> Result<Decision, DecideError> {
    let Some(task) = find_task(view, task_id)? else {
        return Err(CommandError::not_found(format!("Task {task_id} not found")).into());
    };
    check_party(&task, sent_by_user(view, &task)?, actor, "may be canceled")?;
    if !matches!(task.state, TaskState::Submitted | TaskState::Working | TaskState::InputRequired) {
        return Err(
            CommandError::bad(format!("Task {} is {} and cannot be canceled", short_id(&task.id), task.state)).into()
        );
    }
    // Who canceled, when no reason is given: what the other side and the asker are told.
    let reason = reason.clone().or_else(|| match actor {
        Actor::User => Some("canceled by the user".into()),
        Actor::Agent(agent) => Some(format!("canceled by {agent}")),
        Actor::Anonymous => Some("canceled by an A2A client".into()),
    });
    // Who canceled, as a cancel notice names them.
    let who = match actor {
        Actor::User => "user",
        Actor::Agent(agent) => agent.as_str(),
        Actor::Anonymous => "anonymous",
    };
    let by = Some(who.to_string());
    // The other side of the exchange ends with it: the receiver's task of a canceled message (so
    // its queued ticket is never written), the sender's task of a canceled receiver's task (so a
    // `send --wait` returns at once). Only a side still open: one that ended stays as it ended.
    let mut events = vec![Event::TaskCanceled { task_id: task.id.clone(), reason: reason.clone(), by: by.clone() }];
    let mut canceled = vec![task.clone()];
    for linked in [&task.peer_task_id, &task.sender_task_id].into_iter().flatten() {
        if let Some(other) = find_task(view, linked)?
            && other.id != task.id
            && matches!(other.state, TaskState::Submitted | TaskState::Working | TaskState::InputRequired)
        {
            let why = reason.clone().unwrap_or_else(|| "canceled".into());
            events.push(Event::TaskCanceled {
                task_id: other.id.clone(),
                reason: Some(format!("{why} (the other side, task {}, was canceled)", short_id(&task.id))),
                by: by.clone(),
            });
            canceled.push(other);
        }
    }
    // An agent working on a task someone else canceled is told (`[A2A:<id8>:<who>:CANCELED]`),
    // and interrupted first when its CLI works on that task now (SPEC §3): a priority-5 notice
    // interrupts a busy CLI as any priority-5 message does. Now means: the agent is PROCESSING
    // (or WAITING on a dialog, which is never interrupted: the notice waits for it to close)
    // and the last message written into its CLI that began its work is this task's (see
    // `AgentRecord::last_written`: a message written since says the CLI moved on). Otherwise
    // the notice comes at priority 3, at the prompt (or through a hook), and cuts nothing
    // short. Only a task written into this run of the agent: not into a CLI before a restart,
    // nor an agent that took the id since. A task still queued leaves the inbox; if its wrapper
    // was writing it, it is told when it acknowledges it (`decide_ack_injection`).
    for working in
        canceled.iter().filter(|task| task.direction == Direction::Incoming && task.state == TaskState::Working)
    {
        let Some(worker) = working.owner.as_deref() else { continue };
        if *actor == Actor::Agent(worker.to_string()) {
            continue;
        }
        let Some(agent) = view.agent(worker)?.filter(|agent| working.updated_ms >= agent.registered_ms) else {
            continue;
        };
        let works_on_it_now = matches!(agent.status, AgentStatus::Processing | AgentStatus::Waiting)
            && agent.last_written.as_deref() == Some(working.id.as_str());
        events.push(Event::ReverseTicketIssued {
            agent_id: worker.to_string(),
            task_id: working.id.clone(),
            from: who.to_string(),
            priority: if works_on_it_now { 5 } else { 3 },
        });
    }
    // An agent whose request someone else canceled (its receiver, the user) learns it in its
    // terminal, as it would get the reply; after the cancellations, which take a task's tickets
    // away.
    let asked = match task.direction {
        Direction::Outgoing => Some(task.clone()),
        Direction::Incoming => match &task.sender_task_id {
            Some(id) => find_task(view, id)?.filter(|asked| !asked.state.is_final()),
            None => None,
        },
    };
    if let Some(asked) = asked
        && let Some(asker) = asked.owner.as_deref()
        && *actor != Actor::Agent(asker.to_string())
        && let Some(receiver) = task_receiver(&asked)
        && let Ok(Some(ticket)) = back_to_the_asker(view, &asked, receiver, 0)?
    {
        events.push(ticket);
    }
    Ok(Decision { actor: task.owner.clone(), events, answer: Answer::Task { task_id: task.id } })
}
