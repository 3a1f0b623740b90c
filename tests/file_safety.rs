//! File safety through the real binary (issue 5, file-safety part).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::{Command, Stdio};

fn fs(home: &Home, args: &[&str]) -> Command {
    let mut command = home.cmd(&[&["file-safety"], args].concat());
    command.env("SYNAPSE_FILE_SAFETY_ENABLED", "true");
    command
}

fn run(home: &Home, args: &[&str]) -> std::process::Output {
    fs(home, args).output().unwrap()
}

#[test]
fn without_the_flag_each_command_says_how_to_enable_it() {
    let home = Home::new();
    let status = home.run(&["file-safety", "status"]);
    assert!(status.status.success());
    assert!(stdout(&status).contains("SYNAPSE_FILE_SAFETY_ENABLED=true"));
    let locked = home.run(&["file-safety", "lock", "/tmp/x", "someone"]);
    assert_eq!(locked.status.code(), Some(1));
    assert!(stderr(&locked).contains("SYNAPSE_FILE_SAFETY_ENABLED=true"), "{}", describe(&locked));
}

#[test]
fn locks_are_exclusive_renewable_releasable_and_checked() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    let file = project.join("src/main.rs");
    let file_text = file.to_str().unwrap();

    // A relative path with '..' names the same absolute file.
    let locked = fs(&home, &["lock", "src/../src/main.rs", &alice.id, "--intent", "refactor"])
        .current_dir(&project)
        .output()
        .unwrap();
    assert!(locked.status.success(), "{}", describe(&locked));
    assert!(stdout(&locked).contains(&format!("Locked {file_text} for {}", alice.id)), "{}", describe(&locked));
    let refused = run(&home, &["lock", file_text, &bob.id]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains(&format!("File is already locked by {} until", alice.id)),
        "{}",
        describe(&refused)
    );
    assert!(run(&home, &["lock", file_text, &alice.id, "--duration", "600"]).status.success(), "the holder renews");

    let denied = run(&home, &["check", file_text, &bob.id]);
    assert_eq!(denied.status.code(), Some(1));
    assert!(stdout(&denied).starts_with("DENIED"));
    let allowed = run(&home, &["check", file_text, &alice.id]);
    assert!(allowed.status.success() && stdout(&allowed).starts_with("ALLOWED"));
    let locks = stdout(&run(&home, &["locks"]));
    assert!(locks.contains(file_text) && locks.contains(&alice.id) && locks.contains("refactor"), "{locks}");

    let not_holder = run(&home, &["unlock", file_text, &bob.id]);
    assert_eq!(not_holder.status.code(), Some(1));
    assert!(stderr(&not_holder).contains("--force"));
    assert!(run(&home, &["unlock", file_text, &alice.id]).status.success());
    assert!(stdout(&run(&home, &["locks"])).contains("No locks."));
    assert!(run(&home, &["lock", file_text, &bob.id]).status.success());
    assert!(run(&home, &["unlock", file_text, "--force"]).status.success());
    let nothing = run(&home, &["unlock", file_text, &bob.id]);
    assert_eq!(nothing.status.code(), Some(1));
    assert!(stderr(&nothing).contains("is not locked"));
    assert!(home.ok(&["admin", "verify"]).starts_with("ok"), "locks rebuild to the same state");
}

