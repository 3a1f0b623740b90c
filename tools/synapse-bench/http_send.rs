//! `http-send`: A2A sends over keep-alive TCP connections to an agent's port.
//!
//! Raw HTTP/1.1 with prepared bytes, so the client weighs little on the cores it shares with the
//! broker (`http_send*`).

use crate::common::{BenchDir, BrokerProcess, Http, Options, Samples, SynapseEnv, register_agent, result};
use anyhow::{Result, bail};
use hyper::Method;
use hyper::body::Bytes;
use serde_json::json;
use std::time::{Duration, Instant};

/// Concurrent keep-alive connections in `http-send`.
pub const HTTP_CONNECTIONS: usize = 32;

/// `http-send`'s load on `port` for `seconds`: [`HTTP_CONNECTIONS`] keep-alive connections, each
/// posting the same A2A send to `/tasks/send` in a loop. Returns every latency and the elapsed
/// seconds. Also the load of `floor_http_per_s` (against a bare handler).
pub async fn drive_sends(port: u16, seconds: f64) -> Result<(Vec<Duration>, f64)> {
    // One-way, as the figures before it measured: a send without response_mode now expects a
    // reply (the Python Synapse's "notify"), which adds the sender's task.
    let body = Bytes::from(serde_json::to_vec(&json!({
        "message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]},
        "metadata": {"response_mode": "silent"},
    }))?);
    let mut connections = Vec::with_capacity(HTTP_CONNECTIONS);
    for _ in 0..HTTP_CONNECTIONS {
        connections.push(Http::tcp(port).await?);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut clients = Vec::with_capacity(HTTP_CONNECTIONS);
    for mut connection in connections {
        let body = body.clone();
        clients.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let sent = Instant::now();
                let (status, answer) = connection.send(Method::POST, "/tasks/send", Some(body.clone())).await?;
                if !status.is_success() {
                    bail!("POST /tasks/send answered {status}: {}", String::from_utf8_lossy(&answer));
                }
                latencies.push(sent.elapsed());
            }
            Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for client in clients {
        latencies.extend(client.await??);
    }
    Ok((latencies, started.elapsed().as_secs_f64()))
}

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("http-send")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let agent = register_agent(&mut http).await?;

    let (latencies, elapsed) = drive_sends(agent.port, options.seconds).await?;
    drop(http);
    broker.stop()?;

    let samples = Samples::new(latencies);
    println!(
        "{HTTP_CONNECTIONS} connections to 127.0.0.1:{}: {} sends in {elapsed:.2} s; {}",
        agent.port,
        samples.len(),
        samples.summary()
    );
    result("http_sends_per_s", samples.len() as f64 / elapsed, 0, "req/s");
    result("http_send_p99_ms", samples.percentile(99.0), 3, "ms");
    Ok(())
}
