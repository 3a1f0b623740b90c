//! `synapse external add | list | info | send | remove` (SPEC §6).

use super::system::percent_encode;
use crate::client::Client;
use crate::config::Paths;
use serde_json::{Value, json};

#[derive(clap::Subcommand, Debug)]
pub enum ExternalCommand {
    /// Add an external A2A agent by its base URL (reads its agent card)
    Add {
        url: String,
        /// The name to use for it here (default: from its card)
        #[arg(long)]
        alias: Option<String>,
    },
    /// List the external agents
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show one external agent
    Info { alias: String },
    /// Send a message to an external agent
    Send {
        alias: String,
        message: String,
        /// Follow the remote task until it ends (at most SECONDS, default 600) and print the reply
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "600")]
        wait: Option<u64>,
    },
    /// Forget an external agent
    Remove { alias: String },
}

fn line(external: &Value) -> String {
    format!(
        "{:<16} {:<32} {}",
        external["alias"].as_str().unwrap_or_default(),
        external["url"].as_str().unwrap_or_default(),
        external["name"].as_str().unwrap_or_default()
    )
}

pub async fn run(paths: &Paths, command: ExternalCommand) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    match command {
        ExternalCommand::Add { url, alias } => {
            let answer = client.post("/external", &json!({"url": url, "alias": alias})).await?;
            println!("Added {}", line(&answer["external"]));
        }
        ExternalCommand::List { json } => {
            let answer = client.get("/external").await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&answer)?);
            } else {
                let externals = answer["externals"].as_array().cloned().unwrap_or_default();
                if externals.is_empty() {
                    println!("No external agents. Add one with 'synapse external add URL'.");
                }
                for external in externals {
                    println!("{}", line(&external));
                }
            }
        }
        ExternalCommand::Info { alias } => {
            let answer = client.get(&format!("/external/{}", percent_encode(&alias))).await?;
            println!("{}", serde_json::to_string_pretty(&answer["external"])?);
        }
        ExternalCommand::Send { alias, message, wait } => {
            let answer = client
                .post(
                    &format!("/external/{}/send", percent_encode(&alias)),
                    &json!({"text": message, "wait_seconds": wait}),
                )
                .await?;
            if wait.is_none() {
                let task = &answer["task"];
                println!(
                    "Sent to {alias}: task {} {}",
                    task["id"].as_str().unwrap_or_default(),
                    task["status"].as_str().unwrap_or_default()
                );
                return Ok(0);
            }
            let change = &answer["task"];
            let reply = change.pointer("/artifacts/0/parts/0/text").and_then(Value::as_str);
            match (answer["timed_out"].as_bool(), change["state"].as_str(), reply) {
                (Some(false), Some("completed"), Some(reply)) => println!("{reply}"),
                (Some(true), _, _) => {
                    eprintln!("Error: no reply from {alias} in time; the remote task stays open");
                    return Ok(1);
                }
                (_, state, _) => {
                    eprintln!("Error: the remote task ended {} without a reply", state.unwrap_or("unknown"));
                    return Ok(1);
                }
            }
        }
        ExternalCommand::Remove { alias } => {
            client.delete(&format!("/external/{}", percent_encode(&alias))).await?;
            println!("Removed {alias}");
        }
    }
    Ok(0)
}
