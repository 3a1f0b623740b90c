//! `real-clis`: the five real CLIs (tools/install-clis) against the scripted model.
//!
//! Per installed CLI, each the median of [`STARTS`] starts:
//! - `bare_prompt_ms_<cli>`: the CLI alone in a PTY, from spawn until its ready text is drawn;
//! - `start_ready_ms_<cli>`: `synapse <cli>` in a PTY (broker already running), from spawn until
//!   the agent is READY in the log (what a sender waits for).
//!
//! Then `real_delivery_p50_ms`: [`DELIVERIES`] messages to one Claude agent, each from just before
//! `synapse send` until the scripted model has received it (its request log), the agent READY
//! again before the next.
//!
//! `busy-delivery` (its own scenario): per installed CLI, [`BUSY_SAMPLES`] messages sent while the
//! model is in a long tool run (`sleep` [`TOOL_RUN_SECONDS`] s through its shell tool), each from
//! just before `synapse send` until the text is in a request the scripted model received:
//! `busy_delivery_ms_<cli>_pty` typed at the prompt once the turn is over (the profile's `hooks`
//! off), `busy_delivery_ms_<cli>_hook` handed over by the CLI's hook at the end of the tool run,
//! for the CLIs whose profile has hooks (Gemini only where root owns the bench's directory).

use crate::common::{BenchDir, Samples};
use anyhow::{Context, Result, anyhow, bail};
use portable_pty::{CommandBuilder, PtySize, native_pty_system};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use synapse::scripted_model::clis::{self, CLI_NAMES};

const STARTS: usize = 3;
const BUSY_SAMPLES: usize = 5;
const TOOL_RUN_SECONDS: u64 = 3;
const DELIVERIES: usize = 20;
/// Longest a CLI may take to start or to take a message.
const DEADLINE: Duration = Duration::from_secs(120);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(0))
}

/// A running `synapse scripted-model` with its request log; killed when dropped.
struct Model {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Model {
    fn start(synapse: &Path, dir: &Path) -> Result<Model> {
        let log = dir.join("model.jsonl");
        let mut child = Command::new(synapse)
            .args(["scripted-model", "--port", "0", "--log"])
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start synapse scripted-model")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let announce: Value = serde_json::from_str(&line).context("the model's port line")?;
        let port = announce["port"].as_u64().and_then(|port| u16::try_from(port).ok()).context("no port")?;
        Ok(Model { child, port, log })
    }

    /// When (wall clock, ms) a request whose user text contains `needle` arrived, if one did.
    fn arrival(&self, needle: &str) -> Option<u64> {
        let text = std::fs::read_to_string(&self.log).ok()?;
        text.lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()).find_map(|request| {
            let matches = request["internal"] == false
                && request["last_user_text"].as_str().is_some_and(|text| text.contains(needle));
            if matches { request["time_ms"].as_u64() } else { None }
        })
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A program in a PTY of ours, its screen parsed; killed when dropped.
struct Terminal {
    child: Box<dyn portable_pty::Child + Send + Sync>,
    screen: Arc<Mutex<vt100::Parser>>,
    _master: Box<dyn portable_pty::MasterPty + Send>,
}

impl Terminal {
    fn spawn(command: CommandBuilder) -> Result<Terminal> {
        let pty = native_pty_system()
            .openpty(PtySize { rows: 40, cols: 120, pixel_width: 0, pixel_height: 0 })
            .map_err(|error| anyhow!("openpty: {error}"))?;
        let child = pty.slave.spawn_command(command).map_err(|error| anyhow!("spawn: {error}"))?;
        drop(pty.slave);
        let mut reader = pty.master.try_clone_reader().map_err(|error| anyhow!("reader: {error}"))?;
        let screen = Arc::new(Mutex::new(vt100::Parser::new(40, 120, 0)));
        let feed = screen.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 8192];
            while let Ok(count) = reader.read(&mut buffer) {
                if count == 0 {
                    break;
                }
                if let Ok(mut parser) = feed.lock() {
                    parser.process(&buffer[..count]);
                }
            }
        });
        Ok(Terminal { child, screen, _master: pty.master })
    }

    fn shows(&self, text: &str) -> bool {
        self.screen.lock().is_ok_and(|parser| parser.screen().contents().contains(text))
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `synapse events --follow --json` in `home`, lines on a channel; killed when dropped.
struct Events {
    child: Child,
    lines: Receiver<Value>,
}

impl Events {
    fn follow(synapse: &Path, env: &[(String, String)]) -> Result<Events> {
        let mut command = Command::new(synapse);
        command.args(["events", "--follow", "--json"]).stdin(Stdio::null()).stdout(Stdio::piped());
        command.envs(env.iter().map(|(key, value)| (key, value)));
        let mut child = command.spawn().context("cannot follow the events")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(event) = serde_json::from_str::<Value>(&line) else { continue };
                if sender.send(event).is_err() {
                    break;
                }
            }
        });
        Ok(Events { child, lines })
    }

    /// Waits for the next event that satisfies `wanted`; returns its time_ms.
    fn wait(&self, what: &str, wanted: impl Fn(&Value) -> bool) -> Result<u64> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(event) if wanted(&event) => return event["time_ms"].as_u64().context("an event without time_ms"),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => bail!("timed out waiting for {what}"),
                Err(RecvTimeoutError::Disconnected) => bail!("the event stream ended while waiting for {what}"),
            }
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_ready(event: &Value, agent: Option<&str>) -> bool {
    event["event"]["kind"] == "agent_status_changed"
        && event["event"]["data"]["status"] == "READY"
        && agent.is_none_or(|agent| event["event"]["data"]["agent_id"] == agent)
}

