//! Tests of the event types and their encoding, and of `schema/events.md` against the code.
//!
//! The documentation test works both ways: every `## <kind>` section of the doc must decode into
//! the Rust types and name a real kind, and every variant of [`Event`] (one sample each, kept
//! complete by an exhaustive match) must have a section whose example shows every field the code
//! writes. Adding a field or a kind without documenting it fails here.

use super::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;

const EVENTS_DOC: &str = include_str!("../../schema/events.md");

/// The H1 heading under which each `## <kind>` section lives; other parts of the doc (encoding,
/// value types) have their own H1 and are not kinds.
const KINDS_PART_HEADING: &str = "# Event kinds";

/// One `## <kind>` section of the event kinds part of `events.md`.
struct DocSection {
    kind: String,
    /// First column of the field table, backticks removed.
    table_fields: Vec<String>,
    /// Contents of each ```json fence.
    examples: Vec<String>,
}

fn doc_sections() -> Vec<DocSection> {
    let mut sections: Vec<DocSection> = Vec::new();
    let mut in_kinds_part = false;
    let mut fence: Option<(bool, String)> = None; // (is json, text so far)
    for line in EVENTS_DOC.lines() {
        if let Some((is_json, text)) = &mut fence {
            if line.trim_start().starts_with("```") {
                if *is_json && in_kinds_part {
                    let example = std::mem::take(text);
                    sections.last_mut().expect("a json example before the first kind heading").examples.push(example);
                }
                fence = None;
            } else {
                text.push_str(line);
                text.push('\n');
            }
            continue;
        }
        if let Some(info) = line.trim_start().strip_prefix("```") {
            fence = Some((info.trim() == "json", String::new()));
        } else if line.starts_with("# ") {
            in_kinds_part = line.trim_end() == KINDS_PART_HEADING;
        } else if !in_kinds_part {
            continue;
        } else if let Some(kind) = line.strip_prefix("## ") {
            sections.push(DocSection { kind: kind.trim().to_string(), table_fields: Vec::new(), examples: Vec::new() });
        } else if let (Some(row), Some(section)) = (line.strip_prefix('|'), sections.last_mut()) {
            let cell = row.split('|').next().unwrap_or_default().trim().trim_matches('`');
            if cell != "field" && !cell.starts_with("---") {
                section.table_fields.push(cell.to_string());
            }
        }
    }
    assert!(fence.is_none(), "events.md ends inside a code fence");
    assert!(!sections.is_empty(), "events.md has no `## <kind>` sections under `{KINDS_PART_HEADING}`");
    sections
}

fn doc_section(kind: &str) -> DocSection {
    doc_sections()
        .into_iter()
        .find(|section| section.kind == kind)
        .unwrap_or_else(|| panic!("events.md has no `## {kind}` section"))
}

/// The section's one example, as JSON.
fn example_of(section: &DocSection) -> Value {
    assert_eq!(section.examples.len(), 1, "`## {}` must have exactly one ```json example", section.kind);
    serde_json::from_str(&section.examples[0])
        .unwrap_or_else(|error| panic!("`## {}` example is not valid JSON: {error}", section.kind))
}

/// Object keys of `value["event"]["data"]` (or of `value["data"]` for a bare event).
fn data_keys(value: &Value) -> BTreeSet<String> {
    let data = value.get("event").unwrap_or(value).get("data");
    let object = data.and_then(Value::as_object).expect("an object under \"data\"");
    object.keys().cloned().collect()
}

/// The value with every `null` member of every object removed (serde skips unset options).
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(object) => Value::Object(
            object.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, without_nulls(v))).collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// Number of variants of [`Event`]; [`variant_number`] names each one.
const VARIANT_COUNT: usize = 28;

