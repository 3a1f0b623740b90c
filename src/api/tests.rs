//! Every answer type parses the JSON the broker writes and writes it back unchanged; every
//! request type writes only fields `schema/openapi.json` documents, and all it requires.

use super::*;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Parses `example` as `T` and writes it again: the same JSON, key for key.
fn round_trips<T: Serialize + DeserializeOwned>(example: Value) {
    let parsed: T = serde_json::from_value(example.clone())
        .unwrap_or_else(|error| panic!("{} does not parse {example}: {error}", std::any::type_name::<T>()));
    let written = serde_json::to_value(&parsed).unwrap();
    assert_eq!(written, example, "{} changes the JSON", std::any::type_name::<T>());
}

fn task_example(id: &str, status: &str) -> Value {
    json!({
        "id": id,
        "context_id": "ctx-1",
        "status": status,
        "message": {"role": "user", "parts": [
            {"type": "text", "text": "hello"},
            {"type": "file", "file": {"name": "a.txt", "uri": null, "mime_type": "text/plain"}},
            {"type": "data", "data": {"k": [1, 2]}},
        ]},
        "artifacts": [
            {"name": "reply", "parts": [{"type": "text", "text": "done"}], "type": "text", "data": {"content": "done"}},
            {"parts": [], "type": "text", "data": {"content": ""}},
        ],
        "error": null,
        "created_at": "2026-11-22T21:56:39.123Z",
        "updated_at": "2026-11-22T21:56:40.000Z",
        "metadata": {
            "owner": "dummy-8190", "direction": "incoming", "peer": null, "priority": 3,
            "response_expected": true, "sender_task_id": "s-1", "in_reply_to": null,
            "peer_task_id": null, "replied_by": null,
        },
    })
}

#[test]
fn send_and_reply_answers_round_trip() {
    round_trips::<SendAnswer>(json!({
        "task": task_example("t-1", "submitted"),
        "sender_task": task_example("s-1", "working"),
        "is_reply": false,
        "warning": null,
        "seq": 42,
    }));
    round_trips::<SendAnswer>(json!({
        "task": task_example("t-2", "completed"),
        "sender_task": null,
        "is_reply": true,
        "warning": "task abc not found: sent as a new message",
        "seq": 7,
    }));
}

#[test]
fn task_answers_round_trip() {
    round_trips::<TaskAnswer>(json!({"task": task_example("t-1", "canceled")}));
    // An agent's GET /tasks/{id}: the task nested and at the top level (the Python 0.35 client).
    let mut both = task_example("t-1", "completed");
    both["task"] = task_example("t-1", "completed");
    round_trips::<AgentTaskAnswer>(both);
    round_trips::<TaskWait>(json!({"task": task_example("t-1", "completed"), "reply": "done", "timed_out": false}));
    round_trips::<TaskWait>(json!({"task": task_example("t-1", "working"), "reply": null, "timed_out": true}));
    round_trips::<TaskList>(json!({"tasks": [task_example("t-1", "working"), task_example("t-2", "completed")]}));
    round_trips::<TaskList>(json!({"tasks": []}));
}

#[test]
fn request_bodies_refuse_unknown_fields_and_a_status_reads_in_any_case() {
    let unknown = serde_json::from_value::<SendRequest>(json!({"to": "b", "text": "hi", "colour": "red"}));
    assert!(unknown.unwrap_err().to_string().contains("unknown field"));
    assert!(serde_json::from_value::<ReplyRequest>(json!({"from": "a", "text": "t", "x": 1})).is_err());
    let update: StatusUpdate = serde_json::from_value(json!({"status": "ready"})).unwrap();
    assert_eq!(update.status, crate::event::AgentStatus::Ready);
    let refused = serde_json::from_value::<StatusUpdate>(json!({"status": "asleep"})).unwrap_err();
    assert!(refused.to_string().contains("unknown status 'asleep'"), "{refused}");
}

#[test]
fn the_reply_text_is_the_newest_text_artifact() {
    let task: Task = serde_json::from_value(task_example("t-1", "completed")).unwrap();
    assert_eq!(task.reply_text(), Some("done"));
}

