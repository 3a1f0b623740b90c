//! `synapse-bench`: performance scenarios for Synapse (see `tools/README.md`).
//!
//! Usage: `synapse-bench <scenario>... [--seconds N] [--synapse PATH]`, or `synapse-bench all`.
//! Scenarios: append, rebuild, memory, cli-send, http-send, round-trip, delivery, sse-fanout,
//! history-search, lock-contention, storage.
//!
//! Every scenario works in a fresh directory under the system's temporary directory (removed
//! afterwards), lets the system choose every port, and prints human lines plus machine-readable
//! lines of the exact form `RESULT <name> <value> <unit>`.

use anyhow::{Context, Result, anyhow, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use synapse::api::{self, Announce, RegisterRequest as RegisterBody, SendRequest as SendBody, StatusUpdate};
use synapse::broker::BrokerState;
use synapse::broker::command::{Command, Outcome, RegisterRequest, SendRequest};
use synapse::client::Client;
use synapse::config::Paths;
use synapse::event::{AgentStatus, Artifact, Direction, Event, Message, Role, TaskState};
use synapse::secret::hash_secret;
use synapse::store::{Appender, Store, StoreError};

mod real_clis;

const SCENARIOS: [&str; 11] = [
    "append",
    "rebuild",
    "memory",
    "cli-send",
    "http-send",
    "round-trip",
    "delivery",
    "sse-fanout",
    "history-search",
    "lock-contention",
    "storage",
];
/// `storage`: exchanges (a message with a reply expected, and its reply), and the size of
/// each text (16 MB, decimal: the limit is 16 MiB).
const STORAGE_EXCHANGES: usize = 5;
const STORAGE_TEXT_BYTES: usize = 16_000_000;
/// `sse-fanout`: subscribers on `/events`, events appended, concurrent appenders.
const FANOUT_SUBSCRIBERS: usize = 1000;
const FANOUT_EVENTS: usize = 5000;
const FANOUT_APPENDERS: usize = 16;
/// Messages timed by `delivery`.
const DELIVERIES: usize = 1000;

/// Default length of the timed scenarios (append, http-send).
const DEFAULT_SECONDS: f64 = 10.0;
/// Concurrent producers in `append`.
const APPEND_PRODUCERS: usize = 64;
/// Events in the `rebuild` log, and events per transaction while building it.
const REBUILD_EVENTS: u64 = 1_000_000;
const REBUILD_BATCH: u64 = 10_000;
/// Agents registered at the start of the `rebuild` log.
const REBUILD_AGENTS: usize = 8;
/// Timed `synapse send` processes in `cli-send` (after a few untimed warm-up runs).
const CLI_SENDS: usize = 200;
const CLI_WARMUP: usize = 3;
/// Concurrent keep-alive connections in `http-send`.
const HTTP_CONNECTIONS: usize = 32;
/// Timed round trips in `round-trip` (after a few untimed warm-up ones).
const ROUND_TRIPS: usize = 1000;
const ROUND_TRIP_WARMUP: usize = 10;
/// How long to wait for a broker child to answer, or to stop.
const BROKER_TIMEOUT: Duration = Duration::from_secs(15);

const USAGE: &str = "usage: synapse-bench <scenario>... [--seconds N] [--synapse PATH]
scenarios: append, rebuild, memory, cli-send, http-send, round-trip, delivery, sse-fanout,
           history-search, lock-contention, storage, all; real-clis (needs tools/install-clis; not in all)
  --seconds N      length of the timed scenarios (append, http-send, lock-contention); default 10,
                   or SYNAPSE_BENCH_SECONDS
  --synapse PATH   the synapse binary (default: next to synapse-bench), or SYNAPSE_BENCH_BIN
  SYNAPSE_BENCH_APPEND=send|status   what the append producers submit (default send)";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("synapse-bench: {error:#}");
            ExitCode::from(2)
        }
    }
}

struct Options {
    seconds: f64,
    synapse: PathBuf,
}

fn run() -> Result<ExitCode> {
    let (scenarios, options) = parse_args(std::env::args().skip(1).collect())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut failed = Vec::new();
    for scenario in &scenarios {
        println!("== {scenario}");
        let outcome = match scenario.as_str() {
            "append" => runtime.block_on(append(&options)),
            "rebuild" => rebuild(),
            "memory" => runtime.block_on(memory(&options)),
            "cli-send" => runtime.block_on(cli_send(&options)),
            "http-send" => runtime.block_on(http_send(&options)),
            "round-trip" => runtime.block_on(round_trip(&options)),
            "delivery" => runtime.block_on(delivery(&options)),
            "sse-fanout" => runtime.block_on(sse_fanout(&options)),
            "history-search" => history_search(),
            "lock-contention" => runtime.block_on(lock_contention(&options)),
            "real-clis" => real_clis::run(&options.synapse),
            "storage" => runtime.block_on(storage(&options)),
            other => Err(anyhow!("unknown scenario '{other}'")),
        };
        if let Err(error) = outcome {
            eprintln!("scenario {scenario} FAILED: {error:#}");
            failed.push(scenario.clone());
        }
    }
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("failed scenarios: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
}

fn parse_args(args: Vec<String>) -> Result<(Vec<String>, Options)> {
    let mut seconds = match std::env::var("SYNAPSE_BENCH_SECONDS") {
        Ok(text) if !text.trim().is_empty() => parse_seconds(&text)?,
        _ => DEFAULT_SECONDS,
    };
    let mut synapse = std::env::var_os("SYNAPSE_BENCH_BIN").filter(|path| !path.is_empty()).map(PathBuf::from);
    let mut scenarios = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--seconds" => seconds = parse_seconds(&args.next().context("--seconds needs a value")?)?,
            "--synapse" => synapse = Some(PathBuf::from(args.next().context("--synapse needs a path")?)),
            "all" => scenarios.extend(SCENARIOS.iter().map(|name| name.to_string())),
            name if SCENARIOS.contains(&name) || name == "real-clis" => scenarios.push(name.to_string()),
            other => bail!("unknown argument '{other}'\n{USAGE}"),
        }
    }
    if scenarios.is_empty() {
        bail!("no scenario given\n{USAGE}");
    }
    let synapse = match synapse {
        Some(path) => path,
        None => std::env::current_exe().context("cannot find the synapse-bench executable")?.with_file_name("synapse"),
    };
    Ok((scenarios, Options { seconds, synapse }))
}

