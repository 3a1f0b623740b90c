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
//! | `message`| answers with a message, not a task result (an A2A client that sent  |
//! |          | the message gets a `Message`, no task)                              |
//! | `file`   | completes with an artifact holding a file part (and a text part)  |
//! | `data`   | completes with an artifact holding a data part (and a text part)  |
//! | anything else | completes with a text artifact (a `synapse reply`)           |
//!
//! The first rule that matches wins (case-insensitive). A follow-up on a task that asked for
//! input (A2A multi-turn) arrives as one more ticket of the same task, carrying the follow-up's
//! text, and is answered by the same rules: `use the blue one` completes the task, another
//! `input` asks again. Like the wrapper's watcher it takes one ticket at a time from its inbox;
//! it acknowledges the ticket before acting, so a restart never answers a message twice (it may
//! leave one unanswered).

use super::wrapper::{Backoff, connect, is_gone};
use crate::api::{self, InboxTicket, TicketKind};
use crate::client::{Client, ClientError};
use crate::config::Paths;
use crate::event::{AgentStatus, Artifact, Part, TaskState};
use anyhow::Context;
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
    Message,
    File,
    Data,
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
    } else if text.contains("message") {
        Scenario::Message
    } else if text.contains("file") {
        Scenario::File
    } else if text.contains("data") {
        Scenario::Data
    } else {
        Scenario::Complete
    }
}

/// The file the `file` scenario attaches (a `data:` URL: the content travels with it).
pub const SCENARIO_FILE_URI: &str = "data:text/plain;base64,c2NlbmFyaW8gcmVwb3J0Cg==";

/// Number of artifacts the `stream` scenario sends before completing.
pub const STREAM_CHUNKS: usize = 3;

/// Runs the scenario agent until SIGTERM / SIGINT; returns the exit code.
pub fn run(paths: Paths, port: Option<u16>, name: Option<String>) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = runtime.block_on(async move {
        let mut client = Client::connect(&paths, true).await?;
        let working_dir = std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
        let request = api::RegisterRequest {
            agent_type: "scenario".into(),
            name,
            role: None,
            pid: std::process::id(),
            working_dir,
            port: Some(port.unwrap_or(0)),
            port_range: None,
        };
        let registration = client.register(&request).await.context("cannot register the scenario agent")?;
        let agent_id = registration.agent.agent_id.clone();
        let secret = registration.secret.clone();
        client.set_secret(secret.clone());
        {
            let announce = api::Announce {
                agent_id: agent_id.clone(),
                pid: std::process::id(),
                child_pid: None,
                port: registration.agent.port,
                log: None,
                socket: registration.socket.clone(),
                endpoint: Some(registration.endpoint.clone()),
                secret: secret.clone(),
            };
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{}", api::json_line(&announce)?)?;
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
            let _ = client.deregister(&agent_id).await;
        }
        Ok(0)
    });
    // Blocking work still under way must not keep a finished agent alive.
    runtime.shutdown_timeout(super::wrapper::EXIT_GRACE);
    result
}

struct Agent {
    paths: Paths,
    id: String,
    secret: String,
}

/// A refusal (the ticket already acknowledged, say): no use asking again.
fn is_client_error(error: &ClientError) -> bool {
    error.status().is_some_and(|status| status.is_client_error())
}

impl Agent {
    async fn follow_inbox(&self) {
        let mut client = connect(&self.paths, &self.secret).await;
        let ready = api::StatusUpdate { status: AgentStatus::Ready, note: None };
        // Every failed call waits before the next one: a broker that forgot this agent (or
        // one that refuses it) answers at once, and retrying at once was a busy loop.
        let mut backoff = Backoff::default();
        let mut warned_gone = false;
        loop {
            if let Err(error) = client.set_status(&self.id, &ready).await {
                if is_gone(&error) && !std::mem::replace(&mut warned_gone, true) {
                    tracing::warn!(
                        "the broker no longer knows agent {} (deregistered?): messages cannot reach it; retrying",
                        self.id
                    );
                }
                backoff.wait().await;
                client = connect(&self.paths, &self.secret).await;
                continue;
            }
            warned_gone = false;
            let inbox = match client.inbox(&self.id, INBOX_WAIT_MS, Some(1)).await {
                Ok(inbox) => inbox,
                Err(_) => {
                    backoff.wait().await;
                    client = connect(&self.paths, &self.secret).await;
                    continue;
                }
            };
            backoff.reset();
            let Some(ticket) = inbox.tickets.into_iter().next() else {
                continue;
            };
            let number = ticket.ticket;
            match client.ack(&self.id, number, None).await {
                Ok(_) => {}
                Err(error) if is_client_error(&error) => continue,
                Err(_) => {
                    backoff.wait().await;
                    client = connect(&self.paths, &self.secret).await;
                    continue;
                }
            }
            if ticket.kind == TicketKind::Message
                && let Err(error) = self.answer(&mut client, &ticket).await
            {
                tracing::warn!("scenario agent: cannot answer ticket {number}: {error:#}");
                backoff.wait().await;
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
        let update = api::TaskUpdate { state, artifacts, error, as_message: false };
        client.update_task(&self.id, task_id, &update).await?;
        Ok(())
    }

    async fn answer(&self, client: &mut Client, ticket: &InboxTicket) -> anyhow::Result<()> {
        let task_id = ticket.task_id.as_str();
        let text = ticket.text.as_str();
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
            Scenario::Message => {
                let update = api::TaskUpdate {
                    state: TaskState::Completed,
                    artifacts: vec![Artifact::text(format!("scenario agent: a message for you: {preview}"))],
                    error: None,
                    as_message: true,
                };
                client.update_task(&self.id, task_id, &update).await?;
                Ok(())
            }
            Scenario::File => {
                let file = Part::File {
                    name: Some("report.txt".into()),
                    uri: Some(SCENARIO_FILE_URI.into()),
                    mime_type: Some("text/plain".into()),
                };
                let artifact = Artifact {
                    name: Some("report".into()),
                    parts: vec![Part::Text { text: "scenario agent: the report is attached".into() }, file],
                };
                self.update(client, task_id, TaskState::Completed, vec![artifact], None).await
            }
            Scenario::Data => {
                let data = serde_json::json!({"request": text, "answer": 42, "items": ["a", "b"]});
                let artifact = Artifact {
                    name: Some("result".into()),
                    parts: vec![
                        Part::Text { text: "scenario agent: the data is attached".into() },
                        Part::Data { json: data.to_string() },
                    ],
                };
                self.update(client, task_id, TaskState::Completed, vec![artifact], None).await
            }
            Scenario::Complete => self.complete(client, ticket, &format!("scenario agent: done: {preview}")).await,
        }
    }

    /// Completes the task: a reply when the sender waits for one (as `synapse reply` does),
    /// else a completed state with the text as artifact.
    async fn complete(&self, client: &mut Client, ticket: &InboxTicket, text: &str) -> anyhow::Result<()> {
        let task_id = ticket.task_id.as_str();
        if ticket.response_expected {
            let request = api::SendRequest {
                from: Some(self.id.clone()),
                secret: Some(self.secret.clone()),
                reply_to: Some(ticket.display_task_id.clone()),
                ..api::SendRequest::new(ticket.from.as_deref().unwrap_or("anonymous"), text)
            };
            client.send(&request).await?;
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
        assert_eq!(scenario_of("a MESSAGE with data"), Scenario::Message);
        assert_eq!(scenario_of("send the file"), Scenario::File);
        assert_eq!(scenario_of("some data please"), Scenario::Data);
        assert_eq!(scenario_of("hello"), Scenario::Complete);
    }
}
