//! Interoperability with the official A2A Python client, a2a-sdk 1.3.0 (issue 7): the script
//! `tests/a2a_interop.py` resolves the cards and runs every method (and a multi-turn exchange:
//! input-required, a follow-up with the taskId, completed) against a dummy agent that
//! auto-replies and against the scenario agent.
//!
//! The client lives in a virtual environment under the build directory (`target/a2a-venv`,
//! made by `.ci/run`, or by this test on its first run; `SYNAPSE_A2A_PYTHON` names another
//! interpreter). If it cannot be made the test fails and says how: a skipped interoperability
//! test would look like a pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

/// Longest the whole script may take.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(300);

fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("SYNAPSE_A2A_PYTHON") {
        return PathBuf::from(path);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/a2a-venv");
    let venv = root.join("bin/python");
    let has_client = |python: &PathBuf| {
        std::process::Command::new(python)
            .args([
                "-c",
                "import importlib.metadata as m, sys; \
                 sys.exit(m.version('a2a-sdk') != '1.3.0' or m.version('synapse-a2a') != '0.35.0')",
            ])
            .status()
            .is_ok_and(|status| status.success())
    };
    if !has_client(&venv) {
        // First run on this machine: make the environment (what .ci/run does), from PyPI. The
        // tests of this file run as processes of their own and at once: one makes it while the
        // others wait for the lock, then find it made (two making it together broke it).
        std::fs::create_dir_all(root.parent().unwrap()).unwrap();
        let lock = std::fs::File::create(root.with_extension("lock")).unwrap();
        lock.lock().unwrap();
        if has_client(&venv) {
            return venv;
        }
        let made = std::process::Command::new("python3").arg("-m").arg("venv").arg(&root).status();
        let installed = std::process::Command::new(root.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "a2a-sdk==1.3.0", "synapse-a2a==0.35.0"])
            .status();
        assert!(
            made.is_ok_and(|status| status.success())
                && installed.is_ok_and(|status| status.success())
                && has_client(&venv),
            "the A2A interoperability tests need the official client a2a-sdk 1.3.0 and synapse-a2a 0.35.0 in {} and could not install them.\n\
             Create it with:\n  python3 -m venv target/a2a-venv && target/a2a-venv/bin/pip install 'a2a-sdk==1.3.0' 'synapse-a2a==0.35.0'\n\
             or point SYNAPSE_A2A_PYTHON at an interpreter that has it.",
            root.display()
        );
    }
    venv
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        kill(self.0.id(), libc::SIGTERM);
        let _ = self.0.wait();
    }
}

struct Stopped<'a>(&'a Home, String);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        let _ = self.0.cmd(&["stop", &self.1]).output();
    }
}

/// A dummy agent that auto-replies, started in the background; stopped when dropped.
fn auto_replying_dummy(home: &Home) -> (Value, Stopped<'_>) {
    let output =
        home.cmd(&["start", "dummy", "--name", "bob", "--json"]).env("SYNAPSE_DUMMY_AUTO_REPLY", "1").output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let dummy: Value = serde_json::from_slice(&output.stdout).unwrap();
    let stopped = Stopped(home, dummy["agent_id"].as_str().unwrap().to_string());
    (dummy, stopped)
}