#[test]
fn modifications_are_recorded_and_shown_to_the_next_writer() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let sent: serde_json::Value =
        serde_json::from_str(&stdout(&home.run_as(&alice, &["send", "bob", "edit it", "--json"]))).unwrap();
    let task = sent["sender_task"]["id"].as_str().unwrap().to_string();
    let recorded =
        run(&home, &["record", "/srv/app/lib.rs", &bob.id, &task[..8], "--type", "CREATE", "--intent", "new module"]);
    assert!(recorded.status.success(), "{}", describe(&recorded));
    assert!(run(&home, &["record", "/srv/app/lib.rs", &bob.id, &task, "--type", "modify"]).status.success());
    let history = stdout(&run(&home, &["history", "/srv/app/lib.rs"]));
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 2, "{history}");
    assert!(lines[0].contains("MODIFY") && lines[1].contains("CREATE") && lines[1].contains("new module"), "{history}");
    let check = stdout(&run(&home, &["check", "/srv/app/lib.rs", &alice.id]));
    assert!(check.starts_with("ALLOWED") && check.contains("CREATE"), "the check shows recent changes: {check}");
    assert!(stdout(&run(&home, &["recent", "--agent", &bob.id])).contains("/srv/app/lib.rs"));
    assert!(stdout(&run(&home, &["recent", "--agent", &alice.id])).contains("No recorded modifications"));
    assert!(stdout(&run(&home, &["status"])).contains("2 recorded modification(s)"));
    // Records of today are kept by a cleanup that keeps the last day.
    let cleaned = stdout(&run(&home, &["cleanup", "--days", "1"]));
    assert!(cleaned.contains("removed 0 modification record(s)"), "{cleaned}");
    assert!(stdout(&run(&home, &["status"])).contains("2 recorded modification(s)"));
}

