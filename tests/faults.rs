//! Storage faults through the real binary (issue 12, "Faults"): a full disk refuses writes
//! clearly, reads go on, and the broker writes again by itself once space returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Larger than the whole log file of a young broker: storing it needs new blocks.
const LARGE_MESSAGE_BYTES: usize = 6 << 20;

/// Waits until `condition` holds, or fails the test with `what` after a deadline.
fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn large_message(marker: &str) -> String {
    format!("{marker}:{}", "x".repeat(LARGE_MESSAGE_BYTES))
}

/// Has the broker checkpointed: does its write-ahead log hold no batch? (A checkpoint zeroes
/// the first record's header; see `src/store/wal.rs`.)
fn write_ahead_log_is_empty(home: &Home) -> bool {
    let log = std::fs::read(home.home().join("synapse.wal")).unwrap_or_default();
    log.get(..16).is_none_or(|header| header.iter().all(|byte| *byte == 0))
}

/// How many of `events` carry `marker` in their text.
fn count_with(events: &[Value], marker: &str) -> usize {
    events.iter().filter(|event| event.to_string().contains(&format!("{marker}:"))).count()
}

#[test]
fn a_full_disk_refuses_sends_clearly_keeps_reads_working_and_recovers_without_a_restart() {
    let home = Home::new();
    let switch = home.dir.path().join("disk-full");
    let started = home.cmd(&["broker", "start"]).env("SYNAPSE_TEST_DISK_FULL_FILE", &switch).output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let pid = home.broker_pid().unwrap();
    let bob = home.register(Some("bob"));
    home.ok(&["send", "bob", "before: a small message", "--no-response"]);
    let file = home.dir.path().join("message.txt");
    // The events one send leaves with its text (to count each stored send exactly once).
    let per_send = count_with(&home.events(), "before");
    assert!(per_send >= 1);
    let (status, _) = home.http("GET", "/broker/health", None, &[]);
    assert_eq!(status, 200);
    // What follows holds for a broker whose database has taken in every batch (the idle
    // checkpoint, 50 ms after the send). Before that, a reopen takes the batches back from the
    // write-ahead log, which may need room the full disk does not give: reads then wait for
    // space, refused with the reason (a store test covers that case).
    wait_for("the idle checkpoint", || write_ahead_log_is_empty(&home));

    // The disk fills up: a send that needs space is refused with the reason, nothing stored.
    std::fs::write(&switch, b"").unwrap();
    std::fs::write(&file, large_message("refused-cli")).unwrap();
    let refused = home.run(&["send", "bob", "-F", file.to_str().unwrap(), "--no-response"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("disk is full"), "{}", describe(&refused));

    let (status, health) = home.http("GET", "/broker/health", None, &[]);
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["healthy"], false);
    assert!(health["write_failure"]["reason"].as_str().unwrap().contains("disk is full"), "{health}");
    assert!(health["write_failure"]["since_ms"].as_u64().unwrap() > 0);
    assert_eq!(health["pid"].as_u64(), Some(u64::from(pid)));
    let status_command = home.run(&["broker", "status"]);
    assert_eq!(status_command.status.code(), Some(1), "{}", describe(&status_command));
    assert!(stderr(&status_command).contains("cannot store"), "{}", describe(&status_command));

    // The same over HTTP, once the database is reopened (while full: it keeps refusing).
    let body = serde_json::to_vec(&json!({"to": "bob", "text": large_message("refused-http")})).unwrap();
    wait_for("an HTTP send refused because the disk is full", || {
        let (status, answer) = home.http("POST", "/send", Some(&body), &[]);
        assert_eq!(status, 503, "{answer}");
        answer["message"].as_str().unwrap().contains("disk is full")
    });

    // Reads go on from the reopened database while the disk is still full. The history
    // indexer's commits fail too, and each failure reopens the database again (reads refused
    // for that moment, "try again in a moment"): a read is asked until one is served, rather
    // than two in a row assumed to fall between two reopens.
    let served = |args: &[&str]| {
        let mut out = String::new();
        wait_for("reads served while the disk is full", || {
            let output = home.run(args);
            out = stdout(&output);
            output.status.success()
        });
        out
    };
    assert!(served(&["list"]).contains("bob"));
    let events: Vec<Value> =
        served(&["events", "--json"]).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(count_with(&events, "before"), per_send);
    let (status, _) = home.http("GET", "/broker/health", None, &[]);
    assert_eq!(status, 503, "no write has succeeded yet");

    // Space returns: the next send is stored, by the same broker.
    std::fs::remove_file(&switch).unwrap();
    std::fs::write(&file, large_message("after")).unwrap();
    // A reopen the indexer's last failure began may still be under way: a send meanwhile is
    // refused with "nothing was written", and sent again.
    wait_for("a send stored once space returned", || {
        let output = home.run(&["send", "bob", "-F", file.to_str().unwrap(), "--no-response"]);
        let refused = stderr(&output);
        assert!(output.status.success() || refused.contains("nothing was written"), "{}", describe(&output));
        output.status.success()
    });
    assert_eq!(home.broker_pid(), Some(pid));
    assert!(is_alive(pid));
    let (status, health) = home.http("GET", "/broker/health", None, &[]);
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["healthy"], true);
    assert!(health.get("write_failure").is_none(), "{health}");
    assert!(home.ok(&["admin", "verify"]).starts_with("ok"));

    // Every acknowledged message exactly once; nothing refused.
    let events = home.events();
    assert_eq!(count_with(&events, "before"), per_send);
    assert_eq!(count_with(&events, "after"), per_send);
    assert_eq!(count_with(&events, "refused-cli"), 0);
    assert_eq!(count_with(&events, "refused-http"), 0);
    let inbox: Vec<Value> = home.inbox(&bob);
    assert_eq!(inbox.len(), 2, "bob's inbox holds the two stored messages: {inbox:?}");
}
