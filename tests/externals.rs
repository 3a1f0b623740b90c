//! External agents: a second Synapse broker acts as the external agent; unreachable, slow and
//! malformed endpoints give clear errors in bounded time (issue 6, item 3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A command against the local broker; a broker it starts saves the delivery worker's snapshot
/// (which holds the external agents) at every change, so that a restart starts from it.
fn local(home: &Home, args: &[&str]) -> std::process::Output {
    home.cmd(args)
        .env("SYNAPSE_EXTERNAL_TIMEOUT_MS", "700")
        .env("SYNAPSE_DELIVERY_SNAPSHOT_EVERY", "1")
        .output()
        .unwrap()
}

/// An auto-replying dummy named bob, started in `remote` (another broker); its announcement.
fn remote_bob(remote: &Home) -> Value {
    let started = remote
        .cmd(&["start", "dummy", "--name", "bob", "--json"])
        .env("SYNAPSE_DUMMY_AUTO_REPLY", "1")
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    serde_json::from_slice(&started.stdout).unwrap()
}
/// Issue 14: `synapse send <alias>` did not reach an agent added with `synapse external add`.
/// With no local agent of that name, it goes to the external agent, with the flags that apply
/// there; the ones that name things of this broker are refused clearly.
#[test]
fn send_to_an_external_alias_reaches_the_external_agent() {
    let remote = Home::new();
    let bob = remote_bob(&remote);
    let home = Home::new();
    home.ok(&["external", "add", &format!("http://127.0.0.1:{}", bob["port"]), "--alias", "remote-bob"]);

    let asked = local(&home, &["send", "remote-bob", "ping through send", "--wait", "30"]);
    assert!(asked.status.success(), "{}", describe(&asked));
    assert!(
        stdout(&asked).contains("Auto-reply") && stdout(&asked).contains("ping through send"),
        "{}",
        describe(&asked)
    );
    let told = local(&home, &["send", "remote-bob", "just so you know", "--no-response", "--json"]);
    assert!(told.status.success(), "{}", describe(&told));
    let told: Value = serde_json::from_slice(&told.stdout).unwrap();
    assert!(told["task"]["id"].is_string(), "the remote task: {told}");
    let remote_events = remote.ok(&["events", "--json"]);
    assert!(remote_events.contains("just so you know"), "bob's broker got it: {remote_events}");

    let alice = home.register(Some("alice"));
    for (flag, value) in [("--reply-to", "1a2b3c4d"), ("--idempotency-key", "k")] {
        let refused = local(&home, &["send", "remote-bob", "hi", flag, value]);
        assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
        assert!(
            stderr(&refused)
                .contains(&format!("'remote-bob' is an external agent (synapse external list): {flag} cannot apply")),
            "{}",
            describe(&refused)
        );
    }
    // External agents are the user's: an agent is told so.
    let from_agent = home.run_as(&alice, &["send", "remote-bob", "hi"]);
    assert_eq!(from_agent.status.code(), Some(1), "{}", describe(&from_agent));
    assert!(stderr(&from_agent).contains("for the user only"), "{}", describe(&from_agent));
    let nobody = home.run(&["send", "nobody", "hi"]);
    assert_eq!(nobody.status.code(), Some(1), "{}", describe(&nobody));
    assert!(stderr(&nobody).contains("No agent found matching 'nobody'"), "{}", describe(&nobody));
    // A local agent of that name comes first.
    let local_bob = home.register(Some("remote-bob"));
    let sent = home.ok(&["send", "remote-bob", "to the local one", "--no-response"]);
    assert!(sent.contains(&format!("Sent to {}", local_bob.id)), "{sent}");
    let _ = remote.run(&["stop", "bob"]);
}

