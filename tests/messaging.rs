//! Messaging through the broker: send, reply, reverse tickets, A2A endpoints, bad input (issue 3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::process::Stdio;

fn task_of(home: &Home, id: &str) -> Value {
    let (status, body) = home.http("GET", &format!("/tasks/{id}"), None, &[]);
    assert_eq!(status, 200, "{body}");
    body["task"].clone()
}

/// The seed-002 round trip, still true after the broker is killed with SIGKILL.
#[test]
fn a_response_round_trip_completes_the_senders_task_and_queues_a_reverse_ticket_durably() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));

    let sent = home.run_as(&alice, &["send", "bob", "analyse this", "--response", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let sent: Value = serde_json::from_str(&stdout(&sent)).unwrap();
    let sender_task = sent["sender_task"]["id"].as_str().unwrap().to_string();
    assert_eq!(sent["sender_task"]["status"], "working");
    assert_eq!(sent["sender_task"]["metadata"]["owner"], alice.id.as_str());

    let inbox = home.inbox(&bob);
    assert_eq!(inbox.len(), 1);
    let id8 = &sender_task[..8];
    assert_eq!(inbox[0]["prefix"], format!("[A2A:{id8}:{}:R]", alice.id));
    assert_eq!(inbox[0]["text"], "analyse this");

    // A reply awaits no reply of its own: --wait does not hand back the task it just completed
    // (whose text is the reply itself) as if the other side had answered.
    let replied = home.run_as(&bob, &["send", "alice", "the result", "--reply-to", id8, "--wait", "5"]);
    assert!(replied.status.success(), "{}", describe(&replied));
    assert!(stdout(&replied).contains(&format!("Replied to {}", alice.id)), "{}", describe(&replied));
    assert!(!stdout(&replied).lines().any(|line| line == "the result"), "{}", describe(&replied));

    let check = |home: &Home| {
        let task = task_of(home, &sender_task);
        assert_eq!(task["status"], "completed");
        assert_eq!(task["artifacts"][0]["parts"][0]["text"], "the result");
        let inbox = home.inbox(&alice);
        assert_eq!(inbox.len(), 1, "{inbox:?}");
        assert_eq!(inbox[0]["kind"], "reply");
        assert_eq!(inbox[0]["prefix"], format!("[A2A:{id8}:{}:REPLY]", bob.id));
        assert_eq!(inbox[0]["text"], "the result");
        let targets = home.run_as(&bob, &["reply", "--list-targets"]);
        assert_eq!(stdout(&targets).trim(), "No reply targets.");
        // The receiver's own task is completed too.
        let receiver_task = task_of(home, sent["task"]["id"].as_str().unwrap());
        assert_eq!(receiver_task["status"], "completed");
    };
    check(&home);
    home.kill_broker();
    // The broker comes back with the same state, read from the log.
    home.ok(&["broker", "start"]);
    check(&home);
    // A second reply to the same task is refused and changes nothing.
    let head = home.head();
    let again = home.run_as(&bob, &["send", "alice", "again", "--reply-to", id8]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("already answered"), "{}", describe(&again));
    assert_eq!(home.head(), head);
}

/// Reads `child`'s standard error until a line holds `part`; all it read, and whether it came.
fn stderr_until(child: &mut std::process::Child, part: &str) -> (String, bool) {
    use std::io::BufRead;
    let mut read = String::new();
    let mut lines = std::io::BufReader::new(child.stderr.as_mut().unwrap()).lines();
    while let Some(Ok(line)) = lines.next() {
        read.push_str(&line);
        read.push('\n');
        if line.contains(part) {
            return (read, true);
        }
    }
    (read, false)
}

/// A send whose answer is late (the broker frozen with SIGSTOP) is sent again with the same
/// idempotency key: it arrives once, and the command succeeds. It used to fail with "timed
/// out", though the broker made the send when it woke, and sending it again made a second.
#[test]
fn a_send_whose_answer_is_late_is_tried_again_and_made_once() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let pid = home.broker_pid().expect("broker.json");
    freeze(pid);
    let mut sending = home
        .cmd(&["send", "bob", "sent while the broker froze", "--no-response"])
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "2000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (log, retried) = stderr_until(&mut sending, "trying again with idempotency key");
    kill(pid, libc::SIGCONT);
    assert!(retried, "{log}");
    let output = output_within(sending, std::time::Duration::from_secs(60), "synapse send");
    assert!(output.status.success(), "{log}{}", describe(&output));
    let sent = home.events().into_iter().filter(|event| event["event"]["kind"] == "message_sent").count();
    assert_eq!(sent, 1, "sent once");
    assert_eq!(home.inbox(&bob).len(), 1);
}

