//! The dummy agent: a tiny interactive program for tests and demos (SPEC §1).
//!
//! Prompt `> `; echoes each line as `[DUMMY] You said: <line>`; the first Ctrl-C prints a
//! notice, a second one in a row exits. With `SYNAPSE_DUMMY_AUTO_REPLY=1` it answers every line
//! that carries the `:R` flag by running `synapse reply` itself, after
//! `SYNAPSE_DUMMY_REPLY_DELAY_MS` (busy, no prompt, meanwhile). A line typed by its user that
//! begins with `/work` keeps it busy as long, as a prompt of the user's own keeps a CLI.

use std::io::Write;
use std::time::Duration;

/// `[A2A:<id8>:<sender>:R]` at the start of a line: (id8, sender).
pub fn reply_request(line: &str) -> Option<(String, String)> {
    let start = line.find("[A2A:")?;
    let rest = &line[start + 5..];
    let end = rest.find(']')?;
    let fields: Vec<&str> = rest[..end].split(':').collect();
    match fields.as_slice() {
        [id, sender, "R"] => Some((id.to_string(), sender.to_string())),
        _ => None,
    }
}

fn prompt() {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "> ");
    let _ = out.flush();
}

pub fn run() -> anyhow::Result<i32> {
    let auto_reply = std::env::var("SYNAPSE_DUMMY_AUTO_REPLY").is_ok_and(|value| value == "1" || value == "true");
    let delay = Duration::from_millis(
        std::env::var("SYNAPSE_DUMMY_REPLY_DELAY_MS").ok().and_then(|ms| ms.parse().ok()).unwrap_or(0),
    );
    let me = std::env::var("SYNAPSE_AGENT_ID").unwrap_or_else(|_| "dummy".into());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        // Lines from standard input, read on a thread (blocking I/O); the channel is lossless.
        let (lines, mut incoming) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if lines.send(line.trim_end_matches(['\r', '\n']).to_string()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        // One listener for the whole run, so no SIGINT between two polls is missed.
        let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        println!("[DUMMY] Dummy agent {me} ready. Ctrl-C twice to exit.");
        prompt();
        let mut interrupts = 0;
        loop {
            // An interrupt that arrived before a line is handled first (a priority-5 message
            // is written right after its SIGINT).
            tokio::select! {
                biased;
                _ = interrupt.recv() => {
                    interrupts += 1;
                    if interrupts >= 2 {
                        println!("\n[DUMMY] Exiting.");
                        return Ok(130);
                    }
                    println!("\n[DUMMY] Interrupted. Press Ctrl-C again to exit.");
                    prompt();
                }
                line = incoming.recv() => {
                    let Some(line) = line else { return Ok(0) };
                    interrupts = 0;
                    println!("[DUMMY] You said: {line}");
                    if auto_reply && let Some((id8, sender)) = reply_request(&line) {
                        // Busy until the reply is sent; an interrupt meanwhile abandons it, as
                        // a real CLI abandons its turn.
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => answer(&id8, &sender, &line).await,
                            _ = interrupt.recv() => println!("\n[DUMMY] Interrupted while answering {id8}."),
                        }
                    } else if line.starts_with("/work") {
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => println!("[DUMMY] Done with your prompt."),
                            _ = interrupt.recv() => println!("\n[DUMMY] Interrupted while working on your prompt."),
                        }
                    }
                    prompt();
                }
            }
        }
    })
}

async fn answer(id8: &str, sender: &str, line: &str) {
    let received = line.split_once("] ").map_or(line, |(_, text)| text);
    let text = format!("[DUMMY] Auto-reply to {id8}: {}", crate::event::preview(received, 80));
    let exe = crate::config::synapse_exe().unwrap_or_else(|_| "synapse".into());
    // An anonymous sender, and one that named itself without proof (`<name>(unverified)`),
    // waits under `anonymous-<id8>` (see `reply_target_sender`).
    let target = if sender == "anonymous" || sender.ends_with("(unverified)") {
        format!("anonymous-{id8}")
    } else {
        sender.to_string()
    };
    let result = tokio::process::Command::new(exe)
        .args(["reply", "--to", &target, &text])
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    match result {
        Ok(output) if output.status.success() => println!("[DUMMY] Replied to {sender} ({id8})."),
        Ok(output) => println!("[DUMMY] Reply failed: {}", String::from_utf8_lossy(&output.stderr).trim()),
        Err(error) => println!("[DUMMY] Reply failed: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lines_with_the_reply_flag_ask_for_an_answer() {
        assert_eq!(
            reply_request("[A2A:abc12345:synapse-claude-8100:R] do it"),
            Some(("abc12345".into(), "synapse-claude-8100".into()))
        );
        assert_eq!(reply_request("[A2A:abc12345:synapse-claude-8100] fyi"), None);
        assert_eq!(reply_request("[A2A:abc12345:synapse-claude-8100:REPLY] done"), None);
        assert_eq!(reply_request("no prefix"), None);
    }
}