#[test]
fn bad_input_is_refused_with_a_clear_error_and_nothing_appended() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let head = home.head();
    let long_intent = "x".repeat(1001);
    let long_path = "/a".repeat(2049);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["lock", "/a", "synapse-ghost-1"], "is not registered"),
        (vec!["check", "/a", "claud"], "Agent 'claud' is not registered"),
        (vec!["lock", "/a", &alice.id, "--duration", "0"], "positive number of seconds"),
        (vec!["lock", "/a", &alice.id, "--duration", "-5"], "positive number of seconds"),
        (vec!["lock", "/a", &alice.id, "--duration", "99999999"], "between 1 and"),
        (vec!["record", "/a", &alice.id, "deadbeef"], "Task deadbeef not found"),
        (vec!["record", "/a", &alice.id, "deadbeef", "--type", "RENAME"], "unknown change type"),
        (vec!["record", "/a", "synapse-ghost-1", "deadbeef"], "is not registered"),
        (vec!["history", "/a", "--limit", "99999999"], "limit must be between"),
        (vec!["history", "/a", "--limit", "0"], "limit must be between"),
        (vec!["cleanup", "--days", "0"], "positive number of days"),
        (vec!["cleanup", "--days", "-2"], "positive number of days"),
        // Printed by `file-safety locks` on the user's terminal: no escape sequence gets there.
        (
            vec!["lock", "/a", &alice.id, "--intent", "edit \u{1b}]52;c;cHduZWQ=\u{7}"],
            "intent contains a control character",
        ),
        (vec!["lock", "/a", &alice.id, "--intent", "two\nlines"], "intent contains a control character"),
        (vec!["lock", "/a", &alice.id, "--intent", &long_intent], "intent is longer than 1000 characters"),
        (vec!["record", "/a", &alice.id, "dead\u{9b}beef"], "task_id contains a control character"),
        // Joined to the working directory, an empty path locked that directory.
        (vec!["lock", "", &alice.id], "the path is empty"),
        (vec!["check", " ", &alice.id], "the path is empty"),
        (vec!["lock", &long_path, &alice.id], "4098 bytes long; a path is at most 4096 bytes"),
    ];
    for (args, expected) in cases {
        let output = run(&home, &args);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", describe(&output));
        assert!(stderr(&output).contains(expected), "{args:?}: {}", describe(&output));
    }
    let (status, answer) =
        home.http("POST", "/file-safety/lock", Some(br#"{"path":"relative/x","agent_id":"a"}"#), &[]);
    assert_eq!(status, 400, "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("not an absolute path"));
    // A path of 50,000 missing parts: each was looked up with every part before it, which held
    // the broker's socket for minutes.
    let body = serde_json::json!({"path": "/a".repeat(50_000), "agent_id": alice.id}).to_string();
    for route in ["/file-safety/lock", "/file-safety/validate"] {
        let (status, answer) = home.http("POST", route, Some(body.as_bytes()), &[]);
        assert_eq!(status, 400, "{route}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains("a path is at most 4096 bytes"), "{answer}");
    }
    assert_eq!(home.head(), head, "nothing appended");
}

/// Two agents racing for the same file from parallel processes: exactly one wins, every time.
#[test]
fn two_agents_racing_for_one_file_get_exactly_one_winner_in_100_rounds() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    for round in 0..100 {
        let file = format!("/race/file-{round}");
        let racers: Vec<_> = [&alice.id, &bob.id]
            .iter()
            .map(|agent| {
                fs(&home, &["lock", &file, agent]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
            })
            .collect();
        let winners =
            racers.into_iter().map(|child| child.wait_with_output().unwrap()).filter(|o| o.status.success()).count();
        assert_eq!(winners, 1, "round {round}");
    }
}

#[test]
fn lock_wait_returns_when_the_holder_releases() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    assert!(run(&home, &["lock", "/shared/config.toml", &alice.id]).status.success());
    let waiter = fs(&home, &["lock", "/shared/config.toml", &bob.id, "--wait", "--wait-timeout", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The waiter either finds the file free already or waits for the release event; either
    // way it must end holding the lock.
    assert!(run(&home, &["unlock", "/shared/config.toml", &alice.id]).status.success());
    let output = waiter.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stdout(&output).contains(&format!("for {}", bob.id)));
    let timed_out = run(&home, &["lock", "/shared/config.toml", &alice.id, "--wait", "--wait-timeout", "1"]);
    assert_eq!(timed_out.status.code(), Some(1));
    assert!(stderr(&timed_out).contains("already locked by"), "{}", describe(&timed_out));
    // Issue 14: the refusal after waiting says that it waited.
    assert!(stderr(&timed_out).contains("--wait-timeout 1)"), "{}", describe(&timed_out));
    // A wait longer than the call limit: the call waits as long as the broker does, and the
    // answer is the broker's refusal, not a time-out of the call (after which the lock could be
    // taken all the same).
    let outlasted = fs(&home, &["lock", "/shared/config.toml", &alice.id, "--wait", "--wait-timeout", "2"])
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "500")
        .output()
        .unwrap();
    assert_eq!(outlasted.status.code(), Some(1), "{}", describe(&outlasted));
    assert!(stderr(&outlasted).contains("--wait-timeout 2)"), "{}", describe(&outlasted));
}

#[test]
fn lock_wait_also_ends_when_the_holders_lock_expires() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    assert!(run(&home, &["lock", "/shared/short.lock", &alice.id, "--duration", "1"]).status.success());
    let waited = run(&home, &["lock", "/shared/short.lock", &bob.id, "--wait", "--wait-timeout", "30"]);
    assert!(waited.status.success(), "{}", describe(&waited));
    // Bob's lock was taken no earlier than the moment Alice's expired.
    let events = home.events();
    let acquired: Vec<&serde_json::Value> =
        events.iter().filter(|event| event["event"]["kind"] == "file_lock_acquired").collect();
    assert_eq!(acquired.len(), 2);
    let alice_expiry = acquired[0]["event"]["data"]["expires_ms"].as_u64().unwrap();
    assert!(acquired[1]["time_ms"].as_u64().unwrap() >= alice_expiry);
}

/// A lock is about the file, not the name it was reached by: a symlink to a locked file (or to its
/// directory) is locked too, and a path with control characters is refused (issue 12).
#[test]
fn a_symlink_to_a_locked_file_is_locked_and_control_characters_are_refused() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(project.join("src/main.rs"), "fn main() {}").unwrap();
    std::os::unix::fs::symlink(project.join("src/main.rs"), project.join("alias.rs")).unwrap();
    std::os::unix::fs::symlink(project.join("src"), project.join("code")).unwrap();
    let file = project.join("src/main.rs");
    let locked = fs(&home, &["lock", file.to_str().unwrap(), &alice.id]).output().unwrap();
    assert!(locked.status.success(), "{}", describe(&locked));
    for alias in [project.join("alias.rs"), project.join("code/main.rs")] {
        let as_bob = fs(&home, &["lock", alias.to_str().unwrap(), &bob.id])
            .env("SYNAPSE_AGENT_ID", &bob.id)
            .env("SYNAPSE_AGENT_SECRET", &bob.secret)
            .output()
            .unwrap();
        assert_eq!(as_bob.status.code(), Some(1), "{}", describe(&as_bob));
        assert!(stderr(&as_bob).contains(&format!("already locked by {}", alice.id)), "{}", describe(&as_bob));
        let check = run(&home, &["check", alias.to_str().unwrap(), &bob.id]);
        assert!(stdout(&check).starts_with("DENIED"), "{}", describe(&check));
    }
    // `..` after a link leaves the link's target, as the kernel reads it: one file, one lock.
    std::fs::create_dir_all(project.join("elsewhere/sub")).unwrap();
    std::fs::write(project.join("elsewhere/shared.rs"), "").unwrap();
    std::os::unix::fs::symlink(project.join("elsewhere/sub"), project.join("src/deep")).unwrap();
    let through = project.join("src/deep/../shared.rs");
    let locked = fs(&home, &["lock", through.to_str().unwrap(), &alice.id]).output().unwrap();
    assert!(locked.status.success(), "{}", describe(&locked));
    let direct = run(&home, &["lock", project.join("elsewhere/shared.rs").to_str().unwrap(), &bob.id]);
    assert_eq!(direct.status.code(), Some(1), "{}", describe(&direct));
    assert!(stderr(&direct).contains(&format!("already locked by {}", alice.id)), "{}", describe(&direct));
    let hostile = format!("{}/evil\u{1b}]52;c;cm0=\u{7}.rs", project.display());
    let refused = run(&home, &["lock", &hostile, &alice.id]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(
        stderr(&refused).contains("control character") && !stderr(&refused).contains('\u{1b}'),
        "{}",
        describe(&refused)
    );
}

/// A lock taken on a file in a directory not made yet is kept under that path; when the
/// directory then appears as a link, the same path resolves elsewhere. The lock still binds
/// (by either name), and its holder and the user still release it by the path `locks` prints;
/// it could be released by nobody, and `check` said ALLOWED to everyone. (The bench's agents
/// lock through the writer and take no aliases.)
#[test]
fn a_lock_taken_before_a_link_on_its_path_appeared_still_binds_and_is_released() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(project.join("real")).unwrap();
    let later = project.join("later/f.rs");
    let later_text = later.to_str().unwrap();
    let locked = run(&home, &["lock", later_text, &alice.id, "--duration", "600"]);
    assert!(locked.status.success(), "{}", describe(&locked));
    std::os::unix::fs::symlink(project.join("real"), project.join("later")).unwrap();
    let real = project.join("real/f.rs");
    for name in [later_text, real.to_str().unwrap()] {
        let check = run(&home, &["check", name, &bob.id]);
        assert!(stdout(&check).starts_with("DENIED"), "{name}: {}", describe(&check));
        let refused = run(&home, &["lock", name, &bob.id]);
        assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
        assert!(stderr(&refused).contains(&format!("already locked by {}", alice.id)), "{}", describe(&refused));
    }
    let as_alice = |args: &[&str]| {
        fs(&home, args).env("SYNAPSE_AGENT_ID", &alice.id).env("SYNAPSE_AGENT_SECRET", &alice.secret).output().unwrap()
    };
    let released = as_alice(&["unlock", later_text, &alice.id]);
    assert!(released.status.success(), "{}", describe(&released));
    let check = run(&home, &["check", later_text, &bob.id]);
    assert!(stdout(&check).starts_with("ALLOWED"), "{}", describe(&check));
    // The user's force reaches such a lock too.
    std::fs::remove_file(project.join("later")).unwrap();
    assert!(run(&home, &["lock", later_text, &alice.id]).status.success());
    std::os::unix::fs::symlink(project.join("real"), project.join("later")).unwrap();
    let forced = run(&home, &["unlock", later_text, "--force"]);
    assert!(forced.status.success(), "{}", describe(&forced));
    let locks = stdout(&run(&home, &["locks"]));
    assert!(!locks.contains("f.rs"), "{locks}");
    // A written path that is another file is not a name of this one: `link/../x` is read from
    // the link's target, and the lock on the x beside the link is left alone.
    std::fs::create_dir_all(project.join("elsewhere/sub")).unwrap();
    std::os::unix::fs::symlink(project.join("elsewhere/sub"), project.join("real/deep")).unwrap();
    std::fs::write(project.join("real/x.rs"), "").unwrap();
    assert!(run(&home, &["lock", project.join("real/x.rs").to_str().unwrap(), &alice.id]).status.success());
    let through = project.join("real/deep/../x.rs");
    let check = run(&home, &["check", through.to_str().unwrap(), &bob.id]);
    assert!(stdout(&check).starts_with("ALLOWED"), "{}", describe(&check));
    let not_locked = run(&home, &["unlock", through.to_str().unwrap(), "--force"]);
    assert_eq!(not_locked.status.code(), Some(1), "{}", describe(&not_locked));
    assert!(stdout(&run(&home, &["locks"])).contains("x.rs"), "the other file's lock stays");
}

