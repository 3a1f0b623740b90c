//! The typed contract (`synapse::api`) against a real broker: every answer the CLI and the
//! wrappers read parses into its type and writes back to exactly the JSON the broker sent, so
//! the types lose nothing and invent nothing (the unit tests in `src/api` check the shapes on
//! examples; this checks them on the wire).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Home;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use synapse::api;

/// `raw` parses as `T` and writes back unchanged.
fn round_trips<T: Serialize + DeserializeOwned>(what: &str, raw: &Value) {
    let parsed: T = serde_json::from_value(raw.clone())
        .unwrap_or_else(|error| panic!("{what}: {} does not parse {raw}: {error}", std::any::type_name::<T>()));
    assert_eq!(&serde_json::to_value(&parsed).unwrap(), raw, "{what}: {} changes the JSON", std::any::type_name::<T>());
}

fn ok(home: &Home, method: &str, path: &str, body: Option<Value>, headers: &[(&str, &str)]) -> Value {
    let bytes = body.map(|body| serde_json::to_vec(&body).unwrap());
    let (status, answer) = home.http(method, path, bytes.as_deref(), headers);
    assert_eq!(status, 200, "{method} {path}: {answer}");
    answer
}

#[test]
fn every_answer_the_clients_read_round_trips_through_its_api_type() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    round_trips::<api::BrokerInfo>("health", &ok(&home, "GET", "/broker/health", None, &[]));

    let ask = api::SendRequest {
        from: Some(alice.id.clone()),
        secret: Some(alice.secret.clone()),
        response_expected: true,
        ..api::SendRequest::new("bob", "what is 6 x 7?")
    };
    let sent = ok(&home, "POST", "/send", Some(serde_json::to_value(&ask).unwrap()), &[]);
    round_trips::<api::SendAnswer>("send", &sent);
    let task_id = sent["task"]["id"].as_str().unwrap().to_string();
    let sender_task = sent["sender_task"]["id"].as_str().unwrap().to_string();

    round_trips::<api::AgentList>("agents", &ok(&home, "GET", "/agents", None, &[]));
    let status_path = format!("/agents/{}/status", bob.id);
    round_trips::<api::AgentStatusView>("agent status", &ok(&home, "GET", &status_path, None, &[]));
    let bob_secret = [(api::SECRET_HEADER, bob.secret.as_str())];
    let set = ok(&home, "POST", &status_path, Some(json!({"status": "READY", "note": "busy"})), &bob_secret);
    round_trips::<api::Outcome>("status set", &set);
    let inbox = ok(&home, "GET", &format!("/agents/{}/inbox", bob.id), None, &bob_secret);
    round_trips::<api::Inbox>("inbox", &inbox);
    let ticket = inbox["tickets"][0]["ticket"].as_u64().unwrap();
    let acked = ok(&home, "POST", &format!("/agents/{}/inbox/{ticket}/ack", bob.id), None, &bob_secret);
    round_trips::<api::Outcome>("ack", &acked);
    let targets = ok(&home, "GET", &format!("/agents/{}/reply-stack/list", bob.id), None, &[]);
    round_trips::<api::ReplyTargets>("reply targets", &targets);
    round_trips::<api::TaskAnswer>("task", &ok(&home, "GET", &format!("/tasks/{task_id}"), None, &[]));
    let waited = ok(&home, "GET", &format!("/tasks/{sender_task}/wait?timeout_ms=1"), None, &[]);
    round_trips::<api::TaskWait>("wait (timed out)", &waited);

    let reply = api::ReplyRequest {
        from: bob.id.clone(),
        secret: Some(bob.secret.clone()),
        to: None,
        text: "42".into(),
        idempotency_key: None,
    };
    let replied = ok(&home, "POST", "/reply", Some(serde_json::to_value(&reply).unwrap()), &[]);
    round_trips::<api::SendAnswer>("reply", &replied);
    let waited = ok(&home, "GET", &format!("/tasks/{sender_task}/wait?timeout_ms=5000"), None, &[]);
    round_trips::<api::TaskWait>("wait (final)", &waited);
    assert_eq!(waited["reply"], "42");

    round_trips::<api::HistoryRecords>("history", &ok(&home, "GET", "/history?limit=10", None, &[]));
    round_trips::<api::HistoryStats>("history stats", &ok(&home, "GET", "/history/stats", None, &[]));
    round_trips::<api::HistoryRecords>("thread", &ok(&home, "GET", &format!("/threads/{task_id}"), None, &[]));
    round_trips::<api::VerifyReport>("verify", &ok(&home, "POST", "/admin/verify", None, &[]));
    let alice_secret = [(api::SECRET_HEADER, alice.secret.as_str())];
    let gone = ok(&home, "DELETE", &format!("/agents/{}", alice.id), None, &alice_secret);
    round_trips::<api::Deregistered>("deregister", &gone);
}