/// PATH for a CLI: the synapse under test, the installed CLIs, the system's.
fn search_path(synapse: &Path) -> String {
    let synapse_dir = synapse.parent().map(|dir| dir.display().to_string()).unwrap_or_default();
    let clis_bin = clis::clis_dir().join("node_modules/.bin").display().to_string();
    format!("{synapse_dir}:{clis_bin}:{}", std::env::var("PATH").unwrap_or_default())
}

/// One measurement place: a Synapse home and sockets, the CLI's HOME and work dir; its broker is
/// stopped when dropped.
struct Place {
    dir: BenchDir,
    synapse: PathBuf,
}

impl Place {
    fn new(synapse: &Path) -> Result<Place> {
        Ok(Place { dir: BenchDir::new("real-clis")?, synapse: synapse.to_path_buf() })
    }

    fn root(&self) -> &Path {
        &self.dir.root
    }

    fn synapse_env(&self) -> Vec<(String, String)> {
        vec![
            ("SYNAPSE_HOME".into(), self.dir.home().display().to_string()),
            ("SYNAPSE_UDS_DIR".into(), self.dir.uds().display().to_string()),
            ("SYNAPSE_BROKER_PORT".into(), "0".into()),
        ]
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let env = self.synapse_env();
        let _ = Command::new(&self.synapse).args(["broker", "stop"]).envs(env).stdin(Stdio::null()).output();
    }
}

/// A CLI command with the set-up's environment, in its work dir.
fn cli_command(program: &str, args: &[String], setup: &clis::CliSetup, work: &Path, path: &str) -> CommandBuilder {
    let mut command = CommandBuilder::new(program);
    command.args(args);
    command.cwd(work);
    command.env("PATH", path);
    command.env("TERM", "xterm-256color");
    command.env_remove("SYNAPSE_AGENT_ID");
    command.env_remove("SYNAPSE_AGENT_SECRET");
    for (key, value) in &setup.env {
        command.env(key, value);
    }
    command
}