fn parse_seconds(text: &str) -> Result<f64> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() => Ok(seconds),
        _ => bail!("'{text}' is not a positive number of seconds"),
    }
}

// ---------------------------------------------------------------------------------------------
// Results and statistics

/// Prints one machine-readable result line.
fn result(name: &str, value: f64, decimals: usize, unit: &str) {
    println!("RESULT {name} {value:.decimals$} {unit}");
}

/// Latency samples in milliseconds, sorted.
struct Samples(Vec<f64>);

impl Samples {
    fn new(durations: impl IntoIterator<Item = Duration>) -> Samples {
        let mut millis: Vec<f64> = durations.into_iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        millis.sort_by(f64::total_cmp);
        Samples(millis)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// The middle sample (the mean of the two middle ones for an even count).
    fn median(&self) -> f64 {
        let n = self.0.len();
        match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => self.0[n / 2],
            _ => (self.0[n / 2 - 1] + self.0[n / 2]) / 2.0,
        }
    }

    /// Nearest-rank percentile.
    fn percentile(&self, percent: f64) -> f64 {
        let n = self.0.len();
        if n == 0 {
            return f64::NAN;
        }
        let rank = (percent / 100.0 * n as f64).ceil() as usize;
        self.0[rank.clamp(1, n) - 1]
    }

    fn summary(&self) -> String {
        format!(
            "n={} min {:.3} ms, p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            self.len(),
            self.0.first().copied().unwrap_or(f64::NAN),
            self.median(),
            self.percentile(90.0),
            self.percentile(99.0),
            self.0.last().copied().unwrap_or(f64::NAN),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Temporary directories

/// A fresh directory under the system's temporary directory, removed on drop. Holds `home`
/// (SYNAPSE_HOME) and `uds` (SYNAPSE_UDS_DIR).
struct BenchDir {
    root: PathBuf,
}

impl BenchDir {
    fn new(scenario: &str) -> Result<BenchDir> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.subsec_nanos());
        let root = std::env::temp_dir().join(format!("synapse-bench-{scenario}-{}-{nanos:09}", std::process::id()));
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        builder.create(&root).with_context(|| format!("cannot create {}", root.display()))?;
        let dir = BenchDir { root };
        builder.create(dir.home()).with_context(|| format!("cannot create {}", dir.home().display()))?;
        builder.create(dir.uds()).with_context(|| format!("cannot create {}", dir.uds().display()))?;
        Ok(dir)
    }

    fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    fn uds(&self) -> PathBuf {
        self.root.join("uds")
    }

    fn paths(&self) -> Paths {
        Paths { home: self.home(), uds_dir: self.uds(), broker_port: 0 }
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            eprintln!("warning: cannot remove {}: {error}", self.root.display());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP/1.1 (one keep-alive connection): the instrument of `http-send` and `sse-fanout`,
// which send prepared bytes and read only the status or the stream, so that the client's own
// work weighs as little as possible on the two cores it shares with the broker. Every other
// call goes through `synapse::client::Client`.

struct Http {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Http {
    async fn unix(path: &Path) -> Result<Http> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .with_context(|| format!("cannot connect to {}", path.display()))?;
        Http::handshake(TokioIo::new(stream)).await
    }

    async fn tcp(port: u16) -> Result<Http> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .with_context(|| format!("cannot connect to 127.0.0.1:{port}"))?;
        stream.set_nodelay(true)?;
        Http::handshake(TokioIo::new(stream)).await
    }

    async fn handshake<T>(io: T) -> Result<Http>
    where
        T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let (sender, connection) = hyper::client::conn::http1::handshake(io).await.context("HTTP handshake failed")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Http { sender })
    }