/// A reply whose answer is late (the broker frozen) is tried again with its idempotency key
/// and made once; one whose answer never comes names the key, and replying again with it
/// answers the first reply. `synapse reply` had no key and no retry: it failed though the
/// reply was made (a review saw 3 of 6 such failures under broker restarts), and replying
/// again found no reply target, or answered the next request in line.
#[test]
fn a_reply_whose_answer_is_lost_is_tried_again_with_its_key_and_made_once() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let ask = |text: &str| {
        let output = home.run_as(&alice, &["send", "bob", text, "--response", "--json"]);
        assert!(output.status.success(), "{}", describe(&output));
        let sent: Value = serde_json::from_slice(&output.stdout).unwrap();
        sent["sender_task"]["id"].as_str().unwrap().to_string()
    };
    let replies = || home.events().into_iter().filter(|event| event["event"]["kind"] == "reply_posted").count();
    let state = |task: &str| task_of(&home, task)["status"].as_str().unwrap_or_default().to_string();
    let pid = home.broker_pid().expect("broker.json");

    let first = ask("first question");
    freeze(pid);
    let mut replying = home
        .cmd(&["reply", "first answer"])
        .env("SYNAPSE_AGENT_ID", &bob.id)
        .env("SYNAPSE_AGENT_SECRET", &bob.secret)
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "2000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (log, retried) = stderr_until(&mut replying, "trying again with idempotency key");
    kill(pid, libc::SIGCONT);
    assert!(retried, "{log}");
    let output = output_within(replying, std::time::Duration::from_secs(60), "synapse reply");
    assert!(output.status.success(), "{log}{}", describe(&output));
    assert_eq!(replies(), 1, "replied once");
    assert_eq!(state(&first), "completed");

    let second = ask("second question");
    freeze(pid);
    let failed = home
        .cmd(&["reply", "second answer"])
        .env("SYNAPSE_AGENT_ID", &bob.id)
        .env("SYNAPSE_AGENT_SECRET", &bob.secret)
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "500")
        .output()
        .unwrap();
    kill(pid, libc::SIGCONT);
    assert_eq!(failed.status.code(), Some(1), "{}", describe(&failed));
    let said = stderr(&failed);
    assert!(said.contains("may have been sent"), "{said}");
    let key = said.split("--idempotency-key ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap();
    let again = home.run_as(&bob, &["reply", "second answer", "--idempotency-key", key]);
    assert!(again.status.success(), "{}", describe(&again));
    assert!(stdout(&again).contains(&second), "{}", describe(&again));
    assert_eq!(replies(), 2, "the second reply made once");
    assert_eq!(state(&second), "completed");
    // The key stands for that reply: another text with it is refused, nothing replied.
    let third = ask("third question");
    let reused = home.run_as(&bob, &["reply", "another answer", "--idempotency-key", key]);
    assert_eq!(reused.status.code(), Some(1), "{}", describe(&reused));
    assert!(stderr(&reused).contains("idempotency key"), "{}", describe(&reused));
    assert_eq!(state(&third), "working");
    // Nor does the same text to another sender count as the same reply: it was answered with
    // the first reply's tasks, and the other sender's request stayed open without a word.
    let carol = home.register(Some("carol"));
    let asked = home.run_as(&carol, &["send", "bob", "carol's question", "--response", "--json"]);
    assert!(asked.status.success(), "{}", describe(&asked));
    let carols: Value = serde_json::from_slice(&asked.stdout).unwrap();
    let carols = carols["sender_task"]["id"].as_str().unwrap().to_string();
    let to_alice = home.run_as(&bob, &["reply", "OK", "--to", "alice", "--idempotency-key", "k-ok"]);
    assert!(to_alice.status.success(), "{}", describe(&to_alice));
    assert_eq!(state(&third), "completed");
    let to_carol = home.run_as(&bob, &["reply", "OK", "--to", "carol", "--idempotency-key", "k-ok"]);
    assert_eq!(to_carol.status.code(), Some(1), "{}", describe(&to_carol));
    assert!(stderr(&to_carol).contains("a reply to another sender"), "{}", describe(&to_carol));
    assert_eq!(state(&carols), "working");
    let again = home.run_as(&bob, &["reply", "OK", "--to", "alice", "--idempotency-key", "k-ok"]);
    assert!(again.status.success(), "the same reply again: {}", describe(&again));
}

/// A reply's wait (`send --wait N`, the MCP send's `wait_seconds`) counts from the send's start:
/// a send that took the time, tried again, leaves nothing more to wait, so the whole call keeps
/// within its bound. It had waited the whole time again after the send, and an MCP call then
/// outlived the CLI's tool timeout (620 s for 600 s of wait). Here the time is spent before the
/// wait begins; the bound on the wait's return is half of it.
#[test]
fn a_reply_wait_counts_from_the_sends_start() {
    let home = Home::new();
    home.register(Some("bob"));
    let sent: Value = serde_json::from_str(&home.ok(&["send", "bob", "a question", "--response", "--json"])).unwrap();
    let task = sent["sender_task"]["id"].as_str().unwrap().to_string();
    let paths = synapse::config::Paths { home: home.home(), uds_dir: home.uds(), broker_port: broker_port(&home) };
    let seconds = 60;
    // The send began a whole wait ago (the machine has been up longer: the suite was built).
    let started = std::time::Instant::now().checked_sub(std::time::Duration::from_secs(seconds)).unwrap();
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let result = runtime.block_on(async {
            let mut client = synapse::client::Client::connect_with(&paths, false, true).await.unwrap();
            client.wait_for_reply(&paths, true, &task, seconds, started).await
        });
        let _ = done.send(result);
    });
    let result = waited.recv_timeout(std::time::Duration::from_secs(seconds / 2)).expect("the wait ended at once");
    assert!(
        matches!(result, Err(synapse::client::ReplyWaitError::TimedOut { seconds: 60, .. })),
        "{:?}",
        result.map_err(|error| error.to_string())
    );
}

/// A send whose answer never comes (the broker stays frozen through both tries) fails saying
/// the message may have been sent and naming its key; sent again with that key once the broker
/// is back, it is made once.
#[test]
fn a_send_that_may_have_been_sent_names_the_key_that_sends_it_at_most_once() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let pid = home.broker_pid().expect("broker.json");
    freeze(pid);
    let failed = home
        .cmd(&["send", "bob", "maybe sent", "--no-response"])
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "500")
        .output()
        .unwrap();
    kill(pid, libc::SIGCONT);
    assert_eq!(failed.status.code(), Some(1), "{}", describe(&failed));
    let said = stderr(&failed);
    assert!(said.contains("the message may have been sent"), "{said}");
    let key = said.split("--idempotency-key ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap();
    home.ok(&["send", "bob", "maybe sent", "--no-response", "--idempotency-key", key]);
    let sent = home.events().into_iter().filter(|event| event["event"]["kind"] == "message_sent").count();
    assert_eq!(sent, 1, "sent once");
    assert_eq!(home.inbox(&bob).len(), 1);
}

