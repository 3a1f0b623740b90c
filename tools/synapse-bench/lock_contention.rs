//! `lock-contention`: agents contending for files through the writer.
//!
//! File-safety commands submitted straight to the writer of a broker state in this process
//! (`lock_decisions_per_s`).

use crate::common::{BenchDir, Options, result, splitmix};
use anyhow::{Result, anyhow, bail};
use std::time::{Duration, Instant};
use synapse::broker::BrokerState;
use synapse::broker::command::{Command, Outcome, RegisterRequest};
use synapse::secret::hash_secret;
use synapse::store::Store;

const LOCK_AGENTS: usize = 64;
const LOCK_FILES: usize = 100;

pub async fn run(options: &Options) -> Result<()> {
    use synapse::broker::file_safety::FileCommand;
    let dir = BenchDir::new("lock-contention")?;
    let paths = dir.paths();
    let store = Store::open(&paths.database())?;
    let (state, writer_thread) = BrokerState::start(store, paths)?;
    let pid = std::process::id();
    let mut agent_ids = Vec::new();
    for agent in 0..LOCK_AGENTS {
        let command = Command::RegisterAgent(RegisterRequest {
            agent_type: "bench".into(),
            name: None,
            role: None,
            pid,
            working_dir: String::new(),
            port: 42_000 + agent as u16,
            secret_hash: hash_secret("bench-secret"),
            pid_start: None,
            wrapper: false,
            by_user: true,
        });
        match state.writer.submit(command).await {
            Ok(Outcome::Registered { agent }) => agent_ids.push(agent.agent_id),
            Ok(other) => bail!("unexpected answer to a registration: {other:?}"),
            Err(error) => bail!("registration refused: {error}"),
        }
    }

    let duration = Duration::from_secs_f64(options.seconds);
    let started = Instant::now();
    let deadline = started + duration;
    let mut contenders = Vec::with_capacity(LOCK_AGENTS);
    for (index, agent_id) in agent_ids.into_iter().enumerate() {
        let writer = state.writer.clone();
        contenders.push(tokio::spawn(async move {
            let (mut granted, mut refused, mut released) = (0u64, 0u64, 0u64);
            let mut random = 7 + index as u64;
            while Instant::now() < deadline {
                let path = format!("/bench/file-{}.rs", splitmix(&mut random) % LOCK_FILES as u64);
                let lock = Command::FileSafety(FileCommand::Lock {
                    path: path.clone(),
                    aliases: Vec::new(),
                    agent_id: agent_id.clone(),
                    duration_seconds: 300,
                    intent: None,
                    task_id: None,
                });
                if writer.submit(lock).await.is_err() {
                    refused += 1;
                    continue;
                }
                granted += 1;
                let unlock = Command::FileSafety(FileCommand::Unlock {
                    path,
                    agent_id: Some(agent_id.clone()),
                    force: false,
                    by_user: false,
                });
                writer
                    .submit(unlock)
                    .await
                    .map_err(|error| anyhow!("the holder could not release its lock: {error}"))?;
                released += 1;
            }
            Ok::<_, anyhow::Error>((granted, refused, released))
        }));
    }
    let (mut granted, mut refused, mut released) = (0u64, 0u64, 0u64);
    for contender in contenders {
        let (g, r, u) = contender.await??;
        granted += g;
        refused += r;
        released += u;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let decisions = granted + refused + released;
    println!(
        "{LOCK_AGENTS} agents, {LOCK_FILES} files, {elapsed:.2} s: {granted} locks granted, {refused} refused, {released} released ({:.0} decisions/s)",
        decisions as f64 / elapsed
    );
    result("lock_decisions_per_s", decisions as f64 / elapsed, 0, "decisions/s");
    drop(state);
    tokio::task::spawn_blocking(move || writer_thread.join())
        .await?
        .map_err(|_| anyhow!("the writer thread panicked"))?;
    Ok(())
}
