//! `synapse mcp` driven by an MCP client no one here wrote: the official Python SDK, mcp 2.3.0
//! (issue 18). The script `tests/mcp_client.py` starts the server over stdio in this test's home
//! (anonymous, then as a registered agent, then with file safety on) and calls every tool,
//! good arguments and bad; this side checks what only it can see: bob's terminal.
//!
//! The client lives in the test venv under the build directory (`target/a2a-venv`, made by
//! `.ci/run` with a2a-sdk and mcp pinned; `SYNAPSE_MCP_PYTHON` names another interpreter).
//! Without it the test is skipped on a developer's machine and fails under CI=true, where a
//! skipped protocol test would look like a pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// The pinned client, as `.ci/run` installs it.
const MCP_VERSION: &str = "2.3.0";

/// Longest the whole script may take.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(300);

/// Longest a message may take from the broker into bob's terminal log.
const TERMINAL_DEADLINE: Duration = Duration::from_secs(60);

/// The interpreter with the official MCP client, or None (the test then skips, outside CI).
fn python() -> Option<PathBuf> {
    let python = match std::env::var_os("SYNAPSE_MCP_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/a2a-venv/bin/python"),
    };
    let check = format!("import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '{MCP_VERSION}')");
    let has_client =
        std::process::Command::new(&python).args(["-c", &check]).status().is_ok_and(|status| status.success());
    if has_client {
        return Some(python);
    }
    let recipe = format!(
        "the MCP protocol test needs the official client mcp {MCP_VERSION} in {}.\n\
         Install it with:\n  python3 -m venv target/a2a-venv && target/a2a-venv/bin/pip install 'mcp=={MCP_VERSION}'\n\
         (or run .ci/run), or point SYNAPSE_MCP_PYTHON at an interpreter that has it.",
        python.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{recipe}");
    eprintln!("SKIPPED: {recipe}");
    None
}

struct Stopped<'a>(&'a Home, String);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        let _ = self.0.cmd(&["stop", &self.1]).output();
    }
}

/// Starts a background dummy agent on a port the system chooses.
fn start_dummy<'a>(home: &'a Home, name: &str, auto_reply: bool) -> Stopped<'a> {
    let mut command = home.cmd(&["start", "dummy", "--name", name, "--port", "0", "--json"]);
    if auto_reply {
        command.env("SYNAPSE_DUMMY_AUTO_REPLY", "1");
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let started: Value = serde_json::from_slice(&output.stdout).unwrap();
    Stopped(home, started["agent_id"].as_str().unwrap().to_string())
}

/// Follows `synapse logs <agent>` until `is_wanted` holds for a line; that line, or a panic with
/// the lines seen after [`TERMINAL_DEADLINE`].
fn wait_for_terminal_line(home: &Home, agent: &str, is_wanted: impl Fn(&str) -> bool) -> String {
    let mut follower = home.cmd(&["logs", agent, "--follow"]).stdout(Stdio::piped()).spawn().unwrap();
    let stdout = follower.stdout.take().unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + TERMINAL_DEADLINE;
    let mut seen = String::new();
    let found = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if is_wanted(&line) {
                    break Some(line);
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => break None,
        }
    };
    let _ = follower.kill();
    let _ = follower.wait();
    found.unwrap_or_else(|| panic!("the line never reached {agent}'s terminal:\n{seen}"))
}

#[test]
fn the_official_mcp_python_client_sends_waits_replies_and_is_refused_clearly_through_synapse_mcp() {
    let Some(python) = python() else { return };
    let home = Home::new();
    let _bob = start_dummy(&home, "bob", false);
    let _alice = start_dummy(&home, "alice", true);
    let carol = home.register(Some("carol"));
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let child = std::process::Command::new(&python)
        .arg(&script)
        .env("SYNAPSE_BIN", BIN)
        .env("SYNAPSE_HOME", home.home())
        .env("SYNAPSE_UDS_DIR", home.uds())
        .env("SYNAPSE_BROKER_PORT", "0")
        .env("CAROL_ID", &carol.id)
        .env("CAROL_SECRET", &carol.secret)
        .env("PROJECT_DIR", &project)
        .env_remove("SYNAPSE_AGENT_ID")
        .env_remove("SYNAPSE_AGENT_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    let output = output_within(child, SCRIPT_DEADLINE, "the MCP client script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("MCP CLIENT OK"),
        "mcp_client.py failed ({:?})\nstdout:\n{stdout}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );

    // What the script sent to bob reached the program in bob's terminal, exactly as written,
    // under an anonymous sender's header without R.
    let facts: Vec<Value> = stdout.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let sent = facts.iter().find_map(|fact| fact["sent_to_bob"].as_str()).expect("the script sent to bob");
    let line = wait_for_terminal_line(&home, "bob", |line| line.starts_with("[DUMMY] You said: [A2A:"));
    let said = line.strip_prefix("[DUMMY] You said: ").unwrap();
    let (header, text) = said.split_once("] ").expect("a header");
    assert!(header.ends_with(":anonymous"), "{line}");
    assert_eq!(text, sent, "{line}");
    assert!(facts.iter().any(|fact| fact["alice_replied"].is_string()), "{stdout}");
    assert!(facts.iter().any(|fact| fact["carol_replied"].is_string()), "{stdout}");
    assert!(facts.iter().any(|fact| fact["file_safety"] == "ok"), "{stdout}");
}
