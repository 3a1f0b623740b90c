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

/// An absolute, normalised path for a file named on the command line.
fn absolute(file: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(file);
    let joined = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    crate::broker::file_safety::normalize(&joined.to_string_lossy()).map_err(|reason| anyhow::anyhow!("{reason}"))
}

fn time(time_ms: u64) -> String {
    crate::http::wire::rfc3339(time_ms)
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
            modification.intent.as_ref().map(|intent| format!(" ({intent})")).unwrap_or_default(),
        );
    }
}

pub async fn run(paths: &Paths, command: FileSafetyCommand) -> anyhow::Result<i32> {
    let on = crate::settings::file_safety_enabled(&paths.home);
    if let FileSafetyCommand::Status = command
        && !on
    {
        println!("{}", crate::settings::FILE_SAFETY_HOW_TO_ENABLE);
        return Ok(0);
    }
    if !on {
        anyhow::bail!("{}", crate::settings::FILE_SAFETY_HOW_TO_ENABLE);
    }
    let mut client = Client::connect(paths, true).await?;
    match command {
        FileSafetyCommand::Status => {
            let status = client.file_safety_status().await?;
            println!(
                "File safety: enabled; {} lock(s), {} recorded modification(s)",
                status.locks, status.modifications
            );
        }
        FileSafetyCommand::Locks { agent } => {
            let locks = client.locks(agent.as_deref()).await?.locks;
            if locks.is_empty() {
                println!("No locks.");
            }
            for entry in locks {
                let lock = &entry.lock;
                println!(
                    "{}  {}  until {}{}{}",
                    lock.path,
                    lock.agent_id,
                    time(lock.expires_ms),
                    if entry.expired { " (expired)" } else { "" },
                    lock.intent.as_ref().map(|intent| format!(" - {intent}")).unwrap_or_default(),
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
            let answer = client.lock(&request).await?;
            let lock = answer.lock.as_ref();
            println!(
                "Locked {} for {} until {}",
                lock.map_or("", |lock| lock.path.as_str()),
                lock.map_or("", |lock| lock.agent_id.as_str()),
                lock.map(|lock| time(lock.expires_ms)).unwrap_or_default()
            );
        }
        FileSafetyCommand::Unlock { file, agent, force } => {
            let request = api::UnlockRequest { path: absolute(&file)?, agent_id: agent, force };
            println!("Unlocked {}", client.unlock(&request).await?.unlocked);
        }
        FileSafetyCommand::History { file, limit } => {
            print_modifications(&client.file_history(&absolute(&file)?, limit).await?.modifications);
        }
        FileSafetyCommand::Recent { agent, limit } => {
            print_modifications(&client.recent_modifications(agent.as_deref(), limit).await?.modifications);
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
            println!("Recorded {} of {}", change_name(answer.change_type), answer.recorded);
        }
        FileSafetyCommand::Check { file, agent } => {
            let answer =
                client.validate_write(&api::ValidateRequest { path: absolute(&file)?, agent_id: agent }).await?;
            println!("{}: {}", if answer.allowed { "ALLOWED" } else { "DENIED" }, answer.reason);
            print_modifications(&answer.recent_modifications);
            return Ok(if answer.allowed { 0 } else { 1 });
        }
        FileSafetyCommand::Cleanup { days } => {
            let answer = client.cleanup_file_safety(&api::FileCleanup { days: Some(days) }).await?;
            println!(
                "Released {} stale lock(s); removed {} modification record(s) older than {days} days",
                answer.released, answer.pruned
            );
        }
        FileSafetyCommand::Debug => {
            let status = client.file_safety_status().await?;
            let health = client.health().await?;
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