#[test]
fn an_agent_of_another_broker_is_added_asked_and_answers() {
    let remote = Home::new();
    let bob = remote_bob(&remote);
    let url = format!("http://127.0.0.1:{}", bob["port"]);

    let home = Home::new();
    let added = local(&home, &["external", "add", &url, "--alias", "remote-bob"]);
    assert!(added.status.success(), "{}", describe(&added));
    assert!(stdout(&added).contains("remote-bob") && stdout(&added).contains("bob"), "{}", describe(&added));
    let listed = home.ok(&["external", "list"]);
    assert!(listed.contains("remote-bob") && listed.contains(&url), "{listed}");
    let info: Value = serde_json::from_str(&home.ok(&["external", "info", "remote-bob"])).unwrap();
    assert_eq!(info["url"], url.as_str());
    let again = local(&home, &["external", "add", &url, "--alias", "remote-bob"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("taken"), "{}", describe(&again));

    let asked = local(&home, &["external", "send", "remote-bob", "ping over the wire", "--wait", "30"]);
    assert!(asked.status.success(), "{}", describe(&asked));
    assert!(
        stdout(&asked).contains("Auto-reply") && stdout(&asked).contains("ping over the wire"),
        "{}",
        describe(&asked)
    );
    let fire = local(&home, &["external", "send", "remote-bob", "no wait"]);
    assert!(fire.status.success(), "{}", describe(&fire));

    // The registration is an event: it survives a restart of the local broker (which starts
    // from the delivery worker's snapshot, saved at every change here, and the log after it).
    home.kill_broker();
    assert!(home.ok(&["external", "list"]).contains("remote-bob"));
    assert!(home.ok(&["external", "remove", "remote-bob"]).contains("Removed remote-bob"));
    let gone = home.run(&["external", "info", "remote-bob"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(stderr(&gone).contains("No external agent 'remote-bob'"));
    let _ = remote.run(&["stop", "bob"]);
}

#[test]
fn unreachable_slow_and_malformed_endpoints_fail_clearly_and_quickly() {
    let home = Home::new();
    // Nothing listens on this port, and no listener can take it while `held` lives: it is the
    // local end of a connection. (A port freed by dropping a listener was once taken by the
    // broker this very command started, which then refused itself as a target.)
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let held = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let free = held.local_addr().unwrap().port();
    let refused = local(&home, &["external", "add", &format!("http://127.0.0.1:{free}")]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("cannot reach"), "{}", describe(&refused));

    // Accepts, never answers.
    let slow = TcpListener::bind("127.0.0.1:0").unwrap();
    let slow_port = slow.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in slow.incoming().flatten() {
            held.push(stream);
        }
    });
    let started = Instant::now();
    let timed_out = local(&home, &["external", "add", &format!("http://127.0.0.1:{slow_port}")]);
    assert_eq!(timed_out.status.code(), Some(1));
    assert!(stderr(&timed_out).contains("did not answer within"), "{}", describe(&timed_out));
    assert!(started.elapsed() < Duration::from_secs(10), "bounded by the timeout");

    // Answers 200 with something that is not an agent card.
    let malformed = TcpListener::bind("127.0.0.1:0").unwrap();
    let malformed_port = malformed.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in malformed.incoming().flatten() {
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nnot json");
        }
    });
    let bad = local(&home, &["external", "add", &format!("http://127.0.0.1:{malformed_port}")]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("malformed agent card"), "{}", describe(&bad));

    for (args, expected) in [
        (vec!["external", "add", "https://secure.example/"], "only http://"),
        (vec!["external", "add", "http://127.0.0.1:9", "--alias", "bad alias"], "Invalid alias"),
        (vec!["external", "add", "http://127.0.0.1:9/a2a?token=x"], "without a query"),
        (vec!["external", "add", "http://127.0.0.1:9/#top"], "without a query"),
        (vec!["external", "send", "nobody", "hi"], "No external agent 'nobody'"),
    ] {
        let output = local(&home, &args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(stderr(&output).contains(expected), "{args:?}: {}", describe(&output));
    }
    assert!(home.ok(&["external", "list"]).contains("No external agents"));
}

/// How a fake external A2A agent behaves.
#[derive(Clone, Copy)]
struct Fake {
    /// Its agent card (a JSON text).
    card: &'static str,
    /// `POST /tasks/send` is refused with a 500 and this body; None answers a working task
    /// `remote-1`.
    refusal: Option<&'static str>,
    /// The event stream of `remote-1` (the bytes of the whole stream); None: it has none (a
    /// Python Synapse agent has none either).
    events: Option<&'static str>,
    /// `POST /tasks/send` takes the message and never answers; once the broker closes the
    /// connection, `{"closed": true}` follows the message on the channel.
    holds: bool,
    /// The event stream of `remote-1` stays open after `events` (until the broker closes it);
    /// `{"subscribed": true}` goes on the channel when it is asked for.
    holds_stream: bool,
}

