//! `synapse external add | list | info | send | remove` (SPEC §6).

use crate::api::{self, External};
use crate::client::Client;
use crate::config::Paths;
use crate::escape::visible_line;

#[derive(clap::Subcommand, Debug)]
pub enum ExternalCommand {
    /// Add an external A2A agent by its base URL (reads its agent card)
    Add {
        /// The agent's base URL (its card is at <url>/.well-known/agent-card.json)
        url: String,
        /// The name to use for it here (default: from its card)
        #[arg(long)]
        alias: Option<String>,
    },
    /// List the external agents
    List,
    /// Show one external agent
    Info {
        /// The external agent's alias
        alias: String,
    },
    /// Send a message to an external agent
    Send {
        /// The external agent's alias
        alias: String,
        /// The message (or use --message-file / --stdin)
        message: Option<String>,
        /// Read the message from a file ('-' for standard input)
        #[arg(short = 'F', long, value_name = "PATH")]
        message_file: Option<std::path::PathBuf>,
        /// Read the message from standard input
        #[arg(long)]
        stdin: bool,
        /// Follow the remote task until it ends (at most SECONDS, default 600) and print the reply
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "600")]
        wait: Option<u64>,
        /// Priority 1-5 for the remote agent (5 interrupts its CLI first; default: its own, 3)
        #[arg(short = 'p', long, allow_hyphen_values = true)]
        priority: Option<String>,
    },
    /// Forget an external agent
    Remove {
        /// The external agent's alias
        alias: String,
    },
}

/// One external agent on a line; its card's name (the remote's words) with controls visible.
fn line(external: Option<&External>) -> String {
    let shown = |text: Option<&str>| visible_line(text.unwrap_or_default());
    format!(
        "{:<16} {:<32} {}",
        shown(external.map(|external| external.alias.as_str())),
        shown(external.map(|external| external.url.as_str())),
        shown(external.map(|external| external.name.as_str()))
    )
}

pub async fn run(paths: &Paths, command: ExternalCommand, json: bool) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    match command {
        ExternalCommand::Add { url, alias } => {
            let answer = client.add_external(&api::AddExternal { url, alias }).await?;
            if json {
                println!("{}", api::json_line(&answer)?);
            } else {
                println!("Added {}", line(answer.external.as_ref()));
            }
        }
        ExternalCommand::List => {
            let answer = client.externals().await?;
            if json {
                println!("{}", api::json_pretty(&answer)?);
            } else {
                if answer.externals.is_empty() {
                    println!("No external agents. Add one with 'synapse external add URL'.");
                }
                for external in &answer.externals {
                    println!("{}", line(Some(external)));
                }
            }
        }
        ExternalCommand::Info { alias } => {
            println!("{}", api::json_pretty(&client.external(&alias).await?.external)?);
        }
        ExternalCommand::Send { alias, message, message_file, stdin, wait, priority } => {
            let text = super::read_message(message, message_file.as_ref(), stdin)?;
            let priority = priority.as_deref().map(super::parse_priority).transpose()?;
            let request = api::ExternalSend { text, wait_seconds: wait, priority, response_expected: None };
            return send(&mut client, &alias, &request, json).await;
        }
        ExternalCommand::Remove { alias } => {
            client.remove_external(&alias).await?;
            if json {
                println!("{}", serde_json::json!({"removed": alias}));
            } else {
                println!("Removed {alias}");
            }
        }
    }
    Ok(0)
}

/// Sends `request` to the external agent `alias` and shows the answer (`external send`, and
/// `send` to an alias no local agent answers to). With `wait_seconds`, the reply is printed,
/// and a reply that did not come is an error (exit 1).
pub(super) async fn send(
    client: &mut Client,
    alias: &str,
    request: &api::ExternalSend,
    json: bool,
) -> anyhow::Result<i32> {
    let answer = client.send_external(alias, request).await?;
    let waited = request.wait_seconds.is_some();
    if json {
        println!("{}", api::json_line(&answer)?);
        // As without --json: a wait that brought no reply (none in time, or the remote task
        // ended otherwise) is a failure.
        let task = answer.task.as_ref();
        let answered = answer.timed_out == Some(false)
            && task.is_some_and(|task| task.state.as_deref() == Some("completed") && task.reply_text().is_some());
        return Ok(if waited && !answered { 1 } else { 0 });
    }
    let task = answer.task.unwrap_or_default();
    if !waited {
        println!(
            "Sent to {}: task {} {}",
            visible_line(alias),
            visible_line(task.id.as_deref().unwrap_or_default()),
            visible_line(task.status_text().unwrap_or_default())
        );
        if let Some(reply_task) = &answer.reply_task_id {
            println!(
                "Reply expected: your task {reply_task} ({}) completes with it (synapse history show {})",
                crate::event::short_id(reply_task),
                crate::event::short_id(reply_task)
            );
        }
        return Ok(0);
    }
    match (answer.timed_out, task.state.as_deref(), task.reply_text()) {
        // Exact for a script; on a terminal, the remote's controls are made visible (as a
        // local agent's reply is).
        (Some(false), Some("completed"), Some(reply)) if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
            println!("{}", crate::escape::visible(reply))
        }
        (Some(false), Some("completed"), Some(reply)) => println!("{reply}"),
        (Some(true), _, _) => anyhow::bail!("no reply from {alias} in time; the remote task stays open"),
        (_, state, _) => {
            anyhow::bail!("the remote task ended {} without a reply", visible_line(state.unwrap_or("unknown")))
        }
    }
    Ok(0)
}
