//! `scale`: what a request costs as the log grows (issue 16). On demand only: not in `all`.
//!
//! One log grows to each size in turn (100k, 1M and 10M events by default, or the sizes in
//! `SYNAPSE_BENCH_SCALE_SIZES`, comma-separated), written straight into the store with the
//! realistic mix of `rebuild`. At each size a broker starts on it and the p50 of `synapse
//! send`, `synapse list`, `GET /tasks/{id}`, an inbox fetch, an agent's `/status` and `synapse
//! history list` is measured (`scale_<op>_p50_ms_<size>`), with the broker's RSS and the
//! file's bytes per event; `history stats` (which reads every task) and `history thread` are
//! timed too (three samples). Then the broker restarts on the same log: the time until its
//! socket answers, and its first `GET /webhooks` (which waits for the delivery worker to catch
//! up with the log), one sample each (`scale_restart_ms_<size>`,
//! `scale_first_webhooks_ms_<size>`). Then `scale_bytes_per_send`: the file's growth per small
//! send through `POST /tasks/send`, in a log of its own.
//!
//! A size the disk cannot hold (judged up front from the bytes per event of the previous size,
//! or of `rebuild`'s log for the first) is skipped with a line that says so.

use crate::common::{
    BenchDir, BrokerProcess, Http, Options, Samples, SynapseEnv, proc_status_kib, register_agent, result, splitmix,
};
use crate::rebuild::LogGenerator;
use anyhow::{Context, Result, bail};
use hyper::Method;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use synapse::client::Client;
use synapse::store::Store;

const DEFAULT_SIZES: [u64; 3] = [100_000, 1_000_000, 10_000_000];
/// Samples of each operation at each size.
const SAMPLES: usize = 30;
/// Events per transaction while the log grows.
const BATCH: u64 = 10_000;
/// Bytes per event of `rebuild`'s log on this machine (1,028 MiB for 1M events): the first
/// size's disk estimate.
const FIRST_ESTIMATE_BYTES_PER_EVENT: f64 = 1_100.0;
/// Small sends for `scale_bytes_per_send`.
const SENDS: usize = 20_000;

fn sizes() -> Result<Vec<u64>> {
    let Ok(text) = std::env::var("SYNAPSE_BENCH_SCALE_SIZES") else { return Ok(DEFAULT_SIZES.to_vec()) };
    let mut sizes: Vec<u64> = text
        .split(',')
        .map(str::trim)
        .filter(|size| !size.is_empty())
        .map(|size| size.parse().with_context(|| format!("SYNAPSE_BENCH_SCALE_SIZES: '{size}' is not a number")))
        .collect::<Result<_>>()?;
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.first().is_none_or(|first| *first < 1_000) {
        bail!("SYNAPSE_BENCH_SCALE_SIZES needs sizes of at least 1000 events");
    }
    Ok(sizes)
}

/// `100k`, `1m`, `10m`: the size in a result's name.
fn label(size: u64) -> String {
    match size {
        size if size % 1_000_000 == 0 => format!("{}m", size / 1_000_000),
        size if size % 1_000 == 0 => format!("{}k", size / 1_000),
        size => size.to_string(),
    }
}

/// Free bytes on the file system of `path` (from `df`, which every machine here has).
fn free_bytes(path: &std::path::Path) -> Result<u64> {
    let output = std::process::Command::new("df").args(["-k", "--output=avail"]).arg(path).output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let kib: u64 = text.lines().nth(1).map(str::trim).unwrap_or_default().parse().context("cannot read df's answer")?;
    Ok(kib * 1024)
}

fn gb(bytes: f64) -> String {
    format!("{:.1} GB", bytes / 1e9)
}

