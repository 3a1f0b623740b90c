//! Sending a message and replying to one: target resolution, idempotent retries, the tasks,
//! events and tickets of an exchange.

use super::checks::{agent_id_of, check_sender, check_unverified, find_task, new_id, resolve_target, validate_text};
use super::decision::{Answer, CommandError, Context, DecideError, Decision, Liveness};
use super::requests::{ContinueRequest, IDEMPOTENCY_WINDOW_MS, ReplyRequest, SendRequest};
use crate::escape;
use crate::event::{Artifact, Direction, Event, INLINE_TEXT_MAX_BYTES, Message, Part, Role, TaskState, short_id};
use crate::store::{AgentRecord, Projections, ReplyTarget, TaskRecord, text_digest, waits_anonymously};

/// The longest idempotency key accepted.
const IDEMPOTENCY_KEY_MAX_CHARS: usize = 200;

/// Resolves a target among the registered agents whose process still runs. An exact agent id
/// is one lookup and one liveness check (the hot path of every send); names, `<type>-<port>`
/// and types scan the agents. Names may not look like agent ids, so the order of SPEC §2 holds.
///
/// A process that exited and is not yet reaped (a zombie) is gone: a message accepted for it
/// stayed `submitted` for good once the agent was pruned. A name or `<type>-<port>` of such an
/// agent says so too, rather than that no agent has it.
fn resolve_live_target(view: &Projections<'_>, liveness: &Liveness, target: &str) -> Result<AgentRecord, DecideError> {
    let gone = |agent: &AgentRecord| {
        CommandError::not_found(format!(
            "Agent '{}' is no longer running (process {} is gone); it is being removed from the list.",
            agent.agent_id, agent.pid
        ))
    };
    if let Some(agent) = view.agent(target.trim())? {
        if liveness.is_alive(agent.pid) {
            return Ok(agent);
        }
        return Err(gone(&agent).into());
    }
    let (live, dead): (Vec<AgentRecord>, Vec<AgentRecord>) =
        view.agents()?.into_iter().partition(|agent| liveness.is_alive(agent.pid));
    match resolve_target(&live, target) {
        Err(CommandError::NotFound { .. })
            if let Some(agent) = dead.iter().find(|agent| {
                agent.name.as_deref() == Some(target.trim())
                    || format!("{}-{}", agent.agent_type, agent.port) == target.trim()
            }) =>
        {
            Err(gone(agent).into())
        }
        resolved => Ok(resolved?),
    }
}

pub fn validate_priority(priority: u8) -> Result<(), CommandError> {
    if !(1..=5).contains(&priority) {
        return Err(CommandError::bad(format!("priority must be between 1 and 5 (got {priority})")));
    }
    Ok(())
}

