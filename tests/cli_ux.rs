//! What a user sees at the command line (issue 14): closed pipes, typos, one JSON document.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Stdio;

/// `synapse history stats | head -1` panicked ("failed printing to stdout: Broken pipe", status
/// 101). A closed pipe now ends the command quietly.
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    home.register(Some("bob"));
    assert!(home.run_as(&alice, &["send", "bob", "hello", "--no-response"]).status.success());
    let commands = [
        &["history", "stats"][..],
        &["history", "list"],
        &["list"],
        &["events"],
        &["logs", "alice"],
        &["completions", "bash"],
        &["man"],
    ];
    std::fs::create_dir_all(home.home().join("logs")).unwrap();
    std::fs::write(home.home().join("logs").join(format!("{}.log", alice.id)), "a line of the terminal\n").unwrap();
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = home.cmd(args).stdout(writer).stderr(Stdio::piped()).output().unwrap();
        let errors = stderr(&output);
        assert!(!errors.contains("panicked") && !errors.contains("Broken pipe"), "{args:?}: {errors}");
        assert_eq!(output.status.code(), Some(141), "{args:?}: {errors}");
    }
    // Output that cannot be written for another reason (a full disk) is an error, never a
    // panic (status 101) nor a success: `events` and `logs` said 0, the others panicked.
    if std::path::Path::new("/dev/full").exists() {
        for args in commands {
            let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
            let output = home.cmd(args).stdout(full).stderr(Stdio::piped()).output().unwrap();
            let errors = stderr(&output);
            assert_eq!(output.status.code(), Some(1), "{args:?}: {errors}");
            assert!(errors.contains("cannot write the output") && !errors.contains("panicked"), "{args:?}: {errors}");
        }
    }
}

/// `synapse lsit` said only "unknown profile 'lsit'".
/// An empty id, alias or name says so; it was sent as an empty path segment, which the broker
/// answered with "no such endpoint".
#[test]
fn an_empty_id_or_name_is_refused_as_such() {
    let home = Home::new();
    home.ok(&["list"]);
    let head = home.head();
    for args in [
        &["history", "show", ""][..],
        &["history", "thread", ""],
        &["cancel", ""],
        &["external", "info", ""],
        &["agent", "deregister", ""],
    ] {
        let output = home.run(args);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", describe(&output));
        assert!(stderr(&output).contains("an id or name given for it is empty"), "{args:?}: {}", describe(&output));
    }
    assert_eq!(home.head(), head, "nothing appended");
}

