//! `storage`: how much the log grows per byte of message text.
//!
//! Exchanges of 16 MB texts (a message with a reply expected, and its reply), the database file
//! measured before and after (`storage_amplification`).

use crate::common::{
    BenchDir, BrokerProcess, Options, SynapseEnv, ack_as, history_word, register_agent, reply_body, result,
};
use anyhow::{Context, Result};
use std::path::Path;
use synapse::api::SendRequest as SendBody;

/// `storage`: exchanges (a message with a reply expected, and its reply), and the size of
/// each text (16 MB, decimal: the limit is 16 MiB).
const STORAGE_EXCHANGES: usize = 5;
const STORAGE_TEXT_BYTES: usize = 16_000_000;

/// A text of `bytes` bytes made of words (what a long prompt or a pasted file looks like to the
/// history index), different for every `seed`.
fn storage_text(seed: u64, bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 32);
    let mut index = seed.wrapping_mul(1_000_003);
    while text.len() < bytes {
        text.push_str(&history_word(index % 20_000));
        text.push(' ');
        index += 1;
    }
    text.truncate(bytes);
    text
}

fn file_bytes(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path).with_context(|| format!("cannot read the size of {}", path.display()))?.len())
}

fn megabytes(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("storage")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let database = dir.paths().database();
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let a = register_agent(&mut http).await?;
    let b = register_agent(&mut http).await?;
    let start_bytes = file_bytes(&database)?;
    println!(
        "A = {}, B = {}; {STORAGE_EXCHANGES} exchanges of a {:.0} MB message (reply expected) and a {:.0} MB reply; log {:.1} MB at the start",
        a.id,
        b.id,
        megabytes(STORAGE_TEXT_BYTES as u64),
        megabytes(STORAGE_TEXT_BYTES as u64),
        megabytes(start_bytes)
    );
    let mut payload = 0u64;
    for exchange in 0..STORAGE_EXCHANGES {
        let before = file_bytes(&database)?;
        let seed = exchange as u64 * 2;
        let request = SendBody {
            from: Some(a.id.clone()),
            secret: Some(a.secret.clone()),
            response_expected: true,
            ..SendBody::new(b.id.clone(), storage_text(seed, STORAGE_TEXT_BYTES))
        };
        http.send(&request).await?;
        // B's watcher writes the message into its PTY: the ticket leaves the inbox and the task
        // starts working (a state change of the task that holds the message).
        let inbox = http.inbox(&b.id, 0, None).await?;
        let ticket = inbox.tickets.first().context("B's inbox is empty")?.ticket;
        ack_as(&mut http, &b, ticket).await?;
        let after_send = file_bytes(&database)?;
        http.reply(&reply_body(&b, storage_text(seed + 1, STORAGE_TEXT_BYTES))).await?;
        let inbox = http.inbox(&a.id, 0, None).await?;
        let ticket = inbox.tickets.first().context("A's inbox is empty")?.ticket;
        ack_as(&mut http, &a, ticket).await?;
        let after_reply = file_bytes(&database)?;
        payload += 2 * STORAGE_TEXT_BYTES as u64;
        println!(
            "exchange {exchange}: message +{:.1} MB ({:.2}x), reply +{:.1} MB ({:.2}x)",
            megabytes(after_send.saturating_sub(before)),
            after_send.saturating_sub(before) as f64 / STORAGE_TEXT_BYTES as f64,
            megabytes(after_reply.saturating_sub(after_send)),
            after_reply.saturating_sub(after_send) as f64 / STORAGE_TEXT_BYTES as f64,
        );
    }
    drop(http);
    broker.stop()?;
    let grown = file_bytes(&database)?.saturating_sub(start_bytes);
    println!(
        "log grew {:.1} MB for {:.1} MB of text sent ({:.1} MB per exchange of two texts)",
        megabytes(grown),
        megabytes(payload),
        megabytes(grown) / STORAGE_EXCHANGES as f64
    );
    result("storage_amplification", grown as f64 / payload as f64, 2, "ratio");
    Ok(())
}