pub async fn run(options: &Options) -> Result<()> {
    let sizes = sizes()?;
    let dir = BenchDir::new("scale")?;
    let largest = sizes.last().copied().unwrap_or_default() as f64;
    println!(
        "scale: one log grown to {} events; needs about {} of free disk under {} at today's size per event ({} free)",
        sizes.iter().map(|size| label(*size)).collect::<Vec<_>>().join(", "),
        gb(largest * FIRST_ESTIMATE_BYTES_PER_EVENT),
        dir.root.display(),
        gb(free_bytes(&dir.root)? as f64)
    );
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let database = dir.paths().database();
    let mut log = LogGenerator::new(0);
    let mut bytes_per_event = FIRST_ESTIMATE_BYTES_PER_EVENT;
    let mut first: Vec<(&str, f64)> = Vec::new();
    let mut last: Vec<(&str, f64)> = Vec::new();
    let time_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64);
    let mut batch = 0;
    for size in sizes {
        let have = std::fs::metadata(&database).map_or(0, |meta| meta.len());
        let need = (size as f64 * bytes_per_event - have as f64).max(0.0) * 1.1;
        let free = free_bytes(&dir.root)? as f64;
        if need > free {
            println!("size {}: skipped, it needs about {} more and {} is free", label(size), gb(need), gb(free));
            break;
        }
        let growing = Instant::now();
        {
            let store = Store::open(&database)?;
            log.grow_to(size);
            while !log.is_done() {
                store.transact(time_ms + batch, |appender| log.fill(appender, BATCH))?;
                batch += 1;
            }
        }
        let file = std::fs::metadata(&database)?.len();
        bytes_per_event = file as f64 / size as f64;
        println!(
            "size {}: log grown in {:.1} s; file {} ({bytes_per_event:.0} bytes per event)",
            label(size),
            growing.elapsed().as_secs_f64(),
            gb(file as f64)
        );
        let figures = measure(&env, &dir, &log, size).await?;
        if first.is_empty() {
            first = figures.clone();
        }
        last = figures;
        result(&format!("scale_bytes_per_event_{}", label(size)), bytes_per_event, 0, "B");
    }
    if let Some(size) = std::fs::metadata(&database).ok().map(|meta| meta.len())
        && size > 0
        && first.len() == last.len()
    {
        for ((op, at_first), (_, at_last)) in first.iter().zip(&last) {
            if *at_first > 0.0 {
                println!("RATIO scale_{op}_growth {:.2} (target <= 1.5)", at_last / at_first);
            }
        }
    }
    drop(dir);
    bytes_per_send(options).await
}

