//! Webhooks against a real local HTTP receiver (issue 6, item 2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Duration;

fn next(received: &Receiver<Received>) -> Received {
    received.recv_timeout(Duration::from_secs(30)).expect("a webhook delivery")
}

fn start_broker(home: &Home) {
    let output = home.cmd(&["broker", "start"]).env("SYNAPSE_WEBHOOK_RETRY_BASE_MS", "20").output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
}

fn register_hook(home: &Home, body: Value) -> (u16, Value) {
    home.http("POST", "/webhooks", Some(body.to_string().as_bytes()), &[])
}

#[test]
fn deliveries_are_signed_retried_on_5xx_and_finish_on_success() {
    let home = Home::new();
    start_broker(&home);
    let status = Arc::new(AtomicU16::new(500));
    let (port, received) = receiver(status.clone());
    let url = format!("http://127.0.0.1:{port}/hook");
    let (code, hook) = register_hook(&home, json!({"url": url, "events": ["task.replied"], "secret": "s3cret"}));
    assert_eq!(code, 200, "{hook}");
    assert_eq!(hook["webhook"]["events"], json!(["task.replied"]));
    let (_, listed) = home.http("GET", "/webhooks", None, &[]);
    assert_eq!(listed["webhooks"][0]["url"], url.as_str());
    assert!(listed["webhooks"][0].get("secret").is_none(), "secrets are never shown");

    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    assert!(home.run_as(&alice, &["send", "bob", "question"]).status.success());
    assert!(home.run_as(&bob, &["reply", "answer"]).status.success());

    let first = next(&received);
    assert_eq!(first.answered, 500);
    assert_eq!(first.header("x-synapse-event"), Some("task.replied"));
    let event_id = first.header("x-synapse-event-id").unwrap().to_string();
    status.store(200, Ordering::SeqCst);
    // A retry may have come in before the switch to 200 (backoff is short): it got a 500 too.
    let mut attempts = 1;
    let second = loop {
        let attempt = next(&received);
        attempts += 1;
        if attempt.answered == 200 {
            break attempt;
        }
        assert_eq!(attempt.header("x-synapse-event-id"), Some(event_id.as_str()), "a retry keeps the delivery id");
    };
    assert_eq!(second.header("x-synapse-event-id"), Some(event_id.as_str()), "a retry keeps the delivery id");
    assert_eq!(second.body, first.body);
    let body = second.json();
    assert_eq!(body["event"], "task.replied");
    assert_eq!(body["event_id"], event_id.as_str());
    assert_eq!(body["data"]["text"], "answer");
    let signature = synapse::broker::webhooks::hmac_sha256(b"s3cret", second.body.as_bytes());
    let expected: String = signature.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(second.header("x-synapse-signature"), Some(format!("sha256={expected}").as_str()));

    // The delivery is finished: it is listed as delivered, with every attempt counted.
    // Wait for the successful attempt to be recorded in the log.
    let mut follower = home
        .cmd(&["events", "--follow", "--json", "--kind", "webhook_delivery_attempted"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    for line in lines {
        let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if event["event"]["data"]["status"] == 200 {
            break;
        }
    }
    follower.kill().unwrap();
    follower.wait().unwrap();
    let (_, deliveries) = home.http("GET", "/webhooks/deliveries", None, &[]);
    assert_eq!(deliveries["deliveries"][0]["state"], "delivered", "{deliveries}");
    assert_eq!(deliveries["deliveries"][0]["attempts"], attempts);
    assert!(received.recv_timeout(Duration::from_millis(300)).is_err(), "nothing is sent twice after success");
}

#[test]
fn a_4xx_answer_is_not_retried() {
    let home = Home::new();
    start_broker(&home);
    let (port, received) = receiver(Arc::new(AtomicU16::new(404)));
    let (code, _) =
        register_hook(&home, json!({"url": format!("http://127.0.0.1:{port}/"), "events": ["task.canceled"]}));
    assert_eq!(code, 200);
    let bob = home.register(Some("bob"));
    // One-way (silent): one task, so one cancellation to report.
    let message =
        br#"{"message":{"role":"user","parts":[{"type":"text","text":"x"}]},"metadata":{"response_mode":"silent"}}"#;
    let (_, sent) = http_tcp(bob.port, "POST", "/tasks/send", Some(message), &[]);
    let task = sent["task"]["id"].as_str().unwrap();
    let (code, _) = http_tcp(bob.port, "POST", &format!("/tasks/{task}/cancel"), None, &[]);
    assert_eq!(code, 200);
    let only = next(&received);
    assert_eq!(only.answered, 404);
    assert!(only.header("x-synapse-signature").is_none(), "no secret, no signature");
    assert!(received.recv_timeout(Duration::from_millis(500)).is_err(), "a 4xx is final");
}

#[test]
fn registrations_and_pending_deliveries_survive_a_broker_restart() {
    survive_a_restart(None);
}

/// The same with the delivery worker saving its snapshot at every change: the restarted broker
/// starts from the snapshot, not from the log's first event, and answers the same.
#[test]
fn registrations_and_pending_deliveries_survive_a_restart_from_the_delivery_snapshot() {
    survive_a_restart(Some("1"));
}

fn survive_a_restart(snapshot_every: Option<&str>) {
    let home = Home::new();
    let start_broker = |home: &Home| {
        let mut command = home.cmd(&["broker", "start"]);
        command.env("SYNAPSE_WEBHOOK_RETRY_BASE_MS", "20");
        if let Some(every) = snapshot_every {
            command.env("SYNAPSE_DELIVERY_SNAPSHOT_EVERY", every);
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", describe(&output));
    };
    start_broker(&home);
    let status = Arc::new(AtomicU16::new(503));
    let (port, received) = receiver(status.clone());
    let (code, _) =
        register_hook(&home, json!({"url": format!("http://127.0.0.1:{port}/"), "events": ["task.canceled"]}));
    assert_eq!(code, 200);
    let bob = home.register(Some("bob"));
    let message = br#"{"message":{"role":"user","parts":[{"type":"text","text":"x"}]}}"#;
    let (_, sent) = http_tcp(bob.port, "POST", "/tasks/send", Some(message), &[]);
    let task = sent["task"]["id"].as_str().unwrap();
    http_tcp(bob.port, "POST", &format!("/tasks/{task}/cancel"), None, &[]);
    let failed = next(&received);
    assert_eq!(failed.answered, 503);
    let event_id = failed.header("x-synapse-event-id").unwrap().to_string();
    // The failed attempt is in the log (and, with a snapshot at every change, in a snapshot
    // soon after) before the broker dies.
    let attempts = |home: &Home| {
        let (_, deliveries) = home.http("GET", "/webhooks/deliveries", None, &[]);
        let listed = deliveries["deliveries"].as_array().unwrap().clone();
        listed
            .iter()
            .find(|delivery| delivery["delivery_id"] == event_id.as_str())
            .map(|delivery| (delivery["attempts"].as_u64().unwrap(), delivery["state"].as_str().unwrap().to_string()))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while attempts(&home).is_none_or(|(attempts, _)| attempts == 0) {
        assert!(std::time::Instant::now() < deadline, "the failed attempt was not recorded");
        std::thread::sleep(Duration::from_millis(10));
    }
    home.kill_broker();
    status.store(200, Ordering::SeqCst);
    start_broker(&home);
    // The restarted broker replays its outbox and delivers the same event. The send expects a
    // reply, so the cancel ends two tasks (the anonymous sender's side too): two deliveries are
    // pending and the outbox may retry either first.
    loop {
        let request = next(&received);
        if request.answered == 200 && request.header("x-synapse-event-id") == Some(event_id.as_str()) {
            break;
        }
    }
    let (_, listed) = home.http("GET", "/webhooks", None, &[]);
    assert_eq!(listed["webhooks"].as_array().unwrap().len(), 1, "the registration survived");
    // The attempt before the restart counts; the one that succeeded may not be recorded yet.
    let (count, state) = attempts(&home).expect("the delivery is listed");
    assert!(count >= 1 && (count >= 2 || state == "pending"), "{count} attempts, {state}");
    let log = std::fs::read_to_string(home.home().join("broker.log")).unwrap();
    let resumed = log.contains("delivery worker: resumed from its snapshot");
    assert_eq!(resumed, snapshot_every.is_some(), "{log}");
}

/// A retired secret file the worker cannot delete stays retired (in its snapshot too) and is
/// deleted at a later pass, once it can be.
#[test]
fn a_retired_secret_that_cannot_be_deleted_is_deleted_later() {
    let home = Home::new();
    let output = home.cmd(&["broker", "start"]).env("SYNAPSE_DELIVERY_SNAPSHOT_EVERY", "1").output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let (code, _) = register_hook(&home, json!({"url": "http://127.0.0.1:9/", "secret": "s3cret"}));
    assert_eq!(code, 200);
    let secrets = home.home().join("webhook-secrets");
    let file = std::fs::read_dir(&secrets).unwrap().flatten().next().expect("the secret's file").path();
    // A directory with something in it where the file was: removing it as a file fails.
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    std::fs::write(file.join("keep"), b"x").unwrap();
    let (code, _) = home.http("DELETE", "/webhooks?url=http://127.0.0.1:9/", None, &[]);
    assert_eq!(code, 200);
    let (_, listed) = home.http("GET", "/webhooks", None, &[]);
    assert!(listed["webhooks"].as_array().unwrap().is_empty());
    // The worker tried and said so.
    let log = home.home().join("broker.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("cannot delete the retired secret") {
        assert!(std::time::Instant::now() < deadline, "the worker did not try to delete the secret");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(file.is_dir());
    std::fs::remove_dir_all(&file).unwrap();
    std::fs::write(&file, b"s3cret").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while file.exists() {
        assert!(std::time::Instant::now() < deadline, "the retired secret was never deleted");
        // Any event makes the worker pass again.
        home.register(None);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_registrations_are_refused_and_removal_needs_a_registered_url() {
    let home = Home::new();
    start_broker(&home);
    let head = home.head();
    for (body, expected) in [
        (json!({"url": "https://example.test/"}), "only http://"),
        (json!({"url": "not a url"}), "not an http:// URL"),
        (json!({"url": "http://127.0.0.1:9/", "events": ["task.exploded"]}), "Unknown webhook event"),
        // Its secret was written to a file before the refusal, and the file stayed for good.
        (json!({"url": "http://127.0.0.1:9/", "events": ["task.exploded"], "secret": "s"}), "Unknown webhook event"),
    ] {
        let (code, answer) = register_hook(&home, body);
        assert_eq!(code, 400, "{answer}");
        assert!(answer["message"].as_str().unwrap().contains(expected), "{answer}");
    }
    let (code, _) = home.http("POST", "/webhooks", Some(br#"{"url":"http://127.0.0.1:9/","colour":1}"#), &[]);
    assert_eq!(code, 400);
    assert_eq!(home.head(), head, "nothing appended");
    let secrets = home.home().join("webhook-secrets");
    let files = || std::fs::read_dir(&secrets).map(|dir| dir.flatten().count()).unwrap_or(0);
    assert_eq!(files(), 0, "no secret file is left by a refused registration");
    let (code, _) = home.http("DELETE", "/webhooks?url=http://127.0.0.1:9/", None, &[]);
    assert_eq!(code, 404);
    let (code, _) = register_hook(&home, json!({"url": "http://127.0.0.1:9/", "secret": "s3cret-to-forget"}));
    assert_eq!(code, 200);
    assert_eq!(files(), 1, "the signing secret is kept in a file");
    // Another spelling of the same target is the same hook, not a second one.
    let (code, answer) = register_hook(&home, json!({"url": "HTTP://127.0.0.1:9#again"}));
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["webhook"]["url"], "http://127.0.0.1:9/", "{answer}");
    let (_, listed) = home.http("GET", "/webhooks", None, &[]);
    assert_eq!(listed["webhooks"].as_array().unwrap().len(), 1, "{listed}");
    let (code, _) = home.http("DELETE", "/webhooks?url=http://127.0.0.1:9", None, &[]);
    assert_eq!(code, 200);
    let (_, listed) = home.http("GET", "/webhooks", None, &[]);
    assert!(listed["webhooks"].as_array().unwrap().is_empty());
    // The removed hook's secret file goes too (the delivery worker deletes it after the event).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while files() > 0 {
        assert!(std::time::Instant::now() < deadline, "the removed hook's secret file stayed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Answers one held HTTP request with 200 (after reading what it sent) and closes it.
fn answer_ok(mut stream: std::net::TcpStream) {
    use std::io::{Read, Write};
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut request = Vec::new();
    let mut chunk = [0_u8; 65536];
    while let Ok(read) = stream.read(&mut chunk) {
        if read == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&request);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= length {
                break;
            }
        }
    }
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

/// A receiver that holds every connection it accepts (unanswered, in `held`) until `answering`
/// is set, and answers 200 to those that come after; `connections` counts them all.
struct Holding {
    port: u16,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    held: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    answering: Arc<std::sync::atomic::AtomicBool>,
}

fn holding_receiver() -> Holding {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let holding = Holding {
        port: listener.local_addr().unwrap().port(),
        connections: Arc::default(),
        held: Arc::default(),
        answering: Arc::default(),
    };
    let (connections, held, answering) = (holding.connections.clone(), holding.held.clone(), holding.answering.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            connections.fetch_add(1, Ordering::SeqCst);
            if answering.load(Ordering::SeqCst) {
                std::thread::spawn(move || answer_ok(stream));
            } else {
                held.lock().unwrap().push(stream);
            }
        }
    });
    holding
}

/// Deliveries share a bounded number of attempts at once: receivers that hold every request
/// get at most that many connections; the rest are sent once those end. (Each delivery had its
/// own connection at once: forty hooks and one burst of events took forty sockets, and enough
/// of them ran the broker out of file descriptors for its own clients.)
#[test]
fn deliveries_under_way_at_once_are_bounded_and_the_rest_follow() {
    const HOOKS: usize = 40;
    const AT_ONCE: usize = synapse::broker::delivery::MAX_ATTEMPTS_AT_ONCE;
    let home = Home::new();
    start_broker(&home);
    let Holding { port, connections, held, answering } = holding_receiver();
    for hook in 0..HOOKS {
        let (code, answer) = register_hook(
            &home,
            json!({"url": format!("http://127.0.0.1:{port}/h{hook}"), "events": ["task.replied"]}),
        );
        assert_eq!(code, 200, "{answer}");
    }
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    assert!(home.run_as(&alice, &["send", "bob", "question"]).status.success());
    assert!(home.run_as(&bob, &["reply", "answer"]).status.success());
    let wait_for = |count: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while connections.load(Ordering::SeqCst) < count {
            assert!(std::time::Instant::now() < deadline, "{} connections", connections.load(Ordering::SeqCst));
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for(AT_ONCE);
    // Watched for a second: no attempt beyond the bound starts while those are held.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(connections.load(Ordering::SeqCst), AT_ONCE, "attempts under way at once");
    answering.store(true, Ordering::SeqCst);
    for stream in held.lock().unwrap().drain(..) {
        std::thread::spawn(move || answer_ok(stream));
    }
    wait_for(HOOKS);
    // Every delivery is recorded as delivered.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, deliveries) = home.http("GET", "/webhooks/deliveries", None, &[]);
        let delivered =
            deliveries["deliveries"].as_array().unwrap().iter().filter(|d| d["state"] == "delivered").count();
        if delivered == HOOKS {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{delivered} delivered: {deliveries}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A stop does not wait for a receiver that holds its attempt: the attempt ends where it is,
/// unrecorded, and the restarted broker makes it again. (The attempt ran to its own limit while
/// the broker waited to exit, and was recorded as a failed attempt.)
#[test]
fn an_attempt_under_way_ends_with_the_stop_and_is_made_again_after_the_restart() {
    let home = Home::new();
    start_broker(&home);
    let Holding { port, connections, held, answering } = holding_receiver();
    let (code, answer) =
        register_hook(&home, json!({"url": format!("http://127.0.0.1:{port}/"), "events": ["task.replied"]}));
    assert_eq!(code, 200, "{answer}");
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    assert!(home.run_as(&alice, &["send", "bob", "question"]).status.success());
    assert!(home.run_as(&bob, &["reply", "answer"]).status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while connections.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "no attempt reached the receiver");
        std::thread::sleep(Duration::from_millis(10));
    }
    let stopped = home.run(&["broker", "stop"]);
    assert!(stopped.status.success(), "{}", describe(&stopped));
    answering.store(true, Ordering::SeqCst);
    start_broker(&home);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let deliveries = loop {
        let (_, deliveries) = home.http("GET", "/webhooks/deliveries", None, &[]);
        let listed = deliveries["deliveries"].as_array().unwrap().clone();
        if !listed.is_empty() && listed.iter().all(|delivery| delivery["state"] == "delivered") {
            break listed;
        }
        assert!(std::time::Instant::now() < deadline, "not delivered: {deliveries}");
        std::thread::sleep(Duration::from_millis(20));
    };
    for delivery in &deliveries {
        assert_eq!(delivery["attempts"], 1, "the attempt the stop ended is not counted: {delivery}");
    }
    drop(held);
}