fn bare_prompt(synapse: &Path, cli: &str, model: &Model) -> Result<Duration> {
    let place = Place::new(synapse)?;
    let work = place.root().join("work");
    let setup = clis::setup(cli, &place.root().join("cli-home"), &work, model.port)?;
    // The same command Synapse runs: the profile's arguments (Codex: --no-daemon), then the set-up's.
    let profile = synapse::agent::profile::builtin(cli).map(|profile| profile.args).unwrap_or_default();
    let args: Vec<String> = profile.into_iter().chain(setup.args.iter().cloned()).collect();
    let started = Instant::now();
    let terminal = Terminal::spawn(cli_command(cli, &args, &setup, &work, &search_path(synapse)))?;
    while !terminal.shows(setup.ready_text) {
        if started.elapsed() > DEADLINE {
            bail!("{cli} never drew {:?}", setup.ready_text);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(started.elapsed())
}

/// Starts `synapse <cli> --name <name>` in `place`; returns its terminal and the spawn time (ms).
fn start_agent(synapse: &Path, cli: &str, place: &Place, model: &Model) -> Result<(Terminal, u64)> {
    let work = place.root().join("work");
    let setup = clis::setup(cli, &place.root().join("cli-home"), &work, model.port)?;
    let mut args = vec![cli.to_string(), "--name".into(), "bench".into()];
    if !setup.args.is_empty() {
        args.push("--".into());
        args.extend(setup.args.iter().cloned());
    }
    let mut command = cli_command(&synapse.display().to_string(), &args, &setup, &work, &search_path(synapse));
    for (key, value) in place.synapse_env() {
        command.env(key, value);
    }
    let spawned = now_ms();
    Ok((Terminal::spawn(command)?, spawned))
}

/// A new place with its broker running (as it is for every agent but the first) and its events
/// followed.
fn place_with_broker(synapse: &Path) -> Result<(Place, Events)> {
    let place = Place::new(synapse)?;
    let env = place.synapse_env();
    let status =
        Command::new(synapse).arg("list").envs(env.clone()).stdin(Stdio::null()).stdout(Stdio::null()).status()?;
    if !status.success() {
        bail!("synapse list failed");
    }
    let events = Events::follow(synapse, &env)?;
    Ok((place, events))
}

fn start_ready(synapse: &Path, cli: &str, model: &Model) -> Result<Duration> {
    let (place, events) = place_with_broker(synapse)?;
    let (_terminal, spawned) = start_agent(synapse, cli, &place, model)?;
    let ready = events.wait(&format!("{cli} READY"), |event| is_ready(event, None))?;
    Ok(Duration::from_millis(ready.saturating_sub(spawned)))
}

fn delivery(synapse: &Path, model: &Model) -> Result<Samples> {
    let (place, events) = place_with_broker(synapse)?;
    let env = place.synapse_env();
    let (_terminal, _) = start_agent(synapse, "claude", &place, model)?;
    events.wait("claude READY", |event| is_ready(event, None))?;
    let mut samples = Vec::new();
    for index in 0..DELIVERIES {
        let marker = format!("delivery-marker-{index:03}");
        let sent = now_ms();
        let output = Command::new(synapse)
            .args(["send", "bench", &marker, "--no-response"])
            .envs(env.clone())
            .stdin(Stdio::null())
            .output()?;
        if !output.status.success() {
            bail!("send failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        let deadline = Instant::now() + DEADLINE;
        let arrived = loop {
            if let Some(at) = model.arrival(&marker) {
                break at;
            }
            if Instant::now() > deadline {
                bail!("{marker} never reached the model");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        samples.push(Duration::from_millis(arrived.saturating_sub(sent)));
        // The answer is drawn and the agent READY again before the next message.
        events.wait("READY after the answer", |event| is_ready(event, None))?;
    }
    Ok(Samples::new(samples))
}

impl Model {
    /// When (wall clock, ms) the first request holding `needle` anywhere (a hook's context
    /// arrives inside a tool result, not as the user's turn) arrived, if one did.
    fn arrival_anywhere(&self, needle: &str) -> Option<u64> {
        let text = std::fs::read_to_string(&self.log).ok()?;
        text.lines()
            .filter(|line| line.contains(needle))
            .find_map(|line| serde_json::from_str::<Value>(line).ok().and_then(|request| request["time_ms"].as_u64()))
    }

    /// Tool calls the model answered with so far.
    fn tool_calls(&self) -> usize {
        std::fs::read_to_string(&self.log).map_or(0, |text| {
            text.lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .filter(|request| request["tool"].is_string())
                .count()
        })
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Messages sent to a `cli` agent in the middle of a tool run; `hooks` chooses the path.
fn busy_delivery(synapse: &Path, cli: &str, model: &Model, hooks: bool) -> Result<Samples> {
    let (place, events) = place_with_broker(synapse)?;
    let env = place.synapse_env();
    let profiles = place.dir.home().join("profiles");
    std::fs::create_dir_all(&profiles)?;
    std::fs::write(profiles.join(format!("{cli}.json")), format!("{{\"hooks\": {hooks}}}"))?;
    let (_terminal, _) = start_agent(synapse, cli, &place, model)?;
    events.wait(&format!("{cli} READY"), |event| is_ready(event, None))?;
    let send = |text: &str| -> Result<()> {
        let output = Command::new(synapse)
            .args(["send", "bench", text, "--no-response"])
            .envs(env.clone())
            .stdin(Stdio::null())
            .output()?;
        if !output.status.success() {
            bail!("send failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(())
    };
    let mut samples = Vec::new();
    for index in 0..BUSY_SAMPLES {
        let calls = model.tool_calls();
        send(&format!("please run: sleep {TOOL_RUN_SECONDS}"))?;
        wait_until("the tool run", || model.tool_calls() > calls)?;
        let marker = format!("busy-marker-{cli}-{}-{index:03}", if hooks { "hook" } else { "pty" });
        let sent = now_ms();
        send(&marker)?;
        let mut arrived = None;
        wait_until(&format!("{marker} at the model"), || {
            arrived = model.arrival_anywhere(&marker);
            arrived.is_some()
        })?;
        samples.push(Duration::from_millis(arrived.unwrap_or(sent).saturating_sub(sent)));
        // The agent back at its prompt after the marker reached the model, before the next round.
        let arrived = arrived.unwrap_or(sent);
        while events.wait("READY after the round", |event| is_ready(event, None))? < arrived {}
    }
    Ok(Samples::new(samples))
}

/// The `busy-delivery` scenario (`SYNAPSE_BENCH_CLIS=claude,gemini` picks CLIs).
pub fn busy(synapse: &Path) -> Result<()> {
    let picked = std::env::var("SYNAPSE_BENCH_CLIS").ok();
    let installed: Vec<&str> = CLI_NAMES
        .iter()
        .copied()
        .filter(|cli| clis::cli_binary(cli).is_some())
        .filter(|cli| picked.as_deref().is_none_or(|picked| picked.split(',').any(|name| name == *cli)))
        .collect();
    if installed.is_empty() {
        bail!("no real CLI is installed in {}: run tools/install-clis", clis::clis_dir().display());
    }
    let dir = BenchDir::new("busy-delivery-model")?;
    let model = Model::start(synapse, &dir.root)?;
    for cli in &installed {
        let samples = busy_delivery(synapse, cli, &model, false)?;
        println!("{cli}: busy delivery by typing {}", samples.summary());
        println!("RESULT busy_delivery_ms_{cli}_pty {:.0} ms", samples.median());
        let has_hooks = synapse::agent::profile::builtin(cli).is_some_and(|profile| profile.hooks);
        if !has_hooks {
            println!("{cli}: no hook path (its profile hands nothing over by hook)");
            continue;
        }
        if *cli == "gemini"
            && let Some(reason) = synapse::agent::mcp_wiring::gemini_refuses(&dir.root)
        {
            println!("{cli}: no hook path here: Gemini would not read its settings ({reason})");
            continue;
        }
        let samples = busy_delivery(synapse, cli, &model, true)?;
        println!("{cli}: busy delivery by hook {}", samples.summary());
        println!("RESULT busy_delivery_ms_{cli}_hook {:.0} ms", samples.median());
    }
    Ok(())
}

pub fn run(synapse: &Path) -> Result<()> {
    let installed: Vec<&str> = CLI_NAMES.iter().copied().filter(|cli| clis::cli_binary(cli).is_some()).collect();
    if installed.is_empty() {
        bail!("no real CLI is installed in {}: run tools/install-clis", clis::clis_dir().display());
    }
    let dir = BenchDir::new("real-clis-model")?;
    let model = Model::start(synapse, &dir.root)?;
    for cli in &installed {
        let mut bare = Vec::new();
        let mut wrapped = Vec::new();
        for _ in 0..STARTS {
            bare.push(bare_prompt(synapse, cli, &model)?);
            wrapped.push(start_ready(synapse, cli, &model)?);
        }
        let bare = Samples::new(bare);
        let wrapped = Samples::new(wrapped);
        println!("{cli}: bare prompt {}", bare.summary());
        println!("{cli}: start to READY {}", wrapped.summary());
        println!("RESULT bare_prompt_ms_{cli} {:.0} ms", bare.median());
        println!("RESULT start_ready_ms_{cli} {:.0} ms", wrapped.median());
    }
    if installed.contains(&"claude") {
        let samples = delivery(synapse, &model)?;
        println!("claude: send to model {}", samples.summary());
        println!("RESULT real_delivery_p50_ms {:.0} ms", samples.median());
        println!("RESULT real_delivery_p99_ms {:.0} ms", samples.percentile(99.0));
    }
    Ok(())
}
