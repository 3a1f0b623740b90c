//! Shapes on the wire (JSON) built from projection rows.

use crate::event::{Artifact, Message, Part};
use crate::store::{AgentRecord, TaskRecord, Ticket, TicketKind};
use crate::time::rfc3339;
use serde_json::{Value, json};

pub fn part_json(part: &Part) -> Value {
    match part {
        Part::Text { text } => json!({"type": "text", "text": text}),
        Part::File { name, uri, mime_type } => {
            json!({"type": "file", "file": {"name": name, "uri": uri, "mime_type": mime_type}})
        }
        Part::Data { json } => {
            json!({"type": "data", "data": serde_json::from_str::<Value>(json).unwrap_or(Value::Null)})
        }
    }
}

pub fn message_json(message: &Message) -> Value {
    json!({"role": message.role, "parts": message.parts.iter().map(part_json).collect::<Vec<_>>()})
}

pub fn artifact_json(artifact: &Artifact) -> Value {
    let mut value = json!({"parts": artifact.parts.iter().map(part_json).collect::<Vec<_>>()});
    if let Some(name) = &artifact.name {
        value["name"] = json!(name);
    }
    value
}

/// A task as the A2A REST endpoints show it (seed 003 shape).
pub fn task_json(task: &TaskRecord) -> Value {
    json!({
        "id": task.id,
        "context_id": task.context_id,
        "status": task.state,
        "message": message_json(&task.message),
        "artifacts": task.artifacts.iter().map(artifact_json).collect::<Vec<_>>(),
        "error": task.error,
        "created_at": rfc3339(task.created_ms),
        "updated_at": rfc3339(task.updated_ms),
        "metadata": {
            "owner": task.owner,
            "direction": task.direction,
            "peer": task.peer,
            "priority": task.priority,
            "response_expected": task.response_expected,
            "sender_task_id": task.sender_task_id,
            "in_reply_to": task.in_reply_to,
            "peer_task_id": task.peer_task_id,
            "replied_by": task.replied_by,
        },
    })
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

/// An agent as `synapse list --json` and `GET /agents` show it.
pub fn agent_json(agent: &AgentRecord, socket: &str, queue_depth: usize, current_task: Option<&TaskRecord>) -> Value {
    json!({
        "agent_id": agent.agent_id,
        "agent_type": agent.agent_type,
        "name": agent.name,
        "role": agent.role,
        "port": agent.port,
        "status": agent.status,
        "status_note": agent.status_note,
        "pid": agent.pid,
        "pid_start": agent.pid_start,
        "working_dir": agent.working_dir,
        "endpoint": format!("http://127.0.0.1:{}", agent.port),
        "uds_path": socket,
        "queue_depth": queue_depth,
        "current_task": current_task.map(|task| json!({
            "id": task.id,
            "preview": crate::event::preview(&task.message.joined_text(), 60),
        })),
        "registered_at": rfc3339(agent.registered_ms),
    })
}
