//! The broker's rows as the [`crate::api`] contract shows them: tasks, agents, inbox tickets,
//! reply targets, registrations, send answers, the broker's identity.
//!
//! Invariant: these are the only conversions from projection rows to answers, so every endpoint
//! that shows a task (or an agent, ...) shows it the same way; times are RFC 3339 in UTC with
//! milliseconds (`crate::time::rfc3339`).

use crate::api;
use crate::broker::command::SendOutcome;
use crate::event::{Artifact, Message, Part, TaskState};
use crate::store::{AgentRecord, ReplyTarget, TaskRecord, Ticket, TicketKind};
use crate::time::rfc3339;
use serde_json::Value;

pub fn part(part: &Part) -> api::PartView {
    match part {
        Part::Text { text } => api::PartView::Text { text: text.clone() },
        Part::File { name, uri, mime_type } => api::PartView::File {
            file: api::FileView { name: name.clone(), uri: uri.clone(), mime_type: mime_type.clone() },
        },
        // Stored as JSON text; shown as the JSON it holds (null when it holds none).
        Part::Data { json } => api::PartView::Data { data: serde_json::from_str::<Value>(json).unwrap_or(Value::Null) },
    }
}

pub fn message(message: &Message) -> api::MessageView {
    api::MessageView { role: message.role, parts: message.parts.iter().map(part).collect() }
}

pub fn artifact(artifact: &Artifact) -> api::ArtifactView {
    let parts: Vec<api::PartView> = artifact.parts.iter().map(part).collect();
    // The Python Synapse's flat shape: the text parts joined, else the first part's content.
    let texts: Vec<&str> = parts.iter().filter_map(api::PartView::text).collect();
    let (kind, data) = match parts.first() {
        Some(api::PartView::Data { data }) if texts.is_empty() => ("data", data.clone()),
        Some(api::PartView::File { file }) if texts.is_empty() => {
            ("file", serde_json::to_value(file).unwrap_or(Value::Null))
        }
        _ => ("text", serde_json::json!({"content": texts.join("\n")})),
    };
    api::ArtifactView { name: artifact.name.clone(), parts, kind: kind.to_string(), data }
}

/// A task as the A2A REST endpoints show it (seed 003 shape).
pub fn task(task: &TaskRecord) -> api::Task {
    api::Task {
        id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: task.state,
        message: message(&task.message),
        follow_ups: task.follow_ups.iter().map(|follow_up| message(&follow_up.message)).collect(),
        artifacts: task.artifacts.iter().map(artifact).collect(),
        error: task.error.clone(),
        created_at: rfc3339(task.created_ms),
        updated_at: rfc3339(task.updated_ms),
        metadata: api::TaskMetadata {
            owner: task.owner.clone(),
            direction: task.direction,
            peer: task.peer.clone(),
            priority: task.priority,
            response_expected: task.response_expected,
            sender_task_id: task.sender_task_id.clone(),
            in_reply_to: task.in_reply_to.clone(),
            peer_task_id: task.peer_task_id.clone(),
            replied_by: task.replied_by.clone(),
        },
    }
}

/// `{"task": ...}`: the answer of every endpoint that shows or changes one task.
pub fn task_answer(record: &TaskRecord) -> api::TaskAnswer {
    api::TaskAnswer { task: task(record) }
}

/// The answer to a send or a reply.
pub fn sent(sent: &SendOutcome) -> api::SendAnswer {
    api::SendAnswer {
        task: task(&sent.task),
        sender_task: sent.sender_task.as_ref().map(task),
        is_reply: sent.is_reply,
        warning: sent.warning.clone(),
        seq: sent.seq,
    }
}

/// The text of the newest text artifact (a reply), if any.
pub fn reply_text(task: &TaskRecord) -> Option<String> {
    task.artifacts.iter().rev().find_map(|artifact| {
        artifact.parts.iter().find_map(|part| match part {
            Part::Text { text } => Some(text.clone()),
            _ => None,
        })
    })
}

/// What a reverse ticket writes into the asker's terminal: the reply, or how its request ended
/// without one (`Failed: <why>`, `Canceled: <why>`).
pub fn answer_text(task: &TaskRecord) -> String {
    let ended = match task.state {
        TaskState::Failed => "Failed",
        TaskState::Canceled => "Canceled",
        _ => {
            return reply_text(task)
                .unwrap_or_else(|| "(completed without a text answer: its result is in the task)".into());
        }
    };
    let why = task.error.clone().or_else(|| reply_text(task)).unwrap_or_else(|| "no reason given".into());
    format!("{ended}: {why}")
}

