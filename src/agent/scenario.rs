//! The scenario agent: a deterministic agent without a PTY, for conformance tests of every task
//! state (issue 7). `synapse scenario-agent` registers an agent of type `scenario`, prints its
//! registration as one JSON line, and answers each message by rule:
//!
//! | the message contains | the task                                                   |
//! | --- | --- |
//! | `fail`   | fails (`error` says why)                                          |
//! | `input`  | asks for input (`input_required`, the question as an artifact)    |
//! | `stream` | gets three artifacts while working, then completes with a reply   |
//! | `wait`   | stays working until it is canceled                                |
//! | anything else | completes with a text artifact (a `synapse reply`)           |
//!
//! The first rule that matches wins (case-insensitive). Like the wrapper's watcher it takes one
//! ticket at a time from its inbox; it acknowledges the ticket before acting, so a restart never
//! answers a message twice (it may leave one unanswered).

use super::wrapper::connect;
use crate::client::{ApiFailure, Client};
use crate::config::Paths;
use crate::event::{Artifact, TaskState};
use anyhow::Context;
use serde_json::{Value, json};
use std::io::Write;

/// How long one inbox long-poll lasts.
const INBOX_WAIT_MS: u64 = 25_000;

/// What the scenario agent does with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Fail,
    AskInput,
    Stream,
    Wait,
    Complete,
}

/// The scenario a message text asks for.
pub fn scenario_of(text: &str) -> Scenario {
    let text = text.to_lowercase();
    if text.contains("fail") {
        Scenario::Fail
    } else if text.contains("input") {
        Scenario::AskInput
    } else if text.contains("stream") {
        Scenario::Stream
    } else if text.contains("wait") {
        Scenario::Wait
    } else {
        Scenario::Complete
    }
}

/// Number of artifacts the `stream` scenario sends before completing.
pub const STREAM_CHUNKS: usize = 3;

/// Runs the scenario agent until SIGTERM / SIGINT; returns the exit code.
pub fn run(paths: Paths, port: Option<u16>, name: Option<String>) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let mut client = Client::connect(&paths, true).await?;
        let working_dir = std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
        let body = json!({
            "agent_type": "scenario",
            "pid": std::process::id(),
            "name": name,
            "working_dir": working_dir,
            "port": port.unwrap_or(0),
        });
        let registration = client.post("/agents", &body).await.context("cannot register the scenario agent")?;
        let agent_id = registration["agent"]["agent_id"].as_str().unwrap_or_default().to_string();
        let secret = registration["secret"].as_str().unwrap_or_default().to_string();
        client.set_secret(secret.clone());
        {
            let announce = json!({
                "agent_id": agent_id,
                "pid": std::process::id(),
                "port": registration["agent"]["port"],
                "socket": registration["socket"],
                "endpoint": registration["endpoint"],
                "secret": secret,
            });
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{announce}")?;
            stdout.flush()?;
        }
        let agent = Agent { paths: paths.clone(), id: agent_id.clone(), secret: secret.clone() };
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = agent.follow_inbox() => {}
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        if let Some(mut client) = super::wrapper::connect_to_leave(&paths, &secret).await {
            let _ = client.delete(&format!("/agents/{agent_id}")).await;
        }
        Ok(0)
    })
}

struct Agent {
    paths: Paths,
    id: String,
    secret: String,
}

fn is_gone(error: &anyhow::Error) -> bool {
    error.downcast_ref::<ApiFailure>().is_some_and(|failure| failure.status.is_client_error())
}

