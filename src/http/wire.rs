//! Shapes on the wire (JSON) built from projection rows.

use crate::event::{Artifact, Message, Part};
use crate::store::{AgentRecord, TaskRecord, Ticket, TicketKind};
use serde_json::{Value, json};

/// Unix milliseconds as RFC 3339 UTC (`2026-11-22T21:56:39.123Z`).
pub fn rfc3339(time_ms: u64) -> String {
    let seconds = time_ms / 1000;
    let millis = time_ms % 1000;
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    let rem = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, (rem % 3600) / 60, rem % 60)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_384_599_123), "2026-11-22T21:56:39.123Z");
    }
}
