//! `cli-send`: one `synapse send` process per message.
//!
//! Each timed send is a whole CLI process against a running broker child, after a few untimed
//! warm-up runs (`cli_send_*`). Then, as many times, the same request from
//! `synapse-bench-rawsend`, a program that does nothing else (`cli_send_raw_*`): what is left of
//! a send once the client's own code costs nothing (the broker's side, the connection and the
//! process start).

use crate::common::{BenchDir, BrokerProcess, Options, Samples, SynapseEnv, register_agent, result};
use anyhow::{Context, Result, bail};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Timed `synapse send` processes in `cli-send` (after a few untimed warm-up runs).
const CLI_SENDS: usize = 200;
const CLI_WARMUP: usize = 3;

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("cli-send")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env.clone(), dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let agent = register_agent(&mut http).await?;

    let target = agent.id.clone();
    let spawn_env = env.clone();
    let raw = crate::floor::beside_this_one("synapse-bench-rawsend")?;
    let socket = env.broker_socket();
    let (durations, raw_durations) = tokio::task::spawn_blocking(move || -> Result<(Vec<Duration>, Vec<Duration>)> {
        let mut durations = Vec::with_capacity(CLI_SENDS);
        let mut raw_durations = Vec::with_capacity(CLI_SENDS);
        let timed = |command: &mut std::process::Command, what: &str| -> Result<Duration> {
            command.stdout(Stdio::null()).stderr(Stdio::piped());
            let started = Instant::now();
            let output = command.output().with_context(|| format!("cannot run {what}"))?;
            let elapsed = started.elapsed();
            if !output.status.success() {
                bail!("{what} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
            }
            Ok(elapsed)
        };
        // One after the other, each as `synapse send` always ran here: alternating them kept the
        // broker busier and took 0.2-0.3 ms off `synapse send`'s own median.
        for run in 0..CLI_WARMUP + CLI_SENDS {
            let mut command = spawn_env.command(["send", target.as_str(), "bench", "--no-response"]);
            let elapsed = timed(&mut command, "synapse send")?;
            if run >= CLI_WARMUP {
                durations.push(elapsed);
            }
        }
        for run in 0..CLI_WARMUP + CLI_SENDS {
            let mut command = std::process::Command::new(&raw);
            command.arg(&socket).arg(target.as_str());
            let elapsed = timed(&mut command, "synapse-bench-rawsend")?;
            if run >= CLI_WARMUP {
                raw_durations.push(elapsed);
            }
        }
        Ok((durations, raw_durations))
    })
    .await??;

    let depth = http.agent_status(&agent.id).await?.queue_depth;
    if depth != 2 * (CLI_WARMUP + CLI_SENDS) {
        bail!("{} holds {depth} tickets, expected {}", agent.id, 2 * (CLI_WARMUP + CLI_SENDS));
    }
    drop(http);
    broker.stop()?;

    let samples = Samples::new(durations);
    println!("synapse send (spawn to exit, {CLI_WARMUP} warm-up runs not counted): {}", samples.summary());
    result("cli_send_median_ms", samples.median(), 3, "ms");
    result("cli_send_p99_ms", samples.percentile(99.0), 3, "ms");
    let raw = Samples::new(raw_durations);
    println!("the same request from synapse-bench-rawsend (std only): {}", raw.summary());
    result("cli_send_raw_median_ms", raw.median(), 3, "ms");
    result("cli_send_raw_p99_ms", raw.percentile(99.0), 3, "ms");
    Ok(())
}
