//! `synapse file-safety ...` (SPEC §5).

use crate::api::{self, Modification};
use crate::client::Client;
use crate::config::Paths;

#[derive(clap::Subcommand, Debug)]
pub enum FileSafetyCommand {
    /// Whether file safety is on, and how many locks and records there are
    Status,
    /// Current locks
    Locks {
        /// Only the locks this agent holds
        #[arg(long)]
        agent: Option<String>,
    },
    /// Lock a file for an agent (the same agent locking again renews it)
    Lock {
        /// The file (relative to the current directory, or absolute)
        file: String,
        /// The agent that takes the lock
        agent: String,
        /// Seconds the lock lasts
        #[arg(long, default_value_t = 300, allow_hyphen_values = true)]
        duration: i64,
        /// What the agent is about to do, shown to others
        #[arg(long)]
        intent: Option<String>,
        /// The task the change belongs to
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
        /// The locked file
        file: String,
        /// The agent holding the lock
        agent: Option<String>,
        /// Release another agent's lock
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// A file's recorded modifications, newest first
    History {
        /// The file
        file: String,
        /// At most this many records
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Recent modifications of every file
    Recent {
        /// Only this agent's modifications
        #[arg(long)]
        agent: Option<String>,
        /// At most this many records
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Record a modification of a file by an agent for a task
    Record {
        /// The file
        file: String,
        /// The agent that changed it
        agent: String,
        /// The task the change belongs to
        task_id: String,
        /// CREATE, MODIFY or DELETE
        #[arg(long = "type", default_value = "MODIFY")]
        change_type: String,
        /// Why the file changed
        #[arg(long)]
        intent: Option<String>,
    },
    /// May this agent write this file? With the reason and the file's recent modifications
    Check {
        /// The file
        file: String,
        /// The agent that wants to write it
        agent: String,
    },
    /// Release expired locks and locks of agents that are gone; drop old modification records
    Cleanup {
        /// Keep modification records of the last DAYS days
        #[arg(long, default_value_t = 30, allow_hyphen_values = true)]
        days: i64,
    },
    /// Paths, settings and counts, for troubleshooting
    Debug,
}

/// An absolute path for a file named on the command line, as given otherwise: the broker
/// resolves it as the kernel would (a `..` after a symlink included, see
/// `broker::file_safety::canonical`).
fn absolute(file: &str) -> anyhow::Result<String> {
    // Joined to the working directory, an empty name would be that directory.
    if file.trim().is_empty() {
        anyhow::bail!("the path is empty: name the file to lock, check or release");
    }
    let path = std::path::Path::new(file);
    let joined = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    let Some(joined) = joined.to_str() else {
        anyhow::bail!("'{}' is not a UTF-8 path (the working directory's name, or the file's)", joined.display());
    };
    // What is not a path at all (control characters) is refused here already.
    crate::api::normalize(joined).map_err(|reason| anyhow::anyhow!("{reason}"))?;
    Ok(joined.to_string())
}

fn time(time_ms: u64) -> String {
    crate::time::rfc3339(time_ms)
}

/// CREATE, MODIFY or DELETE, as the broker writes the change type.
fn change_name(change: crate::event::ChangeType) -> &'static str {
    match change {
        crate::event::ChangeType::Create => "CREATE",
        crate::event::ChangeType::Modify => "MODIFY",
        crate::event::ChangeType::Delete => "DELETE",
    }
}

fn print_modifications(modifications: &[Modification]) {
    if modifications.is_empty() {
        println!("No recorded modifications.");
    }
    for modification in modifications {
        println!(
            "{}  {:<8} {:<24} {}  task {}{}",
            time(modification.time_ms),
            change_name(modification.change_type),
            modification.agent_id,
            modification.path,
            crate::event::short_id(&modification.task_id),
            modification
                .intent
                .as_ref()
                .map(|intent| format!(" ({})", crate::escape::visible_line(intent)))
                .unwrap_or_default(),
        );
    }
}

/// Prints `answer` as one JSON document when asked, else runs `text`.
fn show<T: serde::Serialize>(json: bool, answer: &T, text: impl FnOnce(&T)) -> anyhow::Result<()> {
    if json {
        println!("{}", api::json_line(answer)?);
    } else {
        text(answer);
    }
    Ok(())
}

pub async fn run(paths: &Paths, command: FileSafetyCommand, json: bool) -> anyhow::Result<i32> {
    let on = crate::settings::file_safety_enabled(&paths.home);
    if let FileSafetyCommand::Status = command
        && !on
    {
        if json {
            println!(
                "{}",
                serde_json::json!({"enabled": false, "how_to_enable": crate::settings::FILE_SAFETY_HOW_TO_ENABLE})
            );
        } else {
            println!("{}", crate::settings::FILE_SAFETY_HOW_TO_ENABLE);
        }
        return Ok(0);
    }
    if !on {
        anyhow::bail!("{}", crate::settings::FILE_SAFETY_HOW_TO_ENABLE);
    }
    let mut client = Client::connect(paths, true).await?;
    match command {
        FileSafetyCommand::Status => {
            let status = client.file_safety_status().await?;
            show(json, &status, |status| {
                println!(
                    "File safety: enabled; {} lock(s), {} recorded modification(s)",
                    status.locks, status.modifications
                )
            })?;
        }
        FileSafetyCommand::Locks { agent } => {
            let answer = client.locks(agent.as_deref()).await?;
            if json {
                println!("{}", api::json_line(&answer)?);
                return Ok(0);
            }
            if answer.locks.is_empty() {
                println!("No locks.");
            }
            for entry in answer.locks {
                let lock = &entry.lock;
                println!(
                    "{}  {}  until {}{}{}",
                    lock.path,
                    lock.agent_id,
                    time(lock.expires_ms),
                    if entry.expired { " (expired)" } else { "" },
                    lock.intent
                        .as_ref()
                        .map(|intent| format!(" - {}", crate::escape::visible_line(intent)))
                        .unwrap_or_default(),
                );
            }
        }
        FileSafetyCommand::Lock { file, agent, duration, intent, task_id, wait, wait_timeout } => {
            if duration <= 0 {
                anyhow::bail!("the duration must be a positive number of seconds (got {duration})");
            }
            let request = api::LockRequest {
                path: absolute(&file)?,
                agent_id: agent,
                duration_seconds: Some(duration.unsigned_abs()),
                intent,
                task_id,
                wait_seconds: wait.then_some(wait_timeout),
            };
            let started = std::time::Instant::now();
            let answer = match client.lock(&request).await {
                Ok(answer) => answer,
                // With --wait, say that it waited: the broker's refusal alone reads as if it had not.
                Err(error) if wait && error.status().is_some_and(|status| status.as_u16() == 409) => {
                    anyhow::bail!(
                        "{error} (waited {:.0} s, --wait-timeout {wait_timeout})",
                        started.elapsed().as_secs_f64()
                    )
                }
                Err(error) => return Err(error.into()),
            };
            show(json, &answer, |answer| {
                let lock = answer.lock.as_ref();
                println!(
                    "Locked {} for {} until {}",
                    lock.map_or("", |lock| lock.path.as_str()),
                    lock.map_or("", |lock| lock.agent_id.as_str()),
                    lock.map(|lock| time(lock.expires_ms)).unwrap_or_default()
                );
            })?;
        }
        FileSafetyCommand::Unlock { file, agent, force } => {
            let request = api::UnlockRequest { path: absolute(&file)?, agent_id: agent, force };
            show(json, &client.unlock(&request).await?, |answer| println!("Unlocked {}", answer.unlocked))?;
        }
        FileSafetyCommand::History { file, limit } => {
            let answer = client.file_history(&absolute(&file)?, limit).await?;
            show(json, &answer, |answer| print_modifications(&answer.modifications))?;
        }
        FileSafetyCommand::Recent { agent, limit } => {
            let answer = client.recent_modifications(agent.as_deref(), limit).await?;
            show(json, &answer, |answer| print_modifications(&answer.modifications))?;
        }
        FileSafetyCommand::Record { file, agent, task_id, change_type, intent } => {
            let request = api::RecordRequest {
                path: absolute(&file)?,
                agent_id: agent,
                task_id,
                change_type: Some(change_type),
                intent,
            };
            let answer = client.record_modification(&request).await?;
            show(json, &answer, |answer| {
                println!("Recorded {} of {}", change_name(answer.change_type), answer.recorded)
            })?;
        }
        FileSafetyCommand::Check { file, agent } => {
            let answer =
                client.validate_write(&api::ValidateRequest { path: absolute(&file)?, agent_id: agent }).await?;
            show(json, &answer, |answer| {
                println!("{}: {}", if answer.allowed { "ALLOWED" } else { "DENIED" }, answer.reason);
                print_modifications(&answer.recent_modifications);
            })?;
            return Ok(if answer.allowed { 0 } else { 1 });
        }
        FileSafetyCommand::Cleanup { days } => {
            let answer = client.cleanup_file_safety(&api::FileCleanup { days: Some(days) }).await?;
            show(json, &answer, |answer| {
                println!(
                    "Released {} stale lock(s); removed {} modification record(s) older than {days} days",
                    answer.released, answer.pruned
                )
            })?;
        }
        FileSafetyCommand::Debug => {
            let status = client.file_safety_status().await?;
            let health = client.health().await?;
            if json {
                let debug = serde_json::json!({
                    "enabled": true,
                    "home": paths.home.display().to_string(),
                    "log": paths.database().display().to_string(),
                    "broker_pid": health.pid,
                    "locks": status.locks,
                    "modifications": status.modifications,
                });
                println!("{debug}");
                return Ok(0);
            }
            println!(
                "enabled: true\nhome: {}\nlog: {}\nbroker pid: {}\nlocks: {}\nmodifications: {}",
                paths.home.display(),
                paths.database().display(),
                health.pid,
                status.locks,
                status.modifications
            );
        }
    }
    Ok(0)
}