/// `synapse send --wait` goes on waiting when the broker restarts meanwhile (killed, then
/// started again by the wait itself): the reply that comes after is printed. The wait ended
/// with "the broker closed the connection", though the reply still came.
#[test]
fn send_wait_goes_on_waiting_across_a_broker_restart() {
    let home = Home::new();
    let carol = home.register(Some("carol"));
    let waiter = home
        .cmd(&["send", "carol", "still there?", "--wait", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the message in carol's inbox", || !home.inbox(&carol).is_empty());
    home.kill_broker();
    let replied = home.run_as(&carol, &["reply", "yes"]);
    assert!(replied.status.success(), "{}", describe(&replied));
    let output = output_within(waiter, std::time::Duration::from_secs(60), "synapse send --wait");
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(stdout(&output).lines().last(), Some("yes"), "{}", describe(&output));
}

#[test]
fn synapse_reply_answers_the_most_recent_target_and_lists_several() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let carol = home.register(Some("carol"));
    let none = home.run_as(&bob, &["reply", "hello"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(stderr(&none).contains("No reply target. No pending messages to reply to."));

    assert!(home.run_as(&alice, &["send", "bob", "from alice"]).status.success());
    assert!(home.run_as(&carol, &["send", "bob", "from carol"]).status.success());
    let listed = stdout(&home.run_as(&bob, &["reply", "--list-targets"]));
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert!(lines[0].starts_with(&alice.id) && lines[0].contains("from alice"));
    assert!(lines[1].starts_with(&carol.id) && lines[1].contains("from carol"));

    let ambiguous = home.run_as(&bob, &["reply", "which?"]);
    assert_eq!(ambiguous.status.code(), Some(1));
    assert!(stderr(&ambiguous).contains(&alice.id) && stderr(&ambiguous).contains(&carol.id));

    let to_carol = home.run_as(&bob, &["reply", "to carol", "--to", &carol.id]);
    assert!(to_carol.status.success(), "{}", describe(&to_carol));
    let to_alice = home.run_as(&bob, &["reply", "to alice"]);
    assert!(to_alice.status.success(), "{}", describe(&to_alice));
    assert_eq!(home.inbox(&alice)[0]["text"], "to alice");
    assert_eq!(home.inbox(&carol)[0]["text"], "to carol");
}

/// Senders without an id are shown to the receiver as `anonymous` and wait each on its own
/// (`anonymous-<id8>`): one left unanswered (its sender's `--wait` ran out) made every plain
/// `synapse reply` fail with "several agents are waiting", and `--to anonymous` was refused. The
/// task id the message showed (`[A2A:<id8>:...]`) now names its sender, and `anonymous` names
/// the only such sender; the error lists the task ids to choose from.
#[test]
fn a_reply_names_its_sender_by_the_task_id_its_message_showed() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    for question in ["first question", "second question"] {
        assert!(home.run(&["send", "bob", question, "--response"]).status.success());
    }
    assert!(home.run_as(&alice, &["send", "bob", "alice asks", "--response"]).status.success());
    // What bob's CLI is shown: `[A2A:<id8>:anonymous:R]`.
    let shown = |text: &str| {
        let ticket = home.inbox(&bob).into_iter().find(|ticket| ticket["text"] == text).unwrap();
        let prefix = ticket["prefix"].as_str().unwrap().to_string();
        assert!(prefix.ends_with(":anonymous:R]") || text == "alice asks", "{prefix}");
        prefix.trim_start_matches("[A2A:").split(':').next().unwrap().to_string()
    };
    let (first, second, from_alice) = (shown("first question"), shown("second question"), shown("alice asks"));
    let plain = home.run_as(&bob, &["reply", "which?"]);
    assert_eq!(plain.status.code(), Some(1));
    for id8 in [&first, &second, &from_alice] {
        assert!(stderr(&plain).contains(&format!("(task {id8})")), "{}", describe(&plain));
    }
    let several = home.run_as(&bob, &["reply", "which?", "--to", "anonymous"]);
    assert_eq!(several.status.code(), Some(1));
    assert!(stderr(&several).contains("Several senders without an id"), "{}", describe(&several));
    assert!(!stderr(&several).contains(&alice.id), "{}", describe(&several));
    let head = home.head();
    // Too short to be a task id, or no task's: refused, nothing changes.
    for wrong in [&first[..4], "0000000000"] {
        let output = home.run_as(&bob, &["reply", "x", "--to", wrong]);
        assert_eq!(output.status.code(), Some(1), "{wrong}: {}", describe(&output));
        assert!(stderr(&output).contains("No reply target from"), "{wrong}: {}", describe(&output));
    }
    assert_eq!(home.head(), head);
    let answered = home.run_as(&bob, &["reply", "to the second", "--to", &second, "--idempotency-key", "k2"]);
    assert!(answered.status.success(), "{}", describe(&answered));
    // Its answer lost, the same reply again with its key: the first one's, not a conflict.
    let head = home.head();
    let again = home.run_as(&bob, &["reply", "to the second", "--to", &second, "--idempotency-key", "k2"]);
    assert!(again.status.success(), "{}", describe(&again));
    assert_eq!(home.head(), head, "not made twice");
    let answered = home.run_as(&bob, &["reply", "to alice", "--to", &from_alice]);
    assert!(answered.status.success(), "{}", describe(&answered));
    assert_eq!(home.inbox(&alice)[0]["text"], "to alice");
    let only = home.run_as(&bob, &["reply", "to the first", "--to", "anonymous", "--idempotency-key", "k1"]);
    assert!(only.status.success(), "{}", describe(&only));
    let again = home.run_as(&bob, &["reply", "to the first", "--to", "anonymous", "--idempotency-key", "k1"]);
    assert!(again.status.success(), "{}", describe(&again));
    // The key used again for a reply to another sender is still refused, also when
    // `anonymous` now names another one (the first one's reply would be its answer, and the new
    // question would go unanswered).
    let other = home.run_as(&bob, &["reply", "to the first", "--to", &alice.id, "--idempotency-key", "k1"]);
    assert_eq!(other.status.code(), Some(1), "{}", describe(&other));
    assert!(stderr(&other).contains("another sender"), "{}", describe(&other));
    assert!(home.run(&["send", "bob", "third question", "--response"]).status.success());
    let head = home.head();
    let reused = home.run_as(&bob, &["reply", "to the first", "--to", "anonymous", "--idempotency-key", "k1"]);
    assert_eq!(reused.status.code(), Some(1), "{}", describe(&reused));
    assert!(stderr(&reused).contains("another sender"), "{}", describe(&reused));
    assert_eq!(home.head(), head, "nothing made");
    let listed = stdout(&home.run_as(&bob, &["reply", "--list-targets"]));
    assert_eq!(listed.lines().filter(|line| line.contains("question")).count(), 1, "{listed}");
    assert!(listed.contains("third question"), "{listed}");
    // Each answered its own question.
    for (id8, answer) in [(&first, "to the first"), (&second, "to the second")] {
        let task = home.http("GET", &format!("/tasks/{id8}"), None, &[]).1;
        assert!(task.to_string().contains(answer), "{id8}: {task}");
    }
}

/// A newer request from the same sender replaces the older target once it is written into the
/// receiver: until then the receiver's reply answers the request it has seen.
#[test]
fn a_newer_request_from_the_same_sender_replaces_the_older_target() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    assert!(home.run_as(&alice, &["send", "bob", "old question"]).status.success());
    assert!(home.run_as(&alice, &["send", "bob", "new question"]).status.success());
    let listed = || stdout(&home.run_as(&bob, &["reply", "--list-targets"]));
    assert_eq!(listed().lines().count(), 1);
    assert!(listed().contains("old question"), "{}", listed());
    let newer = home.inbox(&bob).into_iter().find(|ticket| ticket["text"] == "new question").unwrap();
    let ack = home
        .cmd(&["agent", "ack", &bob.id, &newer["ticket"].to_string()])
        .env("SYNAPSE_AGENT_SECRET", &bob.secret)
        .output()
        .unwrap();
    assert!(ack.status.success(), "{}", describe(&ack));
    assert_eq!(listed().lines().count(), 1);
    assert!(listed().contains("new question"), "{}", listed());
}

#[test]
fn messages_queue_in_the_inbox_by_priority_then_arrival() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    for (priority, text) in [("1", "low"), ("3", "normal-1"), ("5", "urgent"), ("3", "normal-2")] {
        home.ok(&["send", "bob", text, "-p", priority, "--no-response"]);
    }
    let texts: Vec<String> = home.inbox(&bob).iter().map(|t| t["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(texts, ["urgent", "normal-1", "normal-2", "low"]);
    // An acknowledged injection leaves the inbox, and a one-way (--no-response) message's task
    // is then complete: nothing more will happen to it (issue 14: it stayed `working` for ever).
    let first = home.inbox(&bob)[0].clone();
    let ack = home
        .cmd(&["agent", "ack", &bob.id, &first["ticket"].to_string()])
        .env("SYNAPSE_AGENT_SECRET", &bob.secret)
        .output()
        .unwrap();
    assert!(ack.status.success(), "{}", describe(&ack));
    assert_eq!(home.inbox(&bob).len(), 3);
    assert_eq!(task_of(&home, first["task_id"].as_str().unwrap())["status"], "completed");
    // Acknowledging twice is refused (the ticket was written once).
    let twice = home
        .cmd(&["agent", "ack", &bob.id, &first["ticket"].to_string()])
        .env("SYNAPSE_AGENT_SECRET", &bob.secret)
        .output()
        .unwrap();
    assert_eq!(twice.status.code(), Some(1));
}

/// `synapse send carol "what time is it?" --wait <seconds> <extra>`, answered "noon" by carol.
fn send_wait_answered_with_noon(seconds: &str, extra: &[&str]) -> std::process::Output {
    let home = Home::new();
    let carol = home.register(Some("carol"));
    let mut args = vec!["send", "carol", "what time is it?", "--wait", seconds];
    args.extend_from_slice(extra);
    let waiter = home.cmd(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Long-poll carol's inbox until the waiting sender's message is there.
    let ticket = loop {
        let value: Value =
            serde_json::from_str(&home.ok(&["agent", "inbox", &carol.id, "--wait-ms", "10000"])).unwrap();
        if let Some(ticket) = value["tickets"].as_array().unwrap().first() {
            break ticket.clone();
        }
    };
    assert_eq!(ticket["prefix"], format!("[A2A:{}:anonymous:R]", &ticket["display_task_id"].as_str().unwrap()[..8]));
    let replied = home.run_as(&carol, &["reply", "noon"]);
    assert!(replied.status.success(), "{}", describe(&replied));
    waiter.wait_with_output().unwrap()
}

#[test]
fn send_wait_blocks_until_the_reply_arrives_and_prints_it() {
    let output = send_wait_answered_with_noon("30", &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stdout(&output).lines().any(|line| line == "noon"), "{}", describe(&output));
}

/// A limit of centuries is waited in slices: `--wait 18446744073709551615` overflowed the wait
/// request's milliseconds and failed after the message was sent.
#[test]
fn send_wait_with_the_largest_limit_waits_for_the_reply() {
    let output = send_wait_answered_with_noon(&u64::MAX.to_string(), &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stdout(&output).lines().any(|line| line == "noon"), "{}", describe(&output));
}

/// Issue 14: `--wait --json` printed a JSON object and then the reply as a plain line.
#[test]
fn send_wait_json_prints_one_document_that_holds_the_reply() {
    let output = send_wait_answered_with_noon("30", &["--json"]);
    assert!(output.status.success(), "{}", describe(&output));
    let document: Value = serde_json::from_str(&stdout(&output)).expect("exactly one JSON document");
    assert_eq!(document["reply"], "noon", "{document:#}");
    assert!(document["sender_task"]["id"].is_string(), "{document:#}");
}

#[test]
fn send_wait_times_out_with_a_non_zero_exit_and_the_task_stays_open() {
    let home = Home::new();
    home.register(Some("bob"));
    let output = home.run(&["send", "bob", "anyone?", "--wait", "1", "--json"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("no reply within 1 s"), "{}", describe(&output));
    let sent: Value = serde_json::from_str(stdout(&output).lines().next().unwrap()).unwrap();
    assert_eq!(task_of(&home, sent["sender_task"]["id"].as_str().unwrap())["status"], "working");
}

#[test]
fn an_unknown_reply_to_id_falls_back_to_a_new_message_with_a_warning() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let output = home.run(&["send", "bob", "late answer", "--reply-to", "deadbeef"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stderr(&output).contains("Warning: --reply-to deadbeef not found (404), retrying as new message"));
    assert_eq!(home.inbox(&bob)[0]["text"], "late answer");
}

#[test]
fn identity_claims_need_the_agents_secret() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    home.register(Some("bob"));
    let head = home.head();
    let no_secret = home.run(&["send", "bob", "hi", "--from", &alice.id]);
    assert_eq!(no_secret.status.code(), Some(1));
    assert!(stderr(&no_secret).contains("requires its secret"), "{}", describe(&no_secret));
    let wrong = home
        .cmd(&["send", "bob", "hi"])
        .env("SYNAPSE_AGENT_ID", &alice.id)
        .env("SYNAPSE_AGENT_SECRET", "not-the-secret")
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1));
    assert!(stderr(&wrong).contains("does not match"), "{}", describe(&wrong));
    assert_eq!(home.head(), head, "refused sends append nothing");
    // Anonymous sends are allowed.
    assert!(home.run(&["send", "bob", "hi", "--no-response"]).status.success());
}

#[test]
fn bad_input_on_the_command_line_is_a_clear_error_and_appends_nothing() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    home.register(Some("bob"));
    let head = home.head();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["send", "bob", ""], "the message is empty"),
        (vec!["send", "bob", "   "], "the message is empty"),
        (vec!["send", "bob", "hi", "-p", "0"], "priority must be between 1 and 5"),
        (vec!["send", "bob", "hi", "-p", "6"], "priority must be between 1 and 5"),
        (vec!["send", "bob", "hi", "-p", "-1"], "priority must be between 1 and 5"),
        (vec!["send", "bob", "hi", "-p", "x"], "priority must be between 1 and 5"),
        (vec!["send", "nobody", "hi"], "No agent found matching 'nobody'"),
        (vec!["send", "bob", "hi", "--reply-to", "not-hex!"], "Invalid task id"),
        (vec!["send", "bob"], "no message given"),
        (vec!["send", "bob", "hi", "--stdin"], "exactly one way"),
        (vec!["send", "bob", "-F", "/nonexistent/file"], "cannot read /nonexistent/file"),
        (vec!["send", "bob", "hi", "--from", ""], "--from is empty"),
        (vec!["reply", "hi", "--from", " "], "--from is empty"),
        (vec!["events", "--kind", "message_snet"], "unknown event kind 'message_snet'"),
    ];
    for (args, expected) in cases {
        let output = home.run(&args);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", describe(&output));
        assert!(stderr(&output).contains(expected), "{args:?}: {}", describe(&output));
    }
    // A sender named by the environment, not by --from: the way out names both.
    let unknown = home.cmd(&["send", "bob", "hi"]).env("SYNAPSE_AGENT_ID", "nobody").output().unwrap();
    assert_eq!(unknown.status.code(), Some(1), "{}", describe(&unknown));
    assert!(stderr(&unknown).contains("no --from, and SYNAPSE_AGENT_ID unset"), "{}", describe(&unknown));
    let self_send = home.run_as(&alice, &["send", "alice", "me"]);
    assert_eq!(self_send.status.code(), Some(1));
    assert!(stderr(&self_send).contains("cannot send a message to yourself"));
    let bad_utf8 = home.cmd(&["send", "bob", "--stdin"]).stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().and_then(
        |mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(&[0xff, 0xfe, 0x41])?;
            child.wait_with_output()
        },
    );
    let bad_utf8 = bad_utf8.unwrap();
    assert_eq!(bad_utf8.status.code(), Some(1));
    assert!(stderr(&bad_utf8).contains("not valid UTF-8"));
    assert_eq!(home.head(), head, "nothing was appended");
    // Usage errors are exit 2.
    assert_eq!(home.run(&["send"]).status.code(), Some(2));
    assert_eq!(home.run(&["send", "bob", "x", "--bogus"]).status.code(), Some(2));
    // A reply's text with --list-targets was ignored without a word.
    assert_eq!(home.run_as(&alice, &["reply", "--list-targets", "an answer"]).status.code(), Some(2));
    assert_eq!(home.run_as(&alice, &["reply", "--list-targets", "--to", "bob"]).status.code(), Some(2));
}

