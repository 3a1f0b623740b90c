//! Commands to the writer and how each is decided against the projections.
//!
//! `decide` runs inside the writer's transaction and sees every command decided before it in
//! the same batch. It returns the events to append (all or nothing) and the answer for the
//! caller; a rejected command returns an error and appends nothing.
//!
//! `decide` is pure: it reads the projections, the command and the [`Context`] the writer built
//! for the batch (its time, and the liveness of the processes the batch may ask about, looked up
//! once by [`Command::liveness_needed`] before deciding), never the clock or the process table.
//!
//! Layout: [`decision`] (the types every decider shares, also used by the webhook, file-safety
//! and externals deciders), [`requests`] (command bodies), `checks` (lookups every decider
//! uses), `send` (messages and replies), `agents` (registration, status, inboxes), `tasks`.

mod agents;
pub mod checks;
pub mod decision;
pub mod external;
pub mod requests;
mod send;
mod tasks;

pub use agents::agent_id_for;
pub use checks::{agent_id_of, resolve_target};
pub use checks::{ambiguous_task, find_task, unique_task, validate_task_ref};
pub use decision::{Answer, CommandError, Context, DecideError, Decision, Liveness, Outcome, SendOutcome};
pub use requests::{
    Actor, ContinueRequest, ExternalReplyRequest, ExternalSendRequest, IDEMPOTENCY_WINDOW_MS, MAX_MESSAGE_BYTES,
    RegisterRequest, ReplyRequest, SendRequest, UnverifiedSender, UpdateTaskRequest, default_priority,
};
pub use send::validate_priority;
pub use tasks::{check_party, sent_by_user_with};

use crate::event::{Event, Message};
use crate::store::{Projections, StoreError};

/// A request to change the log.
#[derive(Debug, Clone)]
pub enum Command {
    RegisterAgent(RegisterRequest),
    SetStatus {
        agent_id: String,
        status: crate::event::AgentStatus,
        note: Option<String>,
    },
    Deregister {
        agent_id: String,
        reason: String,
        /// The registration meant, as (pid, start time) when it was read: a registration made
        /// since (same id, another process) is not removed. None: whoever holds the id.
        registration: Option<(u32, Option<u64>)>,
    },
    Send(SendRequest),
    /// A reply to one of the senders waiting for `from`'s answer: decided as the send of
    /// [`send::reply_as_send`].
    Reply(ReplyRequest),
    /// A follow-up on a task that asks for input: decided by [`send::decide_continue`].
    Continue(ContinueRequest),
    CreateTask {
        owner: String,
        secret: Option<String>,
        message: Message,
        peer: Option<String>,
    },
    /// Cancel a task: by its sender or receiver (proved), or the user; a task sent anonymously
    /// may also be canceled anonymously (its sender cannot prove itself, A2A clients do this).
    CancelTask {
        task_id: String,
        reason: Option<String>,
        actor: Actor,
    },
    AckInjection {
        agent_id: String,
        ticket: u64,
        /// How the ticket reached the CLI, when the wrapper says.
        how: Option<crate::event::Delivery>,
    },
    /// The receiving agent itself (proved by its secret) moves a task it received to a new
    /// state, with artifacts; the sender's task waiting on it follows (scenario agent, A2A).
    UpdateTask(UpdateTaskRequest),
    /// Webhook registrations and delivery records (see `broker::webhooks`).
    Webhook(super::webhooks::WebhookCommand),
    /// External agents added or removed (see `broker::externals`).
    External(super::externals::ExternalCommand),
    /// The user's message to an external agent that waits for a reply (see [`external`]).
    SendExternal(ExternalSendRequest),
    /// A reply naming the reply token of such a message.
    ExternalReply(ExternalReplyRequest),
    /// Such a message was not delivered (or its remote task ended without a reply).
    ExternalSendFailed {
        task_id: String,
        error: String,
    },
    /// File locks and modification records (see `broker::file_safety`).
    FileSafety(super::file_safety::FileCommand),
    /// Prune the history view (the event is `HistoryPruned`, built by the caller).
    Prune(Event),
    /// Drop the queues of departed agents that nobody took back within `hold_ms` (see
    /// [`crate::broker::agents`] for the rule).
    ExpireInboxes {
        hold_ms: u64,
    },
    /// Drop the idempotency keys older than [`IDEMPOTENCY_WINDOW_MS`] (nothing is appended
    /// when none is).
    ExpireIdempotencyKeys,
}

/// Which processes deciding a command may ask about (see [`Liveness`]).
pub enum LivenessNeeded {
    None,
    Pids(Vec<u32>),
    /// Every registered agent's process.
    AllAgents,
}

impl Command {
    /// The processes whose liveness deciding this command may read, so that the writer looks
    /// them up before the batch. An agent registered earlier in the same batch is covered by
    /// its registration's pid (the writer adds every registering pid).
    pub fn liveness_needed(&self, view: &Projections<'_>) -> Result<LivenessNeeded, StoreError> {
        Ok(match self {
            // An exact agent id is the hot path: one process. Names and types scan the agents.
            Command::Send(request) => send_liveness(view, request)?,
            Command::Reply(request) => match send::reply_as_send(view, request) {
                Ok(send) => send_liveness(view, &send)?,
                Err(DecideError::Storage(error)) => return Err(error),
                // Refused before any target is resolved.
                Err(DecideError::Rejected(_)) => LivenessNeeded::None,
            },
            // The agent the task was sent to must still run.
            Command::Continue(request) => match view.agent(request.to.trim())? {
                Some(agent) => LivenessNeeded::Pids(vec![agent.pid]),
                None => LivenessNeeded::None,
            },
            Command::RegisterAgent(_) => LivenessNeeded::AllAgents,
            Command::FileSafety(command) if command.reads_liveness() => LivenessNeeded::AllAgents,
            _ => LivenessNeeded::None,
        })
    }