/// Position of the event's variant in the enum. Exhaustive on purpose: a new variant does not
/// compile until it is numbered here, and `samples_cover_every_variant_in_enum_order` then fails
/// until [`samples`] has one of it.
fn variant_number(event: &Event) -> usize {
    match event {
        Event::AgentRegistered { .. } => 0,
        Event::AgentStatusChanged { .. } => 1,
        Event::AgentDeregistered { .. } => 2,
        Event::TaskCreated { .. } => 3,
        Event::MessageSent { .. } => 4,
        Event::TicketIssued { .. } => 5,
        Event::TicketInjected { .. } => 6,
        Event::ReplyPosted { .. } => 7,
        Event::ReverseTicketIssued { .. } => 8,
        Event::TaskStateChanged { .. } => 9,
        Event::TaskCanceled { .. } => 10,
        Event::FileLockAcquired { .. } => 11,
        Event::FileLockReleased { .. } => 12,
        Event::FileModified { .. } => 13,
        Event::HistoryPruned { .. } => 14,
        Event::WebhookRegistered { .. } => 15,
        Event::WebhookRemoved { .. } => 16,
        Event::WebhookDeliveryAttempted { .. } => 17,
        Event::ExternalAgentAdded { .. } => 18,
        Event::ExternalAgentRemoved { .. } => 19,
        Event::FileModificationsPruned { .. } => 20,
        Event::InboxExpired { .. } => 21,
        Event::IdempotencyKeysExpired { .. } => 22,
        Event::TaskContinued { .. } => 23,
        Event::PushConfigSet { .. } => 24,
        Event::PushConfigDeleted { .. } => 25,
        Event::ExternalMessageSent { .. } => 26,
        Event::ExternalReplyReceived { .. } => 27,
    }
}