/// The line prefix written into the agent's PTY (SPEC §2, "What the receiving agent sees").
pub fn ticket_prefix(ticket: &Ticket) -> String {
    let id8 = crate::event::short_id(&ticket.display_task_id);
    let from = ticket.from.as_deref().unwrap_or("anonymous");
    match (ticket.kind, ticket.response_expected) {
        (TicketKind::Reply, _) => format!("[A2A:{id8}:{from}:REPLY]"),
        (TicketKind::Message, true) => format!("[A2A:{id8}:{from}:R]"),
        (TicketKind::Message, false) => format!("[A2A:{id8}:{from}]"),
    }
}

/// A ticket of an inbox, with the text it writes.
pub fn inbox_ticket(ticket: &Ticket, text: String) -> api::InboxTicket {
    api::InboxTicket {
        ticket: ticket.ticket,
        kind: match ticket.kind {
            TicketKind::Message => api::TicketKind::Message,
            TicketKind::Reply => api::TicketKind::Reply,
        },
        task_id: ticket.task_id.clone(),
        display_task_id: ticket.display_task_id.clone(),
        from: ticket.from.clone(),
        priority: ticket.priority,
        response_expected: ticket.response_expected,
        prefix: ticket_prefix(ticket),
        text,
        issued_at: rfc3339(ticket.issued_ms),
        cancel_notice: false,
    }
}

/// The ticket that tells an agent a task it was working on was canceled (a reverse ticket for
/// its own received task, `decide_cancel_task`; at priority 5 the interrupt comes first).
/// It names the task by the id its message was shown with (the sender's task, when there is
/// one, as the message's own ticket showed it), not the agent's own task id, which it never saw.
pub fn cancel_notice(ticket: &Ticket, task: &TaskRecord) -> api::InboxTicket {
    let mut notice = inbox_ticket(ticket, format!("{}. Stop working on it: no reply is expected.", answer_text(task)));
    let shown = task.sender_task_id.clone().unwrap_or_else(|| task.id.clone());
    let from = ticket.from.as_deref().unwrap_or("anonymous");
    notice.prefix = format!("[A2A:{}:{from}:CANCELED]", crate::event::short_id(&shown));
    notice.display_task_id = shown;
    notice.cancel_notice = true;
    notice
}

/// An agent as `synapse list --json` and `GET /agents` show it.
pub fn agent(
    agent: &AgentRecord,
    socket: &str,
    queue_depth: usize,
    current_task: Option<&TaskRecord>,
) -> api::AgentView {
    api::AgentView {
        agent_id: agent.agent_id.clone(),
        agent_type: agent.agent_type.clone(),
        name: agent.name.clone(),
        role: agent.role.clone(),
        port: agent.port,
        status: agent.status,
        status_note: agent.status_note.clone(),
        pid: agent.pid,
        pid_start: agent.pid_start,
        working_dir: agent.working_dir.clone(),
        endpoint: format!("http://127.0.0.1:{}", agent.port),
        uds_path: socket.to_string(),
        queue_depth,
        current_task: current_task.map(|task| api::CurrentTask {
            id: task.id.clone(),
            preview: crate::event::preview(&task.message.joined_text(), 60),
        }),
        registered_at: rfc3339(agent.registered_ms),
    }
}

/// The agent as its registration answer shows it.
pub fn registered_agent(agent: &AgentRecord) -> api::RegisteredAgent {
    api::RegisteredAgent {
        agent_id: agent.agent_id.clone(),
        agent_type: agent.agent_type.clone(),
        name: agent.name.clone(),
        role: agent.role.clone(),
        pid: agent.pid,
        port: agent.port,
        working_dir: agent.working_dir.clone(),
        status: agent.status,
        secret_hash: agent.secret_hash.clone(),
        pid_start: agent.pid_start,
        wrapper: agent.wrapper,
        registered_ms: agent.registered_ms,
        status_ms: agent.status_ms,
        status_note: agent.status_note.clone(),
    }
}

/// A sender waiting for a reply.
pub fn reply_target(target: &ReplyTarget) -> api::ReplyTarget {
    api::ReplyTarget {
        sender_id: target.sender_id.clone(),
        sender_task_id: target.sender_task_id.clone(),
        task_id: target.receiver_task_id.clone(),
        received_at: rfc3339(target.received_ms),
        preview: target.preview.clone(),
    }
}
