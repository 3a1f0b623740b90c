//! `synapse history ...` (SPEC §4).

use super::system::percent_encode;
use crate::client::Client;
use crate::config::Paths;
use serde_json::{Value, json};
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

fn enabled() -> bool {
    !std::env::var("SYNAPSE_HISTORY_ENABLED")
        .is_ok_and(|value| matches!(value.trim().to_ascii_lowercase().as_str(), "0" | "false" | "no" | "off"))
}

/// One record on one line; every field but the time and status comes from others, so the whole
/// line has its controls made visible.
fn line(record: &Value) -> String {
    crate::escape::visible_line(&format!(
        "{}  {}  {:<8} {:<24} {} {:<24} {:<10} {}",
        record["updated_ms"].as_u64().map(crate::time::rfc3339).unwrap_or_default(),
        crate::event::short_id(record["task_id"].as_str().unwrap_or_default()),
        record["side"].as_str().unwrap_or_default(),
        record["agent"].as_str().unwrap_or_default(),
        if record["side"] == "sent" { "->" } else { "<-" },
        record["peer"].as_str().unwrap_or_default(),
        record["status"].as_str().unwrap_or_default(),
        crate::event::preview(record["input"].as_str().unwrap_or_default(), 50),
    ))
}

fn print_records(records: &[Value]) {
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

pub fn to_csv(records: &[Value]) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push_str("\r\n");
    for record in records {
        let time = |field: &str| record[field].as_u64().map(crate::time::rfc3339).unwrap_or_default();
        let fields = [
            record["task_id"].as_str().unwrap_or_default().to_string(),
            record["side"].as_str().unwrap_or_default().to_string(),
            record["agent"].as_str().unwrap_or_default().to_string(),
            record["peer"].as_str().unwrap_or_default().to_string(),
            record["status"].as_str().unwrap_or_default().to_string(),
            record["priority"].to_string(),
            record["input"].as_str().unwrap_or_default().to_string(),
            record["output"].as_str().unwrap_or_default().to_string(),
            time("created_ms"),
            time("updated_ms"),
        ];
        out.push_str(&fields.iter().map(|field| csv_field(field)).collect::<Vec<_>>().join(","));
        out.push_str("\r\n");
    }
    out
}

pub async fn run(paths: &Paths, command: HistoryCommand) -> anyhow::Result<i32> {
    if !enabled() {
        anyhow::bail!(
            "Error: history is disabled (SYNAPSE_HISTORY_ENABLED=false). Unset it or set it to true to use the history views."
        );
    }
    let mut client = Client::connect(paths, true).await?;
    let agent_query =
        |agent: &Option<String>| agent.as_ref().map(|a| format!("&agent={}", percent_encode(a))).unwrap_or_default();
    match command {
        HistoryCommand::List { agent, limit } => {
            let answer = client.get(&format!("/history?limit={limit}{}", agent_query(&agent))).await?;
            print_records(answer["records"].as_array().map(Vec::as_slice).unwrap_or_default());
        }
        HistoryCommand::Show { task_id } => {
            let answer = client.get(&format!("/history/{}", percent_encode(&task_id))).await?;
            for record in answer["records"].as_array().cloned().unwrap_or_default() {
                println!("{}", serde_json::to_string_pretty(&record)?);
            }
        }
        HistoryCommand::Thread { task_id } => {
            let answer = client.get(&format!("/threads/{}", percent_encode(&task_id))).await?;
            for record in answer["records"].as_array().cloned().unwrap_or_default() {
                println!("{}", line(&record));
                if let Some(output) = record["output"].as_str().filter(|output| !output.is_empty()) {
                    println!("{:>30} {}", "reply:", crate::escape::visible_line(&crate::event::preview(output, 80)));
                }
            }
        }
        HistoryCommand::Search { keywords, logic, case_sensitive, agent, limit } => {
            let query = format!(
                "/history/search?q={}&logic={}&case_sensitive={case_sensitive}&limit={limit}{}",
                percent_encode(&keywords.join(",")),
                percent_encode(&logic),
                agent_query(&agent)
            );
            let answer = client.get(&query).await?;
            print_records(answer["records"].as_array().map(Vec::as_slice).unwrap_or_default());
        }
        HistoryCommand::Stats { agent } => {
            let query = agent.map(|a| format!("?agent={}", percent_encode(&a))).unwrap_or_default();
            let answer = client.get(&format!("/history/stats{query}")).await?;
            println!("Total records: {}", answer["total"]);
            for (status, count) in answer["by_status"].as_object().cloned().unwrap_or_default() {
                println!("  {status:<15} {count}");
            }
            match answer["success_rate"].as_f64() {
                Some(rate) => println!("Success rate: {:.1}% (completed / (completed + failed))", rate * 100.0),
                None => println!("Success rate: n/a (nothing completed or failed yet)"),
            }
            for (agent, sides) in answer["by_agent"].as_object().cloned().unwrap_or_default() {
                println!(
                    "  {agent:<24} sent {:<6} received {}",
                    sides["sent"].as_u64().unwrap_or(0),
                    sides["received"].as_u64().unwrap_or(0)
                );
            }
            println!(
                "Range: {} .. {}; text {} bytes",
                answer["first"].as_str().unwrap_or("-"),
                answer["last"].as_str().unwrap_or("-"),
                answer["text_bytes"]
            );
        }
        HistoryCommand::Export { format, agent, limit, output } => {
            let answer = client.get(&format!("/history?limit={limit}{}", agent_query(&agent))).await?;
            let records = answer["records"].as_array().cloned().unwrap_or_default();
            let text = if format == "csv" { to_csv(&records) } else { serde_json::to_string_pretty(&records)? + "\n" };
            match output {
                Some(path) => {
                    std::fs::write(&path, text)
                        .map_err(|error| anyhow::anyhow!("Error: cannot write {}: {error}", path.display()))?;
                    println!("Wrote {} records to {}", records.len(), path.display());
                }
                None => print!("{text}"),
            }
        }
        HistoryCommand::Cleanup { days, max_size, dry_run, force } => {
            // Bad options are refused before asking (the broker checks them again).
            match (days, max_size) {
                (Some(_), Some(_)) => anyhow::bail!("Error: give --days or --max-size, not both"),
                (None, None) => anyhow::bail!("Error: give --days N or --max-size MB"),
                (Some(value), None) | (None, Some(value)) if value <= 0 => {
                    anyhow::bail!("Error: --days and --max-size must be positive")
                }
                _ => {}
            }
            if !dry_run && !force {
                if !std::io::stdin().is_terminal() {
                    anyhow::bail!(
                        "Error: not removing history without confirmation; pass --force (or --dry-run to see what would go)"
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
            let answer = client
                .post("/history/cleanup", &json!({"days": days, "max_size_mb": max_size, "dry_run": dry_run}))
                .await?;
            if dry_run {
                println!(
                    "Would remove {} record(s) last updated before {}",
                    answer["would_remove"],
                    answer["before"].as_str().unwrap_or_default()
                );
            } else {
                println!(
                    "Removed {} record(s) last updated before {}",
                    answer["removed"],
                    answer["before"].as_str().unwrap_or_default()
                );
            }
        }
    }
    Ok(0)
}
