//! `cli-send`: one `synapse send` process per message.
//!
//! Each timed send is a whole CLI process against a running broker child, after a few untimed
//! warm-up runs (`cli_send_*`).

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
    let durations = tokio::task::spawn_blocking(move || -> Result<Vec<Duration>> {
        let mut durations = Vec::with_capacity(CLI_SENDS);
        for run in 0..CLI_WARMUP + CLI_SENDS {
            let mut command = spawn_env.command(["send", target.as_str(), "bench", "--no-response"]);
            command.stdout(Stdio::null()).stderr(Stdio::piped());
            let started = Instant::now();
            let output = command.output().context("cannot run synapse send")?;
            let elapsed = started.elapsed();
            if !output.status.success() {
                bail!("synapse send failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
            }
            if run >= CLI_WARMUP {
                durations.push(elapsed);
            }
        }
        Ok(durations)
    })
    .await??;

    let depth = http.agent_status(&agent.id).await?.queue_depth;
    if depth != CLI_WARMUP + CLI_SENDS {
        bail!("{} holds {depth} tickets, expected {}", agent.id, CLI_WARMUP + CLI_SENDS);
    }
    drop(http);
    broker.stop()?;

    let samples = Samples::new(durations);
    println!("synapse send (spawn to exit, {CLI_WARMUP} warm-up runs not counted): {}", samples.summary());
    result("cli_send_median_ms", samples.median(), 3, "ms");
    result("cli_send_p99_ms", samples.percentile(99.0), 3, "ms");
    Ok(())
}
