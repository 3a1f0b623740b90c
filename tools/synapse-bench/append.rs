//! `append`: group commit through the in-process writer.
//!
//! Producers submit commands to a broker state in this process (no HTTP) for the timed length;
//! prints the durable events per second and the latency of one command (`append_*`).

use crate::common::{BenchDir, Options, Samples, result};
use anyhow::{Result, anyhow, bail};
use std::time::{Duration, Instant};
use synapse::broker::BrokerState;
use synapse::broker::command::{Command, Outcome, RegisterRequest, SendRequest};
use synapse::event::AgentStatus;
use synapse::secret::hash_secret;
use synapse::store::Store;

/// Concurrent producers in `append`.
const APPEND_PRODUCERS: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum AppendWork {
    /// Fire-and-forget sends from agent A to agent B (3 events each).
    Send,
    /// READY/PROCESSING toggles, each producer on its own agent (1 event each).
    Status,
}

pub async fn run(options: &Options) -> Result<()> {
    let work = match std::env::var("SYNAPSE_BENCH_APPEND").as_deref() {
        Ok("status") => AppendWork::Status,
        Ok("send") | Err(_) => AppendWork::Send,
        Ok(other) => bail!("SYNAPSE_BENCH_APPEND must be 'send' or 'status', not '{other}'"),
    };
    let dir = BenchDir::new("append")?;
    let paths = dir.paths();
    let store = Store::open(&paths.database())?;
    let (state, writer_thread) = BrokerState::start(store, paths)?;

    let pid = std::process::id();
    let register = |port: u16, secret: &str| {
        Command::RegisterAgent(RegisterRequest {
            agent_type: "bench".into(),
            name: None,
            role: None,
            pid,
            working_dir: String::new(),
            port,
            secret_hash: hash_secret(secret),
            pid_start: None,
            wrapper: false,
            by_user: true,
        })
    };
    let mut agent_ids = Vec::new();
    let mut ports: Vec<u16> = vec![40_001, 40_002];
    if work == AppendWork::Status {
        ports.extend((0..APPEND_PRODUCERS).map(|producer| 41_000 + producer as u16));
    }
    for port in ports {
        match state.writer.submit(register(port, "bench-secret")).await {
            Ok(Outcome::Registered { agent }) => agent_ids.push(agent.agent_id),
            Ok(other) => bail!("unexpected answer to a registration: {other:?}"),
            Err(error) => bail!("registration refused: {error}"),
        }
    }
    let (sender, receiver) = (agent_ids[0].clone(), agent_ids[1].clone());

    let duration = Duration::from_secs_f64(options.seconds);
    let head_before = state.store.head()?;
    let started = Instant::now();
    let deadline = started + duration;
    let mut producers = Vec::with_capacity(APPEND_PRODUCERS);
    for producer in 0..APPEND_PRODUCERS {
        let writer = state.writer.clone();
        let (sender, receiver) = (sender.clone(), receiver.clone());
        let own_agent = agent_ids.get(2 + producer).cloned().unwrap_or_default();
        producers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let command = match work {
                    AppendWork::Send => Command::Send(SendRequest {
                        to: receiver.clone(),
                        from: Some(sender.clone()),
                        secret: Some("bench-secret".into()),
                        text: format!("bench message {producer}-{n}: please look at src/lib.rs"),
                        priority: 3,
                        response_expected: false,
                        ..SendRequest::default()
                    }),
                    AppendWork::Status => Command::SetStatus {
                        agent_id: own_agent.clone(),
                        status: if n.is_multiple_of(2) { AgentStatus::Ready } else { AgentStatus::Processing },
                        note: None,
                    },
                };
                let sent = Instant::now();
                writer.submit(command).await.map_err(|error| anyhow!("command refused: {error}"))?;
                latencies.push(sent.elapsed());
                n += 1;
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for producer in producers {
        latencies.extend(producer.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let events = state.store.head()? - head_before;

    let samples = Samples::new(latencies);
    let commands = samples.len();
    println!(
        "{APPEND_PRODUCERS} producers, {} commands: {commands} commands and {events} durable events in {elapsed:.2} s ({:.0} commands/s)",
        if work == AppendWork::Send { "send (A -> B, no reply)" } else { "set-status (READY/PROCESSING)" },
        commands as f64 / elapsed,
    );
    println!("ack latency: {}", samples.summary());
    result("append_events_per_s", events as f64 / elapsed, 0, "events/s");
    result("append_p50_ms", samples.median(), 3, "ms");
    result("append_p99_ms", samples.percentile(99.0), 3, "ms");

    // The writer thread ends once the last handle to it is gone.
    drop(state);
    tokio::task::spawn_blocking(move || writer_thread.join())
        .await?
        .map_err(|_| anyhow!("the writer thread panicked"))?;
    Ok(())
}