/// Runs `tests/<script>` with the test venv's Python and `args` (and `HOME`, when given);
/// fails unless it exits 0 having printed `done`.
fn run_script(script: &str, args: &[String], home: Option<&std::path::Path>, done: &str) {
    let python = python();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let mut command = std::process::Command::new(&python);
    command.arg(&path).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(home) = home {
        command.env("HOME", home);
    }
    let child = command.spawn().unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    let output = output_within(child, SCRIPT_DEADLINE, script);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(done),
        "{script} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_official_a2a_python_client_talks_to_a_dummy_agent_and_to_the_scenario_agent() {
    let home = Home::new();
    let (dummy, _dummy) = auto_replying_dummy(&home);
    let mut scenario = home.cmd(&["scenario-agent", "--name", "scenario"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(scenario.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _scenario = Killed(scenario);
    let scenario: Value = serde_json::from_str(&line).unwrap();
    let urls = [format!("http://127.0.0.1:{}", dummy["port"]), format!("http://127.0.0.1:{}", scenario["port"])];
    run_script("a2a_interop.py", &urls, None, "A2A INTEROP OK");
}

/// Issue 15, mixed teams: the Python Synapse 0.35's own client sends to a Synapse agent
/// (anonymous, as its `synapse send` does outside an agent; then as a Python agent, an
/// unverified sender): `response_mode` wait, notify and silent are honoured, priority 5
/// arrives, and `--wait` sees the reply because the agent's `GET /tasks/{id}` has `status` at
/// the top level, where that client reads it.
#[test]
fn the_python_synapse_client_sends_and_waits_for_a_reply_from_a_synapse_agent() {
    let home = Home::new();
    let (dummy, _dummy) = auto_replying_dummy(&home);
    // The package keeps its registry and settings under ~/.a2a: a home of the test's own.
    let python_home = home.dir.path().join("python-home");
    std::fs::create_dir_all(&python_home).unwrap();
    let url = [format!("http://127.0.0.1:{}", dummy["port"])];
    run_script("python_synapse.py", &url, Some(&python_home), "PYTHON SYNAPSE OK");
}

/// Issue 15, mixed teams, the other direction: `synapse send` to a Python Synapse agent
/// started from the package (`tests/python_agent.py` wraps a small dummy CLI, as the wheel has
/// none). The message names the user's reply token as `sender_task_id` and this broker's
/// `/external-replies` as `sender_endpoint`; the Python agent's `synapse reply` posts there
/// with `in_reply_to` = the token, which completes the user's task, and `--wait` prints it.
#[test]
fn synapse_send_to_a_python_synapse_agent_gets_its_reply_back() {
    let home = Home::new();
    let root = home.dir.path().join("python-agent");
    std::fs::create_dir_all(&root).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python_agent.py");
    // The script finds a free port itself (and another if that one is taken before its server
    // binds it): its readiness line names it.
    let mut agent = std::process::Command::new(python())
        .arg(&script)
        .arg(&root)
        .env_remove("SYNAPSE_AGENT_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let output = agent.stdout.take().unwrap();
    let _agent = Killed(agent);
    // Its readiness line, or the end of its output (it failed), within the deadline.
    let (ready_sender, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("PYTHON AGENT") {
                let _ = ready_sender.send(line);
                return;
            }
        }
        let _ = ready_sender.send("no readiness line".into());
    });
    let line = ready.recv_timeout(SCRIPT_DEADLINE).expect("the Python agent did not start in time");
    let port: u16 = line
        .strip_prefix("PYTHON AGENT READY ")
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("the Python agent did not start: {line}"));

    home.ok(&["external", "add", &format!("http://127.0.0.1:{port}"), "--alias", "py"]);
    let asked = home.cmd(&["send", "py", "what is 6 x 7?", "--wait", "120", "--json"]).output().unwrap();
    assert!(asked.status.success(), "{}", describe(&asked));
    let answer: Value = serde_json::from_slice(&asked.stdout).unwrap();
    assert_eq!(answer["task"]["state"], "completed", "{answer}");
    let reply = answer["task"]["artifacts"][0]["parts"][0]["text"].as_str().unwrap_or_default();
    assert!(reply.contains("Python auto-reply") && reply.contains("what is 6 x 7?"), "{answer}");
    let task_id = answer["reply_task_id"].as_str().unwrap();
    let (_, task) = home.http("GET", &format!("/tasks/{task_id}"), None, &[]);
    assert_eq!(task["task"]["status"], "completed", "{task}");

    // The Python agent got the token as sender_task_id (its task keeps our metadata); the
    // token completed our task once and never shows here.
    let remote_id = answer["task"]["id"].as_str().unwrap();
    let (status, remote) = http_tcp(port, "GET", &format!("/tasks/{remote_id}"), None, &[]);
    assert_eq!(status, 200, "{remote}");
    let remote = remote.get("task").cloned().unwrap_or(remote);
    let token = remote["metadata"]["sender_task_id"].as_str().unwrap_or_else(|| panic!("{remote}")).to_string();
    assert_eq!(token.len(), 64, "{remote}");
    let events = home.ok(&["events", "--json"]);
    assert!(events.contains("external_reply_received"), "{events}");
    assert!(!events.contains(&token) && !task.to_string().contains(&token), "the token leaked");

    // Plain text too: the reply printed as it came.
    let asked = home.cmd(&["send", "py", "and 7 x 8?", "--wait", "120"]).output().unwrap();
    assert!(asked.status.success(), "{}", describe(&asked));
    assert!(stdout(&asked).contains("Python auto-reply: and 7 x 8?"), "{}", describe(&asked));
}

/// Issue 15, mixed teams: the Python Synapse's own CLI (`synapse external send --wait`, and
/// `synapse send --wait` to an agent in its registry) sends to a Synapse agent and prints the
/// reply. Its client reads a reply from the flat artifact shape of 0.35 (`type`,
/// `data.content`) and takes a message without `response_mode` as expecting a reply
/// ("notify"): our legacy endpoints answer the same way.
#[test]
fn the_python_synapse_cli_sends_to_a_synapse_agent_and_prints_the_reply() {
    let home = Home::new();
    let (dummy, _dummy) = auto_replying_dummy(&home);
    let url = [format!("http://127.0.0.1:{}", dummy["port"])];
    run_script("python_cli_send.py", &url, None, "PYTHON CLI OK");
}

/// Issue 15, mixed teams: a Python Synapse agent (started from the package) sends to a
/// Synapse agent as itself (an unverified sender here, with its endpoint and its own task);
/// our agent's reply goes back to that endpoint naming the Python task (`in_reply_to`), and
/// the Python agent's sending task is completed with it.
#[test]
fn a_python_synapse_agent_sends_to_a_synapse_agent_and_gets_the_reply_into_its_task() {
    let home = Home::new();
    let (dummy, _dummy) = auto_replying_dummy(&home);
    let url = [format!("http://127.0.0.1:{}", dummy["port"])];
    run_script("python_agent_send.py", &url, None, "PYTHON AGENT SEND OK");
}
