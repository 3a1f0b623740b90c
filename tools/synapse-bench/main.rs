//! `synapse-bench`: performance scenarios for Synapse (see `tools/README.md`).
//!
//! Usage: `synapse-bench <scenario>... [--seconds N] [--synapse PATH]`, or `synapse-bench all`.
//! Scenarios: floor (this machine's limits, run first by `all`), append, rebuild, memory, cli-send, http-send, round-trip, delivery, sse-fanout,
//! history-search, lock-contention, storage; on demand only: real-clis, busy-delivery, scale.
//!
//! Every scenario works in a fresh directory under the system's temporary directory (removed
//! afterwards), lets the system choose every port, and prints human lines plus machine-readable
//! lines of the exact form `RESULT <name> <value> <unit>`.
//!
//! One file per scenario (`<scenario>.rs`, `real_clis.rs` for `real-clis`); what they share
//! (temporary directories, a broker child, raw HTTP, statistics and result lines) is in
//! `common.rs`.

mod append;
mod cli_send;
mod common;
mod dashboard;
mod delivery;
mod floor;
mod history_search;
mod http_send;
mod lock_contention;
mod memory;
mod real_clis;
mod rebuild;
mod round_trip;
mod scale;
mod sse_fanout;
mod storage;

use anyhow::{Context, Result, anyhow, bail};
use common::Options;
use std::path::PathBuf;
use std::process::ExitCode;

const SCENARIOS: [&str; 12] = [
    "floor",
    "append",
    "rebuild",
    "memory",
    "cli-send",
    "http-send",
    "round-trip",
    "delivery",
    "sse-fanout",
    "history-search",
    "lock-contention",
    "storage",
];
/// Default length of the timed scenarios (append, http-send).
const DEFAULT_SECONDS: f64 = 10.0;

const USAGE: &str = "usage: synapse-bench <scenario>... [--seconds N] [--synapse PATH]
scenarios: floor, append, rebuild, memory, cli-send, http-send, round-trip, delivery, sse-fanout,
           history-search, lock-contention, storage, all; real-clis, busy-delivery (need tools/install-clis;
           not in all); dashboard (needs chromium and chromedriver; not in all); scale (grows a log to 10M events: needs ~11 GB of disk; not in all)
  --seconds N      length of the timed scenarios (append, http-send, lock-contention); default 10,
                   or SYNAPSE_BENCH_SECONDS
  --synapse PATH   the synapse binary (default: next to synapse-bench), or SYNAPSE_BENCH_BIN
  SYNAPSE_BENCH_APPEND=send|status   what the append producers submit (default send)";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("synapse-bench: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(sse_fanout::FLOOR_SERVER) {
        sse_fanout::serve_floor(&args[1..])?;
        return Ok(ExitCode::SUCCESS);
    }
    let (scenarios, options) = parse_args(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut failed = Vec::new();
    for scenario in &scenarios {
        println!("== {scenario}");
        let outcome = match scenario.as_str() {
            "append" => runtime.block_on(append::run(&options)),
            "floor" => runtime.block_on(floor::run(&options)),
            "rebuild" => rebuild::run(),
            "memory" => runtime.block_on(memory::run(&options)),
            "cli-send" => runtime.block_on(cli_send::run(&options)),
            "http-send" => runtime.block_on(http_send::run(&options)),
            // One caller, one request at a time, on one thread: as the CLI and the wrappers
            // call the broker (their runtimes are current-thread too).
            "round-trip" => single_thread_runtime().and_then(|runtime| runtime.block_on(round_trip::run(&options))),
            "delivery" => runtime.block_on(delivery::run(&options)),
            "sse-fanout" => runtime.block_on(sse_fanout::run(&options)),
            "history-search" => history_search::run(),
            "lock-contention" => runtime.block_on(lock_contention::run(&options)),
            "real-clis" => real_clis::run(&options.synapse),
            "busy-delivery" => real_clis::busy(&options.synapse),
            "storage" => runtime.block_on(storage::run(&options)),
            "scale" => runtime.block_on(scale::run(&options)),
            "dashboard" => runtime.block_on(dashboard::run(&options)),
            other => Err(anyhow!("unknown scenario '{other}'")),
        };
        if let Err(error) = outcome {
            eprintln!("scenario {scenario} FAILED: {error:#}");
            failed.push(scenario.clone());
        }
    }
    common::ratios();
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("failed scenarios: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
}

fn single_thread_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

fn parse_args(args: Vec<String>) -> Result<(Vec<String>, Options)> {
    let mut seconds = match std::env::var("SYNAPSE_BENCH_SECONDS") {
        Ok(text) if !text.trim().is_empty() => parse_seconds(&text)?,
        _ => DEFAULT_SECONDS,
    };
    let mut synapse = std::env::var_os("SYNAPSE_BENCH_BIN").filter(|path| !path.is_empty()).map(PathBuf::from);
    let mut scenarios = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--seconds" => seconds = parse_seconds(&args.next().context("--seconds needs a value")?)?,
            "--synapse" => synapse = Some(PathBuf::from(args.next().context("--synapse needs a path")?)),
            "all" => scenarios.extend(SCENARIOS.iter().map(|name| name.to_string())),
            name if SCENARIOS.contains(&name)
                || ["real-clis", "busy-delivery", "scale", "dashboard"].contains(&name) =>
            {
                scenarios.push(name.to_string())
            }
            other => bail!("unknown argument '{other}'\n{USAGE}"),
        }
    }
    if scenarios.is_empty() {
        bail!("no scenario given\n{USAGE}");
    }
    let synapse = match synapse {
        Some(path) => path,
        None => std::env::current_exe().context("cannot find the synapse-bench executable")?.with_file_name("synapse"),
    };
    Ok((scenarios, Options { seconds, synapse }))
}

fn parse_seconds(text: &str) -> Result<f64> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() => Ok(seconds),
        _ => bail!("'{text}' is not a positive number of seconds"),
    }
}