/// SPEC §5: a lock whose holder is gone is free. The agent's leaving releases its locks; an agent
/// that takes its id again (same name) does not find them held in its name.
#[test]
fn the_locks_of_an_agent_that_leaves_are_released_not_handed_to_the_next_with_its_id() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    assert!(run(&home, &["lock", "/shared/main.rs", &alice.id, "--duration", "86400"]).status.success());
    let (status, answer) = home.http(
        "DELETE",
        &format!("/agents/{}", alice.id),
        None,
        &[(synapse::api::SECRET_HEADER, alice.secret.as_str())],
    );
    assert_eq!(status, 200, "{answer}");
    let (pid, port) = (std::process::id().to_string(), alice.port.to_string());
    let again: serde_json::Value = serde_json::from_str(
        &home.ok(&["agent", "register", "--type", "dummy", "--pid", &pid, "--port", &port, "--name", "alice"]),
    )
    .unwrap();
    assert_eq!(again["agent"]["agent_id"], alice.id.as_str(), "the same port and name take the id back");
    assert!(stdout(&run(&home, &["locks"])).contains("No locks."));
    let allowed = run(&home, &["check", "/shared/main.rs", &bob.id]);
    assert!(allowed.status.success() && stdout(&allowed).starts_with("ALLOWED"), "{}", describe(&allowed));
    let released = home.events().into_iter().any(|event| {
        event["event"]["kind"] == "file_lock_released"
            && event["event"]["data"]["path"] == "/shared/main.rs"
            && event["event"]["data"]["agent_id"] == alice.id.as_str()
    });
    assert!(released, "the release is in the log");
}