impl Agent {
    async fn follow_inbox(&self) {
        let mut client = connect(&self.paths, &self.secret).await;
        let status = format!("/agents/{}/status", self.id);
        let inbox = format!("/agents/{}/inbox?wait_ms={INBOX_WAIT_MS}&limit=1", self.id);
        loop {
            if client.post(&status, &json!({"status": "READY"})).await.is_err() {
                client = connect(&self.paths, &self.secret).await;
                continue;
            }
            let answer = match client.get(&inbox).await {
                Ok(answer) => answer,
                Err(_) => {
                    client = connect(&self.paths, &self.secret).await;
                    continue;
                }
            };
            let Some(ticket) = answer["tickets"].as_array().and_then(|tickets| tickets.first()).cloned() else {
                continue;
            };
            let Some(number) = ticket["ticket"].as_u64() else { continue };
            match client.post(&format!("/agents/{}/inbox/{number}/ack", self.id), &Value::Null).await {
                Ok(_) => {}
                Err(error) if is_gone(&error) => continue,
                Err(_) => {
                    client = connect(&self.paths, &self.secret).await;
                    continue;
                }
            }
            if ticket["kind"] == "message"
                && let Err(error) = self.answer(&mut client, &ticket).await
            {
                tracing::warn!("scenario agent: cannot answer ticket {number}: {error:#}");
                client = connect(&self.paths, &self.secret).await;
            }
        }
    }

    async fn update(
        &self,
        client: &mut Client,
        task_id: &str,
        state: TaskState,
        artifacts: Vec<Artifact>,
        error: Option<String>,
    ) -> anyhow::Result<()> {
        let body = json!({"state": state, "artifacts": artifacts, "error": error});
        client.post(&format!("/agents/{}/tasks/{task_id}/update", self.id), &body).await?;
        Ok(())
    }

    async fn answer(&self, client: &mut Client, ticket: &Value) -> anyhow::Result<()> {
        let task_id = ticket["task_id"].as_str().unwrap_or_default();
        let text = ticket["text"].as_str().unwrap_or_default();
        let preview = crate::event::preview(text, 80);
        match scenario_of(text) {
            Scenario::Fail => {
                let error = format!("scenario agent: failing as asked ({preview})");
                self.update(client, task_id, TaskState::Failed, Vec::new(), Some(error)).await
            }
            Scenario::AskInput => {
                let question = Artifact {
                    name: Some("input-required".into()),
                    ..Artifact::text("scenario agent: which input should I use?")
                };
                self.update(client, task_id, TaskState::InputRequired, vec![question], None).await
            }
            Scenario::Wait => Ok(()),
            Scenario::Stream => {
                for chunk in 1..=STREAM_CHUNKS {
                    let artifact = Artifact {
                        name: Some(format!("chunk-{chunk}")),
                        ..Artifact::text(format!("scenario agent: chunk {chunk} of {STREAM_CHUNKS}"))
                    };
                    self.update(client, task_id, TaskState::Working, vec![artifact], None).await?;
                }
                self.complete(client, ticket, &format!("scenario agent: streamed {STREAM_CHUNKS} chunks")).await
            }
            Scenario::Complete => self.complete(client, ticket, &format!("scenario agent: done: {preview}")).await,
        }
    }

    /// Completes the task: a reply when the sender waits for one (as `synapse reply` does),
    /// else a completed state with the text as artifact.
    async fn complete(&self, client: &mut Client, ticket: &Value, text: &str) -> anyhow::Result<()> {
        let task_id = ticket["task_id"].as_str().unwrap_or_default();
        if ticket["response_expected"] == true {
            let body = json!({
                "to": ticket["from"].as_str().unwrap_or("anonymous"),
                "from": self.id,
                "secret": self.secret,
                "text": text,
                "reply_to": ticket["display_task_id"],
            });
            client.post("/send", &body).await?;
            Ok(())
        } else {
            self.update(client, task_id, TaskState::Completed, vec![Artifact::text(text)], None).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_word_decides_the_scenario_whatever_its_case() {
        assert_eq!(scenario_of("please FAIL this"), Scenario::Fail);
        assert_eq!(scenario_of("fail unless you get input"), Scenario::Fail);
        assert_eq!(scenario_of("I need input"), Scenario::AskInput);
        assert_eq!(scenario_of("stream it"), Scenario::Stream);
        assert_eq!(scenario_of("wait for me"), Scenario::Wait);
        assert_eq!(scenario_of("hello"), Scenario::Complete);
    }
}