#[test]
fn an_acknowledgement_with_next_answers_the_inbox_as_it_stands_after_it() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let carol = home.register(Some("carol"));
    for text in ["first", "second"] {
        ok(&home, "POST", "/send", Some(serde_json::to_value(api::SendRequest::new("bob", text)).unwrap()), &[]);
    }
    let bob_secret = [(api::SECRET_HEADER, bob.secret.as_str())];
    let inbox = ok(&home, "GET", &format!("/agents/{}/inbox", bob.id), None, &bob_secret);
    let first = inbox["tickets"][0]["ticket"].as_u64().unwrap();
    let second = inbox["tickets"][1]["ticket"].as_u64().unwrap();
    let ack = |ticket: u64, query: &str| format!("/agents/{}/inbox/{ticket}/ack{query}", bob.id);

    // Bad queries are refused before anything is stored; so is another agent's secret.
    for query in ["?limit=1", "?next=maybe", "?next=true&limit=x", "?next=true&wait_ms=5", "?how=pasted", "?how="] {
        let (status, body) = home.http("POST", &ack(first, query), None, &bob_secret);
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body["error"].as_str().is_some_and(|error| !error.is_empty()), "{query}: {body}");
    }
    let carol_secret = [(api::SECRET_HEADER, carol.secret.as_str())];
    let (status, body) = home.http("POST", &ack(first, "?next=true"), None, &carol_secret);
    assert_eq!(status, 403, "{body}");
    let still = ok(&home, "GET", &format!("/agents/{}/inbox", bob.id), None, &bob_secret);
    assert_eq!(still["tickets"].as_array().unwrap().len(), 2, "nothing was acknowledged: {still}");

    // The first acknowledged: the answer names it and shows the second, with its text.
    let answered = ok(&home, "POST", &ack(first, "?next=true&limit=1&how=typed"), None, &bob_secret);
    round_trips::<api::AckAndInbox>("ack with next", &answered);
    assert_eq!(answered["ticket"], first);
    assert_eq!(answered["inbox"]["agent_id"], bob.id.as_str());
    let tickets = answered["inbox"]["tickets"].as_array().unwrap();
    assert_eq!(tickets.len(), 1, "{answered}");
    assert_eq!(tickets[0]["ticket"], second);
    assert_eq!(tickets[0]["text"], "second");

    // Acknowledged once: again is 404, and the inbox is unchanged by it.
    let (status, body) = home.http("POST", &ack(first, "?next=true"), None, &bob_secret);
    assert_eq!(status, 404, "{body}");
    let answered = ok(&home, "POST", &ack(second, "?next=true"), None, &bob_secret);
    assert_eq!(answered["ticket"], second);
    assert_eq!(answered["inbox"]["tickets"], json!([]), "{answered}");
    let acknowledged: Vec<Value> =
        home.events().into_iter().filter(|event| event["event"]["kind"] == "ticket_injected").collect();
    assert_eq!(acknowledged.len(), 2);
    // How each reached the CLI, when the acknowledgement said.
    assert_eq!(acknowledged[0]["event"]["data"]["how"], "typed", "{:?}", acknowledged[0]);
    assert!(acknowledged[1]["event"]["data"].get("how").is_none(), "{:?}", acknowledged[1]);
}

/// schema/openapi.json is data written by tools/gen_openapi.py: a hand edit of the JSON that
/// the generator lacks would be lost at its next run (it happened once).
#[test]
fn the_committed_openapi_document_is_what_its_generator_writes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let written = std::env::temp_dir().join(format!("synapse-openapi-{}.json", std::process::id()));
    let run = std::process::Command::new("python3")
        .arg(root.join("tools/gen_openapi.py"))
        .arg(&written)
        .output()
        .expect("python3 runs the generator");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let generated = std::fs::read_to_string(&written).unwrap();
    let _ = std::fs::remove_file(&written);
    let committed = std::fs::read_to_string(root.join("schema/openapi.json")).unwrap();
    assert!(
        generated == committed,
        "schema/openapi.json differs from what tools/gen_openapi.py writes: edit the generator and run it"
    );
}