/// The p50 of each operation against a broker on the log as it is now.
async fn measure(env: &SynapseEnv, dir: &BenchDir, log: &LogGenerator, size: u64) -> Result<Vec<(&'static str, f64)>> {
    let broker = BrokerProcess::start(env.clone(), dir.root.join(format!("broker-{}.log", label(size)))).await?;
    let agent = log.agents().first().cloned().context("the log has no agent")?;
    let task = log.last_task.clone().context("the log has no task")?;
    let rss = |when: &str| {
        if let Ok(kib) = proc_status_kib(broker.pid(), "VmRSS") {
            println!("  broker RSS {when}: {:.1} MB", kib as f64 / 1024.0);
        }
    };
    rss("after start");
    // The history index catches up with the grown log first (the broker's own indexer, in the
    // background): the figures are those of a broker at work, not one still indexing.
    let indexing = Instant::now();
    let mut client = broker.connect().await?;
    let progress = loop {
        let progress = client.index_progress().await?;
        if progress.indexed_through >= progress.head {
            break progress;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    drop(client);
    println!(
        "  history index caught up ({} events, {} exchanges, {} segments) in {:.1} s",
        progress.indexed_through,
        log.exchanges,
        progress.segments,
        indexing.elapsed().as_secs_f64()
    );
    rss("after indexing");
    let mut figures = Vec::new();
    // The CLI, as a user runs it: one process per command.
    let cli = |args: &[&str]| -> Result<f64> {
        let started = Instant::now();
        let output = env.command(args).output()?;
        if !output.status.success() {
            bail!("synapse {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    };
    let mut timed = |name: &'static str, millis: Vec<f64>| {
        let samples = Samples::from_millis(millis);
        println!("  {name}: {}", samples.summary());
        result(&format!("scale_{name}_p50_ms_{}", label(size)), samples.median(), 2, "ms");
        figures.push((name, samples.median()));
    };
    let millis = (0..SAMPLES).map(|_| cli(&["send", &agent, "scale probe", "--no-response"])).collect::<Result<_>>()?;
    timed("send", millis);
    rss("after the sends");
    let millis = (0..SAMPLES).map(|_| cli(&["list"])).collect::<Result<_>>()?;
    timed("list", millis);
    rss("after the lists");
    let mut client = broker.connect().await?;
    let mut millis = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        client.task(&task).await?;
        millis.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    timed("get_task", millis);
    // The log's agents were registered with their own id as their secret (`rebuild`).
    client.set_secret(agent.clone());
    let mut millis = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        client.inbox(&agent, 0, Some(1)).await?;
        millis.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    timed("inbox", millis);
    client.clear_secret();
    let mut millis = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        client.agent_status(&agent).await?;
        millis.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    timed("status", millis);
    rss("after tasks, inbox and status");
    let millis = (0..SAMPLES).map(|_| cli(&["history", "list"])).collect::<Result<_>>()?;
    timed("history_list", millis);
    // Two numbers of exchanges, OR (a word also finds the longer words it begins, so a number
    // finds the numbers it begins): rare words, through the word index. Then two words of every
    // request, AND: every record matches, and the newest 50 are the answer.
    let mut seed = size;
    let exchanges = log.exchanges.max(1);
    let millis = (0..SAMPLES)
        .map(|_| {
            // Exchanges are numbered from 1 (`rebuild`'s texts).
            let (first, second) = (1 + splitmix(&mut seed) % exchanges, 1 + splitmix(&mut seed) % exchanges);
            cli(&["history", "search", &first.to_string(), &second.to_string()])
        })
        .collect::<Result<_>>()?;
    timed("history_search", millis);
    let millis =
        (0..SAMPLES).map(|_| cli(&["history", "search", "review", "disk", "--logic", "AND"])).collect::<Result<_>>()?;
    timed("history_search_common", millis);
    // `history stats` reads every task by its nature; `history thread` did until it had the
    // index. Timed, not held to the growth target, and run before the RSS line, which shows
    // what they leave held.
    for (name, args) in
        [("history_stats", vec!["history", "stats"]), ("history_thread", vec!["history", "thread", &task])]
    {
        let samples = Samples::from_millis((0..3).map(|_| cli(&args)).collect::<Result<_>>()?);
        println!("  {name}: {}", samples.summary());
        result(&format!("scale_{name}_p50_ms_{}", label(size)), samples.median(), 1, "ms");
    }
    if let Ok(kib) = proc_status_kib(broker.pid(), "VmHWM") {
        println!("  broker peak RSS so far: {:.1} MB", kib as f64 / 1024.0);
    }
    drop(client);
    let rss_kib = proc_status_kib(broker.pid(), "VmRSS")?;
    result(&format!("scale_broker_rss_mb_{}", label(size)), rss_kib as f64 / 1024.0, 1, "MB");
    broker.stop()?;
    // A restart on the log that broker left: the time until the socket answers, and the first
    // request that reads the delivery worker's projections (the webhook outbox), at once: it
    // waits until the worker has caught up with the log. One sample each.
    let starting = Instant::now();
    let broker =
        BrokerProcess::start(env.clone(), dir.root.join(format!("broker-{}-restart.log", label(size)))).await?;
    let restart_ms = starting.elapsed().as_secs_f64() * 1000.0;
    let asking = Instant::now();
    let mut http = Http::unix(&env.broker_socket()).await?;
    let (status, body) = http.send(Method::GET, "/webhooks", None).await?;
    if !status.is_success() {
        bail!("GET /webhooks answered {status}: {}", String::from_utf8_lossy(&body));
    }
    let first_webhooks_ms = asking.elapsed().as_secs_f64() * 1000.0;
    drop(http);
    broker.stop()?;
    for (name, millis) in [("restart", restart_ms), ("first_webhooks", first_webhooks_ms)] {
        println!("  {name}: {millis:.2} ms");
        result(&format!("scale_{name}_ms_{}", label(size)), millis, 2, "ms");
        figures.push((name, millis));
    }
    Ok(figures)
}

/// The file's growth per small send (`POST /tasks/send` with "hi"), in a fresh log.
async fn bytes_per_send(options: &Options) -> Result<()> {
    let dir = BenchDir::new("scale-sends")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    let mut client: Client = broker.connect().await?;
    let agent = register_agent(&mut client).await?;
    drop(client);
    let database = dir.paths().database();
    let before = std::fs::metadata(&database)?.len();
    // Sends until SENDS are done, in slices of the http-send load.
    let mut sends = 0;
    while sends < SENDS {
        let (latencies, _) = crate::http_send::drive_sends(agent.port, 0.5).await?;
        sends += latencies.len();
    }
    broker.stop()?;
    let after = std::fs::metadata(&database)?.len();
    let per_send = after.saturating_sub(before) as f64 / sends as f64;
    println!("{sends} small sends grew the file from {} to {} bytes", before, after);
    // Where the bytes go: each table's rows and pages per send.
    for table in Store::open(&database)?.table_sizes()? {
        println!(
            "  {:<32} {:>8.0} B of rows, {:>8.0} B of pages per send",
            table.name,
            table.stored_bytes as f64 / sends as f64,
            (table.pages * 4096) as f64 / sends as f64
        );
    }
    result("scale_bytes_per_send", per_send, 0, "B");
    Ok(())
}