#[test]
fn registration_round_trips() {
    round_trips::<Registration>(json!({
        "agent": {
            "agent_id": "dummy-8190", "agent_type": "dummy", "name": null, "role": "reviewer",
            "pid": 1234, "port": 8190, "working_dir": "/tmp", "status": "STARTING",
            "secret_hash": "ab12", "pid_start": 99, "wrapper": true,
            "registered_ms": 1, "status_ms": 2,
        },
        "secret": "s3cret",
        "socket": "/tmp/synapse-a2a/dummy-8190.sock",
        "endpoint": "http://127.0.0.1:8190",
    }));
}

#[test]
fn agent_views_round_trip() {
    round_trips::<AgentList>(json!({"agents": [
        {
            "agent_id": "dummy-8190", "agent_type": "dummy", "name": "bob", "role": null,
            "port": 8190, "status": "PROCESSING", "status_note": "a dialog is open",
            "pid": 1234, "pid_start": null, "working_dir": "/tmp",
            "endpoint": "http://127.0.0.1:8190", "uds_path": "/tmp/u/dummy-8190.sock",
            "queue_depth": 2, "current_task": {"id": "t-1", "preview": "hello"},
            "registered_at": "2026-11-22T21:56:39.123Z",
        },
        {
            "agent_id": "claude-8100", "agent_type": "claude", "name": null, "role": null,
            "port": 8100, "status": "READY", "status_note": null,
            "pid": 99, "pid_start": 5, "working_dir": "/w",
            "endpoint": "http://127.0.0.1:8100", "uds_path": "/tmp/u/claude-8100.sock",
            "queue_depth": 0, "current_task": null,
            "registered_at": "2026-11-22T21:56:39.123Z",
        },
    ]}));
    round_trips::<AgentStatusView>(json!({
        "agent_id": "dummy-8190", "status": "WAITING", "status_note": null, "queue_depth": 0,
        "since": "2026-11-22T21:56:39.123Z",
    }));
}

#[test]
fn inbox_and_outcomes_round_trip() {
    round_trips::<Inbox>(json!({"agent_id": "dummy-8190", "tickets": [
        {
            "ticket": 3, "kind": "message", "task_id": "t-1", "display_task_id": "t-1",
            "from": "claude-8100", "priority": 5, "response_expected": true,
            "prefix": "[A2A:c54af1ff:claude-8100:R]", "text": "hi", "issued_at": "2026-11-22T21:56:39.123Z",
        },
        {
            "ticket": 4, "kind": "reply", "task_id": "s-1", "display_task_id": "t-9",
            "from": null, "priority": 3, "response_expected": false,
            "prefix": "[A2A:t-9:anonymous:REPLY]", "text": "", "issued_at": "2026-11-22T21:56:39.123Z",
        },
    ]}));
    round_trips::<Outcome>(json!({"outcome": "status_set", "changed": true}));
    round_trips::<Outcome>(json!({"outcome": "injected", "ticket": 3}));
    round_trips::<Deregistered>(json!({"deregistered": "dummy-8190"}));
    round_trips::<ReplyTargets>(json!({"targets": [{
        "sender_id": "claude-8100", "sender_task_id": null, "task_id": "t-1",
        "received_at": "2026-11-22T21:56:39.123Z", "preview": "hello",
    }]}));
}

#[test]
fn broker_answers_round_trip() {
    let info = json!({
        "pid": 7, "version": "0.1.0", "schema": 3, "home": "/h", "socket": "/s", "port": 0, "head": 12,
        "healthy": true,
    });
    round_trips::<BrokerInfo>(info);
    round_trips::<BrokerInfo>(json!({
        "pid": 7, "version": "0.1.0", "schema": 3, "home": "/h", "socket": "/s", "port": 0, "head": 12,
        "healthy": false, "write_failure": {"reason": "disk full", "since_ms": 5},
    }));
    round_trips::<Stopping>(json!({"stopping": true, "pid": 7}));
    round_trips::<RebuildReport>(json!({"events": 10, "elapsed_ms": 1.5}));
    round_trips::<VerifyReport>(json!({"events": 10, "differences": ["agents: dummy-8190 differs"]}));
    round_trips::<IndexProgress>(json!({"indexed_through": 3, "head": 4, "segments": 1}));
    round_trips::<ErrorBody>(json!({"error": "Bad Request", "message": "Ambiguous", "candidates": ["a", "b"]}));
    round_trips::<ErrorBody>(json!({"error": "Not Found", "message": "no such endpoint"}));
}

