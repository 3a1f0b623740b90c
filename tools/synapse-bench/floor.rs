//! `floor`: what this machine allows, measured the way the scenarios use it (issue 16), so that a
//! scenario's target can be a ratio to a floor of the same run:
//! - `floor_redb_events_per_s`: redb appends of [`EVENT_BYTES`]-byte values, [`BATCH`] per
//!   commit, each commit `Durability::Immediate` (fsynced), as the writer's group commit does;
//! - `floor_spawn_ms`: spawning and reaping a minimal Rust binary built beside this one
//!   (`synapse-bench-noop`), not `synapse` itself, so a slower binary cannot loosen its own target;
//! - `floor_http_per_s`: a bare axum handler answering the client and connection count of
//!   `http-send` (the same request and a small JSON answer).
//!
//! The other two floors are measured by the scenarios they bound, on what those build anyway:
//! `rebuild` (`floor_scan_1m_seconds`, its 1M log) and `sse-fanout` (`floor_sse_p99_ms`, its
//! event rate and subscribers).

use crate::common::{BenchDir, Options, Samples, result};
use anyhow::{Context, Result, bail};
use hyper::body::Bytes;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Bytes of one appended value: about what one event of a send encodes to.
const EVENT_BYTES: usize = 256;
/// Events per commit: a full group commit of the writer.
const BATCH: usize = 64;
/// Spawns timed by `floor_spawn_ms`.
const SPAWNS: usize = 200;

const EVENTS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("events");

pub async fn run(options: &Options) -> Result<()> {
    redb_appends(options)?;
    spawns()?;
    http(options).await
}

fn redb_appends(options: &Options) -> Result<()> {
    let dir = BenchDir::new("floor-redb")?;
    let db = redb::Database::create(dir.root.join("floor.redb"))?;
    let value = vec![0x5a_u8; EVENT_BYTES];
    let mut seq = 0_u64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(options.seconds);
    while Instant::now() < deadline {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        {
            let mut table = txn.open_table(EVENTS)?;
            for _ in 0..BATCH {
                seq += 1;
                table.insert(seq, value.as_slice())?;
            }
        }
        txn.commit()?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!("redb: {seq} values of {EVENT_BYTES} bytes in commits of {BATCH}, fsynced, in {elapsed:.2} s");
    result("floor_redb_events_per_s", seq as f64 / elapsed, 0, "events/s");
    Ok(())
}

/// The minimal binary beside this one (`tools/bench` builds it).
fn noop_binary() -> Result<PathBuf> {
    beside_this_one("synapse-bench-noop")
}

/// A bench binary beside this one (`tools/bench` builds them).
pub fn beside_this_one(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find synapse-bench")?;
    let binary = exe.with_file_name(name);
    if !binary.exists() {
        bail!("{} is missing: build it with cargo build --release --features bench --bin {name}", binary.display());
    }
    Ok(binary)
}

fn spawns() -> Result<()> {
    let noop = noop_binary()?;
    let mut samples = Vec::with_capacity(SPAWNS);
    for _ in 0..SPAWNS {
        let started = Instant::now();
        let status = std::process::Command::new(&noop).status()?;
        if !status.success() {
            bail!("{} failed: {status}", noop.display());
        }
        samples.push(started.elapsed());
    }
    let samples = Samples::new(samples);
    println!("spawn and reap {}: {}", noop.display(), samples.summary());
    result("floor_spawn_ms", samples.median(), 3, "ms");
    Ok(())
}

async fn http(options: &Options) -> Result<()> {
    let app = axum::Router::new().route(
        "/tasks/send",
        axum::routing::post(|body: Bytes| async move {
            axum::Json(serde_json::json!({"task": {"id": "0", "status": "submitted"}, "received": body.len()}))
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let (latencies, elapsed) = crate::http_send::drive_sends(port, options.seconds).await?;
    let total = latencies.len();
    server.abort();
    println!(
        "bare axum handler, {} connections: {total} requests in {elapsed:.2} s",
        crate::http_send::HTTP_CONNECTIONS
    );
    result("floor_http_per_s", total as f64 / elapsed, 0, "req/s");
    Ok(())
}