/// The send a reply makes: to the sender `request.to` names among those waiting for
/// `request.from`'s answer (the newest request of that sender), or to the only one waiting,
/// answering the task it waits on (its own task, or else the replier's received task).
pub fn reply_as_send(view: &Projections<'_>, request: &ReplyRequest) -> Result<SendRequest, DecideError> {
    // `--from` and `--to` take a name as well as an id (or a type-port, or a type).
    let from = agent_id_of(view, &request.from)?;
    // Proved first: the answers below name the agents waiting on `from`, which are its business.
    super::checks::check_sender(view, Some(&from), request.secret.as_deref())?;
    let targets = view.reply_targets(&from)?;
    // Each waiting sender with the task id its message showed (`[A2A:<id8>:...]`).
    let pending = |targets: &[&ReplyTarget]| {
        if targets.is_empty() {
            return "none".to_string();
        }
        let shown = |target: &ReplyTarget| short_id(target.shown_task_id()).to_string();
        targets
            .iter()
            .map(|target| format!("{} (task {})", target.sender_id, shown(target)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all: Vec<&ReplyTarget> = targets.iter().collect();
    let target = match &request.to {
        Some(to) => {
            let anonymous: Vec<&ReplyTarget> =
                targets.iter().filter(|target| waits_anonymously(&target.sender_id)).collect();
            // The task id its message showed, or more of it: a message's header names its sender
            // `anonymous` when it has none, which is no id to answer.
            let by_task: Vec<&ReplyTarget> = if names_a_task(to) {
                targets
                    .iter()
                    .filter(|target| {
                        target.shown_task_id().starts_with(to.as_str())
                            || target.receiver_task_id.starts_with(to.as_str())
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let to = match (anonymous.as_slice(), by_task.as_slice()) {
                _ if targets.iter().any(|target| &target.sender_id == to) => to.clone(),
                // A sender shown as `<name>(unverified)` (or as `anonymous`) waits as an
                // anonymous one: when only one anonymous sender waits, that name is it.
                ([only], _) if names_an_anonymous_sender(to) => only.sender_id.clone(),
                (_, [only]) => only.sender_id.clone(),
                (many, _) if to == "anonymous" && !many.is_empty() => {
                    let candidates = many.iter().map(|target| target.sender_id.clone()).collect();
                    return Err(CommandError::Ambiguous {
                        message: format!(
                            "Several senders without an id wait for a reply: {}. Choose one with --to and the task id its message showed ([A2A:<id8>:anonymous:R]).",
                            pending(many)
                        ),
                        candidates,
                    }
                    .into());
                }
                _ => agent_id_of(view, to)?,
            };
            targets.iter().rev().find(|target| target.sender_id == to).ok_or_else(|| {
                CommandError::not_found(format!("No reply target from '{to}'. Pending: {}", pending(&all)))
            })?
        }
        None => match targets.as_slice() {
            [] => return Err(CommandError::not_found("No reply target. No pending messages to reply to.").into()),
            [one] => one,
            _ => {
                return Err(CommandError::Ambiguous {
                    message: format!(
                        "Several agents are waiting for a reply: {}. Choose one with --to: the sender, or the task id its message showed ([A2A:<id8>:<sender>:R]).",
                        pending(&all)
                    ),
                    candidates: targets.iter().map(|target| target.sender_id.clone()).collect(),
                }
                .into());
            }
        },
    };
    Ok(SendRequest {
        to: target.sender_id.clone(),
        from: Some(from),
        secret: request.secret.clone(),
        text: request.text.clone(),
        priority: super::requests::default_priority(),
        reply_to: Some(target.shown_task_id().to_string()),
        idempotency_key: request.idempotency_key.clone(),
        ..SendRequest::default()
    })
}

/// Does `to` name a sender without an id, as its message's header showed it: `anonymous`, or
/// `<name>(unverified)` for a name it gave without proof?
fn names_an_anonymous_sender(to: &str) -> bool {
    to == "anonymous" || to.ends_with("(unverified)")
}

/// Can `to` be (the start of) a task id, as a message's header shows it: 8 characters or more,
/// hex digits and dashes?
fn names_a_task(to: &str) -> bool {
    to.len() >= 8 && to.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The answer to a reply repeated with its idempotency key (its answer lost: the broker
/// restarting under it): the first reply's tasks, and no event. Looked up before the reply
/// targets, which the first reply emptied: the retry was refused with "No reply target", and
/// a reply sent again without the key answered the next request instead.
pub fn repeated_reply(
    view: &Projections<'_>,
    request: &ReplyRequest,
    context: &Context<'_>,
) -> Result<Option<Decision>, DecideError> {
    let Some(key) = &request.idempotency_key else { return Ok(None) };
    let from = agent_id_of(view, &request.from)?;
    super::checks::check_sender(view, Some(&from), request.secret.as_deref())?;
    let Some(first) = view.idempotent_send(Some(&from), key)? else { return Ok(None) };
    if context.now_ms.saturating_sub(first.time_ms) >= IDEMPOTENCY_WINDOW_MS {
        return Ok(None);
    }
    // The key stands for one reply: one to another sender (`--to`) is another reply, which
    // answering the first one's would swallow.
    let another_sender = match (&request.to, &first.to) {
        (Some(wanted), Some(answered)) if wanted != answered => {
            // The forms `--to` takes for the sender answered: `anonymous` (or a name shown
            // `(unverified)`) for one that waited without an id, unless another such sender
            // waits now (it would name that one); the task id its message showed.
            let another_anonymous_waits = || {
                view.reply_targets(&from).is_ok_and(|targets| {
                    targets.iter().any(|target| waits_anonymously(&target.sender_id) && target.sender_id != *answered)
                })
            };
            let anonymous =
                waits_anonymously(answered) && names_an_anonymous_sender(wanted) && !another_anonymous_waits();
            let shown = first.sender_task_id.as_deref().unwrap_or(&first.task_id);
            let by_task = names_a_task(wanted)
                && (shown.starts_with(wanted.as_str()) || first.task_id.starts_with(wanted.as_str()));
            !anonymous && !by_task && agent_id_of(view, wanted).is_ok_and(|wanted| wanted != *answered)
        }
        _ => false,
    };
    if !first.is_reply || another_sender {
        return Err(CommandError::conflict(format!(
            "the idempotency key '{}' was used within the last {} hours for {}: use a new key for a new reply",
            escape::visible_line(key),
            IDEMPOTENCY_WINDOW_MS / 3_600_000,
            if first.is_reply { "a reply to another sender" } else { "a message that was not a reply" },
        ))
        .into());
    }
    repeated_send(view, Some(&from), key, ("", &request.text), context)
}

/// The answer to a send (or follow-up) to `to` of `text` repeated with the idempotency key
/// `key` of `sender` within [`IDEMPOTENCY_WINDOW_MS`]: the first one's tasks, and no event. The
/// key used again for another text, or for another agent than the first send's, is refused:
/// answering the first send's tasks told the sender that a message nobody received was sent.
fn repeated_send(
    view: &Projections<'_>,
    sender: Option<&str>,
    key: &str,
    (to, text): (&str, &str),
    context: &Context<'_>,
) -> Result<Option<Decision>, DecideError> {
    let Some(first) = view.idempotent_send(sender, key)? else { return Ok(None) };
    if context.now_ms.saturating_sub(first.time_ms) >= IDEMPOTENCY_WINDOW_MS {
        return Ok(None);
    }
    let other_text = first.text_digest.as_ref().is_some_and(|digest| *digest != text_digest(text));
    let other_agent = match &first.to {
        Some(first_to) if !first.is_reply => names_another_agent(view, to, first_to)?,
        _ => false,
    };
    if other_text || other_agent {
        return Err(CommandError::conflict(format!(
            "the idempotency key '{}' was used within the last {} hours for {}, and a key stands for one message: use a new key for a new message",
            escape::visible_line(key),
            IDEMPOTENCY_WINDOW_MS / 3_600_000,
            if other_agent { "a message to another agent" } else { "another message" },
        ))
        .into());
    }
    Ok(Some(Decision {
        actor: sender.map(str::to_string),
        events: Vec::new(),
        answer: Answer::Sent {
            task_id: first.task_id,
            sender_task_id: first.sender_task_id,
            is_reply: first.is_reply,
            warning: None,
        },
    }))
}

/// Does `to` (an agent id, a name, a type-port or a type, as a send names its target) name a
/// registered agent other than `first_to`? A target that names none (the agent has gone since)
/// or several cannot tell: only the text is compared then.
fn names_another_agent(view: &Projections<'_>, to: &str, first_to: &str) -> Result<bool, DecideError> {
    let to = to.trim();
    if to == first_to {
        return Ok(false);
    }
    if let Some(agent) = view.agent(to)? {
        return Ok(agent.agent_id != first_to);
    }
    Ok(resolve_target(&view.agents()?, to).is_ok_and(|agent| agent.agent_id != first_to))
}

pub fn decide_send(
    view: &Projections<'_>,
    request: &SendRequest,
    context: &Context<'_>,
) -> Result<Decision, DecideError> {
    validate_text(&request.text)?;
    validate_priority(request.priority)?;
    let sender = check_sender(view, request.from.as_deref(), request.secret.as_deref())?;
    let sender_id = sender.as_ref().map(|agent| agent.agent_id.clone());
    // A sender that names itself without proof is shown as such; it stays anonymous.
    let unverified = match &request.unverified_sender {
        Some(claimed) => Some(check_unverified(view, request.from.as_deref(), claimed)?),
        None => None,
    };

    // A retry of a send whose answer was lost: the first send's tasks, nothing new. Decided
    // here, in the writer, so two retries in one batch are decided once.
    if let Some(key) = &request.idempotency_key {
        if key.is_empty() || key.chars().count() > IDEMPOTENCY_KEY_MAX_CHARS || key.chars().any(char::is_control) {
            return Err(CommandError::bad(format!(
                "an idempotency key must be 1-{IDEMPOTENCY_KEY_MAX_CHARS} characters without control characters"
            ))
            .into());
        }
        if let Some(decision) = repeated_send(view, sender_id.as_deref(), key, (&request.to, &request.text), context)? {
            return Ok(decision);
        }
    }

    // A reply is decided by the task it answers: its sender may be anonymous or gone, and the
    // reply still completes the task (the reverse ticket waits in the sender's inbox).
    let mut warning = None;
    if let Some(reference) = &request.reply_to {
        match find_task(view, reference)? {
            Some(task) => {
                if let Some(decision) = decide_reply(view, request, sender_id.as_deref(), task)? {
                    return Ok(decision);
                }
                warning =
                    Some(format!("Warning: --reply-to {reference} does not expect a reply, sending as a new message"));
            }
            None => {
                warning = Some(format!("Warning: --reply-to {reference} not found (404), retrying as new message"));
            }
        }
    }

    let target = resolve_live_target(view, context.liveness, &request.to)?;
    if sender_id.as_deref() == Some(target.agent_id.as_str()) {
        return Err(CommandError::bad(format!("cannot send a message to yourself ({})", target.agent_id)).into());
    }

    let task_id = new_id();
    let existing_sender_task = match &request.sender_task_id {
        Some(reference) => {
            let task = find_task(view, reference)?
                .ok_or_else(|| CommandError::not_found(format!("Sender task {reference} not found")))?;
            if task.direction != Direction::Outgoing
                || task.owner != sender_id
                || task.state.is_final()
                || task.peer_task_id.is_some()
            {
                return Err(CommandError::bad(format!(
                    "Sender task {} is not an open task of {} waiting for a reply",
                    short_id(&task.id),
                    sender_id.as_deref().unwrap_or("this sender")
                ))
                .into());
            }
            Some(task.id)
        }
        None => None,
    };
    let response_expected = request.response_expected || existing_sender_task.is_some();
    let sender_task_id = existing_sender_task.clone().or_else(|| response_expected.then(new_id));
    let context_id = request.context_id.clone().unwrap_or_else(new_id);
    // A long text is stored once, in the `message_sent` event; both tasks refer to it.
    let is_long = request.text.len() > INLINE_TEXT_MAX_BYTES;
    let (mut message, message_in) = if is_long {
        (Message { role: Role::User, parts: Vec::new(), message_id: None }, Some(task_id.clone()))
    } else {
        (Message::text(Role::User, request.text.clone()), None)
    };
    message.message_id.clone_from(&request.message_id);
    let mut events = Vec::with_capacity(4);
    if let (Some(sender_task_id), None) = (&sender_task_id, &existing_sender_task) {
        events.push(Event::TaskCreated {
            task_id: sender_task_id.clone(),
            owner: sender_id.clone(),
            context_id: context_id.clone(),
            direction: Direction::Outgoing,
            peer: Some(target.agent_id.clone()),
            state: TaskState::Working,
            message: message.clone(),
            priority: request.priority,
            response_expected: true,
            sender_task_id: None,
            in_reply_to: None,
            peer_task_id: Some(task_id.clone()),
            message_in: message_in.clone(),
        });
    }
    events.push(Event::TaskCreated {
        task_id: task_id.clone(),
        owner: Some(target.agent_id.clone()),
        context_id,
        direction: Direction::Incoming,
        peer: sender_id.clone(),
        state: TaskState::Submitted,
        message,
        priority: request.priority,
        response_expected,
        sender_task_id: sender_task_id.clone(),
        in_reply_to: None,
        peer_task_id: None,
        message_in,
    });
    events.push(Event::MessageSent {
        task_id: task_id.clone(),
        from: sender_id.clone(),
        to: target.agent_id.clone(),
        priority: request.priority,
        response_expected,
        sender_task_id: sender_task_id.clone(),
        in_reply_to: None,
        text: request.text.clone(),
        parts: Vec::new(),
        idempotency_key: request.idempotency_key.clone(),
        by_user: sender_id.is_none() && unverified.is_none() && request.by_user,
        unverified_sender: request.unverified_sender.as_ref().map(|claimed| claimed.id.clone()),
        sender_endpoint: request.unverified_sender.as_ref().and_then(|claimed| claimed.endpoint.clone()),
        external_task_id: request.unverified_sender.as_ref().and_then(|claimed| claimed.task_id.clone()),
    });
    events.push(Event::TicketIssued {
        agent_id: target.agent_id.clone(),
        task_id: task_id.clone(),
        priority: request.priority,
        from: sender_id.clone().or(unverified),
        display_task_id: sender_task_id.clone().unwrap_or_else(|| task_id.clone()),
        response_expected,
        turn: 0,
    });
    Ok(Decision {
        actor: sender_id,
        events,
        answer: Answer::Sent { task_id, sender_task_id, is_reply: false, warning },
    })
}

/// A follow-up on a task that asks for input (A2A multi-turn). The A2A task is the anonymous
/// sender's side; the agent's side is its peer task. Both record the message, the sender's
/// goes back to `working` and the agent's to `submitted` (like a new message: the ack of its
/// ticket makes it `working`), and the ticket names the follow-up (`turn`) so that the agent
/// is given that message and not the first.
pub fn decide_continue(
    view: &Projections<'_>,
    request: &ContinueRequest,
    context: &Context<'_>,
) -> Result<Decision, DecideError> {
    validate_text(&request.text)?;
    let not_found = || CommandError::not_found(format!("Task {} not found", request.task_id));
    // A retry of a follow-up whose answer was lost: the same task, nothing new (as for a send,
    // anonymous senders share one key space).
    if let Some(key) = &request.idempotency_key
        && let Some(decision) = repeated_send(view, None, key, (&request.to, &request.text), context)?
    {
        return Ok(decision);
    }
    // Only an anonymous sender's task given to this agent: the A2A tasks of its endpoint.
    let task = find_task(view, &request.task_id)?
        .filter(|task| {
            task.owner.is_none()
                && task.direction == Direction::Outgoing
                && task.peer.as_deref() == Some(request.to.trim())
        })
        .ok_or_else(not_found)?;
    if let Some(context_id) = &request.context_id
        && *context_id != task.context_id
    {
        return Err(CommandError::bad(format!(
            "contextId '{context_id}' is not the context of task {} ('{}'): leave it out or send the task's",
            task.id, task.context_id
        ))
        .into());
    }
    if task.state != TaskState::InputRequired {
        let why = if task.state.is_final() {
            "it cannot take further messages; send a new message (without taskId) to start a new task"
        } else {
            "a follow-up is taken only while the task asks for input (input-required)"
        };
        return Err(CommandError::conflict(format!("Task {} is {}: {why}", task.id, task.state)).into());
    }
    let receiver_task = match &task.peer_task_id {
        Some(peer) => view.task(peer)?,
        None => None,
    }
    .filter(|receiver| receiver.state == TaskState::InputRequired)
    .ok_or_else(|| {
        CommandError::conflict(format!("Task {}: the agent's side of it no longer asks for input", task.id))
    })?;
    if receiver_task.sent_by_user {
        return Err(CommandError::forbidden(format!(
            "Task {} was sent by the user; only the user continues it",
            task.id
        ))
        .into());
    }
    let Some(agent) = receiver_task.owner.clone() else { return Err(not_found().into()) };
    let running = view.agent(&agent)?.is_some_and(|record| context.liveness.is_alive(record.pid));
    if !running {
        // The task's state, not the broker's: a 409, never a "try again later" 503.
        return Err(CommandError::conflict(format!(
            "Agent '{agent}' is no longer running: task {} cannot continue",
            task.id
        ))
        .into());
    }
    let turn = u32::try_from(receiver_task.follow_ups.len() + 1).unwrap_or(u32::MAX);
    let moved = |task_id: &str, state| Event::TaskStateChanged {
        task_id: task_id.to_string(),
        state,
        artifacts: Vec::new(),
        error: None,
        reply_of: None,
        as_message: false,
    };
    let events = vec![
        Event::TaskContinued {
            task_id: receiver_task.id.clone(),
            sender_task_id: Some(task.id.clone()),
            from: None,
            to: agent.clone(),
            text: request.text.clone(),
            message_id: request.message_id.clone(),
            idempotency_key: request.idempotency_key.clone(),
        },
        moved(&task.id, TaskState::Working),
        moved(&receiver_task.id, TaskState::Submitted),
        Event::TicketIssued {
            agent_id: agent,
            task_id: receiver_task.id.clone(),
            priority: receiver_task.priority,
            from: None,
            display_task_id: task.id.clone(),
            response_expected: true,
            turn,
        },
    ];
    Ok(Decision {
        actor: None,
        events,
        answer: Answer::Sent {
            task_id: receiver_task.id,
            sender_task_id: Some(task.id),
            is_reply: false,
            warning: None,
        },
    })
}

/// A message answering `task`. Returns None when the task does not expect a reply (the caller
/// then sends a new message).
fn decide_reply(
    view: &Projections<'_>,
    request: &SendRequest,
    replier: Option<&str>,
    task: TaskRecord,
) -> Result<Option<Decision>, DecideError> {
    // The pair: the sender's outgoing task and the receiver's incoming task.
    let (sender_task, receiver_task) = match task.direction {
        Direction::Outgoing => match &task.peer_task_id {
            Some(peer) => match view.task(peer)? {
                Some(receiver_task) => (task, receiver_task),
                None => return Ok(None),
            },
            None => return Ok(None),
        },
        Direction::Incoming => match view.open_outgoing_of(&task)? {
            Some(sender_task) => (sender_task, task),
            None => return Ok(None),
        },
    };
    let Some(replier) = replier else {
        return Err(CommandError::forbidden(format!(
            "replying to task {} needs the replier's identity: run it inside {} or pass --from {}",
            short_id(&sender_task.id),
            receiver_task.owner.as_deref().unwrap_or("the receiving agent"),
            receiver_task.owner.as_deref().unwrap_or("<agent id>"),
        ))
        .into());
    };
    if receiver_task.owner.as_deref() != Some(replier) {
        return Err(CommandError::forbidden(format!(
            "task {} was sent to {}, not to {replier}; only its receiver can reply",
            short_id(&sender_task.id),
            receiver_task.owner.as_deref().unwrap_or("another agent"),
        ))
        .into());
    }
    if let Some(owner) = &sender_task.owner {
        let addressed = match view.agent(owner)? {
            Some(record) => resolve_target(std::slice::from_ref(&record), &request.to).is_ok(),
            None => request.to.trim() == owner,
        };
        if !addressed {
            return Err(CommandError::bad(format!(
                "task {} came from {owner}, not from '{}'",
                short_id(&sender_task.id),
                request.to
            ))
            .into());
        }
    }
    if receiver_task.replied_by.is_some() || sender_task.state.is_final() {
        return Err(CommandError::conflict(format!(
            "task {} was already answered ({}); nothing changed",
            short_id(&sender_task.id),
            sender_task.state
        ))
        .into());
    }
    // A long reply is stored once, in the `reply_posted` event; both tasks refer to it.
    let (artifacts, reply_of) = if request.text.len() > INLINE_TEXT_MAX_BYTES {
        (Vec::new(), Some(receiver_task.id.clone()))
    } else {
        (vec![Artifact { name: None, parts: vec![Part::Text { text: request.text.clone() }] }], None)
    };
    let mut events = vec![
        Event::ReplyPosted {
            task_id: receiver_task.id.clone(),
            sender_task_id: Some(sender_task.id.clone()),
            from: replier.to_string(),
            to: sender_task.owner.clone(),
            text: request.text.clone(),
            idempotency_key: request.idempotency_key.clone(),
        },
        Event::TaskStateChanged {
            task_id: sender_task.id.clone(),
            state: TaskState::Completed,
            artifacts: artifacts.clone(),
            error: None,
            reply_of: reply_of.clone(),
            as_message: false,
        },
        Event::TaskStateChanged {
            task_id: receiver_task.id.clone(),
            state: TaskState::Completed,
            artifacts,
            error: None,
            reply_of,
            as_message: false,
        },
    ];
    let mut warning = None;
    match back_to_the_asker(view, &sender_task, replier, request.priority)? {
        Ok(ticket) => events.extend(ticket),
        Err(why) => {
            warning = Some(format!("Warning: {why}, so the reply is kept with the task (history) and not delivered"))
        }
    }
    Ok(Some(Decision {
        actor: Some(replier.to_string()),
        events,
        answer: Answer::Sent {
            task_id: receiver_task.id,
            sender_task_id: Some(sender_task.id),
            is_reply: true,
            warning,
        },
    }))
}

/// The reverse ticket that takes the end of `sender_task` (its reply, or its failure) back into
/// the terminal of the agent that asked: none when nobody asked (a user's send), `Err(why)`
/// when the asker cannot get it any more. It is typed only into the agent that asked. The agent
/// the id names now is the registered one, or the departed one whose queue the id holds (the
/// ticket waits there for it to come back); it is the asker if it began before the question.
/// Another agent that took the id since (the asker left with nothing queued), or nobody (the
/// asker's queue expired), is not given it.
pub(super) fn back_to_the_asker(
    view: &Projections<'_>,
    sender_task: &TaskRecord,
    from: &str,
    priority: u8,
) -> Result<Result<Option<Event>, String>, DecideError> {
    let Some(owner) = &sender_task.owner else { return Ok(Ok(None)) };
    let holder_since = match view.agent(owner)? {
        Some(agent) => Some(agent.since_seq),
        None => view.departed(owner)?.map(|departed| departed.since_seq),
    };
    let undelivered = match holder_since {
        Some(since) => since
            .is_some_and(|since| sender_task.created_seq < since)
            .then(|| format!("{owner} left after asking; its id now names another agent")),
        // Nobody holds the id: the asker left and its queue expired.
        None => Some(format!("{owner} left after asking and its queue has expired")),
    };
    Ok(match undelivered {
        Some(why) => Err(why),
        None => Ok(Some(Event::ReverseTicketIssued {
            agent_id: owner.clone(),
            task_id: sender_task.id.clone(),
            from: from.to_string(),
            priority,
        })),
    })
}

/// Drops the keys whose window has passed: decide already ignores them, so this only keeps
/// the table from growing with every keyed send.
pub fn decide_expire_idempotency_keys(view: &Projections<'_>, now_ms: u64) -> Result<Decision, DecideError> {
    let before_ms = now_ms.saturating_sub(IDEMPOTENCY_WINDOW_MS);
    let events = if view.has_idempotency_keys_before(before_ms)? {
        vec![Event::IdempotencyKeysExpired { before_ms }]
    } else {
        Vec::new()
    };
    Ok(Decision { actor: None, events, answer: Answer::Appended })
}