#[test]
fn history_answers_round_trip() {
    round_trips::<HistoryRecords>(json!({"records": [{
        "task_id": "t-1", "side": "sent", "agent": "a", "peer": "b", "input": "hi", "output": "",
        "status": "completed", "priority": 3, "created_ms": 1, "updated_ms": 2,
    }]}));
    round_trips::<HistoryStats>(json!({
        "total": 2, "by_status": {"completed": 2}, "success_rate": 1.0,
        "by_agent": {"a": {"sent": 1}, "b": {"received": 1}},
        "first": "2026-11-22T21:56:39.123Z", "last": null, "text_bytes": 4,
    }));
    round_trips::<HistoryCleanupAnswer>(json!({"would_remove": 0, "removed": 0, "before": "x"}));
    round_trips::<HistoryCleanupAnswer>(json!({"removed": 5, "before": "x"}));
}

#[test]
fn file_safety_answers_round_trip() {
    let lock =
        json!({"path": "/p", "agent_id": "a", "expires_ms": 9, "acquired_ms": 1, "intent": null, "task_id": "t"});
    let modification = json!({
        "path": "/p", "agent_id": "a", "task_id": "t", "change_type": "MODIFY", "intent": null, "time_ms": 1, "seq": 2,
    });
    round_trips::<FileSafetyStatus>(json!({"locks": 1, "modifications": 0}));
    round_trips::<Locks>(json!({"locks": [{"lock": lock, "expired": false}]}));
    round_trips::<Locked>(json!({"locked": true, "lock": lock}));
    round_trips::<Unlocked>(json!({"unlocked": "/p"}));
    round_trips::<Modifications>(json!({"path": "/p", "modifications": [modification]}));
    round_trips::<Modifications>(json!({"modifications": []}));
    round_trips::<Recorded>(json!({"recorded": "/p", "change_type": "DELETE"}));
    round_trips::<Validation>(json!({
        "path": "/p", "agent_id": "a", "allowed": false, "reason": "locked by b", "lock": lock,
        "recent_modifications": [modification],
    }));
    round_trips::<FileCleanupAnswer>(json!({"released": 1, "pruned": 2}));
}

#[test]
fn external_answers_round_trip() {
    let external = json!({"alias": "far", "url": "http://x", "name": "Far", "description": null, "added_seq": 3});
    round_trips::<ExternalAnswer>(json!({"external": external}));
    round_trips::<ExternalAnswer>(json!({"external": null}));
    round_trips::<ExternalList>(json!({"externals": [external]}));
    round_trips::<ExternalSent>(json!({"task": {"id": "r-1", "status": "submitted", "kind": "task"}}));
    round_trips::<ExternalSent>(json!({"task": null, "timed_out": true}));
    let update = json!({"task": {"state": "completed", "final": true,
        "artifacts": [{"parts": [{"type": "text", "text": "42"}], "name": "r"}]}, "timed_out": false});
    round_trips::<ExternalSent>(update.clone());
    let sent: ExternalSent = serde_json::from_value(update).unwrap();
    assert_eq!(sent.task.as_ref().and_then(RemoteTask::reply_text), Some("42"));
}

#[test]
fn the_announce_line_round_trips_for_the_wrapper_and_the_scenario_agent() {
    round_trips::<Announce>(json!({
        "agent_id": "dummy-8190", "pid": 1, "child_pid": 2, "port": 8190, "log": "/h/logs/dummy-8190.log",
        "socket": "/u/dummy-8190.sock", "secret": "s",
    }));
    round_trips::<Announce>(json!({
        "agent_id": "scenario-1", "pid": 1, "port": 40000, "socket": "/u/s.sock",
        "endpoint": "http://127.0.0.1:40000", "secret": "s",
    }));
}

/// The properties and required fields of a request body in `schema/openapi.json`.
fn documented(schema: &str) -> (Vec<String>, Vec<String>) {
    let document: Value = serde_json::from_str(include_str!("../../schema/openapi.json")).unwrap();
    let component = &document["components"]["schemas"][schema];
    let properties = component["properties"].as_object().unwrap().keys().cloned().collect();
    let required = component["required"]
        .as_array()
        .map_or_else(Vec::new, |required| required.iter().map(|name| name.as_str().unwrap().to_string()).collect());
    (properties, required)
}

