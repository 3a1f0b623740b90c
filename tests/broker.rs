//! The broker daemon and the event log, through the real binary (issue 2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[test]
fn any_command_starts_the_broker_on_demand_and_broker_stop_ends_it_cleanly() {
    let home = Home::new();
    assert!(home.broker_pid().is_none());
    let listed = home.ok(&["list"]);
    assert!(listed.contains("No agents running"), "{listed}");
    let pid = home.broker_pid().expect("broker.json written by the started broker");
    assert!(is_alive(pid));
    assert!(home.socket().exists());
    let status: Value = serde_json::from_str(&home.ok(&["broker", "status", "--json"])).unwrap();
    assert_eq!(status["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));

    let stopped = home.ok(&["broker", "stop"]);
    assert!(stopped.contains(&format!("broker stopped (pid {pid})")), "{stopped}");
    assert!(!is_alive(pid));
    assert!(!home.socket().exists(), "the socket file is removed on a clean stop");
    assert!(home.ok(&["broker", "stop"]).contains("no broker is running"));
    assert_eq!(home.run(&["broker", "status"]).status.code(), Some(1));
}

#[test]
fn a_second_broker_on_the_same_home_exits_at_once_with_a_clear_message() {
    let home = Home::new();
    home.ok(&["list"]);
    // Same home, other socket directory: the database lock refuses it.
    let other_uds = home.dir.path().join("uds2");
    let output = home.cmd(&["broker"]).env("SYNAPSE_UDS_DIR", &other_uds).output().unwrap();
    // Its own exit status: a client that started it waits for the broker that has the database.
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(stderr(&output).contains("another synapse broker already has the database"), "{}", describe(&output));
    // Same socket directory, other home: the live socket refuses it.
    let other_home = home.dir.path().join("home2");
    let output = home.cmd(&["broker"]).env("SYNAPSE_HOME", &other_home).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("already listening"), "{}", describe(&output));
}

/// Two homes with one socket folder (the default `/tmp/synapse-a2a`, say): a command of the
/// second home reaches the first home's broker, and must not use it (its log, its settings) nor
/// stop it. It used it, as if it were its own.
#[test]
fn a_command_of_another_home_refuses_the_broker_at_its_socket_and_never_stops_it() {
    let home = Home::new();
    home.ok(&["list"]);
    let pid = home.broker_pid().unwrap();
    let other_home = home.dir.path().join("home2");
    for args in [vec!["list"], vec!["send", "nobody", "hello"], vec!["broker", "status"], vec!["broker", "stop"]] {
        let output = home.cmd(&args).env("SYNAPSE_HOME", &other_home).output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", describe(&output));
        let said = stderr(&output);
        assert!(said.contains("serves SYNAPSE_HOME=") && said.contains("SYNAPSE_UDS_DIR"), "{args:?}: {said}");
    }
    assert!(is_alive(pid), "the first home's broker was stopped by the second home's command");
    assert_eq!(home.broker_pid(), Some(pid));
    // The same home, named relatively from its parent folder, is the same home.
    let parent = home.home().parent().unwrap().to_path_buf();
    let output = home.cmd(&["list"]).env("SYNAPSE_HOME", "home").current_dir(&parent).output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
}

#[test]
fn a_stale_socket_file_left_by_a_dead_broker_is_replaced() {
    let home = Home::new();
    std::fs::create_dir_all(home.uds()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(home.socket()).unwrap());
    assert!(home.socket().exists());
    home.ok(&["list"]);
    assert!(home.broker_pid().is_some());
}

#[test]
fn a_corrupt_database_is_refused_with_a_clear_message() {
    let home = Home::new();
    std::fs::write(home.home().join("synapse.redb"), vec![0x5a; 64 * 1024]).unwrap();
    let output = home.run(&["broker"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let message = stderr(&output);
    assert!(message.contains("cannot be opened") && message.contains("move it aside"), "{message}");
    // A command that needs the broker reports why it could not start it.
    let output = home.run(&["list"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("the broker exited at start"), "{}", describe(&output));
}

/// A command that starts a broker while another process still holds the database (a broker
/// stopping, or one replaying a long log at its start) waits for it instead of failing with
/// "the broker exited at start".
#[test]
fn a_command_waits_while_another_process_still_holds_the_database() {
    let home = Home::new();
    home.ok(&["list"]);
    home.ok(&["broker", "stop"]);
    let held = redb::Database::create(home.home().join("synapse.redb")).unwrap();
    let command = home.cmd(&["list"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The broker it started found the database held, and said so, at least once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(home.home().join("broker.log"))
        .is_ok_and(|log| log.contains("already has the database"))
    {
        assert!(std::time::Instant::now() < deadline, "no broker was refused for the held database");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(held);
    let output = output_within(command, std::time::Duration::from_secs(60), "synapse list");
    assert!(output.status.success(), "{}", describe(&output));
}

/// `synapse broker start` after a deliberate stop ends it at once: while the new broker waits
/// for the database (or replays a long log), an agent's command waits for it too instead of
/// saying the broker was stopped on purpose (the marker went only once the log was open).
#[test]
fn an_agents_command_waits_for_a_broker_the_user_is_starting() {
    let home = Home::new();
    home.ok(&["list"]);
    home.ok(&["broker", "stop"]);
    assert!(home.home().join("broker.stopped").exists());
    let held = redb::Database::create(home.home().join("synapse.redb")).unwrap();
    let start = home.cmd(&["broker", "start"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(home.home().join("broker.log"))
        .is_ok_and(|log| log.contains("already has the database"))
    {
        assert!(std::time::Instant::now() < deadline, "no broker was refused for the held database");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!home.home().join("broker.stopped").exists(), "the deliberate stop is over once the user starts a broker");
    let inside = home
        .cmd(&["list"])
        .env("SYNAPSE_AGENT_ID", "synapse-dummy-1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(held);
    let started = output_within(start, std::time::Duration::from_secs(60), "synapse broker start");
    assert!(started.status.success(), "{}", describe(&started));
    let inside = output_within(inside, std::time::Duration::from_secs(60), "synapse list inside an agent");
    assert!(inside.status.success(), "{}", describe(&inside));
}

/// A command that finds another command starting the broker (it holds the start-up lock) waits
/// for that start as long as a start may take (20 s, or the call limit if longer), not for
/// ever: a holder stopped with Ctrl-Z kept every later command waiting.
#[test]
fn a_command_waits_for_the_start_up_lock_for_a_bounded_time() {
    let home = Home::new();
    std::fs::create_dir_all(home.home()).unwrap();
    let held = std::fs::File::create(home.home().join("broker.start.lock")).unwrap();
    held.lock().unwrap();
    let waiting = home
        .cmd(&["list"])
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "300")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = output_within(waiting, std::time::Duration::from_secs(30), "synapse list");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("still holds"), "{}", describe(&output));
    assert!(std::os::unix::net::UnixStream::connect(home.socket()).is_err(), "no broker was started meanwhile");
    drop(held);
    home.ok(&["list"]);
}

#[test]
fn a_log_written_by_a_newer_schema_is_refused() {
    let home = Home::new();
    home.ok(&["list"]);
    home.ok(&["broker", "stop"]);
    {
        let db = redb::Database::create(home.home().join("synapse.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap();
            meta.insert("schema_version", 99).unwrap();
        }
        txn.commit().unwrap();
    }
    let output = home.run(&["broker"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("newer Synapse (schema 99"), "{}", describe(&output));
    // A command of the user's that fails to start it leaves the deliberate stop in place:
    // agents do not start a broker in its stead.
    let output = home.run(&["list"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(home.home().join("broker.stopped").exists(), "the deliberate stop was ended by a failed start");
}

#[test]
fn events_lists_the_log_and_follow_prints_new_events_as_they_are_appended() {
    let home = Home::new();
    let agent = home.register(Some("alice"));
    let mut follower = home
        .cmd(&["events", "--follow", "--json", "--kind", "message_sent"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    home.ok(&["send", "alice", "first", "--no-response"]);
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["event"]["kind"], "message_sent");
    assert_eq!(first["event"]["data"]["text"], "first");
    home.ok(&["send", "alice", "second", "--no-response"]);
    let second: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(second["event"]["data"]["text"], "second");
    assert!(second["seq"].as_u64() > first["seq"].as_u64());
    follower.kill().unwrap();
    follower.wait().unwrap();

    let human = home.ok(&["events"]);
    assert!(human.lines().any(|line| line.contains("agent_registered") && line.contains(&agent.id)), "{human}");
    assert!(human.lines().any(|line| line.contains("message_sent") && line.contains("first")), "{human}");
    let after = home.ok(&["events", "--json", "--after", &first["seq"].to_string()]);
    assert!(after.lines().all(|line| {
        let value: Value = serde_json::from_str(line).unwrap();
        value["seq"].as_u64() > first["seq"].as_u64()
    }));
    assert!(after.contains("second") && !after.contains("\"first\""));
}

#[test]
fn a_follower_sees_every_event_once_in_order_while_writers_run() {
    let home = Home::new();
    home.register(Some("target"));
    let start = home.head();
    let mut follower = home
        .cmd(&["events", "--follow", "--json", "--after", &start.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let socket = home.socket();
            std::thread::spawn(move || {
                for round in 0..25 {
                    let body = json!({"to": "target", "text": format!("w{writer} r{round}")});
                    let (status, _) = http_unix(&socket, "POST", "/send", Some(body.to_string().as_bytes()), &[]);
                    assert_eq!(status, 200);
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    // Every event the writers caused, whatever their number per send.
    let expected_end = home.head();
    let mut seqs = Vec::new();
    for line in lines {
        let value: Value = serde_json::from_str(&line.unwrap()).unwrap();
        seqs.push(value["seq"].as_u64().unwrap());
        if seqs.last() == Some(&expected_end) {
            break;
        }
    }
    follower.kill().unwrap();
    follower.wait().unwrap();
    let wanted: Vec<u64> = (start + 1..=expected_end).collect();
    assert_eq!(seqs, wanted, "no gap, no repeat, in order");
}

#[test]
fn rebuild_and_verify_report_on_the_whole_log() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let sent = home.run_as(&alice, &["send", "bob", "question", "--response"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    assert!(home.run_as(&bob, &["reply", "answer"]).status.success());
    let events = home.events().len();
    let rebuilt = home.ok(&["admin", "rebuild"]);
    assert!(rebuilt.contains(&format!("rebuilt the projections from {events} events")), "{rebuilt}");
    let verified = home.ok(&["admin", "verify"]);
    assert!(verified.contains(&format!("ok: replaying {events} events")), "{verified}");
}

/// A send is made durable by the write-ahead log, and the writer, once idle, commits it
/// durably to the database and starts the log over.
#[test]
fn an_idle_writer_checkpoints_what_only_the_write_ahead_log_held() {
    let home = Home::new();
    home.register(Some("target"));
    home.ok(&["send", "target", "kept", "--no-response"]);
    let wal = home.home().join("synapse.wal");
    let header = || std::fs::read(&wal).unwrap().get(..16).map(<[u8]>::to_vec).unwrap_or_default();
    assert!(std::fs::metadata(&wal).unwrap().len() >= 1 << 20, "a record was appended (the file grew by a step)");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while header() != [0; 16] {
        assert!(std::time::Instant::now() < deadline, "the write-ahead log still holds a record: {:?}", header());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Durable in the database now: a broker killed at once loses nothing, with nothing to replay.
    home.kill_broker();
    let sent: Vec<Value> = home.events().into_iter().filter(|event| event["event"]["kind"] == "message_sent").collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["event"]["data"]["text"], "kept");
}

/// Issue 2: a broker killed with SIGKILL mid-load loses nothing it acknowledged.
#[test]
fn every_acknowledged_event_survives_a_sigkill_in_the_middle_of_a_load() {
    let home = Home::new();
    home.register(Some("target"));
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..8)
        .map(|producer| {
            let socket = home.socket();
            let acknowledged = acknowledged.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut round = 0;
                while !stop.load(Ordering::SeqCst) {
                    round += 1;
                    let body = json!({"to": "target", "text": format!("p{producer} #{round}")}).to_string();
                    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(&socket) else { break };
                    use std::io::{Read, Write};
                    let request = format!(
                        "POST /send HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(request.as_bytes()).is_err() {
                        break;
                    }
                    let mut answer = String::new();
                    if stream.read_to_string(&mut answer).is_err() || !answer.starts_with("HTTP/1.1 200") {
                        break;
                    }
                    let Some(json_start) = answer.find("\r\n\r\n") else { break };
                    let value: Value = serde_json::from_str(&answer[json_start + 4..]).unwrap();
                    acknowledged.lock().unwrap().push(value["task"]["id"].as_str().unwrap().to_string());
                }
            })
        })
        .collect();
    // Kill once a good number of sends have been acknowledged, while producers are still going.
    while acknowledged.lock().unwrap().len() < 200 {
        std::thread::yield_now();
    }
    home.kill_broker();
    stop.store(true, Ordering::SeqCst);
    for producer in producers {
        producer.join().unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    // The next command starts a new broker on the same log.
    let events = home.events();
    let present: std::collections::HashSet<&str> = events
        .iter()
        .filter(|event| event["event"]["kind"] == "message_sent")
        .filter_map(|event| event["event"]["data"]["task_id"].as_str())
        .collect();
    let missing: Vec<&String> = acknowledged.iter().filter(|task| !present.contains(task.as_str())).collect();
    eprintln!("acknowledged {}, present {}", acknowledged.len(), present.len());
    assert!(missing.is_empty(), "{} acknowledged sends lost: {missing:?}", missing.len());
    let seqs: Vec<u64> = events.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "the recovered log has no gaps");
    assert!(home.ok(&["admin", "verify"]).starts_with("ok"));
}

/// Issue 6: the broker-wide stream resumes from Last-Event-ID without gaps or repeats, and
/// filters by agent and kind.
#[test]
fn the_event_stream_resumes_from_last_event_id_and_filters_by_agent_and_kind() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    home.register(Some("bob"));
    for text in ["one", "two", "three"] {
        home.ok(&["send", "bob", text, "--no-response"]);
    }
    let head = home.head();
    // A client that dropped after event 4 resumes with Last-Event-ID: 4.
    let (status, body) = home.http("GET", "/events?after=0", None, &[("Last-Event-ID", "4")]);
    assert_eq!(status, 200);
    let text = body.as_str().unwrap().to_string();
    let ids: Vec<u64> =
        text.lines().filter_map(|line| line.strip_prefix("id: ")).map(|id| id.parse().unwrap()).collect();
    assert_eq!(ids, (5..=head).collect::<Vec<_>>(), "no gap, no repeat");
    // The three anonymous sends concern bob only; alice's own send is the one she is part of.
    assert!(home.run_as(&alice, &["send", "bob", "from alice", "--no-response"]).status.success());
    let (_, body) = home.http("GET", &format!("/events?kind=message_sent&agent={}", alice.id), None, &[]);
    let events: Vec<&str> = body.as_str().unwrap().lines().filter(|line| line.starts_with("event: ")).collect();
    assert_eq!(events, ["event: message_sent"], "only alice's message");
    let (_, body) = home.http("GET", "/events?kind=message_sent", None, &[]);
    assert_eq!(body.as_str().unwrap().lines().filter(|line| *line == "event: message_sent").count(), 4);
    let (status, _) = home.http("GET", "/events", None, &[("Last-Event-ID", "not-a-number")]);
    assert_eq!(status, 400);
}

/// `synapse events --follow --json` read on a thread: each line as JSON, and the child.
fn follow_events(home: &Home) -> (std::process::Child, std::sync::mpsc::Receiver<Value>) {
    let mut child =
        home.cmd(&["events", "--follow", "--json"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(serde_json::from_str::<Value>(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

/// Takes followed events into `seen` until one with `seq` has come.
fn receive_through(lines: &std::sync::mpsc::Receiver<Value>, seen: &mut Vec<Value>, seq: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.last().and_then(|event| event["seq"].as_u64()).is_none_or(|last| last < seq) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let event = lines.recv_timeout(left).unwrap_or_else(|error| panic!("no event {seq} ({error}); saw {seen:#?}"));
        seen.push(event);
    }
}

/// A broker started, `events --follow` following it, and alice registered: her events seen.
fn following_alice(home: &Home) -> (std::process::Child, std::sync::mpsc::Receiver<Value>, Vec<Value>) {
    home.ok(&["broker", "start"]);
    let (child, lines) = follow_events(home);
    let mut seen = Vec::new();
    home.register(Some("alice"));
    receive_through(&lines, &mut seen, home.head());
    (child, lines, seen)
}

/// Issue 14: `events --follow` ended silently with status 0 when the broker restarted. It
/// waits for the next broker and goes on after the last event it printed: every event of the
/// log once, in order, none missed. A log that lost that event meanwhile ends it with exit 1.
#[test]
fn events_follow_goes_on_across_a_broker_restart_without_duplicates_or_gaps() {
    let home = Home::new();
    let (child, lines, mut seen) = following_alice(&home);

    home.ok(&["broker", "stop"]);
    home.ok(&["broker", "start"]);
    home.register(Some("bob"));
    let head = home.head();
    receive_through(&lines, &mut seen, head);
    let followed: Vec<u64> = seen.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    let logged: Vec<u64> = home.events().iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(followed, logged, "each event once, none missed");
    assert!(
        seen.iter().any(|event| event["event"]["kind"] == "agent_registered" && event.to_string().contains("bob")),
        "an event of the second broker: {seen:#?}"
    );

    // A crash (SIGKILL) is followed through the same way, by whichever client starts the next.
    home.kill_broker();
    home.register(Some("carol"));
    let head = home.head();
    receive_through(&lines, &mut seen, head);
    let followed: Vec<u64> = seen.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(followed, (1..=head).collect::<Vec<u64>>(), "each event once after a crash too");

    // The log moved aside while no broker ran: the next broker's log is not the one followed.
    home.ok(&["broker", "stop"]);
    std::fs::rename(home.home().join("synapse.redb"), home.home().join("synapse.redb.aside")).unwrap();
    home.ok(&["broker", "start"]);
    let ended = output_within(child, std::time::Duration::from_secs(30), "events --follow");
    assert_eq!(ended.status.code(), Some(1), "{}", describe(&ended));
    assert!(stderr(&ended).contains("is no longer in it"), "{}", describe(&ended));
}

/// `events --follow` waits for the next broker after a restart. The next one may be of another
/// version (an upgrade, started by a newer `synapse`) or serve another home (two homes sharing
/// a socket folder): no event of it is this follower's, and it waited for good, printing
/// nothing. It ends with exit 1 and the reason.
#[test]
fn events_follow_ends_with_the_reason_when_the_next_broker_is_of_another_version() {
    let home = Home::new();
    let (child, _lines, _seen) = following_alice(&home);
    home.ok(&["broker", "stop"]);
    let _requests = stand_in_broker(&home, "0.0.0-other");
    let ended = output_within(child, std::time::Duration::from_secs(30), "events --follow");
    assert_eq!(ended.status.code(), Some(1), "{}", describe(&ended));
    assert!(stderr(&ended).contains("the running broker is version 0.0.0-other"), "{}", describe(&ended));
}

/// A stand-in broker on `home`'s socket, served by this test process: `GET /broker/health`
/// answers as a broker of `version`, `GET /agents` with no agents, anything else 404. Each
/// request line is recorded.
fn stand_in_broker(home: &Home, version: &str) -> Arc<Mutex<Vec<String>>> {
    stand_in_broker_of_build(home, version, None)
}

/// [`stand_in_broker`], saying it runs `build` when given.
fn stand_in_broker_of_build(home: &Home, version: &str, build: Option<&str>) -> Arc<Mutex<Vec<String>>> {
    use std::io::{Read, Write};
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).recursive(true).create(home.uds()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(home.socket()).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let mut health = json!({
        "pid": std::process::id(), "version": version, "schema": 1, "home": home.home().to_str().unwrap(),
        "socket": home.socket().to_str().unwrap(), "port": 0, "head": 0, "healthy": true,
    });
    if let Some(build) = build {
        health["build"] = json!(build);
    }
    let health = health.to_string();
    let seen = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let (seen, health) = (seen.clone(), health.clone());
            std::thread::spawn(move || {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One request at a time, no body (the commands used here send none).
                    let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") else {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(count) => buffer.extend_from_slice(&chunk[..count]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..end]).to_string();
                    buffer.drain(..end + 4);
                    let line = head.lines().next().unwrap_or_default().to_string();
                    seen.lock().unwrap().push(line.clone());
                    let (status, body) = if line.starts_with("GET /broker/health ") {
                        ("200 OK", health.clone())
                    } else if line.starts_with("GET /agents ") {
                        ("200 OK", r#"{"agents":[]}"#.to_string())
                    } else {
                        ("404 Not Found", r#"{"error":"not here"}"#.to_string())
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    requests
}

/// A broker that does not answer (here stopped with SIGSTOP) is stopped by `broker stop` all
/// the same: it said "timed out ... restart it with 'synapse broker stop'", which then timed out
/// too. The stop is recorded as deliberate, and nothing acknowledged is lost.
#[test]
fn broker_stop_stops_a_broker_that_does_not_answer() {
    let home = Home::new();
    home.register(Some("bob"));
    home.ok(&["send", "bob", "before the broker froze", "--no-response"]);
    let pid = home.broker_pid().expect("broker.json");
    freeze(pid);
    // Another home sharing the socket folder finds this stuck broker at its socket: not its own
    // (its broker.json does not name it), so it is not signalled.
    let other = Home::new();
    let output = other
        .cmd(&["broker", "stop"])
        .env("SYNAPSE_UDS_DIR", home.uds())
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "300")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        stderr(&output).contains("SYNAPSE_UDS_DIR") && stderr(&output).contains("nothing stopped"),
        "{}",
        describe(&output)
    );
    assert!(is_alive(pid), "another home's broker was stopped");
    assert!(!other.home().join("broker.stopped").exists());
    let output = home.cmd(&["broker", "stop"]).env("SYNAPSE_CLIENT_TIMEOUT_MS", "300").output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stdout(&output).contains(&format!("broker stopped (pid {pid})")), "{}", describe(&output));
    assert!(stderr(&output).contains("with SIGTERM"), "{}", describe(&output));
    assert!(!is_alive(pid), "the broker is gone");
    assert!(home.home().join("broker.stopped").exists(), "recorded as a deliberate stop");
    let history = home.ok(&["history", "list"]);
    assert!(history.contains("before the broker froze"), "{history}");
}

/// A home whose path is not UTF-8 is reported by its broker with replacement characters: the
/// commands of that home took their own broker for another home's and refused it.
#[test]
fn a_home_whose_path_is_not_utf8_uses_its_own_broker() {
    use std::os::unix::ffi::OsStrExt;
    let home = Home::new();
    let odd = home.dir.path().join(std::ffi::OsStr::from_bytes(b"home-\xff"));
    let run = |args: &[&str]| home.cmd(args).env("SYNAPSE_HOME", &odd).output().unwrap();
    for args in [&["list"][..], &["broker", "status"], &["broker", "stop"]] {
        let output = run(args);
        assert!(output.status.success(), "synapse {args:?}: {}", describe(&output));
    }
    assert!(stdout(&run(&["broker", "stop"])).contains("no broker is running"));
}

/// Removes a `broker.json` the test wrote when the test ends: it names this test process at
/// times, and dropping the `Home` stops (and kills) the pid it names.
struct RemoveInfo(std::path::PathBuf);

impl Drop for RemoveInfo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A `broker.json` left by a killed broker, whose pid another process now has, names a TCP
/// port that another server of the user's may hold by now: `broker stop` does not ask it to
/// shut down (it did, after a health check it ignored the failure of).
#[test]
fn broker_stop_asks_no_server_but_a_broker_to_shut_down() {
    use std::io::{Read, Write};
    let home = Home::new();
    let _remove_info = RemoveInfo(home.home().join("broker.json"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|count| count == 1) {
                head.push(byte[0]);
            }
            let line = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_string();
            seen.lock().unwrap().push(line);
            let body = "<html>another server</html>";
            let _ = stream.write_all(
                format!("HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
                    .as_bytes(),
            );
        }
    });
    // The pid is this test's (alive, not a broker); no Unix socket answers.
    let info = json!({
        "pid": std::process::id(), "version": env!("CARGO_PKG_VERSION"), "schema": 1,
        "home": home.home().to_str().unwrap(), "socket": home.socket().to_str().unwrap(),
        "port": port, "head": 0, "healthy": true,
    });
    std::fs::write(home.home().join("broker.json"), info.to_string()).unwrap();
    let output = home.run(&["broker", "stop"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stdout(&output).contains("no broker is running"), "{}", describe(&output));
    assert!(stderr(&output).contains("does not answer as a broker"), "{}", describe(&output));
    let seen = requests.lock().unwrap().clone();
    assert!(seen.iter().any(|line| line.starts_with("GET /broker/health ")), "the port was tried: {seen:?}");
    assert!(!seen.iter().any(|line| line.contains("/broker/shutdown")), "asked to shut down: {seen:?}");
}

#[test]
fn a_command_skips_the_version_handshake_only_when_broker_json_names_the_process_at_the_socket() {
    let home = Home::new();
    // broker.json names this test process at times: it must be gone before `home` is dropped,
    // which stops (and kills) the pid it names.
    let _remove_info = RemoveInfo(home.home().join("broker.json"));
    // The stand-in claims another version in its health answer: a command that asks is refused.
    let requests = stand_in_broker(&home, "0.0.0-other");
    let info = |pid: u32, version: &str| {
        let info = json!({
            "pid": pid, "version": version, "schema": 1, "home": home.home().to_str().unwrap(),
            "socket": home.socket().to_str().unwrap(), "port": 0, "head": 0, "healthy": true,
        });
        std::fs::write(home.home().join("broker.json"), info.to_string()).unwrap();
    };
    let ours = env!("CARGO_PKG_VERSION");
    let me = std::process::id();
    let asked_health = |requests: &Arc<Mutex<Vec<String>>>| {
        let seen = std::mem::take(&mut *requests.lock().unwrap());
        seen.iter().any(|line| line.starts_with("GET /broker/health "))
    };

    // The file names another process (a broker that died, its pid reused), or this process as
    // another version, or cannot be read: the command asks the broker, and is told its version.
    for (what, write) in
        [("another pid", Some((me + 1, ours))), ("another version", Some((me, "0.0.0-file"))), ("no file", None)]
    {
        match write {
            Some((pid, version)) => info(pid, version),
            None => {
                let _ = std::fs::remove_file(home.home().join("broker.json"));
            }
        }
        let output = home.run(&["list"]);
        assert!(!output.status.success(), "{what}: {}", describe(&output));
        assert!(stderr(&output).contains("the running broker is version 0.0.0-other"), "{what}: {}", describe(&output));
        assert!(asked_health(&requests), "{what}: the health check was skipped");
    }
    std::fs::write(home.home().join("broker.json"), b"{ not json").unwrap();
    let output = home.run(&["list"]);
    assert!(stderr(&output).contains("the running broker is version 0.0.0-other"), "{}", describe(&output));
    assert!(asked_health(&requests));

    // The file names the process the kernel says listens on the socket, as this version: the
    // command goes straight to its request.
    info(me, ours);
    let output = home.run(&["list"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(!asked_health(&requests), "the health check was asked although broker.json vouched for the broker");
}

/// A broker of this version but another build (synapse reinstalled while it ran) serves on,
/// and a command says so once on stderr: it was used without a word (the version alone was
/// compared, and it is the same across builds).
#[test]
fn a_broker_of_another_build_serves_on_and_a_command_says_so() {
    let home = Home::new();
    let requests = stand_in_broker_of_build(&home, env!("CARGO_PKG_VERSION"), Some("another-build"));
    let output = home.run(&["list"]);
    assert!(output.status.success(), "{}", describe(&output));
    let said = stderr(&output);
    assert_eq!(said.matches("another build of synapse").count(), 1, "{said}");
    assert!(said.contains("synapse broker stop"), "{said}");
    assert!(requests.lock().unwrap().iter().any(|line| line.starts_with("GET /agents ")));
    // A broker that names no build (older than the field) is taken as it is.
    let quiet = Home::new();
    let _requests = stand_in_broker_of_build(&quiet, env!("CARGO_PKG_VERSION"), None);
    let output = quiet.run(&["list"]);
    assert!(output.status.success() && !stderr(&output).contains("another build"), "{}", describe(&output));
}

/// The file is removed when the stop begins (the end of the stop leaves it alone: a broker
/// started meanwhile may own it); a command skips its version handshake only while the file
/// names the broker at the socket.
#[test]
fn broker_json_is_gone_once_the_broker_has_stopped_and_the_next_command_starts_a_new_one() {
    let home = Home::new();
    home.ok(&["list"]);
    let first = home.broker_pid().expect("broker.json of the first broker");
    home.ok(&["broker", "stop"]);
    assert!(!home.home().join("broker.json").exists(), "broker.json outlived the stop");
    home.ok(&["list"]);
    let second = home.broker_pid().expect("broker.json of the second broker");
    assert_ne!(first, second);
}

/// The Unix socket is the way in; a command that cannot reach it while broker.json names a live
/// broker uses its TCP port and says why (an agent cannot register that way: the broker cannot
/// tell which process calls).
#[test]
fn a_command_that_cannot_reach_the_socket_uses_the_live_brokers_tcp_port_and_says_why() {
    let home = Home::new();
    home.ok(&["list"]);
    let moved = home.dir.path().join("broker.sock.moved");
    std::fs::rename(home.socket(), &moved).unwrap();
    let output = home.run(&["list"]);
    std::fs::rename(&moved, home.socket()).unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let said = stderr(&output);
    assert!(said.contains("cannot connect to") && said.contains("using the broker's TCP port"), "{said}");
    // With the socket back, nothing is said.
    let output = home.run(&["list"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(!stderr(&output).contains("TCP port"), "{}", describe(&output));
}
