//! `synapse history ...` (SPEC §4).

use crate::api::{self, HistoryRecord};
use crate::client::Client;
use crate::config::Paths;
use std::io::IsTerminal;

#[derive(clap::Subcommand, Debug)]
pub enum HistoryCommand {
    /// Recent records, newest first
    List {
        /// Only records this agent sent or received (name, id, type-port or type)
        #[arg(long)]
        agent: Option<String>,
        /// At most this many records
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON document: {"records": [...]}
        #[arg(long)]
        json: bool,
    },
    /// The records of one task (full id or prefix)
    Show {
        /// Task id, or its 8-character prefix
        task_id: String,
        /// One JSON document: {"records": [...]}
        #[arg(long)]
        json: bool,
    },
    /// The whole conversation a task belongs to, oldest first (message, reply)
    Thread {
        /// Task id, or its 8-character prefix
        task_id: String,
        /// One JSON document: {"records": [...]}
        #[arg(long)]
        json: bool,
    },
    /// Records whose input or output holds the keywords, each from the start of a word
    Search {
        /// Keywords to look for, as typed, from the start of a word: `pars` finds "Parser" (not
        /// "reparse"); punctuation and spaces count (`foo-bar`, `C++`, "hello parser"). Each
        /// needs a letter or digit; at most 32 keywords, of at most 256 bytes each
        #[arg(required = true)]
        keywords: Vec<String>,
        /// OR (any keyword) or AND (every keyword)
        #[arg(long, default_value = "OR")]
        logic: String,
        /// Match upper and lower case exactly
        #[arg(long)]
        case_sensitive: bool,
        /// Only records this agent sent or received (name, id, type-port or type)
        #[arg(long)]
        agent: Option<String>,
        /// At most this many records
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON document: {"records": [...]}
        #[arg(long)]
        json: bool,
    },
    /// Totals by state, success rate, per agent, date range, size
    Stats {
        /// Only records this agent sent or received (name, id, type-port or type)
        #[arg(long)]
        agent: Option<String>,
        /// One JSON document with the totals
        #[arg(long)]
        json: bool,
    },
    /// Write the records as JSON or CSV
    Export {
        /// json (one array) or csv (RFC 4180, with a header row; a text a spreadsheet would
        /// take for a formula, beginning with = + - or @, gets a ' in front)
        #[arg(long, default_value = "json", value_parser = ["json", "csv"])]
        format: String,
        /// Only records this agent sent or received (name, id, type-port or type)
        #[arg(long)]
        agent: Option<String>,
        /// At most this many records
        #[arg(long, default_value_t = 1_000_000)]
        limit: usize,
        /// Write to this file instead of standard output (replaced, never written through a
        /// link; readable by you only)
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
    /// Remove old records from the history view (the log keeps its events)
    Cleanup {
        /// Remove records last updated more than this many days ago
        #[arg(long, allow_hyphen_values = true)]
        days: Option<i64>,
        /// Remove the oldest records until the history's text fits in this many megabytes
        #[arg(long = "max-size", value_name = "MB", allow_hyphen_values = true)]
        max_size: Option<i64>,
        /// Say what would be removed, remove nothing
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation
        #[arg(short = 'f', long)]
        force: bool,
        /// One JSON document with what was (or would be) removed
        #[arg(long)]
        json: bool,
    },
}

/// One record on one line; every field but the time and status comes from others, so the whole
/// line has its controls made visible.
fn line(record: &HistoryRecord) -> String {
    crate::escape::visible_line(&format!(
        "{}  {}  {:<8} {:<24} {} {:<24} {:<10} {}",
        crate::time::rfc3339(record.updated_ms),
        crate::event::short_id(&record.task_id),
        record.side,
        record.agent,
        if record.side == "sent" { "->" } else { "<-" },
        record.peer,
        record.status.as_str(),
        crate::event::preview(&record.input, 50),
    ))
}

/// One record in full, for `history show`: every field on its own line, the texts whole (their
/// controls made visible: they come from others).
fn print_record(record: &HistoryRecord) {
    let visible = crate::escape::visible;
    println!("task:     {}", record.task_id);
    println!(
        "side:     {} ({} {} {})",
        record.side,
        visible(&record.agent),
        if record.side == "sent" { "->" } else { "<-" },
        visible(&record.peer)
    );
    println!("status:   {}  priority {}", record.status.as_str(), record.priority);
    println!(
        "time:     created {}  updated {}",
        crate::time::rfc3339(record.created_ms),
        crate::time::rfc3339(record.updated_ms)
    );
    println!("message:  {}", visible(&record.input).replace('\n', "\n          "));
    if !record.output.is_empty() {
        println!("reply:    {}", visible(&record.output).replace('\n', "\n          "));
    }
    println!();
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

/// Others' text for a CSV cell: one a spreadsheet would take for a formula (`=HYPERLINK(...)`,
/// `+`, `-`, `@`, or a tab or CR first) gets a `'` in front, which shows it as text.
fn csv_text(text: &str) -> String {
    if text.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{text}") } else { text.to_string() }
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
            csv_text(&record.agent),
            csv_text(&record.peer),
            record.status.as_str().to_string(),
            record.priority.to_string(),
            csv_text(&record.input),
            csv_text(&record.output),
            crate::time::rfc3339(record.created_ms),
            crate::time::rfc3339(record.updated_ms),
        ];
        out.push_str(&fields.iter().map(|field| csv_field(field)).collect::<Vec<_>>().join(","));
        out.push_str("\r\n");
    }
    out
}