const FAKE: Fake =
    Fake { card: r#"{"name":"Fake Reviewer"}"#, refusal: None, events: None, holds: false, holds_stream: false };

/// A fake external A2A agent: its card, and `POST /tasks/send` answered with a working task
/// (or refused with a 500, when `refuses`); every message it gets is passed on through the
/// channel.
fn fake_external(refuses: bool) -> (u16, std::sync::mpsc::Receiver<Value>) {
    fake_external_as(if refuses { Fake { refusal: Some(r#"{"message":"out of order"}"#), ..FAKE } } else { FAKE })
}

/// A fake external A2A agent that behaves as `fake` says; every message it gets is passed on
/// through the channel.
fn fake_external_as(fake: Fake) -> (u16, std::sync::mpsc::Receiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            let head_end = loop {
                let Ok(read) = stream.read(&mut buffer) else { break None };
                if read == 0 {
                    break None;
                }
                request.extend_from_slice(&buffer[..read]);
                if let Some(end) = request.windows(4).position(|window| window == b"\r\n\r\n") {
                    break Some(end + 4);
                }
            };
            let Some(head_end) = head_end else { continue };
            let head = String::from_utf8_lossy(&request[..head_end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                })
                .and_then(|value| value.parse().ok())
                .unwrap_or(0);
            while request.len() < head_end + length {
                let Ok(read) = stream.read(&mut buffer) else { break };
                if read == 0 {
                    break;
                }
                request.extend_from_slice(&buffer[..read]);
            }
            if let Some(stream_body) = fake.events
                && head.starts_with("GET /tasks/remote-1/subscribe")
            {
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n{stream_body}"
                    )
                    .as_bytes(),
                );
                if fake.holds_stream {
                    let _ = sender.send(serde_json::json!({"subscribed": true}));
                    std::thread::spawn(move || {
                        let mut rest = [0u8; 256];
                        while matches!(stream.read(&mut rest), Ok(read) if read > 0) {}
                    });
                }
                continue;
            }
            let (status, body) = if head.starts_with("GET /.well-known/agent-card.json") {
                ("200 OK", fake.card.to_string())
            } else if head.starts_with("POST /tasks/send") {
                let message: Value = serde_json::from_slice(&request[head_end..]).unwrap_or(Value::Null);
                let _ = sender.send(message);
                if fake.holds {
                    let closed = sender.clone();
                    std::thread::spawn(move || {
                        let mut rest = [0u8; 256];
                        while matches!(stream.read(&mut rest), Ok(read) if read > 0) {}
                        let _ = closed.send(serde_json::json!({"closed": true}));
                    });
                    continue;
                }
                if let Some(refusal) = fake.refusal {
                    ("500 Internal Server Error", refusal.to_string())
                } else {
                    ("200 OK", r#"{"task":{"id":"remote-1","status":"working"}}"#.to_string())
                }
            } else {
                ("404 Not Found", r#"{"error":"no"}"#.to_string())
            };
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    (port, received)
}

/// Issue 15: a reply from an external agent (a Python Synapse agent has no agent secret) is
/// taken only with the random reply token the user's message carried as `sender_task_id`: a
/// task id (shown by events and history) proves nothing, a token is spent by its first reply,
/// and the token itself never shows in the log, the task or history.
#[test]
fn an_external_reply_completes_the_users_task_only_with_its_token_and_only_once() {
    let (port, received) = fake_external(false);
    let home = Home::new();
    home.ok(&["external", "add", &format!("http://127.0.0.1:{port}"), "--alias", "fake"]);
    let sent = local(&home, &["send", "fake", "review the parser", "--response", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let sent: Value = serde_json::from_slice(&sent.stdout).unwrap();
    let task_id = sent["reply_task_id"].as_str().unwrap_or_else(|| panic!("a task waits for the reply: {sent}"));
    let message = received.recv_timeout(Duration::from_secs(30)).unwrap();
    let metadata = &message["metadata"];
    let token = metadata["sender_task_id"].as_str().unwrap().to_string();
    assert!(token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()), "a random token: {message}");
    assert_eq!(metadata["response_mode"], "wait", "{message}");
    let endpoint = format!("http://127.0.0.1:{}/external-replies", broker_port(&home));
    assert_eq!(metadata["sender"]["sender_endpoint"], endpoint.as_str(), "{message}");
    let (_, task) = home.http("GET", &format!("/tasks/{task_id}"), None, &[]);
    assert_eq!(task["task"]["status"], "working", "{task}");

    let broker = broker_port(&home);
    let reply = |in_reply_to: &str, text: &str| {
        let body = serde_json::json!({
            "message": {"role": "user", "parts": [{"type": "text", "text": text}]},
            "metadata": {"response_mode": "silent", "in_reply_to": in_reply_to,
                         "sender": {"sender_id": "synapse-dummy-8110", "sender_type": "dummy"}},
        })
        .to_string();
        http_tcp(broker, "POST", "/external-replies/tasks/send-priority?priority=3", Some(body.as_bytes()), &[])
    };
    // The task id is public: it completes nothing. Nor does a guess, or no token at all.
    for forged in [task_id, &task_id[..8], "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"] {
        let (status, answer) = reply(forged, "forged approval");
        assert_eq!(status, 404, "{forged}: {answer}");
    }
    let body = serde_json::json!({"message": {"parts": [{"type": "text", "text": "no token"}]}}).to_string();
    let (status, answer) = http_tcp(broker, "POST", "/external-replies/tasks/send", Some(body.as_bytes()), &[]);
    assert_eq!(status, 400, "{answer}");
    // The right token with a name that could act on a terminal, or with a part that is not
    // text: refused, and the token is not spent by it.
    let body = serde_json::json!({
        "message": {"parts": [{"type": "text", "text": "hi"}]},
        "metadata": {"in_reply_to": token, "sender": {"sender_id": "evil\u{1b}[2J"}},
    })
    .to_string();
    let (status, answer) = http_tcp(broker, "POST", "/external-replies/tasks/send", Some(body.as_bytes()), &[]);
    assert_eq!(status, 400, "{answer}");
    let body = serde_json::json!({
        "message": {"parts": [{"type": "data", "data": {"ok": true}}]},
        "metadata": {"in_reply_to": token},
    })
    .to_string();
    let (status, answer) = http_tcp(broker, "POST", "/external-replies/tasks/send", Some(body.as_bytes()), &[]);
    assert_eq!(status, 400, "{answer}");
    let (_, task) = home.http("GET", &format!("/tasks/{task_id}"), None, &[]);
    assert_eq!(task["task"]["status"], "working", "nothing forged completed it: {task}");

    let (status, answer) = reply(&token, "LGTM, one nit");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["task"]["status"], "completed", "{answer}");
    let (status, answer) = reply(&token, "a second answer");
    assert_eq!(status, 404, "a token is spent by its first reply: {answer}");
    let (_, task) = home.http("GET", &format!("/tasks/{task_id}"), None, &[]);
    assert_eq!(task["task"]["artifacts"][0]["parts"][0]["text"], "LGTM, one nit", "{task}");

    // The token never shows: not in the log, the task, or history.
    let events = home.ok(&["events", "--json"]);
    assert!(events.contains("external_reply_received"), "{events}");
    for shown in [events, task.to_string(), home.ok(&["history", "list", "--json"]), home.ok(&["events"])] {
        assert!(!shown.contains(&token), "the token leaked: {shown}");
    }
    // The projections (the spent token included) are what a replay of the log gives.
    assert!(home.ok(&["admin", "verify"]).starts_with("ok"));

    // A message the external agent refuses fails the user's task, with the reason.
    let (refusing, _refused) = fake_external(true);
    home.ok(&["external", "add", &format!("http://127.0.0.1:{refusing}"), "--alias", "refusing"]);
    let sent = local(&home, &["send", "refusing", "anyone there?", "--response"]);
    assert_eq!(sent.status.code(), Some(1), "{}", describe(&sent));
    assert!(stderr(&sent).contains("refused the message (500)"), "{}", describe(&sent));
    let history: Value = serde_json::from_str(&home.ok(&["history", "list", "--json"])).unwrap();
    let record = history
        .as_array()
        .or_else(|| history["records"].as_array())
        .and_then(|records| records.iter().find(|record| record["peer"] == "external:refusing"))
        .unwrap_or_else(|| panic!("the user's task: {history}"));
    assert_eq!(record["status"], "failed", "{record}");
}

/// A wait whose remote task ends without a reply fails, with --json as without.
#[test]
fn a_wait_for_an_external_task_that_fails_exits_non_zero_with_json_too() {
    let remote = Home::new();
    let started = remote.cmd(&["start", "scenario", "--name", "sc", "--json"]).output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    // Stopped before its broker is, pass or fail (left running, it starts its broker again).
    struct Stop<'a>(&'a Home);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.run(&["stop", "sc"]);
        }
    }
    let _stop = Stop(&remote);
    let scenario: Value = serde_json::from_slice(&started.stdout).unwrap();
    let home = Home::new();
    home.ok(&["external", "add", &format!("http://127.0.0.1:{}", scenario["port"]), "--alias", "sc"]);
    let plain = local(&home, &["send", "sc", "please fail", "--wait", "30"]);
    assert_eq!(plain.status.code(), Some(1), "{}", describe(&plain));
    assert!(stderr(&plain).contains("without a reply"), "{}", describe(&plain));
    let json = local(&home, &["send", "sc", "please fail", "--wait", "30", "--json"]);
    assert_eq!(json.status.code(), Some(1), "{}", describe(&json));
    let answer: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(answer["task"]["state"], "failed", "{answer}");
    let asked = local(&home, &["send", "sc", "all good?", "--wait", "30", "--json"]);
    assert!(asked.status.success(), "{}", describe(&asked));
}

/// A message whose delivery times out may have arrived: the user's task is not failed but goes
/// on waiting for the reply, which its token still completes, and the user is told that
/// sending again may deliver it twice. It was marked failed, and the real reply then refused.
#[test]
fn a_message_whose_delivery_times_out_waits_for_its_reply() {
    let (port, received) = fake_external_as(Fake { holds: true, ..FAKE });
    let home = Home::new();
    local(&home, &["external", "add", &format!("http://127.0.0.1:{port}"), "--alias", "slow"]);
    let sent = local(&home, &["send", "slow", "are you there?", "--response"]);
    assert_eq!(sent.status.code(), Some(1), "{}", describe(&sent));
    let said = stderr(&sent);
    assert!(said.contains("did not answer within") && said.contains("may have arrived"), "{said}");
    assert!(said.contains("may deliver it twice"), "{said}");
    let message = received.recv_timeout(Duration::from_secs(30)).unwrap();
    let token = message["metadata"]["sender_task_id"].as_str().unwrap().to_string();
    assert_eq!(received.recv_timeout(Duration::from_secs(30)).unwrap()["closed"], true, "the broker gave up");
    let task_id = said
        .split("task ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the waiting task is named: {said}"))
        .to_string();
    let (_, task) = home.http("GET", &format!("/tasks/{task_id}"), None, &[]);
    assert_eq!(task["task"]["status"], "working", "{task}");
    // The remote agent's reply, posted with the token its message carried.
    let reply = |token: &str, text: &str| {
        let body = serde_json::json!({
            "message": {"parts": [{"type": "text", "text": text}]},
            "metadata": {"in_reply_to": token},
        })
        .to_string();
        let (status, answer) =
            http_tcp(broker_port(&home), "POST", "/external-replies/tasks/send", Some(body.as_bytes()), &[]);
        assert_eq!(status, 200, "{answer}");
    };
    reply(&token, "yes, here");
    let (_, task) = home.http("GET", &format!("/tasks/{task_id}"), None, &[]);
    assert_eq!(task["task"]["status"], "completed", "{task}");
    assert_eq!(task["task"]["artifacts"][0]["parts"][0]["text"], "yes, here", "{task}");

    // A send that waits for the reply goes on waiting after the timeout, for the reply its
    // token still brings.
    let waiting = home
        .cmd(&["send", "slow", "and now?", "--wait", "60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let message = received.recv_timeout(Duration::from_secs(30)).unwrap();
    let token = message["metadata"]["sender_task_id"].as_str().unwrap().to_string();
    // Posted once the broker has given up on the delivery (its 700 ms), while the send waits.
    assert_eq!(received.recv_timeout(Duration::from_secs(30)).unwrap()["closed"], true, "the broker gave up");
    reply(&token, "now, yes");
    let waited = waiting.wait_with_output().unwrap();
    assert!(waited.status.success(), "{}", describe(&waited));
    assert!(stdout(&waited).contains("now, yes"), "{}", describe(&waited));
}

/// A remote task whose stream ends completed with a reply the broker refuses (blank) fails the
/// user's task at once with the reason: the wait lasted to its deadline, for a reply that had
/// already come.
#[test]
fn a_refused_reply_on_the_remote_stream_ends_the_wait_at_once() {
    let home = Home::new();
    let (port, _received) = fake_external_as(Fake {
        events: Some(
            "data: {\"id\":\"remote-1\",\"state\":\"completed\",\"artifacts\":[{\"parts\":[{\"text\":\"   \"}]}]}\n\n",
        ),
        ..FAKE
    });
    local(&home, &["external", "add", &format!("http://127.0.0.1:{port}"), "--alias", "fake"]);
    let asked = local(&home, &["external", "send", "fake", "a question", "--wait", "30", "--json"]);
    assert_eq!(asked.status.code(), Some(1), "{}", describe(&asked));
    let answer: Value = serde_json::from_slice(&asked.stdout).unwrap();
    assert_eq!(answer["task"]["state"], "failed", "{answer}");
    // The task failed with the reason, not left working at the deadline.
    assert!(answer.to_string().contains("reply was refused"), "{answer}");
}

/// Following a remote task's stream (`wait_seconds` without a reply expected, up to a day) ends
/// when the broker stops: a remote that kept its stream open kept the broker from exiting.
#[test]
fn following_a_remote_stream_ends_when_the_broker_stops() {
    let home = Home::new();
    let (port, received) = fake_external_as(Fake {
        events: Some("data: {\"id\":\"remote-1\",\"state\":\"working\"}\n\n"),
        holds_stream: true,
        ..FAKE
    });
    let added = local(&home, &["external", "add", &format!("http://127.0.0.1:{port}"), "--alias", "fake"]);
    assert!(added.status.success(), "{}", describe(&added));
    let pid = home.broker_pid().expect("a broker is running");
    let socket = home.socket();
    let following = std::thread::spawn(move || {
        let body = br#"{"text":"a long job","wait_seconds":86400,"response_expected":false}"#;
        http_unix(&socket, "POST", "/external/fake/send", Some(body), &[])
    });
    // The message reaches the remote first, then the broker asks for the task's stream.
    loop {
        let message = received.recv_timeout(Duration::from_secs(30)).expect("the broker never followed the stream");
        if message["subscribed"] == true {
            break;
        }
    }
    let stopped = home.run(&["broker", "stop"]);
    assert!(stopped.status.success(), "{}", describe(&stopped));
    wait_until_dead(pid);
    let (status, answer) = following.join().unwrap();
    assert_eq!(status, 503, "{answer}");
}

/// A remote agent's words reach the user's terminal with their controls made visible, as a
/// local agent's do: its card's name (`external add`, `external list`) and the message of a
/// refusal (the error). They were printed raw: a card's name could write the clipboard
/// (OSC 52) on every `external list`.
#[test]
fn a_remote_agents_card_and_errors_are_shown_with_their_controls_visible() {
    let home = Home::new();
    let (port, _received) = fake_external_as(Fake {
        card: r#"{"name":"\u001b]52;c;eA==\u0007Fake"}"#,
        refusal: Some(r#"{"message":"\u001b[2Jout of order"}"#),
        ..FAKE
    });
    let added = local(&home, &["external", "add", &format!("http://127.0.0.1:{port}"), "--alias", "fake"]);
    assert!(added.status.success(), "{}", describe(&added));
    let listed = home.ok(&["external", "list"]);
    for shown in [stdout(&added), listed] {
        assert!(!shown.contains('\u{1b}') && !shown.contains('\u{7}'), "raw controls: {shown:?}");
        assert!(shown.contains("^[]52;c;eA==^GFake"), "{shown}");
    }
    let refused = local(&home, &["external", "send", "fake", "hello"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(!stderr(&refused).contains('\u{1b}'), "raw controls: {:?}", stderr(&refused));
    assert!(stderr(&refused).contains("^[[2Jout of order"), "{}", describe(&refused));
}

/// Adds of one alias at the same moment: one wins, the others are told the alias is taken.
/// Each request checked the alias before any of them had added it, so every add succeeded and
/// the last agent replaced the earlier ones without a word to their callers.
#[test]
fn adds_of_one_alias_at_once_give_it_to_one_agent() {
    let (port, _received) = fake_external(false);
    let home = Home::new();
    home.ok(&["broker", "start"]);
    let url = format!("http://127.0.0.1:{port}");
    let adds: Vec<_> = (0..8)
        .map(|_| {
            home.cmd(&["external", "add", &url, "--alias", "shared"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = adds.into_iter().map(|add| add.wait_with_output().unwrap()).collect();
    let added = outputs.iter().filter(|output| output.status.success()).count();
    assert_eq!(added, 1, "{}", outputs.iter().map(describe).collect::<Vec<_>>().join("\n"));
    for refused in outputs.iter().filter(|output| !output.status.success()) {
        assert!(stderr(refused).contains("alias 'shared' is taken"), "{}", describe(refused));
    }
    let events = home.ok(&["events", "--json"]);
    assert_eq!(events.matches("\"external_agent_added\"").count(), 1, "{events}");
}