#[test]
fn a_mistyped_command_suggests_the_one_meant() {
    let home = Home::new();
    let output = home.run(&["lsit"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("Did you mean `synapse list`?"), "{}", describe(&output));
    let unknown = home.run(&["qqqqqq"]);
    assert!(!stderr(&unknown).contains("Did you mean"), "{}", describe(&unknown));
}

/// `--json` on every command that prints data, one JSON document per call (issue 14).
#[test]
fn every_json_flag_prints_exactly_one_document() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    home.register(Some("bob"));
    let sent = home.run_as(&alice, &["send", "bob", "hello json", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let task: serde_json::Value = serde_json::from_str(&stdout(&sent)).unwrap();
    let task_id = task["task"]["id"].as_str().unwrap().to_string();
    let file_safety = |args: &[&str]| {
        let mut command = home.cmd(&[&["file-safety"], args].concat());
        command.env("SYNAPSE_FILE_SAFETY_ENABLED", "true");
        command.output().unwrap()
    };
    let outputs = vec![
        ("list", home.run(&["list", "--json"])),
        ("broker status", home.run(&["broker", "status", "--json"])),
        ("admin verify", home.run(&["admin", "verify", "--json"])),
        ("admin index", home.run(&["admin", "index", "--json"])),
        ("history list", home.run(&["history", "list", "--json"])),
        ("history show", home.run(&["history", "show", &task_id, "--json"])),
        ("history thread", home.run(&["history", "thread", &task_id, "--json"])),
        ("history search", home.run(&["history", "search", "hello", "--json"])),
        ("history stats", home.run(&["history", "stats", "--json"])),
        ("history cleanup", home.run(&["history", "cleanup", "--days", "1", "--dry-run", "--json"])),
        ("file-safety status", file_safety(&["status", "--json"])),
        ("file-safety lock", file_safety(&["lock", "/tmp/json-doc.txt", &alice.id, "--json"])),
        ("file-safety locks", file_safety(&["locks", "--json"])),
        ("file-safety check", file_safety(&["check", "/tmp/json-doc.txt", &alice.id, "--json"])),
        ("file-safety unlock", file_safety(&["unlock", "/tmp/json-doc.txt", &alice.id, "--json"])),
        ("file-safety recent", file_safety(&["recent", "--json"])),
        ("external list", home.run(&["external", "list", "--json"])),
    ];
    for (what, output) in outputs {
        assert!(output.status.success(), "{what}: {}", describe(&output));
        let text = stdout(&output);
        let document: Result<serde_json::Value, _> = serde_json::from_str(&text);
        assert!(document.is_ok(), "{what}: not one JSON document:\n{text}");
    }
}

/// `broker status` said "no broker is running" as text but was JSON only otherwise; now text by
/// default, one JSON document with `--json`, and status 1 without a broker either way.
#[test]
fn broker_status_speaks_text_or_json_and_fails_without_a_broker() {
    let home = Home::new();
    let none = home.run(&["broker", "status", "--json"]);
    assert_eq!(none.status.code(), Some(1), "{}", describe(&none));
    let document: serde_json::Value = serde_json::from_str(&stdout(&none)).unwrap();
    assert_eq!(document["running"], false);
    home.ok(&["broker", "start"]);
    let text = home.ok(&["broker", "status"]);
    assert!(text.starts_with("broker running: pid "), "{text}");
    assert!(serde_json::from_str::<serde_json::Value>(&text).is_err(), "text by default: {text}");
}

/// `--role` was "shown in synapse list" but there was no ROLE column; a long CURRENT text broke
/// the table's columns on a terminal (here: COLUMNS is honoured only on a terminal, so a pipe
/// keeps the whole text for scripts).
#[test]
fn synapse_list_shows_the_role_column() {
    let home = Home::new();
    let pid = std::process::id().to_string();
    home.ok(&[
        "agent", "register", "--type", "dummy", "--pid", &pid, "--port", "0", "--name", "carol", "--role", "reviewer",
    ]);
    let list = home.ok(&["list"]);
    let mut lines = list.lines();
    let header = lines.next().unwrap();
    assert!(header.contains("ROLE"), "{list}");
    let carol = lines.find(|line| line.contains("carol")).unwrap();
    let role_column = header.find("ROLE").unwrap();
    assert_eq!(&carol[role_column..role_column + "reviewer".len()], "reviewer", "{list}");
}

/// Shell completions and man pages come from the same clap definitions (issue 14).
#[test]
fn completions_and_man_pages_are_generated_for_every_shell_and_command() {
    let home = Home::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = home.ok(&["completions", shell]);
        assert!(script.contains("synapse") && script.contains("history"), "{shell}: {script}");
    }
    assert_eq!(home.run(&["completions", "tcsh"]).status.code(), Some(2), "an unknown shell is a usage error");
    let dir = home.dir.path().join("man");
    home.ok(&["man", "--out", dir.to_str().unwrap()]);
    for page in ["synapse.1", "synapse-send.1", "synapse-history-search.1"] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(text.contains(".TH"), "{page}: {text}");
    }
    // A command's page is titled and named as `man` finds it, and shows the command as typed.
    let send = std::fs::read_to_string(dir.join("synapse-history-search.1")).unwrap();
    let version = format!("\"synapse {}\"", env!("CARGO_PKG_VERSION"));
    assert!(send.contains(".TH SYNAPSE-HISTORY-SEARCH 1") && send.contains(&version), "{send}");
    assert!(send.contains("synapse\\-history\\-search \\-"), "the NAME line: {send}");
    assert!(send.contains("\\fBsynapse history search\\fR"), "the synopsis: {send}");
    assert!(home.ok(&["man"]).contains(".TH synapse 1"));
    let file = home.dir.path().join("a-file");
    std::fs::write(&file, "mine").unwrap();
    let refused = home.run(&["man", "--out", file.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("is a file"), "{}", describe(&refused));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

/// docs/commands.md is the reference the README links: it must say what the binary says.
#[test]
fn the_command_reference_in_docs_is_what_the_binary_generates() {
    let home = Home::new();
    let generated = home.ok(&["reference"]);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/commands.md");
    let stored = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(stored == generated, "docs/commands.md is out of date: run `cargo run -q -- reference > docs/commands.md`");
    assert!(generated.contains("`synapse send`") && generated.contains("--priority"), "{generated}");
}

/// `synapse doctor`: each line OK, a warning, or a problem with what to do; problems exit 1.
#[test]
fn doctor_reports_each_check_and_fails_only_on_a_problem() {
    let home = Home::new();
    // A PATH with no CLI on it: each profile's CLI is a warning, not a problem.
    let empty_path = home.dir.path().join("empty-bin");
    std::fs::create_dir_all(&empty_path).unwrap();
    let healthy = home.cmd(&["doctor", "--json"]).env("PATH", &empty_path).output().unwrap();
    assert!(healthy.status.success(), "{}", describe(&healthy));
    let report: serde_json::Value = serde_json::from_str(&stdout(&healthy)).unwrap();
    assert_eq!(report["ok"], true, "{report:#}");
    let checks = report["checks"].as_array().unwrap();
    let find = |what: &str| checks.iter().find(|check| check["what"] == what).cloned().unwrap_or_default();
    assert_ne!(find("home")["level"], "fail", "{report:#}");
    assert_eq!(find("claude CLI")["level"], "warn", "not on this PATH: {report:#}");
    assert!(find("codex ports")["detail"].as_str().unwrap().starts_with("8120-8129"), "{report:#}");

    // Another home's broker at this home's socket (a shared socket folder) is a problem, named.
    home.ok(&["list"]);
    let other = Home::new();
    let shared = other.cmd(&["doctor"]).env("SYNAPSE_UDS_DIR", home.uds()).env("PATH", &empty_path).output().unwrap();
    assert_eq!(shared.status.code(), Some(1), "{}", describe(&shared));
    assert!(
        stdout(&shared).lines().any(|line| line.starts_with("FAIL") && line.contains("SYNAPSE_UDS_DIR")),
        "{}",
        describe(&shared)
    );

    let not_a_dir = home.dir.path().join("plain-file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let broken = home.cmd(&["doctor"]).env("SYNAPSE_HOME", &not_a_dir).env("PATH", &empty_path).output().unwrap();
    assert_eq!(broken.status.code(), Some(1), "{}", describe(&broken));
    assert!(
        stdout(&broken).lines().any(|line| line.starts_with("FAIL") && line.contains("is not a directory")),
        "{}",
        describe(&broken)
    );
}

/// `broker.log` held ANSI colour codes: a log file gets plain text.
#[test]
fn the_broker_log_holds_no_escape_codes() {
    let home = Home::new();
    home.register(Some("alice"));
    home.ok(&["broker", "stop"]);
    let log = std::fs::read_to_string(home.home().join("broker.log")).unwrap();
    assert!(log.contains("listening on"), "{log}");
    assert!(!log.contains('\u{1b}'), "escape codes in broker.log: {log:?}");
}

/// Unknown settings keys were accepted silently: `send` now warns, naming the file and the key.
#[test]
fn an_unknown_settings_key_is_a_warning_that_names_it() {
    let home = Home::new();
    home.register(Some("bob"));
    std::fs::write(home.home().join("settings.json"), r#"{"a2a": {"flwo": "oneway"}}"#).unwrap();
    let sent = home.run(&["send", "bob", "hi", "--no-response"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    assert!(
        stderr(&sent).contains("Warning: ") && stderr(&sent).contains("unknown key 'a2a.flwo'"),
        "{}",
        describe(&sent)
    );
}

/// Names were refused where ids worked (`file-safety lock src/main.rs alice`, the README's own
/// example; `reply --to alice`, `--from bob`; `events --agent` and `history list --agent` printed
/// nothing). Every command that takes an agent now takes its name as well.
#[test]
fn every_command_that_takes_an_agent_takes_its_name() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let carol = home.register(Some("carol"));
    assert!(home.run_as(&alice, &["send", "bob", "from alice", "--response"]).status.success());
    assert!(home.run_as(&carol, &["send", "bob", "from carol", "--response"]).status.success());
    // --from by name (with bob's secret, as inside bob), --to by name among two waiting senders.
    let replied = home
        .cmd(&["reply", "to alice by name", "--from", "bob", "--to", "alice"])
        .env("SYNAPSE_AGENT_SECRET", &bob.secret)
        .output()
        .unwrap();
    assert!(replied.status.success(), "{}", describe(&replied));
    assert!(stdout(&replied).contains(&format!("Replied to {}", alice.id)), "{}", describe(&replied));

    let history = home.ok(&["history", "list", "--agent", "carol"]);
    assert!(history.contains("from carol") && !history.contains("from alice"), "{history}");
    let events = home.ok(&["events", "--agent", "carol"]);
    assert!(events.contains(&carol.id), "{events}");

    let file_safety = |args: &[&str]| {
        let mut command = home.cmd(&[&["file-safety"], args].concat());
        command.env("SYNAPSE_FILE_SAFETY_ENABLED", "true");
        command.output().unwrap()
    };
    let locked = file_safety(&["lock", "/tmp/by-name.txt", "alice"]);
    assert!(locked.status.success(), "{}", describe(&locked));
    assert!(stdout(&locked).contains(&format!("for {}", alice.id)), "{}", describe(&locked));
    let locks = file_safety(&["locks", "--agent", "alice"]);
    assert!(stdout(&locks).contains("/tmp/by-name.txt"), "{}", describe(&locks));
    let unlocked = file_safety(&["unlock", "/tmp/by-name.txt", "alice"]);
    assert!(unlocked.status.success(), "{}", describe(&unlocked));
    let unknown = file_safety(&["lock", "/tmp/by-name.txt", "nobody"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", describe(&unknown));
}

/// A broker that fails at start is quoted from what this start wrote to its log: the lines of
/// an earlier failure (another socket folder) were quoted with it, as if both were this one's.
#[test]
fn a_failed_start_quotes_its_own_lines_of_the_log_only() {
    let home = Home::new();
    let first = home.dir.path().join("not-a-folder-1");
    let second = home.dir.path().join("not-a-folder-2");
    std::fs::write(&first, "").unwrap();
    std::fs::write(&second, "").unwrap();
    let failed = |uds: &std::path::Path| home.cmd(&["list"]).env("SYNAPSE_UDS_DIR", uds).output().unwrap();
    let once = failed(&first);
    assert_eq!(once.status.code(), Some(1), "{}", describe(&once));
    assert!(stderr(&once).contains("not-a-folder-1"), "{}", describe(&once));
    let twice = failed(&second);
    assert_eq!(twice.status.code(), Some(1), "{}", describe(&twice));
    assert!(stderr(&twice).contains("not-a-folder-2"), "{}", describe(&twice));
    assert!(!stderr(&twice).contains("not-a-folder-1"), "{}", describe(&twice));
}