/// One event of every variant, in enum order, with every optional field set (and every list
/// non-empty), so that serialising a sample shows every field the code can write.
fn samples() -> Vec<Event> {
    let sender = || "synapse-claude-8100".to_string();
    let receiver = || "synapse-codex-8120".to_string();
    let sender_task = || "7c1f3a52-0d4e-4b8a-9f21-3e5d6c7b8a90".to_string();
    let receiver_task = || "e2b94d17-5a3c-4f60-8e1b-2c9d0a4f6b13".to_string();
    let path = || "/home/ada/project/src/lib.rs".to_string();
    vec![
        Event::AgentRegistered {
            agent_id: sender(),
            agent_type: "claude".into(),
            name: Some("reviewer".into()),
            role: Some("reviews pull requests".into()),
            pid: 41237,
            port: 8100,
            working_dir: "/home/ada/project".into(),
            secret_hash: "9f86d081".into(),
            pid_start: Some(1_234_567),
            wrapper: true,
            resumes: true,
        },
        Event::AgentStatusChanged {
            agent_id: sender(),
            status: AgentStatus::Waiting,
            note: Some("a dialog is open: messages wait until it is answered".into()),
        },
        Event::AgentDeregistered { agent_id: sender(), reason: "stopped".into() },
        Event::TaskCreated {
            task_id: receiver_task(),
            owner: Some(receiver()),
            context_id: "0a6f2c8e".into(),
            direction: Direction::Incoming,
            peer: Some(sender()),
            state: TaskState::Submitted,
            message: Message {
                role: Role::User,
                parts: vec![
                    Part::Text { text: "review this".into() },
                    Part::File {
                        name: Some("a.md".into()),
                        uri: Some("file:///a.md".into()),
                        mime_type: Some("text/markdown".into()),
                    },
                    Part::Data { json: r#"{"n":1}"#.into() },
                ],
                message_id: Some("msg-0a6f2c8e-1".into()),
            },
            priority: 5,
            response_expected: true,
            sender_task_id: Some(sender_task()),
            in_reply_to: Some("5d0e8b3a".into()),
            peer_task_id: Some("3b7a9c1e".into()),
            message_in: Some(receiver_task()),
        },
        Event::MessageSent {
            task_id: receiver_task(),
            from: Some(sender()),
            to: receiver(),
            priority: 3,
            response_expected: true,
            sender_task_id: Some(sender_task()),
            in_reply_to: Some("5d0e8b3a".into()),
            text: "review this\nplease".into(),
            parts: vec![Part::File { name: None, uri: Some("file:///a.md".into()), mime_type: None }],
            idempotency_key: Some("retry-7f3a".into()),
            by_user: true,
            unverified_sender: Some("py-agent-1".into()),
            sender_endpoint: Some("http://127.0.0.1:8199".into()),
            external_task_id: Some("py-task-1".into()),
        },
        Event::TicketIssued {
            agent_id: receiver(),
            task_id: receiver_task(),
            priority: 3,
            from: Some(sender()),
            display_task_id: sender_task(),
            response_expected: true,
            turn: 1,
        },
        Event::TicketInjected { agent_id: receiver(), ticket: 12, priority: 3, how: Some(Delivery::Typed) },
        Event::ReplyPosted {
            task_id: receiver_task(),
            sender_task_id: Some(sender_task()),
            from: receiver(),
            to: Some(sender()),
            text: "looks good".into(),
            idempotency_key: Some("retry-9b2e".into()),
        },
        Event::ReverseTicketIssued { agent_id: sender(), task_id: sender_task(), from: receiver(), priority: 3 },
        Event::TaskStateChanged {
            task_id: sender_task(),
            state: TaskState::InputRequired,
            artifacts: vec![Artifact { name: Some("reply".into()), parts: vec![Part::Text { text: "ok".into() }] }],
            error: Some("needs a file name".into()),
            reply_of: Some(receiver_task()),
            as_message: true,
        },
        Event::TaskCanceled {
            task_id: sender_task(),
            reason: Some("no longer needed".into()),
            by: Some("user".into()),
        },
        Event::FileLockAcquired {
            path: path(),
            agent_id: receiver(),
            expires_ms: 1_767_226_100_000,
            intent: Some("refactor".into()),
            task_id: Some(receiver_task()),
        },
        Event::FileLockReleased { path: path(), agent_id: receiver(), forced: true },
        Event::FileModified {
            path: path(),
            agent_id: receiver(),
            task_id: receiver_task(),
            change_type: ChangeType::Delete,
            intent: Some("refactor".into()),
        },
        Event::HistoryPruned { before_ms: 1_767_225_600_000, max_size_mb: Some(100) },
        Event::WebhookRegistered {
            webhook_id: "wh-1".into(),
            url: "https://hooks.example.com/synapse".into(),
            events: vec!["task.completed".into()],
            // Never written any more (logs before `secret_ref` carry it; see the legacy test).
            secret: None,
            secret_ref: Some("0f8e2c4a-5b6d-4e7f-8a9b-0c1d2e3f4a5b".into()),
        },
        Event::WebhookRemoved { webhook_id: "wh-1".into(), url: "https://hooks.example.com/synapse".into() },
        Event::WebhookDeliveryAttempted {
            delivery_id: "d7e8f9a0-1b2c".into(),
            webhook_id: "wh-1".into(),
            event: "task.completed".into(),
            attempt: 1,
            status: Some(500),
            error: Some("Internal Server Error".into()),
            next_attempt_ms: Some(1_767_226_005_000),
        },
        Event::ExternalAgentAdded {
            alias: "builder".into(),
            url: "http://build-box.local:9000".into(),
            name: "Build Agent".into(),
            description: Some("Runs the CI build".into()),
        },
        Event::ExternalAgentRemoved { alias: "builder".into() },
        Event::FileModificationsPruned { before_ms: 1_767_225_600_000 },
        Event::InboxExpired {
            agent_id: receiver(),
            reason: "synapse-codex-8120 left and was not started again within 24 h".into(),
            tickets: 2,
        },
        Event::IdempotencyKeysExpired { before_ms: 1_769_904_000_000 },
        Event::TaskContinued {
            task_id: receiver_task(),
            sender_task_id: Some(sender_task()),
            from: Some(sender()),
            to: receiver(),
            text: "use the blue one".into(),
            message_id: Some("msg-0a6f2c8e-2".into()),
            idempotency_key: Some("a2a:synapse-codex-8120:msg-0a6f2c8e-2".into()),
        },
        Event::PushConfigSet {
            task_id: sender_task(),
            config_id: "cfg-1".into(),
            context_id: "ctx-7".into(),
            url: "http://127.0.0.1:9000/a2a-notifications".into(),
            token_ref: Some("7d1f0c2a-9b3e-4c55-8e0f-2f4b6a1d9c30".into()),
            auth_scheme: Some("Bearer".into()),
            credentials_ref: Some("c2b8e4d1-5a6f-4b7c-9d0e-1f2a3b4c5d6e".into()),
            task_ended: true,
        },
        Event::PushConfigDeleted { task_id: sender_task(), config_id: "cfg-1".into() },
        Event::ExternalMessageSent {
            task_id: sender_task(),
            alias: "py-reviewer".into(),
            reply_token_sha256: "9f2c1d4e8b7a6f5e4d3c2b1a0f9e8d7c6b5a49382716f5e4d3c2b1a0f9e8d7c6".into(),
            by_user: true,
        },
        Event::ExternalReplyReceived {
            task_id: sender_task(),
            from: Some("synapse-dummy-8110".into()),
            text: "LGTM".into(),
            reply_token_sha256: "9f2c1d4e8b7a6f5e4d3c2b1a0f9e8d7c6b5a49382716f5e4d3c2b1a0f9e8d7c6".into(),
        },
    ]
}

fn envelope(seq: u64, actor: Option<&str>, event: Event) -> Envelope {
    Envelope { v: SCHEMA_VERSION, seq, time_ms: 1_767_225_600_000 + seq, actor: actor.map(str::to_string), event }
}

fn decode_value(value: &Value) -> Result<Envelope, DecodeError> {
    Envelope::decode(&rmp_serde::to_vec_named(value).unwrap())
}

// ---- schema/events.md against the code ----

#[test]
fn every_event_kind_is_documented_with_a_valid_example() {
    for section in doc_sections() {
        let kind = &section.kind;
        let example = example_of(&section);
        let parsed: Envelope = serde_json::from_value(example.clone())
            .unwrap_or_else(|error| panic!("`## {kind}` example does not decode into an Envelope: {error}"));
        assert_eq!(parsed.event.kind(), kind, "`## {kind}` example has another kind");
        assert_eq!(parsed.v, SCHEMA_VERSION, "`## {kind}` example is not written with the current schema version");
        let decoded = Envelope::decode(&parsed.encode())
            .unwrap_or_else(|error| panic!("`## {kind}` example does not survive msgpack: {error}"));
        assert_eq!(decoded, parsed, "`## {kind}` example changes in a msgpack round trip");
        assert_eq!(
            serde_json::to_value(&parsed).unwrap(),
            without_nulls(example.clone()),
            "`## {kind}` example has fields the code does not write (or spells a value differently)"
        );
        assert_eq!(parsed.to_json(), without_nulls(example), "`## {kind}` example is not what to_json() prints");
    }
}

#[test]
fn samples_cover_every_variant_in_enum_order() {
    let numbers: Vec<usize> = samples().iter().map(variant_number).collect();
    let expected: Vec<usize> = (0..VARIANT_COUNT).collect();
    assert_eq!(numbers, expected, "samples() must hold exactly one event per variant, in enum order");
}

#[test]
fn every_sample_kind_has_a_doc_section_and_every_section_names_a_real_kind() {
    let code_kinds: Vec<&str> = samples().iter().map(Event::kind).collect();
    let doc_kinds: Vec<String> = doc_sections().into_iter().map(|section| section.kind).collect();
    for kind in &code_kinds {
        assert!(doc_kinds.iter().any(|doc| doc == kind), "kind `{kind}` has no `## {kind}` section in events.md");
    }
    for kind in &doc_kinds {
        assert!(code_kinds.contains(&kind.as_str()), "events.md documents `## {kind}`, which is not an event kind");
    }
    assert_eq!(doc_kinds, code_kinds, "events.md lists the kinds in another order than the Event enum");
}

#[test]
fn doc_examples_show_every_field_the_code_writes() {
    for event in samples() {
        let kind = event.kind();
        let written = data_keys(&serde_json::to_value(&event).unwrap());
        let documented = data_keys(&example_of(&doc_section(kind)));
        assert_eq!(
            documented, written,
            "`## {kind}` example must show every field of the kind, optional ones included"
        );
    }
}

#[test]
fn field_tables_list_exactly_the_fields_of_their_example() {
    for section in doc_sections() {
        let in_table: Vec<&str> = section.table_fields.iter().map(String::as_str).collect();
        let in_example = data_keys(&example_of(&section));
        let unique: BTreeSet<&str> = in_table.iter().copied().collect();
        assert_eq!(unique.len(), in_table.len(), "`## {}` table lists a field twice", section.kind);
        assert_eq!(
            unique,
            in_example.iter().map(String::as_str).collect::<BTreeSet<&str>>(),
            "`## {}` table and example disagree on the fields",
            section.kind
        );
    }
}

#[test]
fn kind_matches_the_serialised_tag_of_every_sample() {
    for event in samples() {
        let value = serde_json::to_value(&event).unwrap();
        assert_eq!(value["kind"], event.kind());
        assert!(value["data"].is_object(), "{} has no data object", event.kind());
    }
}

// ---- encoding ----

#[test]
fn every_sample_survives_a_msgpack_round_trip() {
    for (seq, event) in (1..).zip(samples()) {
        for actor in [Some("synapse-claude-8100"), None] {
            let original = envelope(seq, actor, event.clone());
            let decoded = Envelope::decode(&original.encode()).unwrap();
            assert_eq!(decoded, original, "{} changed in a msgpack round trip", event.kind());
        }
    }
}

#[test]
fn encoded_envelopes_are_maps_with_field_names() {
    let original = envelope(7, Some("synapse-claude-8100"), samples().remove(1));
    let as_value: Value = rmp_serde::from_slice(&original.encode()).unwrap();
    assert_eq!(
        as_value,
        json!({
            "v": SCHEMA_VERSION,
            "seq": 7,
            "time_ms": 1_767_225_600_007_u64,
            "actor": "synapse-claude-8100",
            "event": {"kind": "agent_status_changed", "data": {
                "agent_id": "synapse-claude-8100",
                "status": "WAITING",
                "note": "a dialog is open: messages wait until it is answered"
            }}
        })
    );
}

#[test]
fn an_envelope_from_a_newer_schema_is_refused() {
    let mut newer = envelope(1, None, samples().remove(0));
    newer.v = SCHEMA_VERSION + 1;
    match Envelope::decode(&newer.encode()) {
        Err(DecodeError::NewerSchema { found }) => assert_eq!(found, SCHEMA_VERSION + 1),
        other => panic!("expected NewerSchema, got {other:?}"),
    }
}

#[test]
fn a_newer_envelope_with_an_unknown_kind_is_refused_as_newer_not_malformed() {
    let newer = json!({
        "v": SCHEMA_VERSION + 1,
        "seq": 1,
        "time_ms": 1,
        "event": {"kind": "kind_from_the_future", "data": {"anything": [1, 2, 3]}}
    });
    match decode_value(&newer) {
        Err(DecodeError::NewerSchema { found }) => assert_eq!(found, SCHEMA_VERSION + 1),
        other => panic!("expected NewerSchema, got {other:?}"),
    }
}

#[test]
fn an_unknown_kind_in_the_current_schema_is_malformed() {
    let unknown = json!({"v": SCHEMA_VERSION, "seq": 1, "time_ms": 1, "event": {"kind": "no_such_kind", "data": {}}});
    assert!(matches!(decode_value(&unknown), Err(DecodeError::Malformed(_))));
}

#[test]
fn garbage_bytes_are_malformed() {
    let valid = envelope(1, Some("synapse-claude-8100"), samples().remove(3)).encode();
    let truncated = &valid[..valid.len() / 2];
    let inputs: [&[u8]; 5] = [b"", b"not msgpack at all", &[0xc1], &[0xff, 0x00, 0x13, 0x37], truncated];
    for bytes in inputs {
        match Envelope::decode(bytes) {
            Err(DecodeError::Malformed(reason)) => assert!(!reason.is_empty()),
            other => panic!("expected Malformed for {bytes:?}, got {other:?}"),
        }
    }
}

#[test]
fn an_envelope_without_actor_or_optional_data_fields_still_decodes() {
    // What an older writer, which did not know the optional fields yet, would have stored.
    let older = json!({
        "v": SCHEMA_VERSION,
        "seq": 10,
        "time_ms": 1_767_225_660_000_u64,
        "event": {
            "kind": "task_created",
            "data": {
                "task_id": "e2b94d17",
                "context_id": "0a6f2c8e",
                "direction": "outgoing",
                "state": "working",
                "message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]}
            }
        }
    });
    let decoded = decode_value(&older).unwrap();
    assert_eq!(decoded.actor, None);
    assert_eq!(
        decoded.event,
        Event::TaskCreated {
            task_id: "e2b94d17".into(),
            owner: None,
            context_id: "0a6f2c8e".into(),
            direction: Direction::Outgoing,
            peer: None,
            state: TaskState::Working,
            message: Message::text(Role::User, "hi"),
            priority: 0,
            response_expected: false,
            sender_task_id: None,
            in_reply_to: None,
            peer_task_id: None,
            message_in: None,
        }
    );
}

#[test]
fn defaulted_fields_of_other_kinds_decode_when_absent() {
    let cases = [
        (
            json!({"kind": "reverse_ticket_issued", "data": {"agent_id": "a", "task_id": "t", "from": "b"}}),
            Event::ReverseTicketIssued { agent_id: "a".into(), task_id: "t".into(), from: "b".into(), priority: 0 },
        ),
        (
            json!({"kind": "file_lock_released", "data": {"path": "/p", "agent_id": "a"}}),
            Event::FileLockReleased { path: "/p".into(), agent_id: "a".into(), forced: false },
        ),
        (
            json!({"kind": "message_sent", "data": {"task_id": "t", "to": "b", "priority": 3, "response_expected": false, "text": "x"}}),
            Event::MessageSent {
                task_id: "t".into(),
                from: None,
                to: "b".into(),
                priority: 3,
                response_expected: false,
                sender_task_id: None,
                in_reply_to: None,
                text: "x".into(),
                parts: Vec::new(),
                idempotency_key: None,
                by_user: false,
                unverified_sender: None,
                sender_endpoint: None,
                external_task_id: None,
            },
        ),
    ];
    for (event, expected) in cases {
        let decoded = decode_value(&json!({"v": SCHEMA_VERSION, "seq": 1, "time_ms": 1, "event": event})).unwrap();
        assert_eq!(decoded.event, expected);
    }
}

#[test]
fn unknown_extra_fields_in_data_and_envelope_are_ignored() {
    let newer_fields = json!({
        "v": SCHEMA_VERSION,
        "seq": 3,
        "time_ms": 5,
        "actor": "synapse-claude-8100",
        "trace_id": "from a later version",
        "event": {
            "kind": "agent_status_changed",
            "data": {"agent_id": "synapse-claude-8100", "status": "READY", "reason": "prompt seen", "screen_rows": 42}
        }
    });
    let decoded = decode_value(&newer_fields).unwrap();
    assert_eq!(
        decoded,
        envelope_at(
            3,
            5,
            Event::AgentStatusChanged {
                agent_id: "synapse-claude-8100".into(),
                status: AgentStatus::Ready,
                note: None
            }
        )
    );
}

fn envelope_at(seq: u64, time_ms: u64, event: Event) -> Envelope {
    Envelope { v: SCHEMA_VERSION, seq, time_ms, actor: Some("synapse-claude-8100".into()), event }
}

#[test]
fn older_schema_versions_still_decode() {
    let oldest =
        json!({"v": 0, "seq": 1, "time_ms": 1, "event": {"kind": "external_agent_removed", "data": {"alias": "x"}}});
    assert_eq!(decode_value(&oldest).unwrap().v, 0);
}

#[test]
fn value_types_use_their_documented_spellings() {
    let spelled = |value: Value| value.as_str().unwrap().to_string();
    let statuses = [AgentStatus::Starting, AgentStatus::Ready, AgentStatus::Processing, AgentStatus::Waiting];
    for status in statuses {
        let text = spelled(serde_json::to_value(status).unwrap());
        assert_eq!(text, status.to_string());
        assert_eq!(text.parse::<AgentStatus>().unwrap(), status);
        assert!(EVENTS_DOC.contains(&format!("`{text}`")), "AgentStatus {text} is not in events.md");
    }
    for how in [Delivery::Typed, Delivery::HandedOver, Delivery::Unwritten] {
        let text = spelled(serde_json::to_value(how).unwrap());
        assert_eq!(text, how.to_string());
        assert!(EVENTS_DOC.contains(&format!("`{text}`")), "Delivery {text} is not in events.md");
    }
    let states = TaskState::ALL;
    for state in states {
        let text = spelled(serde_json::to_value(state).unwrap());
        assert_eq!(text, state.as_str());
        assert_eq!(text.parse::<TaskState>().unwrap(), state);
        assert!(EVENTS_DOC.contains(&format!("`{text}`")), "TaskState {text} is not in events.md");
    }
    for (change, text) in
        [(ChangeType::Create, "CREATE"), (ChangeType::Modify, "MODIFY"), (ChangeType::Delete, "DELETE")]
    {
        assert_eq!(serde_json::to_value(change).unwrap(), text);
    }
    assert_eq!(serde_json::to_value(Direction::Incoming).unwrap(), "incoming");
    assert_eq!(serde_json::to_value(Direction::Outgoing).unwrap(), "outgoing");
    assert_eq!(serde_json::to_value(Role::Agent).unwrap(), "agent");
    assert_eq!(
        serde_json::to_value(Part::File { name: None, uri: Some("file:///a".into()), mime_type: None }).unwrap(),
        json!({"type": "file", "uri": "file:///a"})
    );
    assert_eq!(serde_json::to_value(Part::Data { json: "1".into() }).unwrap(), json!({"type": "data", "json": "1"}));
}

#[test]
fn every_sample_has_a_one_line_summary() {
    for event in samples() {
        let summary = event.summary();
        assert!(!summary.is_empty(), "{} has an empty summary", event.kind());
        assert!(!summary.contains('\n'), "{} summary spans lines: {summary:?}", event.kind());
    }
}

// ---- short_id and preview ----

#[test]
fn short_id_keeps_the_first_eight_characters_of_a_uuid() {
    assert_eq!(short_id("7c1f3a52-0d4e-4b8a-9f21-3e5d6c7b8a90"), "7c1f3a52");
}

#[test]
fn short_id_returns_an_id_of_eight_characters_or_fewer_whole() {
    assert_eq!(short_id(""), "");
    assert_eq!(short_id("abc"), "abc");
    assert_eq!(short_id("abcdefgh"), "abcdefgh");
}

#[test]
fn short_id_never_splits_a_multi_byte_character() {
    // The cut is at byte 8: when that falls inside a character the id is returned whole, and it
    // never panics. Every result is a prefix of the id on a character boundary.
    for id in ["日本語のタスクID", "ñandú-1234", "ab🦀cdefghij", "é", "aaaaaaa€bbb"] {
        let short = short_id(id);
        assert!(id.starts_with(short), "{short:?} is not a prefix of {id:?}");
        assert!(short == id || short.len() == 8, "{id:?} gave {short:?}");
    }
    assert_eq!(short_id("ñandú-1234"), "ñandú-"); // 8 bytes, 6 characters
}

#[test]
fn preview_keeps_short_text_unchanged() {
    assert_eq!(preview("hello", 60), "hello");
    assert_eq!(preview("", 5), "");
    assert_eq!(preview("exactly5", 8), "exactly5");
}

#[test]
fn preview_puts_text_on_one_line() {
    assert_eq!(preview("first\nsecond", 60), "first second");
    assert_eq!(preview("dos\r\nline", 60), "dos  line");
    assert_eq!(preview("\n\n", 60), "  ");
}

#[test]
fn preview_cuts_long_text_to_max_characters_ending_in_an_ellipsis() {
    let cut = preview("abcdefghij", 5);
    assert_eq!(cut, "abcd…");
    assert_eq!(cut.chars().count(), 5);
    assert_eq!(preview("line one\nline two", 10), "line one …");
    assert_eq!(preview("abcdefghi", 9), "abcdefghi");
    assert_eq!(preview("abcdefghij", 9), "abcdefgh…");
}

#[test]
fn preview_counts_characters_not_bytes() {
    // Nine characters, 27 bytes: fits in 9, is cut at 8 without splitting a character.
    let japanese = "日本語のテキストだ";
    assert_eq!(preview(japanese, 9), japanese);
    assert_eq!(preview(japanese, 8), "日本語のテキス…");
    assert_eq!(preview("🦀🦀🦀🦀", 3), "🦀🦀…");
    assert_eq!(preview("é\nè", 3), "é è");
}

#[test]
fn a_webhook_registration_from_an_old_log_with_its_secret_inline_still_decodes() {
    // Written by versions before `secret_ref`: the secret in clear, no reference.
    #[derive(serde::Serialize)]
    struct OldData<'a> {
        webhook_id: &'a str,
        url: &'a str,
        events: Vec<&'a str>,
        secret: &'a str,
    }
    #[derive(serde::Serialize)]
    struct OldEvent<'a> {
        kind: &'a str,
        data: OldData<'a>,
    }
    #[derive(serde::Serialize)]
    struct OldEnvelope<'a> {
        v: u32,
        seq: u64,
        time_ms: u64,
        event: OldEvent<'a>,
    }
    let old = OldEnvelope {
        v: SCHEMA_VERSION,
        seq: 7,
        time_ms: 1,
        event: OldEvent {
            kind: "webhook_registered",
            data: OldData { webhook_id: "wh", url: "http://h/", events: vec!["task.completed"], secret: "s3cr3t" },
        },
    };
    let bytes = rmp_serde::to_vec_named(&old).unwrap();
    let decoded = Envelope::decode(&bytes).unwrap();
    match decoded.event {
        Event::WebhookRegistered { ref secret, ref secret_ref, .. } => {
            assert_eq!(secret.as_deref(), Some("s3cr3t"));
            assert_eq!(*secret_ref, None);
        }
        ref other => panic!("decoded as {other:?}"),
    }
    let shown = decoded.to_json().to_string();
    assert!(!shown.contains("s3cr3t") && shown.contains("[redacted]"), "{shown}");
}

/// `Event::KINDS` (what `?kind=` accepts) names every kind, in the enum's order, and no other.
#[test]
fn the_list_of_kinds_is_every_kind() {
    let kinds: Vec<&str> = samples().iter().map(Event::kind).collect();
    assert_eq!(kinds, Event::KINDS);
}

/// The dashboard follows `/events` by kind (an SSE listener per kind): a kind missing from its
/// list never showed live, only after a reload.
#[test]
fn the_dashboard_follows_every_event_kind() {
    let page = include_str!("../http/dashboard/app.js");
    let list = page.split("const EVENT_KINDS = [").nth(1).and_then(|rest| rest.split("];").next()).expect("the list");
    for event in samples() {
        assert!(list.contains(&format!("'{}'", event.kind())), "app.js's EVENT_KINDS lacks {}", event.kind());
    }
}
