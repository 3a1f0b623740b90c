//! `synapse history ...` (SPEC §4).

use crate::api::{self, HistoryRecord};
use crate::client::Client;
use crate::config::Paths;
use std::io::IsTerminal;

#[derive(clap::Subcommand, Debug)]
pub enum HistoryCommand {
    /// Recent records, newest first
    List {
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// The records of one task (full id or prefix)
    Show { task_id: String },
    /// The whole conversation a task belongs to, oldest first (message, reply)
    Thread { task_id: String },
    /// Records whose input or output has words starting with the keywords
    Search {
        #[arg(required = true)]
        keywords: Vec<String>,
        /// OR (any keyword) or AND (every keyword)
        #[arg(long, default_value = "OR")]
        logic: String,
        #[arg(long)]
        case_sensitive: bool,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Totals by state, success rate, per agent, date range, size
    Stats {
        #[arg(long)]
        agent: Option<String>,
    },
    /// Write the records as JSON or CSV
    Export {
        #[arg(long, default_value = "json", value_parser = ["json", "csv"])]
        format: String,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, default_value_t = 1_000_000)]
        limit: usize,
        /// Write to this file instead of standard output
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
    /// Remove old records from the history view (the log keeps its events)
    Cleanup {
        #[arg(long, allow_hyphen_values = true)]
        days: Option<i64>,
        #[arg(long = "max-size", value_name = "MB", allow_hyphen_values = true)]
        max_size: Option<i64>,
        /// Say what would be removed, remove nothing
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation
        #[arg(long)]
        force: bool,
    },
}

/// One record on one line; every field but the time and status comes from others, so the whole
/// line has its controls made visible.
fn line(record: &HistoryRecord) -> String {
    crate::escape::visible_line(&format!(
        "{}  {}  {:<8} {:<24} {} {:<24} {:<10} {}",
        crate::http::wire::rfc3339(record.updated_ms),
        crate::event::short_id(&record.task_id),
        record.side,
        record.agent,
        if record.side == "sent" { "->" } else { "<-" },
        record.peer,
        record.status.as_str(),
        crate::event::preview(&record.input, 50),
    ))
}

fn print_records(records: &[HistoryRecord]) {
    if records.is_empty() {
        println!("No records.");
    }
    for record in records {
        println!("{}", line(record));
    }
}

/// One CSV field (RFC 4180): quoted when it holds a comma, quote, CR or LF; quotes doubled.
pub fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\r', '\n']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text.to_string() }
}

pub const CSV_COLUMNS: [&str; 10] =
    ["task_id", "side", "agent", "peer", "status", "priority", "input", "output", "created_at", "updated_at"];

pub fn to_csv(records: &[HistoryRecord]) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push_str("\r\n");
    for record in records {
        let fields = [
            record.task_id.clone(),
            record.side.clone(),
            record.agent.clone(),
            record.peer.clone(),
            record.status.as_str().to_string(),
            record.priority.to_string(),
            record.input.clone(),
            record.output.clone(),
            crate::http::wire::rfc3339(record.created_ms),
            crate::http::wire::rfc3339(record.updated_ms),
        ];
        out.push_str(&fields.iter().map(|field| csv_field(field)).collect::<Vec<_>>().join(","));
        out.push_str("\r\n");
    }
    out
}

pub async fn run(paths: &Paths, command: HistoryCommand) -> anyhow::Result<i32> {
    if !crate::settings::history_enabled() {
        anyhow::bail!("{}", crate::settings::HISTORY_DISABLED);
    }
    let mut client = Client::connect(paths, true).await?;
    match command {
        HistoryCommand::List { agent, limit } => {
            print_records(&client.history(agent.as_deref(), limit).await?.records);
        }
        HistoryCommand::Show { task_id } => {
            // Each record as the broker wrote it.
            for record in client.history_of_task(&task_id).await?.records {
                println!("{}", api::json_pretty(&record)?);
            }
        }
        HistoryCommand::Thread { task_id } => {
            for record in client.thread(&task_id).await?.records {
                println!("{}", line(&record));
                if !record.output.is_empty() {
                    let output = crate::event::preview(&record.output, 80);
                    println!("{:>30} {}", "reply:", crate::escape::visible_line(&output));
                }
            }
        }
        HistoryCommand::Search { keywords, logic, case_sensitive, agent, limit } => {
            let answer = client.search_history(&keywords, &logic, case_sensitive, agent.as_deref(), limit).await?;
            print_records(&answer.records);
        }
        HistoryCommand::Stats { agent } => {
            let stats = client.history_stats(agent.as_deref()).await?;
            println!("Total records: {}", stats.total);
            for (status, count) in &stats.by_status {
                println!("  {status:<15} {count}");
            }
            match stats.success_rate {
                Some(rate) => println!("Success rate: {:.1}% (completed / (completed + failed))", rate * 100.0),
                None => println!("Success rate: n/a (nothing completed or failed yet)"),
            }
            for (agent, sides) in &stats.by_agent {
                println!(
                    "  {agent:<24} sent {:<6} received {}",
                    sides.get("sent").copied().unwrap_or(0),
                    sides.get("received").copied().unwrap_or(0)
                );
            }
            println!(
                "Range: {} .. {}; text {} bytes",
                stats.first.as_deref().unwrap_or("-"),
                stats.last.as_deref().unwrap_or("-"),
                stats.text_bytes
            );
        }
        HistoryCommand::Export { format, agent, limit, output } => {
            let records = client.history(agent.as_deref(), limit).await?.records;
            let text = if format == "csv" { to_csv(&records) } else { api::json_pretty(&records)? + "\n" };
            match output {
                Some(path) => {
                    std::fs::write(&path, text)
                        .map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))?;
                    println!("Wrote {} records to {}", records.len(), path.display());
                }
                None => print!("{text}"),
            }
        }
        HistoryCommand::Cleanup { days, max_size, dry_run, force } => {
            // Bad options are refused before asking (the broker checks them again).
            match (days, max_size) {
                (Some(_), Some(_)) => anyhow::bail!("give --days or --max-size, not both"),
                (None, None) => anyhow::bail!("give --days N or --max-size MB"),
                (Some(value), None) | (None, Some(value)) if value <= 0 => {
                    anyhow::bail!("--days and --max-size must be positive")
                }
                _ => {}
            }
            if !dry_run && !force {
                if !std::io::stdin().is_terminal() {
                    anyhow::bail!(
                        "not removing history without confirmation; pass --force (or --dry-run to see what would go)"
                    );
                }
                eprint!("Remove old history records? [y/N] ");
                let mut answer = String::new();
                std::io::stdin().read_line(&mut answer)?;
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    println!("Nothing changed.");
                    return Ok(1);
                }
            }
            let answer = client.cleanup_history(&api::HistoryCleanup { days, max_size_mb: max_size, dry_run }).await?;
            if dry_run {
                println!(
                    "Would remove {} record(s) last updated before {}",
                    answer.would_remove.map_or_else(|| "null".to_string(), |count| count.to_string()),
                    answer.before
                );
            } else {
                println!("Removed {} record(s) last updated before {}", answer.removed, answer.before);
            }
        }
    }
    Ok(0)
}