/// `request` (every optional field set) writes only documented fields, and `minimal` (only the
/// required ones) writes at least the required ones.
fn documented_request<T: Serialize>(schema: &str, request: &T, minimal: &T) {
    let (properties, required) = documented(schema);
    let full = serde_json::to_value(request).unwrap();
    for key in full.as_object().unwrap().keys() {
        assert!(properties.contains(key), "{schema}: '{key}' is not in schema/openapi.json");
    }
    let minimal = serde_json::to_value(minimal).unwrap();
    for key in &required {
        assert!(minimal.get(key).is_some(), "{schema}: the required '{key}' is missing");
    }
}

#[test]
fn requests_write_the_fields_the_schema_documents() {
    let send = SendRequest {
        from: Some("a".into()),
        secret: Some("s".into()),
        reply_to: Some("t".into()),
        context_id: Some("c".into()),
        sender_task_id: Some("st".into()),
        response_expected: true,
        ..SendRequest::new("b", "hi")
    };
    // The idempotency key travels in the body too; the schema documents the header.
    let mut without_key = send.clone();
    without_key.idempotency_key = None;
    documented_request("SendRequest", &without_key, &SendRequest::new("b", "hi"));
    let reply = ReplyRequest {
        from: "a".into(),
        secret: Some("s".into()),
        to: Some("b".into()),
        text: "t".into(),
        idempotency_key: Some("k".into()),
    };
    let minimal = ReplyRequest { from: "a".into(), secret: None, to: None, text: "t".into(), idempotency_key: None };
    documented_request("ReplyBody", &reply, &minimal);
    let register = RegisterRequest {
        agent_type: "dummy".into(),
        name: Some("n".into()),
        role: Some("r".into()),
        pid: 1,
        working_dir: "/w".into(),
        port: Some(0),
        port_range: Some((8100, 8109)),
    };
    let minimal = RegisterRequest { agent_type: "dummy".into(), pid: 1, ..RegisterRequest::default() };
    documented_request("RegisterBody", &register, &minimal);
    let lock = LockRequest {
        path: "/p".into(),
        agent_id: "a".into(),
        duration_seconds: Some(1),
        intent: Some("i".into()),
        task_id: Some("t".into()),
        wait_seconds: Some(2),
    };
    let minimal = LockRequest {
        path: "/p".into(),
        agent_id: "a".into(),
        duration_seconds: None,
        intent: None,
        task_id: None,
        wait_seconds: None,
    };
    documented_request("LockBody", &lock, &minimal);
    let unlock = UnlockRequest { path: "/p".into(), agent_id: Some("a".into()), force: true };
    documented_request("UnlockBody", &unlock, &UnlockRequest { path: "/p".into(), agent_id: None, force: false });
    let record = RecordRequest {
        path: "/p".into(),
        agent_id: "a".into(),
        task_id: "t".into(),
        change_type: Some("CREATE".into()),
        intent: Some("i".into()),
    };
    let minimal = RecordRequest { change_type: None, intent: None, ..record.clone() };
    documented_request("RecordBody", &record, &minimal);
    let validate = ValidateRequest { path: "/p".into(), agent_id: "a".into() };
    documented_request("ValidateBody", &validate, &validate);
    let cleanup = HistoryCleanup { days: Some(1), max_size_mb: Some(2), dry_run: true };
    documented_request("HistoryCleanupBody", &cleanup, &cleanup);
    documented_request("FileCleanupBody", &FileCleanup { days: Some(3) }, &FileCleanup { days: None });
    let add = AddExternal { url: "http://x".into(), alias: Some("x".into()) };
    documented_request("ExternalAddBody", &add, &AddExternal { url: "http://x".into(), alias: None });
    let send =
        ExternalSend { text: "t".into(), wait_seconds: Some(1), priority: Some(5), response_expected: Some(true) };
    let minimal = ExternalSend { text: "t".into(), wait_seconds: None, priority: None, response_expected: None };
    documented_request("ExternalSendBody", &send, &minimal);
    let status = StatusUpdate { status: crate::event::AgentStatus::Ready, note: None };
    documented_request("StatusBody", &status, &status);
}
