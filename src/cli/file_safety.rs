//! `synapse file-safety ...` (SPEC §5).

use super::system::percent_encode;
use crate::client::Client;
use crate::config::Paths;
use serde_json::{Value, json};

#[derive(clap::Subcommand, Debug)]
pub enum FileSafetyCommand {
    /// Whether file safety is on, and how many locks and records there are
    Status,
    /// Current locks
    Locks {
        #[arg(long)]
        agent: Option<String>,
    },
    /// Lock a file for an agent (the same agent locking again renews it)
    Lock {
        file: String,
        agent: String,
        /// Seconds the lock lasts
        #[arg(long, default_value_t = 300, allow_hyphen_values = true)]
        duration: i64,
        #[arg(long)]
        intent: Option<String>,
        #[arg(long)]
        task_id: Option<String>,
        /// Wait for the file to be free instead of failing
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds
        #[arg(long, default_value_t = 60, requires = "wait")]
        wait_timeout: u64,
    },
    /// Release a lock (only its holder, unless --force)
    Unlock {
        file: String,
        agent: Option<String>,
        #[arg(long)]
        force: bool,
    },
    /// A file's recorded modifications, newest first
    History {
        file: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Recent modifications of every file
    Recent {
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Record a modification of a file by an agent for a task
    Record {
        file: String,
        agent: String,
        task_id: String,
        /// CREATE, MODIFY or DELETE
        #[arg(long = "type", default_value = "MODIFY")]
        change_type: String,
        #[arg(long)]
        intent: Option<String>,
    },
    /// May this agent write this file? With the reason and the file's recent modifications
    Check { file: String, agent: String },
    /// Release expired locks and locks of agents that are gone; drop old modification records
    Cleanup {
        /// Keep modification records of the last DAYS days
        #[arg(long, default_value_t = 30, allow_hyphen_values = true)]
        days: i64,
    },
    /// Paths, settings and counts, for troubleshooting
    Debug,
}

fn enabled(paths: &Paths) -> bool {
    let from_env = std::env::var("SYNAPSE_FILE_SAFETY_ENABLED")
        .ok()
        .map(|value| matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
    let from_home = || crate::trust::TrustSettings::load(&paths.home).ok().and_then(|trust| trust.file_safety_enabled);
    from_env.or_else(from_home).unwrap_or_else(|| {
        crate::settings::Settings::load_current(&paths.home)
            .ok()
            .and_then(|settings| settings.merged.pointer("/file_safety/enabled").and_then(Value::as_bool))
            .unwrap_or(false)
    })
}

const HOW_TO_ENABLE: &str = "File safety is disabled. Enable it with SYNAPSE_FILE_SAFETY_ENABLED=true (or \"file_safety\": {\"enabled\": true} in settings).";

/// An absolute, normalised path for a file named on the command line.
fn absolute(file: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(file);
    let joined = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    crate::broker::file_safety::normalize(&joined.to_string_lossy())
        .map_err(|reason| anyhow::anyhow!("Error: {reason}"))
}

fn time(value: &Value) -> String {
    value.as_u64().map(crate::time::rfc3339).unwrap_or_default()
}

fn print_modifications(modifications: &[Value]) {
    if modifications.is_empty() {
        println!("No recorded modifications.");
    }
    for modification in modifications {
        println!(
            "{}  {:<8} {:<24} {}  task {}{}",
            time(&modification["time_ms"]),
            modification["change_type"].as_str().unwrap_or_default(),
            modification["agent_id"].as_str().unwrap_or_default(),
            modification["path"].as_str().unwrap_or_default(),
            crate::event::short_id(modification["task_id"].as_str().unwrap_or_default()),
            modification["intent"].as_str().map(|intent| format!(" ({intent})")).unwrap_or_default(),
        );
    }
}

pub async fn run(paths: &Paths, command: FileSafetyCommand) -> anyhow::Result<i32> {
    let on = enabled(paths);
    if let FileSafetyCommand::Status = command
        && !on
    {
        println!("{HOW_TO_ENABLE}");
        return Ok(0);
    }
    if !on {
        anyhow::bail!("Error: {HOW_TO_ENABLE}");
    }
    let mut client = Client::connect(paths, true).await?;
    match command {
        FileSafetyCommand::Status => {
            let answer = client.get("/file-safety/status").await?;
            println!(
                "File safety: enabled; {} lock(s), {} recorded modification(s)",
                answer["locks"], answer["modifications"]
            );
        }
        FileSafetyCommand::Locks { agent } => {
            let query = agent.map(|agent| format!("?agent={}", percent_encode(&agent))).unwrap_or_default();
            let answer = client.get(&format!("/file-safety/locks{query}")).await?;
            let locks = answer["locks"].as_array().cloned().unwrap_or_default();
            if locks.is_empty() {
                println!("No locks.");
            }
            for entry in locks {
                let lock = &entry["lock"];
                println!(
                    "{}  {}  until {}{}{}",
                    lock["path"].as_str().unwrap_or_default(),
                    lock["agent_id"].as_str().unwrap_or_default(),
                    time(&lock["expires_ms"]),
                    if entry["expired"].as_bool() == Some(true) { " (expired)" } else { "" },
                    lock["intent"].as_str().map(|intent| format!(" - {intent}")).unwrap_or_default(),
                );
            }
        }
        FileSafetyCommand::Lock { file, agent, duration, intent, task_id, wait, wait_timeout } => {
            if duration <= 0 {
                anyhow::bail!("Error: the duration must be a positive number of seconds (got {duration})");
            }
            let body = json!({
                "path": absolute(&file)?, "agent_id": agent, "duration_seconds": duration,
                "intent": intent, "task_id": task_id, "wait_seconds": wait.then_some(wait_timeout),
            });
            let answer = client.post("/file-safety/lock", &body).await?;
            println!(
                "Locked {} for {} until {}",
                answer["lock"]["path"].as_str().unwrap_or_default(),
                answer["lock"]["agent_id"].as_str().unwrap_or_default(),
                time(&answer["lock"]["expires_ms"])
            );
        }
        FileSafetyCommand::Unlock { file, agent, force } => {
            let answer = client
                .post("/file-safety/unlock", &json!({"path": absolute(&file)?, "agent_id": agent, "force": force}))
                .await?;
            println!("Unlocked {}", answer["unlocked"].as_str().unwrap_or_default());
        }
        FileSafetyCommand::History { file, limit } => {
            let answer = client
                .get(&format!("/file-safety/history?path={}&limit={limit}", percent_encode(&absolute(&file)?)))
                .await?;
            print_modifications(answer["modifications"].as_array().map(Vec::as_slice).unwrap_or_default());
        }
        FileSafetyCommand::Recent { agent, limit } => {
            let agent = agent.map(|agent| format!("&agent={}", percent_encode(&agent))).unwrap_or_default();
            let answer = client.get(&format!("/file-safety/recent?limit={limit}{agent}")).await?;
            print_modifications(answer["modifications"].as_array().map(Vec::as_slice).unwrap_or_default());
        }
        FileSafetyCommand::Record { file, agent, task_id, change_type, intent } => {
            let body = json!({"path": absolute(&file)?, "agent_id": agent, "task_id": task_id, "change_type": change_type, "intent": intent});
            let answer = client.post("/file-safety/record", &body).await?;
            println!(
                "Recorded {} of {}",
                answer["change_type"].as_str().unwrap_or_default(),
                answer["recorded"].as_str().unwrap_or_default()
            );
        }
        FileSafetyCommand::Check { file, agent } => {
            let answer =
                client.post("/file-safety/validate", &json!({"path": absolute(&file)?, "agent_id": agent})).await?;
            let allowed = answer["allowed"].as_bool() == Some(true);
            println!(
                "{}: {}",
                if allowed { "ALLOWED" } else { "DENIED" },
                answer["reason"].as_str().unwrap_or_default()
            );
            print_modifications(answer["recent_modifications"].as_array().map(Vec::as_slice).unwrap_or_default());
            return Ok(if allowed { 0 } else { 1 });
        }
        FileSafetyCommand::Cleanup { days } => {
            let answer = client.post("/file-safety/cleanup", &json!({"days": days})).await?;
            println!(
                "Released {} stale lock(s); removed {} modification record(s) older than {days} days",
                answer["released"], answer["pruned"]
            );
        }
        FileSafetyCommand::Debug => {
            let status = client.get("/file-safety/status").await?;
            let health = client.broker_info().await?;
            println!(
                "enabled: true\nhome: {}\nlog: {}\nbroker pid: {}\nlocks: {}\nmodifications: {}",
                paths.home.display(),
                paths.database().display(),
                health["pid"],
                status["locks"],
                status["modifications"]
            );
        }
    }
    Ok(0)
}