#[test]
fn ambiguous_targets_and_id_prefixes_list_the_candidates() {
    let home = Home::new();
    let first = home.register(None);
    let second = home.register(None);
    let output = home.run(&["send", "dummy", "hi"]);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(message.contains("Ambiguous target 'dummy'"), "{message}");
    assert!(message.contains(&first.id) && message.contains(&second.id), "{message}");
    // <type>-<port> picks exactly one.
    home.ok(&["send", &format!("dummy-{}", first.port), "hi", "--no-response"]);

    // Make two tasks that share a first character.
    let mut ids: Vec<String> = Vec::new();
    let shared = loop {
        let sent: Value = serde_json::from_str(&home.ok(&["send", &first.id, "x", "--no-response", "--json"])).unwrap();
        let id = sent["task"]["id"].as_str().unwrap().to_string();
        if let Some(other) = ids.iter().find(|other| other[..1] == id[..1]) {
            break other[..1].to_string();
        }
        ids.push(id);
    };
    let (status, body) = home.http("GET", &format!("/tasks/{shared}"), None, &[]);
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("Ambiguous task id"));
    assert!(body["candidates"].as_array().unwrap().len() >= 2);
    let output = home.run(&["send", &first.id, "answer", "--reply-to", &shared]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("Ambiguous task id"), "{}", describe(&output));
}