/// A waiting `lock_file` the MCP client cancels (the user pressed Esc) leaves no lock behind:
/// the broker granted it when the holder let go, to an agent whose model was told nothing, and
/// it blocked every other agent for its whole duration.
#[test]
fn a_cancelled_waiting_lock_through_mcp_is_released_when_granted() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let file = home.dir.path().join("shared.rs");
    let file_text = file.to_str().unwrap();
    assert!(run(&home, &["lock", file_text, &alice.id]).status.success());

    let mut session = McpSession::start(
        home.cmd(&["mcp"])
            .env("SYNAPSE_FILE_SAFETY_ENABLED", "true")
            .env("SYNAPSE_AGENT_ID", &bob.id)
            .env("SYNAPSE_AGENT_SECRET", &bob.secret),
    );
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "lock_file", "arguments": {"path": file_text, "wait_seconds": 60}}}));
    session.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the user pressed Esc"}}));
    // Messages are handled in order: once the ping is answered, the cancellation is in.
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    session.answer_to(3);
    assert!(run(&home, &["unlock", file_text, &alice.id]).status.success());
    // The server answers nothing to a cancelled request: the log tells. Bob's lock was granted
    // once alice's went, and released again.
    let bobs = |events: &str, kind: &str| {
        events.lines().filter(|line| line.contains(kind) && line.contains(&format!("\"{}\"", bob.id))).count()
    };
    wait_until("bob's lock granted and released", || {
        let events = home.ok(&["events", "--json"]);
        bobs(&events, "\"file_lock_acquired\"") == 1 && bobs(&events, "\"file_lock_released\"") == 1
    });
    let locks = stdout(&run(&home, &["locks"]));
    assert!(locks.contains("No locks."), "{locks}");
    drop(session);
}