    /// One request; returns the status and the whole body.
    async fn send(&mut self, method: Method, path: &str, body: Option<Bytes>) -> Result<(StatusCode, Bytes)> {
        let mut builder = Request::builder().method(method).uri(path).header(HOST, "localhost");
        if body.is_some() {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        let request = builder.body(Full::new(body.unwrap_or_default()))?;
        self.sender.ready().await.context("the connection closed")?;
        let response = self.sender.send_request(request).await.with_context(|| format!("request {path} failed"))?;
        let status = response.status();
        let bytes =
            response.into_body().collect().await.with_context(|| format!("reading the answer to {path}"))?.to_bytes();
        Ok((status, bytes))
    }
}

// ---------------------------------------------------------------------------------------------
// A broker child process

/// Runs `synapse` with the bench's temporary SYNAPSE_HOME and SYNAPSE_UDS_DIR.
#[derive(Clone)]
struct SynapseEnv {
    synapse: PathBuf,
    home: PathBuf,
    uds: PathBuf,
}

impl SynapseEnv {
    fn new(synapse: &Path, dir: &BenchDir) -> Result<SynapseEnv> {
        if !synapse.is_file() {
            bail!(
                "{} not found: build it with 'cargo build --release --features bench --bin synapse' (or pass --synapse PATH)",
                synapse.display()
            );
        }
        Ok(SynapseEnv { synapse: synapse.to_path_buf(), home: dir.home(), uds: dir.uds() })
    }

    fn command<I, S>(&self, args: I) -> std::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut command = std::process::Command::new(&self.synapse);
        command
            .args(args)
            .env("SYNAPSE_HOME", &self.home)
            .env("SYNAPSE_UDS_DIR", &self.uds)
            .env("SYNAPSE_BROKER_PORT", "0")
            .env_remove("SYNAPSE_AGENT_ID")
            .env_remove("SYNAPSE_AGENT_SECRET")
            .stdin(Stdio::null());
        command
    }

    fn broker_socket(&self) -> PathBuf {
        self.uds.join("broker.sock")
    }
}

/// `synapse broker` in the foreground as a child; killed on drop unless stopped cleanly.
struct BrokerProcess {
    env: SynapseEnv,
    child: Child,
    log: PathBuf,
    stopped: bool,
}

impl BrokerProcess {
    async fn start(env: SynapseEnv, log: PathBuf) -> Result<BrokerProcess> {
        let out = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let child = env
            .command(["broker"])
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {} broker", env.synapse.display()))?;
        let mut broker = BrokerProcess { env, child, log, stopped: false };
        let started = Instant::now();
        broker.wait_ready(started).await?;
        println!("broker pid {} answered after {:.1} ms", broker.pid(), started.elapsed().as_secs_f64() * 1000.0);
        Ok(broker)
    }