    /// The pid a registration brings into the batch.
    pub fn registering_pid(&self) -> Option<u32> {
        match self {
            Command::RegisterAgent(request) => Some(request.pid),
            _ => None,
        }
    }
}

fn send_liveness(view: &Projections<'_>, request: &SendRequest) -> Result<LivenessNeeded, StoreError> {
    Ok(match view.agent(request.to.trim())? {
        Some(agent) => LivenessNeeded::Pids(vec![agent.pid]),
        None => LivenessNeeded::AllAgents,
    })
}

/// Decides one command against the current projections and the batch's [`Context`].
pub fn decide(view: &Projections<'_>, command: &Command, context: &Context<'_>) -> Result<Decision, DecideError> {
    match command {
        Command::RegisterAgent(request) => agents::decide_register(view, request, context),
        Command::SetStatus { agent_id, status, note } => agents::decide_set_status(view, agent_id, *status, note),
        Command::Deregister { agent_id, reason, registration } => {
            agents::decide_deregister(view, agent_id, reason, *registration)
        }
        Command::Send(request) => send::decide_send(view, request, context),
        Command::Reply(request) => match send::repeated_reply(view, request, context)? {
            Some(decision) => Ok(decision),
            None => send::decide_send(view, &send::reply_as_send(view, request)?, context),
        },
        Command::Continue(request) => send::decide_continue(view, request, context),
        Command::CreateTask { owner, secret, message, peer } => {
            tasks::decide_create_task(view, owner, secret.as_deref(), message, peer)
        }
        Command::CancelTask { task_id, reason, actor } => tasks::decide_cancel_task(view, task_id, reason, actor),
        Command::AckInjection { agent_id, ticket, how } => {
            agents::decide_ack_injection(view, agent_id, *ticket, *how, context.now_ms)
        }
        Command::UpdateTask(request) => tasks::decide_update_task(view, request),
        Command::Webhook(command) => super::webhooks::decide(view, command),
        Command::External(command) => super::externals::decide(command),
        Command::SendExternal(request) => external::decide_send_external(view, request),
        Command::ExternalReply(request) => external::decide_external_reply(view, request),
        Command::ExternalSendFailed { task_id, error } => external::decide_external_failed(view, task_id, error),
        Command::FileSafety(command) => super::file_safety::decide(view, command, context),
        Command::ExpireInboxes { hold_ms } => agents::decide_expire_inboxes(view, *hold_ms, context.now_ms),
        Command::ExpireIdempotencyKeys => send::decide_expire_idempotency_keys(view, context.now_ms),
        Command::Prune(event) => match event {
            Event::HistoryPruned { .. } => {
                Ok(Decision { actor: None, events: vec![event.clone()], answer: Answer::Appended })
            }
            _ => Err(CommandError::bad("only history_pruned events can be appended this way").into()),
        },
    }
}

