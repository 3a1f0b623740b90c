//! What the scenarios share: result lines and statistics, temporary directories, raw HTTP/1.1,
//! a broker child process, agents registered or started for a scenario, and the helpers more
//! than one scenario uses.

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use synapse::api::{self, Announce, RegisterRequest as RegisterBody};
use synapse::client::Client;
use synapse::config::Paths;

/// How long to wait for a broker child to answer, or to stop.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// Results and statistics

/// Every result of this run, by name, for the ratios to the floors (issue 16).
static RESULTS: std::sync::Mutex<Vec<(String, f64)>> = std::sync::Mutex::new(Vec::new());

/// Prints one machine-readable result line (and keeps it for [`ratios`]).
pub fn result(name: &str, value: f64, decimals: usize, unit: &str) {
    println!("RESULT {name} {value:.decimals$} {unit}");
    if let Ok(mut results) = RESULTS.lock() {
        results.push((name.to_string(), value));
    }
}

/// The latest value of a result of this run.
fn value_of(name: &str) -> Option<f64> {
    RESULTS.lock().ok()?.iter().rev().find(|(kept, _)| kept == name).map(|(_, value)| *value)
}

/// Issue 16's targets as ratios to the floors measured in the same run, one `RATIO` line each
/// for which both figures exist: `RATIO <name> <value> (target <comparison>)`.
pub fn ratios() {
    let ratio = |name: &str, top: &str, bottom: &str, target: &str| {
        if let (Some(top), Some(bottom)) = (value_of(top), value_of(bottom))
            && bottom > 0.0
        {
            println!("RATIO {name} {:.2} (target {target})", top / bottom);
        }
    };
    ratio("append_to_redb_floor", "append_events_per_s", "floor_redb_events_per_s", ">= 0.6");
    ratio("http_sends_to_http_floor", "http_sends_per_s", "floor_http_per_s", ">= 0.5");
    ratio("rebuild_to_scan_floor", "rebuild_1m_seconds", "floor_scan_1m_seconds", "<= 3");
    ratio("sse_p99_to_sse_floor", "sse_fanout_p99_ms", "floor_sse_p99_ms", "<= 2");
    ratio("lock_decisions_to_redb_floor", "lock_decisions_per_s", "floor_redb_events_per_s", ">= 0.6");
    ratio("round_trip_to_cli_send", "round_trip_p50_ms", "cli_send_median_ms", "<= 0.5");
    if let (Some(send), Some(spawn)) = (value_of("cli_send_median_ms"), value_of("floor_spawn_ms")) {
        println!("RATIO cli_send_over_spawn_floor_ms {:.2} (target <= 1.0)", send - spawn);
        // Not a target: the same over the floor for a client whose own code costs nothing.
        if let Some(raw) = value_of("cli_send_raw_median_ms") {
            println!(
                "RATIO cli_send_raw_over_spawn_floor_ms {:.2} (the target's 1.0, for no client code)",
                raw - spawn
            );
        }
    }
}