#[test]
fn bad_http_input_gets_a_4xx_json_error_and_appends_nothing() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let head = home.head();
    let send = |body: &[u8]| home.http("POST", "/send", Some(body), &[]);
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"".to_vec(), 400, "empty"),
        (b"{not json".to_vec(), 400, "invalid JSON"),
        (vec![0xff, 0xfe], 400, "UTF-8"),
        (json!({"to": "bob", "text": "hi", "colour": "red"}).to_string().into_bytes(), 400, "unknown field"),
        (json!({"to": "bob", "text": ""}).to_string().into_bytes(), 400, "empty"),
        (json!({"to": "bob", "text": "hi", "priority": 0}).to_string().into_bytes(), 400, "priority"),
        (json!({"to": "bob", "text": "hi", "priority": 6}).to_string().into_bytes(), 400, "priority"),
        (json!({"to": "bob", "text": "hi", "priority": -1}).to_string().into_bytes(), 400, "invalid JSON"),
        (json!({"to": "bob", "text": "hi", "priority": "x"}).to_string().into_bytes(), 400, "invalid JSON"),
        (json!({"to": "ghost", "text": "hi"}).to_string().into_bytes(), 404, "No agent found"),
        (json!({"to": "bob", "text": "hi", "reply_to": "xyz"}).to_string().into_bytes(), 400, "Invalid task id"),
    ];
    for (body, status, expected) in cases {
        let (got, answer) = send(&body);
        assert_eq!(got, status, "{}: {answer}", String::from_utf8_lossy(&body));
        assert!(answer["message"].as_str().unwrap().contains(expected), "{answer}");
    }
    let big = json!({"to": "bob", "text": "a".repeat(17 << 20)}).to_string();
    let (status, answer) = send(big.as_bytes());
    assert_eq!(status, 413, "{answer}");
    // A message under its own bound whose JSON is over the body's: the refusal names both.
    let escaped = json!({"to": "bob", "text": "\n".repeat(9 << 20)}).to_string();
    let (status, answer) = send(escaped.as_bytes());
    assert_eq!(status, 413, "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("16777216 bytes of text"), "{answer}");
    // The same on the A2A HTTP+JSON binding, whose errors have their own shape.
    let (status, answer) = home.http("POST", "/agents/bob/v1/message:send", Some(escaped.as_bytes()), &[]);
    assert!((400..500).contains(&status), "{status}: {answer}");
    assert!(answer.to_string().contains("16777216 bytes of text"), "{answer}");
    // The same checks on the agent's own endpoints.
    let (status, _) = http_tcp(
        bob.port,
        "POST",
        "/tasks/send-priority?priority=9",
        Some(br#"{"message":{"role":"user","parts":[{"type":"text","text":"hi"}]}}"#),
        &[],
    );
    assert_eq!(status, 400);
    let (status, _) = http_tcp(
        bob.port,
        "POST",
        "/tasks/send-priority?priority=x",
        Some(br#"{"message":{"role":"user","parts":[{"type":"text","text":"hi"}]}}"#),
        &[],
    );
    assert_eq!(status, 400);
    let (status, _) = http_tcp(bob.port, "POST", "/tasks/send", Some(br#"{"message":{"parts":[]},"extra":1}"#), &[]);
    assert_eq!(status, 400);
    let (status, body) = http_tcp(bob.port, "GET", "/tasks/0123abcd", None, &[]);
    assert_eq!(status, 404, "{body}");
    let (status, _) = http_tcp(bob.port, "GET", "/no/such/route", None, &[]);
    assert_eq!(status, 404);
    assert_eq!(home.head(), head, "nothing was appended");
}

#[test]
fn per_agent_a2a_endpoints_answer_on_the_agents_port_socket_and_broker_path() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let (status, card) = http_unix(&bob.socket, "GET", "/.well-known/agent.json", None, &[]);
    assert_eq!(status, 200);
    assert_eq!(card["name"], "bob");
    assert_eq!(card["extensions"]["synapse"]["agent_id"], bob.id.as_str());
    let skills: Vec<&str> = card["skills"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(skills, ["chat", "interrupt"]);

    let message = json!({"message": {"role": "user", "parts": [{"type": "text", "text": "over tcp"}]}}).to_string();
    let (status, sent) = http_tcp(bob.port, "POST", "/tasks/send-priority?priority=4", Some(message.as_bytes()), &[]);
    assert_eq!(status, 200, "{sent}");
    let task_id = sent["task"]["id"].as_str().unwrap();
    assert_eq!(sent["task"]["status"], "submitted");
    assert_eq!(sent["task"]["metadata"]["priority"], 4);
    let (status, got) = http_unix(&bob.socket, "GET", &format!("/tasks/{}", &task_id[..8]), None, &[]);
    assert_eq!(status, 200);
    assert_eq!(got["task"]["id"], task_id);
    let (status, listed) = home.http("GET", &format!("/agents/{}/tasks?state=submitted", bob.id), None, &[]);
    assert_eq!(status, 200);
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 1);
    let (status, agent_status) = http_tcp(bob.port, "GET", "/status", None, &[]);
    assert_eq!(status, 200);
    assert_eq!(agent_status["queue_depth"], 1);
    // No response_mode and no response_expected: a reply is expected, as the Python Synapse
    // 0.35 takes it ("notify"), so the anonymous sender waits on the reply stack.
    let (status, waiting) = http_tcp(bob.port, "GET", "/reply-stack/get", None, &[]);
    assert_eq!(status, 200, "{waiting}");

    // Cancel from submitted works once; a canceled task cannot be canceled again.
    let (status, canceled) = http_tcp(bob.port, "POST", &format!("/tasks/{task_id}/cancel"), None, &[]);
    assert_eq!(status, 200, "{canceled}");
    assert_eq!(canceled["task"]["status"], "canceled");
    assert_eq!(canceled["task"]["error"], "canceled by an A2A client", "who canceled, as JSON-RPC says it");
    let (status, _) = http_tcp(bob.port, "POST", &format!("/tasks/{task_id}/cancel"), None, &[]);
    assert_eq!(status, 400);
    assert!(home.inbox(&bob).is_empty(), "the canceled message left bob's queue");
    // response_mode silent: no reply expected.
    let silent = json!({"message": {"role": "user", "parts": [{"type": "text", "text": "fyi"}]},
                        "metadata": {"response_mode": "silent"}})
    .to_string();
    let (status, fyi) = http_tcp(bob.port, "POST", "/tasks/send", Some(silent.as_bytes()), &[]);
    assert_eq!(status, 200, "{fyi}");
    assert_eq!(fyi["task"]["metadata"]["response_expected"], false, "{fyi}");
    let fyi_id = fyi["task"]["id"].as_str().unwrap();
    let (status, _) = http_tcp(bob.port, "POST", &format!("/tasks/{fyi_id}/cancel"), None, &[]);
    assert_eq!(status, 200);

    // /tasks/create makes a task owned by the agent, and needs its secret.
    let (status, _) = http_unix(&bob.socket, "POST", "/tasks/create", Some(message.as_bytes()), &[]);
    assert_eq!(status, 403);
    let (status, created) = http_unix(
        &bob.socket,
        "POST",
        "/tasks/create",
        Some(message.as_bytes()),
        &[("x-synapse-agent-secret", &bob.secret)],
    );
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["task"]["status"], "working");
    assert!(home.inbox(&bob).is_empty(), "create writes nothing into the PTY");

    // The endpoints go away with the agent.
    let gone = home.cmd(&["agent", "deregister", &bob.id]).env("SYNAPSE_AGENT_SECRET", &bob.secret).output().unwrap();
    assert!(gone.status.success(), "{}", describe(&gone));
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", bob.port)).is_ok() {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "agent port still served");
        std::thread::yield_now();
    }
}

#[test]
fn list_shows_agents_with_status_and_queue_depth() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    home.ok(&["send", "bob", "queued", "--no-response"]);
    let status =
        home.cmd(&["agent", "status", &bob.id, "READY"]).env("SYNAPSE_AGENT_SECRET", &bob.secret).output().unwrap();
    assert!(status.status.success(), "{}", describe(&status));
    let bad =
        home.cmd(&["agent", "status", &bob.id, "SLEEPING"]).env("SYNAPSE_AGENT_SECRET", &bob.secret).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let listed: Value = serde_json::from_str(&home.ok(&["list", "--json"])).unwrap();
    let agent = &listed["agents"][0];
    assert_eq!(agent["agent_id"], bob.id.as_str());
    assert_eq!(agent["name"], "bob");
    assert_eq!(agent["status"], "READY");
    assert_eq!(agent["queue_depth"], 1);
    assert_eq!(agent["pid"], std::process::id());
    let table = home.ok(&["list"]);
    assert!(table.contains(&bob.id) && table.contains("READY"), "{table}");
}

