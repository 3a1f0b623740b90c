//! `memory`: resident size of an idle broker.
//!
//! And of an idle wrapper with a dummy agent, read from `/proc` (`broker_idle_rss_mb`,
//! `wrapper_rss_mb`).

use crate::common::{
    BenchDir, BrokerProcess, Options, SynapseEnv, proc_status_kib, proc_status_value, result, start_dummy,
};
use anyhow::Result;
use std::time::Duration;

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("memory")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_kib = proc_status_kib(broker.pid(), "VmRSS")?;
    let peak_kib = proc_status_kib(broker.pid(), "VmHWM")?;
    let threads = proc_status_value(broker.pid(), "Threads")?;
    println!("idle broker (empty log): VmRSS {rss_kib} kB, VmHWM {peak_kib} kB, {threads} threads");
    // One wrapper with a dummy agent, idle at its prompt.
    let agent = start_dummy(&broker.env)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let wrapper_kib = proc_status_kib(agent.wrapper_pid, "VmRSS")?;
    println!("idle wrapper with a dummy agent: VmRSS {wrapper_kib} kB (the dummy itself is a separate process)");
    // Most of that RSS is the executable's pages, which every synapse process shares: what one
    // more agent costs the machine is its private memory (and its share of the rest, PSS).
    let rollup = |pid: u32| smaps_rollup_kib(pid).unwrap_or_default();
    let (broker_private, broker_pss) = rollup(broker.pid());
    let (wrapper_private, wrapper_pss) = rollup(agent.wrapper_pid);
    println!(
        "  broker: {broker_private} kB private, PSS {broker_pss} kB; wrapper: {wrapper_private} kB private, PSS {wrapper_pss} kB"
    );
    drop(agent);
    broker.stop()?;
    result("broker_idle_rss_mb", rss_kib as f64 / 1024.0, 1, "MB");
    result("wrapper_rss_mb", wrapper_kib as f64 / 1024.0, 1, "MB");
    result("wrapper_private_mb", wrapper_private as f64 / 1024.0, 1, "MB");
    Ok(())
}

/// Private (clean and dirty) and proportional set size of a process, in kB, from
/// `/proc/<pid>/smaps_rollup`.
fn smaps_rollup_kib(pid: u32) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Ok((field("Private_Clean:") + field("Private_Dirty:"), field("Pss:")))
}