    async fn wait_ready(&mut self, started: Instant) -> Result<()> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.stopped = true;
                bail!("the broker exited at start ({status}): {}", self.log_tail());
            }
            if let Ok(mut client) = Client::at_socket(&self.env.broker_socket()).await
                && client.health().await.is_ok()
            {
                return Ok(());
            }
            if started.elapsed() > BROKER_TIMEOUT {
                bail!("the broker did not answer within {} s: {}", BROKER_TIMEOUT.as_secs(), self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn connect(&self) -> Result<Client> {
        let socket = self.env.broker_socket();
        Client::at_socket(&socket).await.with_context(|| format!("cannot connect to {}", socket.display()))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Stops the broker with `synapse broker stop` and waits for the child to exit.
    fn stop(mut self) -> Result<()> {
        let output = self.env.command(["broker", "stop"]).output().context("cannot run 'synapse broker stop'")?;
        if !output.status.success() {
            bail!(
                "'synapse broker stop' failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.stopped = true;
                if !status.success() {
                    bail!("the broker exited with {status}: {}", self.log_tail());
                }
                return Ok(());
            }
            if started.elapsed() > BROKER_TIMEOUT {
                bail!("the broker did not exit within {} s after 'synapse broker stop'", BROKER_TIMEOUT.as_secs());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An agent registered with the broker.
struct Agent {
    id: String,
    port: u16,
    secret: String,
}

/// Registers a `dummy` agent on any free port, owned by this process.
async fn register_agent(broker: &mut Client) -> Result<Agent> {
    let request =
        RegisterBody { agent_type: "dummy".into(), pid: std::process::id(), port: Some(0), ..RegisterBody::default() };
    let registration = broker.register(&request).await?;
    Ok(Agent { id: registration.agent.agent_id, port: registration.agent.port, secret: registration.secret })
}

// ---------------------------------------------------------------------------------------------
// append: group commit through the in-process writer

#[derive(Clone, Copy, PartialEq)]
enum AppendWork {
    /// Fire-and-forget sends from agent A to agent B (3 events each).
    Send,
    /// READY/PROCESSING toggles, each producer on its own agent (1 event each).
    Status,
}

async fn append(options: &Options) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// rebuild: replay a 1M-event log

fn rebuild() -> Result<()> {
    let dir = BenchDir::new("rebuild")?;
    let database = dir.paths().database();
    let store = Store::open(&database)?;
    let building = Instant::now();
    let mut log = LogGenerator::new(REBUILD_EVENTS);
    let time_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64);
    let mut batch = 0;
    while !log.is_done() {
        store.transact(time_ms + batch, |appender| log.fill(appender, REBUILD_BATCH))?;
        batch += 1;
    }
    drop(store);
    let size_mib = std::fs::metadata(&database)?.len() as f64 / f64::from(1 << 20);
    println!(
        "built {} events ({} exchanges, {batch} transactions) in {:.2} s; file {size_mib:.0} MiB",
        REBUILD_EVENTS,
        log.exchanges,
        building.elapsed().as_secs_f64()
    );

    // Reopened, so redb's own cache starts empty (the OS page cache stays warm).
    let store = Store::open(&database)?;
    let count = store.event_count()?;
    if count != REBUILD_EVENTS {
        bail!("the log holds {count} events, expected {REBUILD_EVENTS}");
    }
    let sample = store.read_after(REBUILD_EVENTS / 2, 10_000)?;
    let sample_bytes: usize = sample.iter().map(|envelope| envelope.encode().len()).sum();
    println!(
        "encoded events average {:.0} bytes (10,000 from the middle of the log)",
        sample_bytes as f64 / sample.len().max(1) as f64
    );
    let started = Instant::now();
    let report = store.rebuild()?;
    let seconds = started.elapsed().as_secs_f64();
    if report.events != REBUILD_EVENTS {
        bail!("the rebuild replayed {} events, expected {REBUILD_EVENTS}", report.events);
    }
    drop(store);
    let size_after_mib = std::fs::metadata(&database)?.len() as f64 / f64::from(1 << 20);
    println!(
        "rebuild replayed {} events in {seconds:.3} s ({:.0} events/s; the store reports {:.1} ms); file {size_after_mib:.0} MiB after",
        report.events,
        report.events as f64 / seconds,
        report.elapsed_ms
    );
    result("rebuild_1m_seconds", seconds, 3, "s");
    Ok(())
}

/// Writes a realistic log: agents register, then exchanges follow. In every ten exchanges six
/// are requests with a reply (13 events: send, injection, status changes, reply, reverse ticket
/// and its injection), three are acknowledged fire-and-forget messages (5 events) and one stays
/// in the inbox (3 events).
struct LogGenerator {
    target: u64,
    agents: Vec<String>,
    exchanges: u64,
    written: u64,
}

const REQUEST_TEXT: &str = "Please review the error handling in src/store/mod.rs and tell me whether a full disk \
                            during commit can lose an acknowledged event. Keep the answer short.";
const REPLY_TEXT: &str = "Reviewed: a failed commit answers every caller with an error, nothing acknowledged is lost.";

impl LogGenerator {
    fn new(target: u64) -> LogGenerator {
        LogGenerator { target, agents: Vec::new(), exchanges: 0, written: 0 }
    }

    fn is_done(&self) -> bool {
        self.written >= self.target
    }

    /// Appends up to `limit` events (fewer only at the end of the log).
    fn fill(&mut self, appender: &mut Appender<'_>, limit: u64) -> Result<(), StoreError> {
        let room = limit.min(self.target - self.written);
        let end = appender.next_seq() + room;
        while appender.next_seq() < end {
            let before = appender.next_seq();
            self.append_next(appender, end - before)?;
            self.written += appender.next_seq() - before;
        }
        Ok(())
    }

    fn append_next(&mut self, appender: &mut Appender<'_>, room: u64) -> Result<(), StoreError> {
        let pid = std::process::id();
        if self.agents.len() < REBUILD_AGENTS {
            let port = 8100 + self.agents.len() as u16;
            let agent_id = format!("synapse-claude-{port}");
            let event = Event::AgentRegistered {
                agent_id: agent_id.clone(),
                agent_type: "claude".into(),
                name: Some(format!("worker{}", self.agents.len())),
                role: Some("reviewer".into()),
                pid,
                port,
                working_dir: "/home/user/project".into(),
                secret_hash: hash_secret(&agent_id),
                pid_start: None,
                wrapper: false,
            };
            appender.append(Some(&agent_id), vec![event])?;
            self.agents.push(agent_id);
            return Ok(());
        }
        let k = self.exchanges as usize;
        let n = self.agents.len();
        let sender = self.agents[k % n].clone();
        let receiver = self.agents[(k % n + 1 + (k / n) % (n - 1)) % n].clone();
        let (needed, reply, acked) = match k % 10 {
            0..=5 => (13, true, true),
            6..=8 => (5, false, true),
            _ => (3, false, false),
        };
        if room < needed {
            // Pad the end of a batch with status changes, so the log has exactly `target` events.
            let event =
                Event::AgentStatusChanged { agent_id: receiver.clone(), status: AgentStatus::Ready, note: None };
            appender.append(Some(&receiver), vec![event])?;
            return Ok(());
        }
        self.exchanges += 1;
        self.append_exchange(appender, &sender, &receiver, reply, acked)
    }

    fn append_exchange(
        &self,
        appender: &mut Appender<'_>,
        sender: &str,
        receiver: &str,
        reply: bool,
        acked: bool,
    ) -> Result<(), StoreError> {
        let priority = 3;
        let task_id = uuid::Uuid::new_v4().to_string();
        let sender_task_id = reply.then(|| uuid::Uuid::new_v4().to_string());
        let context_id = uuid::Uuid::new_v4().to_string();
        let text = format!("{REQUEST_TEXT} (#{})", self.exchanges);
        let message = Message::text(Role::User, text.clone());

        let mut send = Vec::with_capacity(4);
        if let Some(sender_task_id) = &sender_task_id {
            send.push(Event::TaskCreated {
                task_id: sender_task_id.clone(),
                owner: Some(sender.into()),
                context_id: context_id.clone(),
                direction: Direction::Outgoing,
                peer: Some(receiver.into()),
                state: TaskState::Working,
                message: message.clone(),
                priority,
                response_expected: true,
                sender_task_id: None,
                in_reply_to: None,
                peer_task_id: Some(task_id.clone()),
                message_in: None,
            });
        }
        send.push(Event::TaskCreated {
            task_id: task_id.clone(),
            owner: Some(receiver.into()),
            context_id,
            direction: Direction::Incoming,
            peer: Some(sender.into()),
            state: TaskState::Submitted,
            message,
            priority,
            response_expected: reply,
            sender_task_id: sender_task_id.clone(),
            in_reply_to: None,
            peer_task_id: None,
            message_in: None,
        });
        send.push(Event::MessageSent {
            task_id: task_id.clone(),
            from: Some(sender.into()),
            to: receiver.into(),
            priority,
            response_expected: reply,
            sender_task_id: sender_task_id.clone(),
            in_reply_to: None,
            text,
            parts: Vec::new(),
            idempotency_key: None,
            by_user: false,
        });
        send.push(Event::TicketIssued {
            agent_id: receiver.into(),
            task_id: task_id.clone(),
            priority,
            from: Some(sender.into()),
            display_task_id: sender_task_id.clone().unwrap_or_else(|| task_id.clone()),
            response_expected: reply,
        });
        let written = appender.append(Some(sender), send)?;
        let ticket = written.last().map_or(0, |envelope| envelope.seq);
        if !acked {
            return Ok(());
        }
        appender.append(
            Some(receiver),
            vec![
                Event::TicketInjected { agent_id: receiver.into(), ticket, priority },
                Event::TaskStateChanged {
                    task_id: task_id.clone(),
                    state: TaskState::Working,
                    artifacts: Vec::new(),
                    error: None,
                    reply_of: None,
                },
            ],
        )?;
        let Some(sender_task_id) = sender_task_id else { return Ok(()) };

        let status = |status| Event::AgentStatusChanged { agent_id: receiver.into(), status, note: None };
        appender.append(Some(receiver), vec![status(AgentStatus::Processing)])?;
        let completed = |task_id: &str| Event::TaskStateChanged {
            task_id: task_id.into(),
            state: TaskState::Completed,
            artifacts: vec![Artifact::text(REPLY_TEXT)],
            error: None,
            reply_of: None,
        };
        let written = appender.append(
            Some(receiver),
            vec![
                Event::ReplyPosted {
                    task_id: task_id.clone(),
                    sender_task_id: Some(sender_task_id.clone()),
                    from: receiver.into(),
                    to: Some(sender.into()),
                    text: REPLY_TEXT.into(),
                    idempotency_key: None,
                },
                completed(&sender_task_id),
                completed(&task_id),
                Event::ReverseTicketIssued {
                    agent_id: sender.into(),
                    task_id: sender_task_id.clone(),
                    from: receiver.into(),
                    priority,
                },
            ],
        )?;
        let reverse_ticket = written.last().map_or(0, |envelope| envelope.seq);
        appender.append(
            Some(sender),
            vec![Event::TicketInjected { agent_id: sender.into(), ticket: reverse_ticket, priority }],
        )?;
        appender.append(Some(receiver), vec![status(AgentStatus::Ready)])?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// memory: resident size of an idle broker

async fn memory(options: &Options) -> Result<()> {
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
    drop(agent);
    broker.stop()?;
    result("broker_idle_rss_mb", rss_kib as f64 / 1024.0, 1, "MB");
    result("wrapper_rss_mb", wrapper_kib as f64 / 1024.0, 1, "MB");
    Ok(())
}

/// A dummy agent started with `synapse start dummy --json`.
/// A background dummy agent, stopped when dropped: a scenario that fails half-way must not
/// leave a wrapper behind (it would start a broker of its own in the removed directory).
struct StartedAgent {
    id: String,
    wrapper_pid: u32,
    log: PathBuf,
    env: SynapseEnv,
}

impl Drop for StartedAgent {
    fn drop(&mut self) {
        let _ = self.env.command(["stop", self.id.as_str()]).output();
    }
}

fn start_dummy(env: &SynapseEnv) -> Result<StartedAgent> {
    let output =
        env.command(["start", "dummy", "--json", "--port", "0"]).output().context("cannot run synapse start")?;
    if !output.status.success() {
        bail!("synapse start failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    let announce: Announce =
        serde_json::from_slice(&output.stdout).context("synapse start --json printed no announce line")?;
    Ok(StartedAgent {
        id: announce.agent_id,
        wrapper_pid: announce.pid,
        log: PathBuf::from(announce.log.context("no log")?),
        env: env.clone(),
    })
}

// ---------------------------------------------------------------------------------------------
// delivery: from the send's answer to the bytes in the target's PTY

/// Reads what was appended to `path` since `offset`.
fn read_from(path: &Path, offset: &mut u64) -> Result<String> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
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

async fn delivery(options: &Options) -> Result<()> {
    let dir = BenchDir::new("delivery")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env.clone(), dir.root.join("broker.log")).await?;
    let agent = start_dummy(&env)?;
    let mut http = broker.connect().await?;
    let mut offset = 0;
    let mut seen = String::new();
    wait_in_log(&agent.log, &mut offset, &mut seen, "> ")?;
    let mut samples = Vec::with_capacity(DELIVERIES);
    for number in 0..DELIVERIES {
        let text = format!("delivery-{number:05}");
        http.send(&SendBody::new(agent.id.clone(), text.clone())).await?;
        let sent = Instant::now();
        // The echo of the written line; then the dummy's answer and its prompt (READY again).
        wait_in_log(&agent.log, &mut offset, &mut seen, &format!("] {text}"))?;
        samples.push(sent.elapsed());
        wait_in_log(&agent.log, &mut offset, &mut seen, "You said: [A2A")?;
        wait_in_log(&agent.log, &mut offset, &mut seen, "> ")?;
    }
    drop(http);
    drop(agent);
    broker.stop()?;
    let samples = Samples::new(samples);
    println!("send answered -> line echoed by the target PTY (dummy, settle 0): {}", samples.summary());
    result("delivery_p50_ms", samples.median(), 3, "ms");
    result("delivery_p99_ms", samples.percentile(99.0), 3, "ms");
    Ok(())
}

fn proc_status_value(pid: u32, field: &str) -> Result<String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field).and_then(|rest| rest.strip_prefix(':')))
        .map(|value| value.trim().to_string())
        .with_context(|| format!("{path} has no {field}"))
}

fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let value = proc_status_value(pid, field)?;
    value.trim_end_matches("kB").trim().parse().with_context(|| format!("cannot read {field} '{value}'"))
}

// ---------------------------------------------------------------------------------------------
// cli-send: one `synapse send` process per message

async fn cli_send(options: &Options) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// http-send: A2A sends over keep-alive TCP connections to an agent's port

async fn http_send(options: &Options) -> Result<()> {
    let dir = BenchDir::new("http-send")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let agent = register_agent(&mut http).await?;

    let body = Bytes::from(serde_json::to_vec(
        &json!({"message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]}}),
    )?);
    let mut connections = Vec::with_capacity(HTTP_CONNECTIONS);
    for _ in 0..HTTP_CONNECTIONS {
        connections.push(Http::tcp(agent.port).await?);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(options.seconds);
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
    let elapsed = started.elapsed().as_secs_f64();
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

// ---------------------------------------------------------------------------------------------
// round-trip: A asks B, B replies, A sees and acknowledges the reply

async fn round_trip(options: &Options) -> Result<()> {
    let dir = BenchDir::new("round-trip")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let a = register_agent(&mut http).await?;
    let b = register_agent(&mut http).await?;
    println!("A = {} (port {}), B = {} (port {})", a.id, a.port, b.id, b.port);

    let mut durations = Vec::with_capacity(ROUND_TRIPS);
    let mut steps: [Vec<Duration>; 4] = Default::default();
    for round in 0..ROUND_TRIP_WARMUP + ROUND_TRIPS {
        let started = Instant::now();
        let step_times =
            one_round_trip(&mut http, &a, &b, round).await.with_context(|| format!("round trip {round}"))?;
        if round >= ROUND_TRIP_WARMUP {
            durations.push(started.elapsed());
            for (samples, time) in steps.iter_mut().zip(step_times) {
                samples.push(time);
            }
        }
    }
    drop(http);
    broker.stop()?;

    let samples = Samples::new(durations);
    println!(
        "send (reply expected) + reply + inbox long-poll + ack, {ROUND_TRIP_WARMUP} warm-up rounds not counted: {}",
        samples.summary()
    );
    let [send, reply, inbox, ack] = steps.map(Samples::new);
    println!(
        "step medians: POST /send {:.3} ms, POST /reply {:.3} ms, GET inbox {:.3} ms, POST ack {:.3} ms",
        send.median(),
        reply.median(),
        inbox.median(),
        ack.median()
    );
    result("round_trip_p50_ms", samples.median(), 3, "ms");
    result("round_trip_p99_ms", samples.percentile(99.0), 3, "ms");
    Ok(())
}

/// One round trip; returns how long each of its four requests took.
async fn one_round_trip(http: &mut Client, a: &Agent, b: &Agent, round: usize) -> Result<[Duration; 4]> {
    let mut step = Instant::now();
    let mut lap = || {
        let now = Instant::now();
        let elapsed = now - step;
        step = now;
        elapsed
    };
    let request = SendBody {
        from: Some(a.id.clone()),
        secret: Some(a.secret.clone()),
        response_expected: true,
        ..SendBody::new(b.id.clone(), format!("round trip {round}: what is the status of your task?"))
    };
    let sent = http.send(&request).await?;
    let sender_task = sent.sender_task.context("the send answer has no sender_task")?.id;
    let sent_time = lap();
    http.reply(&reply_body(b, format!("answer {round}: done"))).await?;
    let reply_time = lap();

    let waiting = Instant::now();
    let ticket = loop {
        let inbox = http.inbox(&a.id, 5000, None).await?;
        let found = inbox
            .tickets
            .iter()
            .find(|ticket| ticket.kind == api::TicketKind::Reply && ticket.task_id == sender_task)
            .map(|ticket| ticket.ticket);
        if let Some(ticket) = found {
            break ticket;
        }
        if waiting.elapsed() > Duration::from_secs(10) {
            bail!("the reply ticket for task {sender_task} did not reach {}'s inbox within 10 s: {inbox:?}", a.id);
        }
    };
    let inbox_time = lap();
    ack_as(http, a, ticket).await?;
    Ok([sent_time, reply_time, inbox_time, lap()])
}

/// `agent`'s reply to the sender waiting for it.
fn reply_body(agent: &Agent, text: String) -> api::ReplyRequest {
    api::ReplyRequest { from: agent.id.clone(), secret: Some(agent.secret.clone()), to: None, text }
}

/// Acknowledges `ticket` as `agent` (its secret for this request only).
async fn ack_as(http: &mut Client, agent: &Agent, ticket: u64) -> Result<()> {
    http.set_secret(agent.secret.clone());
    let acked = http.ack(&agent.id, ticket).await;
    http.clear_secret();
    acked?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// storage: how much the log grows per byte of message text

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

async fn storage(options: &Options) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// sse-fanout: many subscribers on /events while events are appended

fn unix_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

/// One subscriber: reads `/events` from `after` until it has `wanted` events; returns each
/// event's lag (receive time minus the event's time, in ms).
async fn subscriber(socket: PathBuf, after: u64, wanted: usize, ready: Arc<tokio::sync::Barrier>) -> Result<Vec<f64>> {
    let mut http = Http::unix(&socket).await?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("/events?after={after}&follow=true"))
        .header(HOST, "localhost")
        .body(Full::new(Bytes::new()))?;
    http.sender.ready().await?;
    let response = http.sender.send_request(request).await?;
    ready.wait().await;
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    let mut lags = Vec::with_capacity(wanted);
    while lags.len() < wanted {
        let Some(frame) = body.frame().await else { bail!("the stream ended after {} events", lags.len()) };
        let frame = frame?;
        let Some(data) = frame.data_ref() else { continue };
        buffer.extend_from_slice(data);
        while let Some(end) = buffer.windows(2).position(|pair| pair == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            // Only the time is needed: find it without parsing the whole event (the client
            // shares the machine's two cores with the broker it measures).
            if let Some(json) = text.lines().find_map(|line| line.strip_prefix("data:")) {
                let at = json.find("\"time_ms\":").context("an event without time_ms")? + "\"time_ms\":".len();
                let digits: String = json[at..].chars().take_while(char::is_ascii_digit).collect();
                let time_ms: f64 = digits.parse().context("a bad time_ms")?;
                lags.push((unix_ms() - time_ms).max(0.0));
            }
        }
    }
    Ok(lags)
}

async fn sse_fanout(options: &Options) -> Result<()> {
    let dir = BenchDir::new("sse-fanout")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env.clone(), dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let mut agents = Vec::new();
    for _ in 0..FANOUT_APPENDERS {
        agents.push(register_agent(&mut http).await?);
    }
    let head = http.health().await?.head;
    let ready = Arc::new(tokio::sync::Barrier::new(FANOUT_SUBSCRIBERS + 1));
    let socket = env.broker_socket();
    let subscribers: Vec<_> = (0..FANOUT_SUBSCRIBERS)
        .map(|_| tokio::spawn(subscriber(socket.clone(), head, FANOUT_EVENTS, ready.clone())))
        .collect();
    ready.wait().await;
    println!(
        "{FANOUT_SUBSCRIBERS} subscribers connected; appending {FANOUT_EVENTS} events from {FANOUT_APPENDERS} appenders"
    );
    let started = Instant::now();
    let per_appender = FANOUT_EVENTS / FANOUT_APPENDERS;
    let appenders: Vec<_> = agents
        .into_iter()
        .enumerate()
        .map(|(index, agent)| {
            let socket = socket.clone();
            let count = per_appender + usize::from(index < FANOUT_EVENTS % FANOUT_APPENDERS);
            tokio::spawn(async move {
                let mut http = Client::at_socket(&socket).await?;
                http.set_secret(agent.secret.clone());
                for round in 0..count {
                    let status = if round % 2 == 0 { AgentStatus::Ready } else { AgentStatus::Processing };
                    http.set_status(&agent.id, &StatusUpdate { status, note: None }).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for appender in appenders {
        appender.await??;
    }
    let appended = started.elapsed();
    let mut lags = Vec::with_capacity(FANOUT_SUBSCRIBERS * FANOUT_EVENTS);
    for subscriber in subscribers {
        lags.extend(subscriber.await??);
    }
    let all = started.elapsed();
    drop(http);
    broker.stop()?;
    let delivered = lags.len();
    lags.sort_by(f64::total_cmp);
    let samples = Samples(lags);
    println!(
        "{FANOUT_EVENTS} events appended in {:.2} s; all {delivered} deliveries done after {:.2} s; lag: {}",
        appended.as_secs_f64(),
        all.as_secs_f64(),
        samples.summary()
    );
    result("sse_fanout_p99_ms", samples.percentile(99.0), 3, "ms");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// history-search: two keywords over 1,000,000 history records

/// Messages written (each gives a sent and a received record).
const HISTORY_MESSAGES: u64 = 500_000;
const HISTORY_BATCH: u64 = 10_000;
/// Distinct words the generated texts draw from, and words per text.
const HISTORY_VOCABULARY: u64 = 20_000;
const HISTORY_WORDS_PER_TEXT: u64 = 8;
/// Timed searches (alternating OR and AND).
const HISTORY_SEARCHES: usize = 20;

/// A deterministic pseudo-random sequence (splitmix64), so that runs compare.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn history_word(index: u64) -> String {
    format!("w{index}x")
}

fn history_search() -> Result<()> {
    use synapse::store::history::Logic;
    let dir = BenchDir::new("history-search")?;
    let database = dir.paths().database();
    let store = Store::open(&database)?;
    let building = Instant::now();
    let mut random = 42u64;
    let time_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64);
    let mut written = 0u64;
    let mut batch = 0u64;
    while written < HISTORY_MESSAGES {
        let count = HISTORY_BATCH.min(HISTORY_MESSAGES - written);
        let events: Vec<Event> = (0..count)
            .map(|offset| {
                let n = written + offset;
                let mut words: Vec<String> = (0..HISTORY_WORDS_PER_TEXT)
                    .map(|_| history_word(splitmix(&mut random) % HISTORY_VOCABULARY))
                    .collect();
                // One common word per text, in a tenth of all records each.
                words.push(format!("topic{}", n % 10));
                let text = words.join(" ");
                // A message that expected no reply: its receiver's task gives both history
                // records (sent and received).
                Event::TaskCreated {
                    task_id: format!("task-{n:07}"),
                    owner: Some(format!("agent-{}", (n + 1) % 8)),
                    context_id: "bench".into(),
                    direction: Direction::Incoming,
                    peer: Some(format!("agent-{}", n % 8)),
                    state: TaskState::Submitted,
                    message: Message::text(Role::User, text),
                    priority: 3,
                    response_expected: false,
                    sender_task_id: None,
                    in_reply_to: None,
                    peer_task_id: None,
                    message_in: None,
                }
            })
            .collect();
        store.transact(time_ms + batch, |appender| appender.append(Some("bench"), events))?;
        written += count;
        batch += 1;
    }
    println!(
        "built {} history records ({HISTORY_MESSAGES} messages, {HISTORY_WORDS_PER_TEXT} of {HISTORY_VOCABULARY} words each) in {:.2} s",
        2 * HISTORY_MESSAGES,
        building.elapsed().as_secs_f64()
    );
    let last = store.read(|view| view.history_of_task(&format!("task-{:07}", HISTORY_MESSAGES - 1)))?;
    if last.len() != 2 {
        bail!("the last message has {} history records, expected 2 (sent and received)", last.len());
    }
    // The broker's indexer does this in the background, in steps, after writes settle.
    let indexing = Instant::now();
    let progress = store.index_history()?;
    let indexing = indexing.elapsed().as_secs_f64();
    println!("indexed {} events in {indexing:.2} s ({} segments)", progress.indexed_through, progress.segments);
    result("history_index_events_per_s", progress.indexed_through as f64 / indexing, 0, "events/s");

    let mut durations = Vec::with_capacity(HISTORY_SEARCHES);
    let mut found_total = 0usize;
    for search in 0..HISTORY_SEARCHES {
        let keywords = vec![
            history_word(splitmix(&mut random) % HISTORY_VOCABULARY),
            history_word(splitmix(&mut random) % HISTORY_VOCABULARY),
        ];
        let logic = if search % 2 == 0 { Logic::Or } else { Logic::And };
        let started = Instant::now();
        let found = store.search_history(&keywords, logic, false, None, 50)?;
        durations.push(started.elapsed());
        found_total += found.len();
        if search < 2 {
            // The index only narrows what is read: it must answer what the full scan answers.
            let scanned = store.read(|view| view.search_history(&keywords, logic, false, None, 50))?;
            if scanned != found {
                bail!("the indexed search for {keywords:?} differs from the scan");
            }
        }
    }
    let samples = Samples::new(durations);
    println!(
        "{HISTORY_SEARCHES} searches (two keywords, OR and AND, limit 50), {found_total} records found: {}",
        samples.summary()
    );
    result("history_search_p50_ms", samples.median(), 3, "ms");

    // Not a target: common words match a tenth of the records each.
    let mut durations = Vec::new();
    for search in 0..4u64 {
        let keywords = vec![format!("topic{search}"), format!("topic{}", (search + 1) % 10)];
        let logic = if search % 2 == 0 { Logic::Or } else { Logic::And };
        let started = Instant::now();
        store.search_history(&keywords, logic, false, None, 50)?;
        durations.push(started.elapsed());
    }
    println!("4 searches for two common words (each in 100,000 records): {}", Samples::new(durations).summary());

    // Not a target: `history list` (the newest 50 records) walks the index by last update.
    let mut durations = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        let listed = store.recent_history(None, 50)?;
        durations.push(started.elapsed());
        if listed.len() != 50 {
            bail!("history list gave {} records, expected 50", listed.len());
        }
    }
    println!("4 lists of the newest 50 records: {}", Samples::new(durations).summary());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// lock-contention: agents contending for files through the writer

const LOCK_AGENTS: usize = 16;
const LOCK_FILES: usize = 100;

async fn lock_contention(options: &Options) -> Result<()> {
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
