//! `delivery`: from the send's answer to the bytes in the target's PTY.
//!
//! A dummy agent in a wrapper; each message is timed from the broker's answer to its echo in
//! the wrapper's terminal log, and the dummy is back at its prompt before the next (`delivery_*`);
//! the same from the send's request too (`delivery_from_request_*`: what the sender waits for).

use crate::common::{BenchDir, BrokerProcess, Options, Samples, SynapseEnv, result, start_dummy};
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::time::{Duration, Instant};
use synapse::api::SendRequest as SendBody;

/// Messages timed by `delivery`.
const DELIVERIES: usize = 1000;

/// Reads what was appended to `path` since `offset`.
fn read_from(path: &Path, offset: &mut u64) -> Result<String> {
    use std::io::{Read, Seek};
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        // The wrapper may announce itself before its CLI's log exists.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(error) => return Err(error).with_context(|| format!("cannot open {}", path.display())),
    };
    file.seek(std::io::SeekFrom::Start(*offset))?;
    let mut text = String::new();
    let read = file.read_to_string(&mut text)?;
    *offset += read as u64;
    Ok(text)
}

/// Waits until the log shows `needle` (polling the file: this is a measurement, and the PTY's
/// echo in the wrapper's log is the first observable sign of the write).
fn wait_in_log(path: &Path, offset: &mut u64, seen: &mut String, needle: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        seen.push_str(&read_from(path, offset)?);
        if let Some(at) = seen.find(needle) {
            seen.drain(..at + needle.len());
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            bail!("'{needle}' never appeared in {}", path.display());
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("delivery")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env.clone(), dir.root.join("broker.log")).await?;
    let agent = start_dummy(&env)?;
    let mut http = broker.connect().await?;
    let mut offset = 0;
    let mut seen = String::new();
    wait_in_log(&agent.log, &mut offset, &mut seen, "> ")?;
    let mut samples = Vec::with_capacity(DELIVERIES);
    let mut from_request = Vec::with_capacity(DELIVERIES);
    for number in 0..DELIVERIES {
        let text = format!("delivery-{number:05}");
        let body = SendBody::new(agent.id.clone(), text.clone());
        let asked = Instant::now();
        http.send(&body).await?;
        let sent = Instant::now();
        // The echo of the written line; then the dummy's answer and its prompt (READY again).
        wait_in_log(&agent.log, &mut offset, &mut seen, &format!("] {text}"))?;
        let echoed = Instant::now();
        samples.push(echoed - sent);
        from_request.push(echoed - asked);
        wait_in_log(&agent.log, &mut offset, &mut seen, "You said: [A2A")?;
        wait_in_log(&agent.log, &mut offset, &mut seen, "> ")?;
    }
    drop(http);
    drop(agent);
    broker.stop()?;
    let samples = Samples::new(samples);
    let from_request = Samples::new(from_request);
    println!("send answered -> line echoed by the target PTY (dummy, settle 0): {}", samples.summary());
    println!("send asked -> line echoed by the target PTY: {}", from_request.summary());
    result("delivery_p50_ms", samples.median(), 3, "ms");
    result("delivery_p99_ms", samples.percentile(99.0), 3, "ms");
    result("delivery_from_request_p50_ms", from_request.median(), 3, "ms");
    result("delivery_from_request_p99_ms", from_request.percentile(99.0), 3, "ms");
    Ok(())
}