#[test]
fn messages_of_any_text_arrive_unchanged() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let text = "line one\nline two 🎉 $HOME `id` \"quoted\" 'single' \\ back\ttab";
    home.ok(&["send", "bob", text, "--no-response"]);
    let file = home.dir.path().join("message.txt");
    std::fs::write(&file, "from a file\n").unwrap();
    home.ok(&["send", "bob", "-F", file.to_str().unwrap(), "--no-response"]);
    let texts: Vec<String> = home.inbox(&bob).iter().map(|t| t["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(texts, [text, "from a file\n"]);
}

/// Issue 12 (storage): a long message and its reply are each stored once. Before, a send
/// copied the text into both tasks' events and rows and every state change rewrote the rows
/// (five 16 MB messages grew the log by 780 MB).
#[test]
fn a_multi_megabyte_message_and_its_reply_grow_the_log_by_about_their_size() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let words = |word: &str, bytes: usize| -> String {
        let mut text = String::with_capacity(bytes + 16);
        let mut n = 0u64;
        while text.len() < bytes {
            text.push_str(&format!("{word}{n} "));
            n += 1;
        }
        text.truncate(bytes);
        text
    };
    let (request, answer) = (words("question", 2_000_000), words("answer", 2_000_000));
    let files = tempfile::tempdir().unwrap();
    let (request_file, answer_file) = (files.path().join("request.txt"), files.path().join("answer.txt"));
    std::fs::write(&request_file, &request).unwrap();
    std::fs::write(&answer_file, &answer).unwrap();
    let database = home.home().join("synapse.redb");
    let size = || std::fs::metadata(&database).unwrap().len();
    let before = size();

    let sent =
        home.run_as(&alice, &["send", "bob", "--message-file", request_file.to_str().unwrap(), "--response", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let sent: Value = serde_json::from_str(&stdout(&sent)).unwrap();
    let sender_task = sent["sender_task"]["id"].as_str().unwrap().to_string();
    let receiver_task = sent["task"]["id"].as_str().unwrap().to_string();
    let inbox = home.inbox(&bob);
    assert_eq!(inbox[0]["text"], request.as_str());
    let ticket = inbox[0]["ticket"].as_u64().unwrap();
    let (status, body) = home.http(
        "POST",
        &format!("/agents/{}/inbox/{ticket}/ack", bob.id),
        None,
        &[("x-synapse-agent-secret", bob.secret.as_str())],
    );
    assert_eq!(status, 200, "{body}");
    let replied = home
        .run_as(&bob, &["send", "alice", "--message-file", answer_file.to_str().unwrap(), "--reply-to", &sender_task]);
    assert!(replied.status.success(), "{}", describe(&replied));

    let grown = size() - before;
    let payload = (request.len() + answer.len()) as u64;
    assert!(
        grown * 10 <= payload * 25,
        "the log grew {grown} bytes for {payload} bytes of text ({:.2}x)",
        grown as f64 / payload as f64
    );

    let check = |home: &Home| {
        for id in [&sender_task, &receiver_task] {
            let task = task_of(home, id);
            assert_eq!(task["status"], "completed");
            assert_eq!(task["message"]["parts"][0]["text"], request.as_str());
            assert_eq!(task["artifacts"][0]["parts"][0]["text"], answer.as_str());
        }
        // The log's readers see each event as if the text were copied into it.
        let events = home.events();
        let created: Vec<&Value> = events.iter().filter(|event| event["event"]["kind"] == "task_created").collect();
        assert_eq!(created.len(), 2);
        for event in created {
            assert_eq!(event["event"]["data"]["message"]["parts"][0]["text"], request.as_str());
            assert!(event["event"]["data"].get("message_in").is_none());
        }
        let completed: Vec<&Value> = events
            .iter()
            .filter(|event| {
                event["event"]["kind"] == "task_state_changed" && event["event"]["data"]["state"] == "completed"
            })
            .collect();
        assert_eq!(completed.len(), 2);
        for event in completed {
            assert_eq!(event["event"]["data"]["artifacts"][0]["parts"][0]["text"], answer.as_str());
        }
    };
    check(&home);
    home.kill_broker();
    home.ok(&["broker", "start"]);
    check(&home);
    let verified = home.ok(&["admin", "verify"]);
    assert!(verified.starts_with("ok:"), "{verified}");
}

/// Issue 14: cancelling a queued message answered "canceled", yet it was still written into the
/// agent's terminal, and the sender's task stayed `working`. Now the ticket leaves the queue and
/// both sides end.
#[test]
fn a_canceled_queued_message_leaves_the_queue_and_both_sides_end() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let sent: Value =
        serde_json::from_str(&stdout(&home.run_as(&alice, &["send", "bob", "never mind", "--json"]))).unwrap();
    let receiver_task = sent["task"]["id"].as_str().unwrap().to_string();
    let sender_task = sent["sender_task"]["id"].as_str().unwrap().to_string();
    assert_eq!(home.inbox(&bob).len(), 1, "queued for bob");
    let canceled = home.ok(&["cancel", &receiver_task[..8]]);
    assert!(canceled.starts_with(&format!("Canceled task {receiver_task}")), "{canceled}");
    assert!(home.inbox(&bob).is_empty(), "a canceled message is never written: {:?}", home.inbox(&bob));
    assert_eq!(task_of(&home, &receiver_task)["status"], "canceled");
    assert_eq!(task_of(&home, &sender_task)["status"], "canceled", "the sender's side ends too");
    let again = home.run(&["cancel", &receiver_task]);
    assert_eq!(again.status.code(), Some(1), "{}", describe(&again));
    assert!(home.ok(&["admin", "verify"]).starts_with("ok"), "replay gives the same queues");
}

/// A `send --wait` whose message is canceled returns at once, non-zero, saying so.
#[test]
fn send_wait_returns_at_once_when_its_message_is_canceled() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let waiter = home
        .cmd(&["send", "bob", "long question", "--wait", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ticket = loop {
        let value: Value = serde_json::from_str(&home.ok(&["agent", "inbox", &bob.id, "--wait-ms", "10000"])).unwrap();
        if let Some(ticket) = value["tickets"].as_array().unwrap().first() {
            break ticket.clone();
        }
    };
    home.ok(&["cancel", ticket["task_id"].as_str().unwrap()]);
    let output = waiter.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("was canceled"), "{}", describe(&output));
}