/// Whether `path` names one of this process's own descriptors (`/dev/stdout`, `/dev/fd/N`).
fn own_descriptor(path: &std::path::Path) -> bool {
    path == std::path::Path::new("/dev/stdout")
        || path == std::path::Path::new("/dev/stderr")
        || path.starts_with("/dev/fd")
        || path.starts_with("/proc/self/fd")
}

/// Writes an export to `path`:
/// - one of this process's own descriptors (`/dev/stdout`, `/dev/fd/N`, `>(gzip > out)`):
///   written into, as the user asked;
/// - a file, a link, or nothing: a new private file renamed over it, so that a link planted
///   there (in a shared directory, to a file of the user's) is replaced, never written through;
/// - a pipe or a device of the user's own (`mkfifo`) that is not a link: written into;
/// - one of another user's (a FIFO planted in `/tmp`): refused, the messages are not theirs.
fn write_export(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let write_into = |path: &std::path::Path| {
        std::io::Write::write_all(&mut std::fs::OpenOptions::new().write(true).open(path)?, text.as_bytes())
    };
    if own_descriptor(path) {
        return write_into(path);
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() || meta.file_type().is_symlink() => crate::private_files::replace(path, text),
        Ok(meta) if meta.is_dir() => Err(std::io::Error::other("it is a directory")),
        Ok(meta) if meta.uid() != crate::private_files::my_uid() => Err(std::io::Error::other(format!(
            "it belongs to uid {}, not to you: the history's messages are not written into it",
            meta.uid()
        ))),
        Ok(_) => write_into(path),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => crate::private_files::replace(path, text),
        Err(error) => Err(error),
    }
}

pub async fn run(paths: &Paths, command: HistoryCommand) -> anyhow::Result<i32> {
    if !crate::settings::history_enabled() {
        anyhow::bail!("{}", crate::settings::HISTORY_DISABLED);
    }
    let mut client = Client::connect(paths, true).await?;
    match command {
        HistoryCommand::List { agent, limit, json } => {
            let answer = client.history(agent.as_deref(), limit).await?;
            if json {
                println!("{}", api::json_line(&answer)?);
            } else {
                print_records(&answer.records);
            }
        }
        HistoryCommand::Show { task_id, json } => {
            let answer = client.history_of_task(&task_id).await?;
            if json {
                println!("{}", api::json_line(&answer)?);
            } else {
                for record in &answer.records {
                    print_record(record);
                }
            }
        }
        HistoryCommand::Thread { task_id, json } => {
            let answer = client.thread(&task_id).await?;
            if json {
                println!("{}", api::json_line(&answer)?);
                return Ok(0);
            }
            for record in answer.records {
                println!("{}", line(&record));
                if !record.output.is_empty() {
                    let output = crate::event::preview(&record.output, 80);
                    println!("{:>30} {}", "reply:", crate::escape::visible_line(&output));
                }
            }
        }
        HistoryCommand::Search { keywords, logic, case_sensitive, agent, limit, json } => {
            let answer = client.search_history(&keywords, &logic, case_sensitive, agent.as_deref(), limit).await?;
            if json {
                println!("{}", api::json_line(&answer)?);
            } else {
                print_records(&answer.records);
            }
        }
        HistoryCommand::Stats { agent, json } => {
            let stats = client.history_stats(agent.as_deref()).await?;
            if json {
                println!("{}", api::json_line(&stats)?);
                return Ok(0);
            }
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
                    write_export(&path, &text)
                        .map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))?;
                    // Not into the export itself when that is the standard output.
                    if own_descriptor(&path) {
                        eprintln!("Wrote {} records to {}", records.len(), path.display());
                    } else {
                        println!("Wrote {} records to {}", records.len(), path.display());
                    }
                }
                // Others' text: its controls made visible on a terminal (the JSON export
                // escapes them itself); piped or redirected, the CSV as it is, to be read back.
                None if std::io::stdout().is_terminal() => print!("{}", crate::escape::visible(&text)),
                None => print!("{text}"),
            }
        }
        HistoryCommand::Cleanup { days, max_size, dry_run, force, json } => {
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
            let none = if dry_run { answer.would_remove == Some(0) } else { answer.removed == 0 };
            if json {
                println!("{}", api::json_line(&answer)?);
            } else if none {
                // By size, there is no cut-off date to name when everything fits.
                match max_size {
                    Some(mb) => println!("Nothing to remove: the history's text fits in {mb} MB"),
                    None => println!("Nothing to remove: no record was last updated before {}", answer.before),
                }
            } else if dry_run {
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
