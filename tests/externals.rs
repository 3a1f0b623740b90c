//! External agents: a second Synapse broker acts as the external agent; unreachable, slow and
//! malformed endpoints give clear errors in bounded time (issue 6, item 3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn local(home: &Home, args: &[&str]) -> std::process::Output {
    home.cmd(args).env("SYNAPSE_EXTERNAL_TIMEOUT_MS", "700").output().unwrap()
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

    // The registration is an event: it survives a restart of the local broker.
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
    // Nothing listens on this port once the listener is dropped.
    let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
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
        (vec!["external", "send", "nobody", "hi"], "No external agent 'nobody'"),
    ] {
        let output = local(&home, &args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(stderr(&output).contains(expected), "{args:?}: {}", describe(&output));
    }
    assert!(home.ok(&["external", "list"]).contains("No external agents"));
}
