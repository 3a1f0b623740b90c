//! `synapse hook <event>`: the second way a message reaches a model. A CLI runs it at a turn's
//! tool boundaries (Claude Code's `PostToolUse`, Gemini CLI's `AfterTool`, registered for the
//! session next to the MCP server); it asks the agent's wrapper for the messages that arrived
//! while the CLI was busy, and prints them as the hook's `additionalContext`, which the CLI adds
//! to what the model reads next. An idle CLI is still woken by typing: hooks fire only in a turn.
//!
//! The wrapper stays the only one that delivers: it listens on
//! `$SYNAPSE_UDS_DIR/<agent_id>.hook` (the directory is the user's, 0700) and serves a hook
//! under the same lock as its own writes. The exchange: the hook sends its request, the wrapper
//! answers the waiting messages, the hook prints them and says [`PRINTED`], the wrapper
//! acknowledges them and says [`RECORDED`]. A message is handed over or typed, never both, and
//! one whose hook died before printing stays queued (`wrapper::hooks`).
//!
//! A hook must never break its CLI: outside an agent, without a wrapper, or on any error it
//! prints nothing and exits 0.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The socket of an agent's wrapper for its hooks.
pub fn socket_path(uds_dir: &Path, agent_id: &str) -> PathBuf {
    uds_dir.join(format!("{agent_id}.hook"))
}

/// What a hook sends the wrapper (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
pub struct HookRequest {
    /// The agent's secret: only its own CLI's hooks are served.
    pub secret: String,
    /// The CLI's event name (`PostToolUse`, `AfterTool`).
    pub event: String,
}

/// The wrapper's answer (one JSON line): the messages to hand to the model, already in the
/// form they would have been typed; empty when none waits.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct HookAnswer {
    pub text: String,
}

/// What a hook sends back once it printed the messages: only then are they acknowledged.
pub const PRINTED: &str = "printed";

/// What the wrapper answers once it recorded the printed messages as delivered.
pub const RECORDED: &str = "recorded";

/// Longest a hook waits for its wrapper: a hook delays the CLI's turn.
const HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What `synapse hook <event>` prints for `text` handed over at `event`: the hook output Claude
/// Code, Codex and Gemini CLI read (`hookSpecificOutput.additionalContext`); nothing when no
/// message waits.
pub fn hook_output(event: &str, text: &str) -> Option<String> {
    if text.is_empty() {
        return None;
    }
    let context = format!(
        "Messages from other Synapse agents arrived while you were working (answer those marked :R with the synapse reply tool or `synapse reply`):\n{text}"
    );
    serde_json::to_string(&serde_json::json!({
        "hookSpecificOutput": {"hookEventName": event, "additionalContext": context}
    }))
    .ok()
}

/// `synapse hook <event>`: always exits 0.
pub fn run(uds_dir: &Path, event: &str) -> i32 {
    // The CLI writes the hook's input on stdin (what the tool did), which the hook has no use
    // for: it is drained aside, into nothing, so that the CLI never blocks on a full pipe, and
    // never waited for past STDIN_WAIT (a CLI that kept it open would hold its own turn). Not
    // a terminal: someone trying the command by hand.
    let drained = (!crate::agent::terminal::is_terminal(0))
        .then(|| {
            let (done, drained) = std::sync::mpsc::channel();
            let drain = std::thread::Builder::new().name("synapse-hook-stdin".into()).spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
                let _ = done.send(());
            });
            drain.ok().map(|_| drained)
        })
        .flatten();
    let handed = hand_over(uds_dir, event);
    if let Err(error) = handed {
        tracing::debug!("hook {event}: {error}");
    }
    if let Some(drained) = drained {
        let _ = drained.recv_timeout(STDIN_WAIT);
    }
    0
}

/// How long a hook that has done its work waits for the end of its input (so that a CLI
/// still writing it gets no broken pipe) before it exits all the same.
const STDIN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks the wrapper for the messages waiting, prints them, and tells it they were printed.
fn hand_over(uds_dir: &Path, event: &str) -> std::io::Result<()> {
    use std::io::{BufRead, Write};
    let (Ok(agent_id), Ok(secret)) = (std::env::var("SYNAPSE_AGENT_ID"), std::env::var("SYNAPSE_AGENT_SECRET")) else {
        return Ok(());
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket_path(uds_dir, &agent_id))?;
    // The secret goes only to a wrapper of this user: the kernel names the other end.
    if crate::process::socket_peer_uid(&stream) != Some(crate::private_files::my_uid()) {
        return Err(std::io::Error::other("the hook socket is not served by this user"));
    }
    stream.set_read_timeout(Some(HOOK_TIMEOUT))?;
    stream.set_write_timeout(Some(HOOK_TIMEOUT))?;
    let request = HookRequest { secret, event: event.to_string() };
    let mut line = serde_json::to_vec(&request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut answer = String::new();
    let mut reader = std::io::BufReader::new(&stream);
    reader.read_line(&mut answer)?;
    let answer: HookAnswer = serde_json::from_str(&answer).map_err(std::io::Error::other)?;
    if let Some(output) = hook_output(event, &answer.text) {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{output}")?;
        stdout.flush()?;
        // Printed: now the wrapper may record them as delivered; the hook ends once it has
        // (best effort: the messages are printed either way).
        (&stream).write_all(format!("{PRINTED}\n").as_bytes())?;
        let mut recorded = String::new();
        let _ = reader.read_line(&mut recorded);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_carries_the_messages_as_additional_context_or_nothing() {
        assert_eq!(hook_output("PostToolUse", ""), None);
        let output: serde_json::Value =
            serde_json::from_str(&hook_output("AfterTool", "[A2A:1234abcd:alice:R] what is 2+2").unwrap()).unwrap();
        assert_eq!(output["hookSpecificOutput"]["hookEventName"], "AfterTool");
        let context = output["hookSpecificOutput"]["additionalContext"].as_str().unwrap();
        assert!(context.ends_with("\n[A2A:1234abcd:alice:R] what is 2+2"), "{context}");
    }
}