/// Latency samples in milliseconds, sorted.
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn new(durations: impl IntoIterator<Item = Duration>) -> Samples {
        let mut millis: Vec<f64> = durations.into_iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        millis.sort_by(f64::total_cmp);
        Samples(millis)
    }

    /// Samples already in milliseconds.
    pub fn from_millis(mut millis: Vec<f64>) -> Samples {
        millis.sort_by(f64::total_cmp);
        Samples(millis)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The middle sample (the mean of the two middle ones for an even count).
    pub fn median(&self) -> f64 {
        let n = self.0.len();
        match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => self.0[n / 2],
            _ => (self.0[n / 2 - 1] + self.0[n / 2]) / 2.0,
        }
    }

    /// Nearest-rank percentile.
    pub fn percentile(&self, percent: f64) -> f64 {
        let n = self.0.len();
        if n == 0 {
            return f64::NAN;
        }
        let rank = (percent / 100.0 * n as f64).ceil() as usize;
        self.0[rank.clamp(1, n) - 1]
    }

    pub fn summary(&self) -> String {
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
pub struct BenchDir {
    pub root: PathBuf,
}

impl BenchDir {
    pub fn new(scenario: &str) -> Result<BenchDir> {
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

    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    pub fn uds(&self) -> PathBuf {
        self.root.join("uds")
    }

    pub fn paths(&self) -> Paths {
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

pub struct Http {
    pub sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Http {
    pub async fn unix(path: &Path) -> Result<Http> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .with_context(|| format!("cannot connect to {}", path.display()))?;
        Http::handshake(TokioIo::new(stream)).await
    }

    pub async fn tcp(port: u16) -> Result<Http> {
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
    pub async fn send(&mut self, method: Method, path: &str, body: Option<Bytes>) -> Result<(StatusCode, Bytes)> {
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
pub struct SynapseEnv {
    pub synapse: PathBuf,
    pub home: PathBuf,
    pub uds: PathBuf,
}

impl SynapseEnv {
    pub fn new(synapse: &Path, dir: &BenchDir) -> Result<SynapseEnv> {
        if !synapse.is_file() {
            bail!(
                "{} not found: build it with 'cargo build --release --features bench --bin synapse' (or pass --synapse PATH)",
                synapse.display()
            );
        }
        Ok(SynapseEnv { synapse: synapse.to_path_buf(), home: dir.home(), uds: dir.uds() })
    }

    pub fn command<I, S>(&self, args: I) -> std::process::Command
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
            // sse-fanout holds 1,000 subscribers: above the default connection limit (512).
            .env("SYNAPSE_HTTP_MAX_CONNECTIONS", "4096")
            .env_remove("SYNAPSE_AGENT_ID")
            .env_remove("SYNAPSE_AGENT_SECRET")
            .stdin(Stdio::null());
        command
    }

    pub fn broker_socket(&self) -> PathBuf {
        self.uds.join("broker.sock")
    }
}

/// `synapse broker` in the foreground as a child; killed on drop unless stopped cleanly.
pub struct BrokerProcess {
    pub env: SynapseEnv,
    child: Child,
    log: PathBuf,
    stopped: bool,
}

impl BrokerProcess {
    pub async fn start(env: SynapseEnv, log: PathBuf) -> Result<BrokerProcess> {
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn connect(&self) -> Result<Client> {
        let socket = self.env.broker_socket();
        Client::at_socket(&socket).await.with_context(|| format!("cannot connect to {}", socket.display()))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Stops the broker with SIGTERM (a clean stop, as `synapse broker stop` asks) and waits for
    /// the child to exit. Not `synapse broker stop`: scenarios register this process as an
    /// agent, and a command run below an agent is not the user, who alone may stop the broker.
    pub fn stop(mut self) -> Result<()> {
        let pid = i32::try_from(self.child.id()).context("broker pid")?;
        synapse::process::signal(pid, libc::SIGTERM);
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
pub struct Agent {
    pub id: String,
    pub port: u16,
    pub secret: String,
}

/// Registers a `dummy` agent on any free port, owned by this process.
pub async fn register_agent(broker: &mut Client) -> Result<Agent> {
    let request =
        RegisterBody { agent_type: "dummy".into(), pid: std::process::id(), port: Some(0), ..RegisterBody::default() };
    let registration = broker.register(&request).await?;
    Ok(Agent { id: registration.agent.agent_id, port: registration.agent.port, secret: registration.secret })
}

/// A dummy agent started with `synapse start dummy --json`.
/// A background dummy agent, stopped when dropped: a scenario that fails half-way must not
/// leave a wrapper behind (it would start a broker of its own in the removed directory).
pub struct StartedAgent {
    pub id: String,
    pub wrapper_pid: u32,
    pub log: PathBuf,
    pub env: SynapseEnv,
}

impl Drop for StartedAgent {
    fn drop(&mut self) {
        let _ = self.env.command(["stop", self.id.as_str()]).output();
    }
}

pub fn start_dummy(env: &SynapseEnv) -> Result<StartedAgent> {
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

pub fn proc_status_value(pid: u32, field: &str) -> Result<String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field).and_then(|rest| rest.strip_prefix(':')))
        .map(|value| value.trim().to_string())
        .with_context(|| format!("{path} has no {field}"))
}

pub fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let value = proc_status_value(pid, field)?;
    value.trim_end_matches("kB").trim().parse().with_context(|| format!("cannot read {field} '{value}'"))
}

/// `agent`'s reply to the sender waiting for it.
pub fn reply_body(agent: &Agent, text: String) -> api::ReplyRequest {
    api::ReplyRequest {
        from: agent.id.clone(),
        secret: Some(agent.secret.clone()),
        to: None,
        text,
        idempotency_key: None,
    }
}

/// Acknowledges `ticket` as `agent` (its secret for this request only).
pub async fn ack_as(http: &mut Client, agent: &Agent, ticket: u64) -> Result<()> {
    http.set_secret(agent.secret.clone());
    let acked = http.ack(&agent.id, ticket, Some(synapse::event::Delivery::Typed)).await;
    http.clear_secret();
    acked?;
    Ok(())
}

pub fn history_word(index: u64) -> String {
    format!("w{index}x")
}

/// What every scenario is given: the length of the timed ones and the synapse binary.
pub struct Options {
    pub seconds: f64,
    pub synapse: PathBuf,
}

/// A deterministic pseudo-random sequence (splitmix64), so that runs compare.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