/// Turns a decision's answer into the outcome, reading the state after its events.
pub fn complete(view: &Projections<'_>, answer: Answer, last_seq: u64) -> Result<Outcome, StoreError> {
    Ok(match answer {
        Answer::Registered { agent_id } => match view.agent(&agent_id)? {
            Some(agent) => Outcome::Registered { agent: Box::new(agent) },
            None => return Err(StoreError::Corrupt(format!("agent {agent_id} missing after registration"))),
        },
        Answer::StatusSet { changed } => Outcome::StatusSet { changed },
        Answer::Deregistered => Outcome::Deregistered,
        Answer::Sent { task_id, sender_task_id, is_reply, warning } => {
            let task = view
                .task(&task_id)?
                .ok_or_else(|| StoreError::Corrupt(format!("task {task_id} missing after send")))?;
            let sender_task = match sender_task_id {
                Some(id) => view.task(&id)?,
                None => None,
            };
            Outcome::Sent(Box::new(SendOutcome { task, sender_task, is_reply, warning, seq: last_seq }))
        }
        Answer::Task { task_id } => Outcome::Task {
            task: Box::new(view.task(&task_id)?.ok_or_else(|| StoreError::Corrupt(format!("task {task_id} missing")))?),
        },
        Answer::Injected { ticket } => Outcome::Injected { ticket },
        Answer::Appended => Outcome::Appended { seq: last_seq },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::hash_secret;
    use crate::store::Store;
    use redb::backends::InMemoryBackend;

    const SENDER: &str = "synapse-claude-8100";
    const RECEIVER: &str = "synapse-codex-8120";
    const START_MS: u64 = 1_767_225_600_000;

    fn registered(agent_id: &str, port: u16) -> Event {
        Event::AgentRegistered {
            agent_id: agent_id.into(),
            agent_type: "dummy".into(),
            name: None,
            role: None,
            // A live process, so the target resolves.
            pid: std::process::id(),
            port,
            working_dir: "/tmp".into(),
            secret_hash: hash_secret(agent_id),
            pid_start: None,
            wrapper: false,
            resumes: false,
        }
    }

    /// Decides `command` at `now_ms` and appends its events, as the writer does.
    fn run(store: &Store, now_ms: u64, command: Command) -> Answer {
        match try_run(store, now_ms, command) {
            Ok(answer) => answer,
            Err(error) => panic!("rejected: {error}"),
        }
    }

    /// [`run`], with a refusal as the answer.
    fn try_run(store: &Store, now_ms: u64, command: Command) -> Result<Answer, CommandError> {
        store
            .transact(now_ms, |appender| {
                let liveness = Liveness::look_up([std::process::id()]);
                let context = Context { now_ms, liveness: &liveness };
                let decision = match decide(appender.view(), &command, &context) {
                    Ok(decision) => decision,
                    Err(DecideError::Rejected(error)) => return Ok(Err(error)),
                    Err(DecideError::Storage(error)) => return Err(error),
                };
                appender.append(decision.actor.as_deref(), decision.events)?;
                Ok(Ok(decision.answer))
            })
            .expect("the transaction commits")
    }

    /// A store in memory with `agents` (id, port) registered at START_MS.
    fn store_with(agents: &[(&str, u16)]) -> Store {
        let store = Store::open_with_backend(InMemoryBackend::new()).expect("memory store");
        let registrations = agents.iter().map(|(agent, port)| registered(agent, *port)).collect();
        store.transact(START_MS, |appender| appender.append(None, registrations)).expect("agents registered");
        store
    }

    /// Sends `text` to RECEIVER anonymously at priority 3; returns RECEIVER's task.
    fn ask_receiver(store: &Store, at: u64, text: &str, response_expected: bool) -> String {
        let send = Command::Send(SendRequest {
            to: RECEIVER.into(),
            text: text.into(),
            priority: 3,
            response_expected,
            ..SendRequest::default()
        });
        sent(run(store, at, send)).0
    }

    /// The number of the ticket in RECEIVER's inbox that writes `task`.
    fn queued_ticket(store: &Store, task: &str) -> u64 {
        let inbox = store.read(|view| view.inbox(RECEIVER, 100)).expect("the view reads");
        inbox.iter().find(|ticket| ticket.task_id == task).expect("queued").ticket
    }

    fn task_of(store: &Store, task_id: &str) -> crate::store::TaskRecord {
        store.read(|view| view.task(task_id)).expect("the view reads").expect("the task exists")
    }

    /// A cancel interrupts the receiver (a priority-5 notice) only while its CLI works on the
    /// task now: PROCESSING or WAITING, the task's message the last written into it that began
    /// work. After a one-way message typed at the prompt since, the notice comes at priority 3;
    /// a reply written since (to the agent's own question), or a one-way message handed over
    /// mid-turn, changes nothing.
    #[test]
    fn a_cancel_interrupts_only_while_the_cli_works_on_the_task() {
        use crate::event::{AgentStatus, TaskState};
        let store = store_with(&[(RECEIVER, 8120), (SENDER, 8100)]);
        let ask = |at: u64, text: &str, response_expected: bool| ask_receiver(&store, at, text, response_expected);
        let write = |at: u64, task: &str| {
            let ticket = queued_ticket(&store, task);
            run(&store, at, Command::AckInjection { agent_id: RECEIVER.into(), ticket, how: None });
        };
        let cancel = |at: u64, task: &str| {
            run(&store, at, Command::CancelTask { task_id: task.into(), reason: None, actor: Actor::User });
            store.read_after(0, usize::MAX).expect("the log reads").iter().rev().find_map(|envelope| {
                match &envelope.event {
                    Event::ReverseTicketIssued { task_id, priority, .. } if task_id == task => Some(*priority),
                    _ => None,
                }
            })
        };
        let first = ask(START_MS + 1, "first", true);
        write(START_MS + 2, &first);
        assert_eq!(cancel(START_MS + 3, &first), Some(5), "written and worked on: interrupted");

        let second = ask(START_MS + 10, "second", true);
        write(START_MS + 12, &second);
        let ready = Command::SetStatus { agent_id: RECEIVER.into(), status: AgentStatus::Ready, note: None };
        run(&store, START_MS + 13, ready);
        let urgent = ask(START_MS + 14, "urgent", false);
        write(START_MS + 15, &urgent);
        assert_eq!(task_of(&store, &urgent).state, TaskState::Completed);
        assert_eq!(cancel(START_MS + 16, &second), Some(3), "the CLI moved on: told, not interrupted");

        // Working on a third, the receiver asks the sender; the answer is written into its CLI.
        let third = ask(START_MS + 20, "third", true);
        write(START_MS + 21, &third);
        let (_, asked, _) = sent(run(&store, START_MS + 22, send(RECEIVER, "which file?", None, "q1")));
        let asked = asked.expect("the receiver's own task");
        let (_, _, is_reply) = sent(run(&store, START_MS + 23, send(SENDER, "main.rs", Some(&asked), "a1")));
        assert!(is_reply);
        write(START_MS + 24, &asked);
        assert_eq!(cancel(START_MS + 25, &third), Some(5), "the reply is part of the work on the third");

        // A one-way message a hook hands over mid-turn joins the work; a dialog opens.
        let fourth = ask(START_MS + 30, "fourth", true);
        write(START_MS + 31, &fourth);
        let aside = ask(START_MS + 32, "for your information", false);
        write(START_MS + 33, &aside);
        let dialog = Command::SetStatus { agent_id: RECEIVER.into(), status: AgentStatus::Waiting, note: None };
        run(&store, START_MS + 34, dialog);
        assert_eq!(cancel(START_MS + 35, &fourth), Some(5), "still the fourth's turn, behind a dialog");
    }

    /// A message canceled after its wrapper took it from the inbox and before it acknowledged
    /// it (the paste typed, the submit key not yet; or a hook handing it over): the
    /// acknowledgement still succeeds, and the CLI that took it is told at once, interrupted
    /// first when the message began its work (typed at the prompt, whatever status the CLI
    /// reported meanwhile), at priority 3 when a hook handed a one-way message over mid-turn.
    /// Not told: a message not written into this CLI, one the agent canceled itself. A hook's
    /// batch: acknowledging one ticket keeps the others known. The live projections and a
    /// replay agree.
    #[test]
    fn a_message_canceled_while_it_is_written_is_told_at_its_acknowledgement() {
        use crate::event::{AgentStatus, Delivery};
        let store = store_with(&[(RECEIVER, 8120)]);
        let status = |at: u64, status: AgentStatus| {
            run(&store, at, Command::SetStatus { agent_id: RECEIVER.into(), status, note: None });
        };
        let ask = |at: u64, text: &str, response_expected: bool| {
            let task = ask_receiver(&store, at, text, response_expected);
            (queued_ticket(&store, &task), task)
        };
        let ack = |at: u64, ticket: u64, how: Delivery| {
            try_run(&store, at, Command::AckInjection { agent_id: RECEIVER.into(), ticket, how: Some(how) }).map(|_| ())
        };
        let cancel_as = |at: u64, task: &str, actor: Actor| {
            run(&store, at, Command::CancelTask { task_id: task.into(), reason: None, actor });
        };
        let cancel = |at: u64, task: &str| cancel_as(at, task, Actor::User);
        let notices = || {
            let log = store.read_after(0, usize::MAX).expect("the log reads");
            log.iter()
                .filter_map(|envelope| match &envelope.event {
                    Event::ReverseTicketIssued { task_id, from, priority, .. } => {
                        Some((task_id.clone(), from.clone(), *priority))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        let user = |task: &str, priority: u8| (task.to_string(), "user".to_string(), priority);
        status(START_MS + 1, AgentStatus::Ready);
        let (ticket, task) = ask(START_MS + 2, "first", true);
        cancel(START_MS + 3, &task);
        assert_eq!(notices(), [], "still queued: nobody to tell yet");
        ack(START_MS + 4, ticket, Delivery::Typed).expect("the CLI took it: acknowledged");
        assert_eq!(notices(), [user(&task, 5)], "typed at the prompt: interrupted, told");
        assert!(ack(START_MS + 5, ticket, Delivery::Typed).is_err(), "acknowledged once");

        // One-way, typed at the prompt, the CLI's PROCESSING reported before the
        // acknowledgement: it began the CLI's work all the same.
        status(START_MS + 6, AgentStatus::Ready);
        let (ticket, typed) = ask(START_MS + 7, "one-way, typed", false);
        status(START_MS + 8, AgentStatus::Processing);
        cancel(START_MS + 9, &typed);
        ack(START_MS + 10, ticket, Delivery::Typed).expect("typed");
        assert_eq!(notices().last(), Some(&user(&typed, 5)));

        // A hook hands over two one-way messages mid-turn, and the second is canceled before
        // its acknowledgement: told, not interrupted; the first one's acknowledgement did not
        // make it unknown.
        let (first, _) = ask(START_MS + 20, "for your information", false);
        let (second, aside) = ask(START_MS + 21, "and this too", false);
        cancel(START_MS + 22, &aside);
        ack(START_MS + 23, first, Delivery::HandedOver).expect("handed over");
        ack(START_MS + 24, second, Delivery::HandedOver).expect("handed over");
        assert_eq!(notices().last(), Some(&user(&aside, 3)));

        // Not written into this CLI (written before a restart), and canceled by the agent
        // itself: acknowledged, nobody told.
        let told = notices().len();
        let (ticket, before) = ask(START_MS + 30, "written before a restart", true);
        cancel(START_MS + 31, &before);
        ack(START_MS + 32, ticket, Delivery::Unwritten).expect("acknowledged unwritten");
        let (ticket, own) = ask(START_MS + 33, "dropped by the agent", true);
        cancel_as(START_MS + 34, &own, Actor::Agent(RECEIVER.into()));
        ack(START_MS + 35, ticket, Delivery::Typed).expect("typed");
        assert_eq!(notices().len(), told);

        // Known ten minutes: a ticket canceled longer ago is unknown to an acknowledgement, and
        // the agent's next cancel drops it.
        let later = START_MS + 41 + crate::store::CANCELED_UNWRITTEN_MS;
        let (old, stale) = ask(START_MS + 40, "canceled long ago", true);
        cancel(START_MS + 41, &stale);
        assert!(ack(later + 1, old, Delivery::Typed).is_err());
        let (_, next) = ask(later + 2, "canceled later", true);
        cancel(later + 3, &next);
        let record = store.read(|view| view.agent(RECEIVER)).expect("the view reads").expect("registered");
        assert_eq!(record.canceled_unwritten.len(), 1, "the later one is kept, and a replay keeps it too");

        let report = store.verify().expect("verify runs");
        assert!(report.differences.is_empty(), "replay differs: {:?}", report.differences);
    }

    /// An A2A client's exchange with RECEIVER: a message that gets a question back, a follow-up
    /// (long, so stored once), its retry, and follow-ups the task can no longer take.
    #[test]
    fn a_follow_up_continues_a_task_that_asks_for_input_and_replays_to_the_same_projections() {
        use crate::event::TaskState;
        let store = store_with(&[(RECEIVER, 8120)]);
        let first = Command::Send(SendRequest {
            to: RECEIVER.into(),
            text: "need your input".into(),
            priority: 3,
            response_expected: true,
            idempotency_key: Some("a2a:first".into()),
            message_id: Some("first".into()),
            ..SendRequest::default()
        });
        let (receiver_task, sender_task, _) = sent(run(&store, START_MS, first));
        let sender_task = sender_task.expect("a sender task");
        let asked = Command::UpdateTask(UpdateTaskRequest {
            agent_id: RECEIVER.into(),
            secret: Some(RECEIVER.into()),
            task_id: receiver_task.clone(),
            state: TaskState::InputRequired,
            artifacts: vec![crate::event::Artifact::text("which one?")],
            error: None,
            as_message: false,
        });
        run(&store, START_MS + 1_000, asked);
        let long = "blue ".repeat(crate::event::INLINE_TEXT_MAX_BYTES);
        let follow_up = |text: &str, key: &str| {
            Command::Continue(ContinueRequest {
                to: RECEIVER.into(),
                task_id: sender_task[..8].to_string(),
                text: text.into(),
                message_id: Some(key.into()),
                context_id: None,
                idempotency_key: Some(format!("a2a:{key}")),
            })
        };
        let continued = sent(run(&store, START_MS + 2_000, follow_up(&long, "second")));
        assert_eq!(continued, (receiver_task.clone(), Some(sender_task.clone()), false));

        for id in [&sender_task, &receiver_task] {
            let task = task_of(&store, id);
            assert_eq!(task.message.message_id.as_deref(), Some("first"), "the client's id is kept");
            assert_eq!(task.follow_ups.len(), 1);
            let follow_up = &task.follow_ups[0];
            assert_eq!(follow_up.question.as_deref(), Some("which one?"));
            assert_eq!(follow_up.asked_ms, START_MS + 1_000);
            assert_eq!(follow_up.message.joined_text(), long, "the long follow-up is read back whole");
            assert_eq!(follow_up.message.message_id.as_deref(), Some("second"));
        }
        assert_eq!(task_of(&store, &sender_task).state, TaskState::Working);
        assert_eq!(task_of(&store, &receiver_task).state, TaskState::Submitted);
        let inbox = store.read(|view| view.inbox(RECEIVER, 10)).expect("the inbox reads");
        assert_eq!(inbox.iter().map(|ticket| ticket.turn).collect::<Vec<_>>(), [0, 1], "a ticket for each message");

        let events_before = store.head().expect("the head");
        assert_eq!(sent(run(&store, START_MS + 3_000, follow_up(&long, "second"))), continued, "a retry");
        assert_eq!(store.head().expect("the head"), events_before, "a retry appends nothing");

        match try_run(&store, START_MS + 4_000, follow_up("again", "third")) {
            Err(CommandError::Conflict { message }) => assert!(message.contains("input-required"), "{message}"),
            other => panic!("a working task takes no follow-up: {:?}", other.map(|_| ())),
        }
        let mut wrong_context = follow_up("other context", "fourth");
        if let Command::Continue(request) = &mut wrong_context {
            request.context_id = Some("another-context".into());
        }
        assert!(matches!(try_run(&store, START_MS + 4_000, wrong_context), Err(CommandError::BadRequest { .. })));
        let mut unknown = follow_up("unknown", "fifth");
        if let Command::Continue(request) = &mut unknown {
            request.task_id = "0123abcd".into();
        }
        assert!(matches!(try_run(&store, START_MS + 4_000, unknown), Err(CommandError::NotFound { .. })));
        run(
            &store,
            START_MS + 5_000,
            Command::CancelTask { task_id: sender_task.clone(), reason: None, actor: Actor::User },
        );
        match try_run(&store, START_MS + 6_000, follow_up("too late", "sixth")) {
            Err(CommandError::Conflict { message }) => assert!(message.contains("canceled"), "{message}"),
            other => panic!("a final task takes no follow-up: {:?}", other.map(|_| ())),
        }

        let report = store.verify().expect("verify runs");
        assert!(report.differences.is_empty(), "replay differs: {:?}", report.differences);
    }

    /// A request that ended without a reply (canceled, failed) is no reply target any more: it
    /// made `synapse reply` ambiguous, or refused it as already answered, until its sender
    /// asked again. The live projections and a replay agree.
    #[test]
    fn a_request_that_ends_unanswered_leaves_the_reply_targets() {
        use crate::event::TaskState;
        const THIRD: &str = "synapse-gemini-8110";
        let store = store_with(&[(SENDER, 8100), (RECEIVER, 8120), (THIRD, 8110)]);
        let ask = |from: &str, key: &str| {
            let request = SendRequest {
                to: RECEIVER.into(),
                from: Some(from.into()),
                secret: Some(from.into()),
                text: format!("question from {from}"),
                priority: 3,
                response_expected: true,
                idempotency_key: Some(key.into()),
                ..SendRequest::default()
            };
            sent(run(&store, START_MS + 1_000, Command::Send(request)))
        };
        let reply = |to: Option<&str>| {
            let request = ReplyRequest {
                from: RECEIVER.into(),
                secret: Some(RECEIVER.into()),
                to: to.map(str::to_string),
                text: "the answer".into(),
                idempotency_key: None,
            };
            try_run(&store, START_MS + 3_000, Command::Reply(request))
        };
        let (_, canceled_sender_task, _) = ask(SENDER, "a");
        let (_, third_sender_task, _) = ask(THIRD, "b");
        // Who waits on RECEIVER is told to RECEIVER only, not to a caller without its secret.
        let mut unproved = ReplyRequest {
            from: RECEIVER.into(),
            secret: Some("a guess".into()),
            to: None,
            text: "x".into(),
            ..Default::default()
        };
        for secret in [Some("a guess".to_string()), None] {
            unproved.secret = secret;
            match try_run(&store, START_MS + 1_500, Command::Reply(unproved.clone())) {
                Err(CommandError::Forbidden { message }) => {
                    assert!(!message.contains(SENDER) && !message.contains(THIRD), "{message}")
                }
                other => panic!("refused before the targets are read: {:?}", other.map(|_| ())),
            }
        }
        run(
            &store,
            START_MS + 2_000,
            Command::CancelTask {
                task_id: canceled_sender_task.expect("a sender task"),
                reason: None,
                actor: Actor::User,
            },
        );
        sent(reply(None).unwrap_or_else(|error| panic!("the only request still open is answered: {error}")));
        let third = third_sender_task.expect("a sender task");
        assert_eq!(task_of(&store, &third).state, TaskState::Completed);

        // A failed request (its message could not be written) goes as well.
        let (failed, _, _) = ask(THIRD, "c");
        run(
            &store,
            START_MS + 4_000,
            Command::UpdateTask(UpdateTaskRequest {
                agent_id: RECEIVER.into(),
                secret: Some(RECEIVER.into()),
                task_id: failed,
                state: TaskState::Failed,
                artifacts: Vec::new(),
                error: Some("not written".into()),
                as_message: false,
            }),
        );
        match reply(None) {
            Err(CommandError::NotFound { message }) => assert!(message.contains("No reply target"), "{message}"),
            other => panic!("nothing is owed: {:?}", other.map(|_| ())),
        }
        let report = store.verify().expect("verify runs");
        assert!(report.differences.is_empty(), "replay differs: {:?}", report.differences);
    }

    /// A second request from the same sender becomes the reply target when its ticket reaches
    /// the receiver, not when it is sent: the receiver's `synapse reply` answered the request
    /// still queued, which it had not seen, and the one it worked on stayed open for good (a
    /// review reproduced it with two dummies: 26 of 36 round trips stuck). Once the second
    /// ticket is written, it replaces the first as before; the live projections and a replay
    /// agree.
    #[test]
    fn a_reply_answers_the_request_the_receiver_has_seen_not_one_still_queued() {
        use crate::event::TaskState;
        let store = store_with(&[(SENDER, 8100), (RECEIVER, 8120)]);
        let reply = |text: &str, at: u64| {
            let request = ReplyRequest {
                from: RECEIVER.into(),
                secret: Some(RECEIVER.into()),
                to: None,
                text: text.into(),
                ..Default::default()
            };
            sent(run(&store, at, Command::Reply(request)))
        };
        let ack = |task: &str, at: u64| {
            let ticket = queued_ticket(&store, task);
            run(&store, at, Command::AckInjection { agent_id: RECEIVER.into(), ticket, how: None });
        };
        let target_task = || {
            let targets = store.read(|view| view.reply_targets(RECEIVER)).expect("the view reads");
            targets.iter().map(|target| target.receiver_task_id.clone()).collect::<Vec<_>>()
        };
        // A is written into the receiver; B arrives while it works on A.
        let (a, a_sender, _) = sent(run(&store, START_MS + 1_000, send(SENDER, "question A", None, "a")));
        ack(&a, START_MS + 1_100);
        let (b, b_sender, _) = sent(run(&store, START_MS + 1_200, send(SENDER, "question B", None, "b")));
        assert_eq!(target_task(), [a.as_str()], "B waits in the inbox: A stays the target");
        reply("answer A", START_MS + 1_300);
        assert_eq!(task_of(&store, &a_sender.clone().expect("A's sender task")).state, TaskState::Completed);
        let b_sender = b_sender.expect("B's sender task");
        assert_eq!(task_of(&store, &b_sender).state, TaskState::Working, "B is not answered by A's reply");
        assert!(target_task().is_empty(), "B is owed once it is written");
        ack(&b, START_MS + 1_400);
        assert_eq!(target_task(), [b.as_str()]);
        reply("answer B", START_MS + 1_500);
        assert_eq!(task_of(&store, &b_sender).state, TaskState::Completed);
        let artifacts = |task: &str| serde_json::to_string(&task_of(&store, task).artifacts).expect("encodes");
        assert!(artifacts(&b_sender).contains("answer B"), "{}", artifacts(&b_sender));

        // Both queued before either is written: the first stays the target until the second
        // is written, and a second written while the first is unanswered replaces it (the
        // receiver has seen both: the newest is answered, as the spec says).
        let (c, _, _) = sent(run(&store, START_MS + 2_000, send(SENDER, "question C", None, "c")));
        let (d, _, _) = sent(run(&store, START_MS + 2_100, send(SENDER, "question D", None, "d")));
        assert_eq!(target_task(), [c.as_str()]);
        ack(&c, START_MS + 2_200);
        assert_eq!(target_task(), [c.as_str()]);
        ack(&d, START_MS + 2_300);
        assert_eq!(target_task(), [d.as_str()]);

        // A queued request canceled before it is written never becomes a target.
        reply("answer D", START_MS + 2_400);
        let (e, _, _) = sent(run(&store, START_MS + 3_000, send(SENDER, "question E", None, "e")));
        ack(&e, START_MS + 3_100);
        let (f, f_sender, _) = sent(run(&store, START_MS + 3_200, send(SENDER, "question F", None, "f")));
        run(
            &store,
            START_MS + 3_300,
            Command::CancelTask { task_id: f_sender.expect("F's sender task"), reason: None, actor: Actor::User },
        );
        assert_eq!(target_task(), [e.as_str()]);
        if store.read(|view| view.inbox(RECEIVER, 100)).expect("the view reads").iter().any(|t| t.task_id == f) {
            ack(&f, START_MS + 3_400);
        }
        assert_eq!(target_task(), [e]);

        let report = store.verify().expect("verify runs");
        assert!(report.differences.is_empty(), "replay differs: {:?}", report.differences);
    }

    /// An agent whose process exited but is not yet reaped (a zombie) is gone: a send to it,
    /// by id, by name or by `<type>-<port>`, is refused saying it is no longer running, and
    /// nothing is sent. By id it had been accepted and the message stayed `submitted` for good
    /// once the agent was pruned; by name it said no agent had that name.
    #[test]
    fn a_send_to_an_agent_whose_process_exited_is_refused_as_no_longer_running() {
        let store = store_with(&[]);
        let mut child = std::process::Command::new("sleep").arg("600").spawn().expect("sleep starts");
        let pid = child.id();
        let mut registration = registered(RECEIVER, 8120);
        if let Event::AgentRegistered { pid: registered_pid, name, .. } = &mut registration {
            *registered_pid = pid;
            *name = Some("frank".into());
        }
        store.transact(START_MS, |appender| appender.append(None, vec![registration])).expect("registered");
        child.kill().expect("killed");
        // Not waited for: a zombie until then.
        while !crate::process::is_zombie(pid) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        for target in [RECEIVER, "frank", "dummy-8120"] {
            let refused = store
                .transact(START_MS + 1_000, |appender| {
                    let liveness = Liveness::look_up([pid]);
                    let context = Context { now_ms: START_MS + 1_000, liveness: &liveness };
                    let request =
                        SendRequest { to: target.into(), text: "x".into(), priority: 3, ..SendRequest::default() };
                    Ok(match decide(appender.view(), &Command::Send(request), &context) {
                        Ok(_) => None,
                        Err(DecideError::Rejected(error)) => Some(error),
                        Err(DecideError::Storage(error)) => return Err(error),
                    })
                })
                .expect("the transaction commits");
            match refused {
                Some(CommandError::NotFound { message }) => {
                    assert!(message.contains("no longer running"), "{target}: {message}")
                }
                other => panic!("{target}: {other:?}"),
            }
        }
        child.wait().expect("reaped");
        assert_eq!(store.head().expect("the head reads"), 1, "nothing was sent");
    }

    fn send(from: &str, text: &str, reply_to: Option<&str>, key: &str) -> Command {
        Command::Send(SendRequest {
            to: if from == SENDER { RECEIVER.into() } else { SENDER.into() },
            from: Some(from.into()),
            secret: Some(from.into()),
            text: text.into(),
            priority: 3,
            response_expected: reply_to.is_none(),
            reply_to: reply_to.map(str::to_string),
            idempotency_key: Some(key.into()),
            ..SendRequest::default()
        })
    }

    fn sent(answer: Answer) -> (String, Option<String>, bool) {
        match answer {
            Answer::Sent { task_id, sender_task_id, is_reply, .. } => (task_id, sender_task_id, is_reply),
            _ => panic!("the answer is not a send"),
        }
    }

    fn expired_events(store: &Store) -> usize {
        store
            .read_after(0, usize::MAX)
            .expect("the log reads")
            .iter()
            .filter(|envelope| matches!(envelope.event, Event::IdempotencyKeysExpired { .. }))
            .count()
    }

    #[test]
    fn keys_older_than_a_day_expire_through_the_log_and_a_later_retry_sends_again() {
        let store = store_with(&[(SENDER, 8100), (RECEIVER, 8120)]);

        let (first, first_sender_task, first_is_reply) = sent(run(&store, START_MS, send(SENDER, "hi", None, "k1")));
        assert!(!first_is_reply);
        let retry = sent(run(&store, START_MS + 1_000, send(SENDER, "hi", None, "k1")));
        assert_eq!(retry, (first.clone(), first_sender_task.clone(), false), "a retry answers the first send");

        // A reply retried with its key says it was a reply, as the first answer did.
        let reply = sent(run(&store, START_MS + 2_000, send(RECEIVER, "done", Some(&first), "r1")));
        assert!(reply.2, "the first answer is a reply");
        let reply_retry = sent(run(&store, START_MS + 3_000, send(RECEIVER, "done", Some(&first), "r1")));
        assert_eq!(reply_retry, reply, "a retried reply answers the first reply, is_reply included");
        // The reply's key used again for another text is refused: it stands for one message.
        match try_run(&store, START_MS + 3_500, send(RECEIVER, "done, and more", Some(&first), "r1")) {
            Err(CommandError::Conflict { message }) => assert!(message.contains("idempotency key 'r1'"), "{message}"),
            other => panic!("another reply under the same key: {:?}", other.map(|_| ())),
        }

        // Nothing is past its window yet: the sweep appends nothing.
        run(&store, START_MS + IDEMPOTENCY_WINDOW_MS - 1, Command::ExpireIdempotencyKeys);
        assert_eq!(expired_events(&store), 0);

        let later = START_MS + IDEMPOTENCY_WINDOW_MS + 5_000;
        run(&store, later, Command::ExpireIdempotencyKeys);
        assert_eq!(expired_events(&store), 1, "one event drops the old keys");
        run(&store, later + 1, Command::ExpireIdempotencyKeys);
        assert_eq!(expired_events(&store), 1, "nothing is left to drop");
        store
            .transact(later, |appender| {
                assert!(appender.view().idempotent_send(Some(SENDER), "k1")?.is_none(), "the key row is gone");
                assert!(appender.view().idempotent_send(Some(RECEIVER), "r1")?.is_none(), "the reply key row is gone");
                Ok(())
            })
            .expect("the view reads");

        let (again, _, _) = sent(run(&store, later, send(SENDER, "hi", None, "k1")));
        assert_ne!(again, first, "a retry after the window creates a new task");

        let report = store.verify().expect("verify runs");
        assert!(report.differences.is_empty(), "replay differs: {:?}", report.differences);
    }

    /// Two agents that asked each other and left together: their queues expire in one sweep,
    /// both requests fail, and neither failure is queued for the other agent (its queue and its
    /// id are given up in the same decision: the ticket would wait for whoever takes the id).
    #[test]
    fn queues_that_expire_together_queue_no_failure_for_each_other() {
        let store = store_with(&[(SENDER, 8100), (RECEIVER, 8120)]);
        let (to_receiver, asked_by_sender, _) = sent(run(&store, START_MS, send(SENDER, "a?", None, "k1")));
        let (to_sender, asked_by_receiver, _) = sent(run(&store, START_MS, send(RECEIVER, "b?", None, "k2")));
        for agent in [SENDER, RECEIVER] {
            let gone = Command::Deregister {
                agent_id: agent.into(),
                reason: "process gone".into(),
                registration: Some((std::process::id(), None)),
            };
            assert!(matches!(run(&store, START_MS + 1, gone), Answer::Deregistered));
        }
        run(&store, START_MS + 10, Command::ExpireInboxes { hold_ms: 1 });
        for task in [to_receiver, to_sender, asked_by_sender.unwrap(), asked_by_receiver.unwrap()] {
            assert_eq!(task_of(&store, &task).state, crate::event::TaskState::Failed);
        }
        for agent in [SENDER, RECEIVER] {
            let inbox = store.read(|view| view.inbox(agent, usize::MAX)).expect("the view reads");
            assert!(inbox.is_empty(), "{agent}: {inbox:?}");
        }
        let report = store.verify().expect("verify runs");
        assert!(report.differences.is_empty(), "replay differs: {:?}", report.differences);
    }

    /// A deregistration decided for one registration (the sweeper's, of a process found gone)
    /// leaves alone a registration made since under the same id by another process.
    #[test]
    fn a_deregistration_meant_for_a_gone_registration_leaves_a_newer_one_alone() {
        let store = store_with(&[(SENDER, 8100)]);
        let other_process = Some((std::process::id() + 1, None));
        let stale =
            Command::Deregister { agent_id: SENDER.into(), reason: "process gone".into(), registration: other_process };
        let Err(refused) = try_run(&store, START_MS + 1, stale) else { panic!("removed another registration") };
        assert!(matches!(refused, CommandError::NotFound { .. }), "{refused}");
        assert!(store.read(|view| view.agent(SENDER)).expect("the view reads").is_some());
        let meant = Some((std::process::id(), None));
        let current =
            Command::Deregister { agent_id: SENDER.into(), reason: "process gone".into(), registration: meant };
        assert!(matches!(run(&store, START_MS + 2, current), Answer::Deregistered));
        assert!(store.read(|view| view.agent(SENDER)).expect("the view reads").is_none());
    }
}
