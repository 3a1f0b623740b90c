//! The agent wrapper: runs a CLI in a PTY, registers it with the broker, reports its status and
//! writes its tickets into it (the watcher).
//!
//! Threads own the blocking PTY I/O: one reader (output → terminal or log, and the readiness
//! model), one writer (the only owner of the PTY's writer; its queue is lossless), one waiter
//! (reaps the child). The async side (status reporter, watcher, signals) talks to them through
//! channels.
//!
//! Exactly once: the watcher takes one ticket at a time, writes it, and acknowledges it (an
//! event) before taking the next; an acknowledgement that fails because the broker is down is
//! retried after reconnecting, never the write. If the wrapper itself dies, its CLI dies with
//! the PTY, so a ticket written but not acknowledged is written again into the new CLI.

use super::input::{InputRouter, Routed};
use super::profile::{InterruptStyle, Profile};
use super::readiness::Readiness;
use super::terminal;
use crate::api::{self, InboxTicket};
use crate::client::{Client, ClientError};
use crate::config::Paths;
use crate::event::AgentStatus;
use anyhow::Context;
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// Messages longer than this (characters) go to a file (`SYNAPSE_LONG_MESSAGE_THRESHOLD`).
const DEFAULT_LONG_MESSAGE_THRESHOLD: usize = 200;
/// While a ticket waits for the CLI, how often the inbox is asked again for a more urgent one.
const QUEUE_RECHECK: Duration = Duration::from_secs(1);
/// How long one inbox long-poll lasts.
const INBOX_WAIT_MS: u64 = 25_000;
/// Headless PTY size.
const HEADLESS_SIZE: (u16, u16) = (40, 160);

pub struct Options {
    pub profile: Profile,
    pub port: Option<u16>,
    pub name: Option<String>,
    pub role: Option<String>,
    pub tool_args: Vec<String>,
    /// No terminal: output goes to `$SYNAPSE_HOME/logs/<agent_id>.log`.
    pub headless: bool,
    /// Print one JSON line with the registration on stdout (for `synapse start`).
    pub announce: bool,
}

/// Writes to the terminal and the log.
struct Tee(std::io::Stdout, std::fs::File);

impl Write for Tee {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let _ = self.1.write_all(bytes);
        self.0.write_all(bytes)?;
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The wrapper's record of the last ticket it wrote completely (`<agent>.delivered` beside the
/// log), written by the PTY writer thread right after the submit key, before the
/// acknowledgement. A wrapper killed in between leaves it behind and its successor acknowledges
/// that ticket without writing it again, provided the terminal log shows that the CLI saw it
/// (see [`written_before_restart`]). A ticket whose text was written but not its submit key is
/// written again: the CLI that saw the text died with its wrapper.
fn delivered_path(log: &std::path::Path) -> PathBuf {
    log.with_extension("delivered")
}

fn last_delivered(log: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(delivered_path(log)).ok()?.trim().parse().ok()
}

/// How much of the end of the terminal log [`written_before_restart`] reads.
const LOG_TAIL_BYTES: u64 = 256 << 10;

/// Did the wrapper before this one write ticket `number` into its CLI before it died? Its
/// record says it wrote the submit key, and the terminal log shows the ticket's header
/// (`prefix`), so the CLI echoed or drew it. A record without that trace means the bytes may
/// have sat unread in the PTY when the wrapper (and with it the CLI) was killed, or that the
/// echo never reached the log: the ticket is written again, since nothing may be lost.
fn written_before_restart(log: &std::path::Path, number: u64, prefix: &str) -> bool {
    use std::io::{Read, Seek};
    if prefix.is_empty() || last_delivered(log) != Some(number) {
        return false;
    }
    let Ok(mut file) = std::fs::File::open(log) else { return false };
    let start = file.metadata().map_or(0, |meta| meta.len().saturating_sub(LOG_TAIL_BYTES));
    let mut tail = Vec::new();
    if file.seek(std::io::SeekFrom::Start(start)).and_then(|_| file.read_to_end(&mut tail)).is_err() {
        return false;
    }
    String::from_utf8_lossy(&tail).contains(prefix)
}

/// One write into the PTY; `done` is answered once the bytes are written.
struct PtyWrite {
    bytes: Vec<u8>,
    done: Option<oneshot::Sender<()>>,
    /// A record to write right after the bytes, on the writer thread (no task switch in
    /// between): (file, content).
    then_record: Option<(PathBuf, String)>,
}

struct Shared {
    paths: Paths,
    profile: Profile,
    agent_id: String,
    secret: String,
    readiness: Mutex<Readiness>,
    /// Bumped on every output chunk and every input written: wakes the status reporter and
    /// anyone waiting for the CLI to react (a watch, so no wake-up is lost and many can wait).
    output_changed: watch::Sender<u64>,
    pty_input: std::sync::mpsc::Sender<PtyWrite>,
    master: Mutex<Box<dyn MasterPty + Send>>,
    child_pid: Option<u32>,
    log: PathBuf,
    /// Set by the watcher after an acknowledgement (which records PROCESSING in the broker):
    /// the reporter then reports the current status again, after that event. Only the reporter
    /// keeps what it last reported, so no update of another task can be lost.
    report_again: std::sync::atomic::AtomicBool,
    /// Why a queued message is not written now (reported with the status, shown by `synapse
    /// list`); None when nothing is held back.
    note: Mutex<Option<String>>,
    /// Held by the watcher from writing a ticket until its acknowledgement is recorded, and by
    /// the reporter while it decides and posts a status: a READY seen before a ticket was written
    /// cannot land in the log after that ticket's acknowledgement.
    report_gate: Arc<tokio::sync::Mutex<()>>,
    /// The user's keystrokes held back while a message is typed (between its paste and its
    /// submit key), then passed on: they can never land inside a message and be sent with it.
    held_keys: Mutex<Option<Vec<u8>>>,
}

impl Shared {
    fn lock_readiness(&self) -> std::sync::MutexGuard<'_, Readiness> {
        self.readiness.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts holding the user's keystrokes back, or stops and passes on what was held.
    fn hold_keys(&self, hold: bool) {
        let Ok(mut held) = self.held_keys.lock() else { return };
        if hold {
            held.get_or_insert_with(Vec::new);
        } else if let Some(bytes) = held.take().filter(|bytes| !bytes.is_empty()) {
            let _ = self.pty_input.send(PtyWrite { bytes, done: None, then_record: None });
        }
    }

    /// The user's keystrokes: to the CLI now, or held while a message is being typed.
    fn user_keys(&self, bytes: Vec<u8>) {
        match self.held_keys.lock() {
            Ok(mut held) if held.is_some() => held.get_or_insert_with(Vec::new).extend_from_slice(&bytes),
            _ => {
                let _ = self.pty_input.send(PtyWrite { bytes, done: None, then_record: None });
            }
        }
    }

    fn note(&self) -> Option<String> {
        self.note.lock().map(|note| note.clone()).unwrap_or_default()
    }

    /// Sets (or clears) the note and wakes the reporter when it changed.
    fn set_note(&self, note: Option<String>) {
        let changed = match self.note.lock() {
            Ok(mut current) if *current != note => {
                *current = note;
                true
            }
            _ => false,
        };
        if changed {
            self.output_changed.send_modify(|count| *count += 1);
        }
    }

    async fn write(&self, bytes: Vec<u8>) -> anyhow::Result<()> {
        self.write_then_record(bytes, None).await
    }

    async fn write_then_record(&self, bytes: Vec<u8>, then_record: Option<(PathBuf, String)>) -> anyhow::Result<()> {
        let (done, written) = oneshot::channel();
        self.pty_input
            .send(PtyWrite { bytes, done: Some(done), then_record })
            .map_err(|_| anyhow::anyhow!("the PTY is closed"))?;
        written.await.map_err(|_| anyhow::anyhow!("the PTY is closed"))
    }

    /// Interrupts the CLI as its profile says (never called while it is STARTING or WAITING:
    /// interrupt keys could answer a dialog).
    async fn interrupt(&self) {
        match &self.profile.interrupt {
            InterruptStyle::Signal => {
                let group = self
                    .master
                    .lock()
                    .ok()
                    .and_then(|master| master.process_group_leader())
                    .or_else(|| self.child_pid.and_then(|pid| i32::try_from(pid).ok()));
                if let Some(group) = group {
                    crate::process::signal(-group, libc::SIGINT);
                }
            }
            InterruptStyle::CtrlC => {
                let _ = self.write(vec![0x03]).await;
            }
            InterruptStyle::Keys(keys) => {
                for (index, key) in keys.iter().enumerate() {
                    if index > 0 {
                        tokio::time::sleep(super::profile::KEY_GAP).await;
                    }
                    // Checked when the profile was loaded.
                    if let Ok(bytes) = super::profile::parse_key(key) {
                        let _ = self.write(bytes).await;
                    }
                }
            }
        }
    }
}

fn long_message_threshold() -> usize {
    std::env::var("SYNAPSE_LONG_MESSAGE_THRESHOLD")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(DEFAULT_LONG_MESSAGE_THRESHOLD)
}

pub fn log_path(paths: &Paths, agent_id: &str) -> PathBuf {
    paths.home.join("logs").join(format!("{agent_id}.log"))
}

/// Runs the wrapper until the CLI exits or the wrapper is told to stop; returns the exit code.
pub fn run(paths: Paths, options: Options) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run_async(paths, options))
}

/// A connection to the broker acting as the agent (its secret sent with every request),
/// retried until the broker answers (it is started when none runs).
pub(crate) async fn connect(paths: &Paths, secret: &str) -> Client {
    let mut delay = Duration::from_millis(20);
    loop {
        // Never restarts a broker stopped on purpose: waits until someone starts one.
        match Client::connect_unless_stopped(paths).await {
            Ok(mut client) => {
                client.set_secret(secret.to_string());
                return client;
            }
            Err(error) => {
                tracing::warn!("cannot reach the broker ({error:#}); retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// The connection for an exiting agent's deregistration: None when the broker was stopped on
/// purpose (waiting for a new one would keep a finished agent alive; the next broker prunes
/// its dead pid anyway).
pub(crate) async fn connect_to_leave(paths: &Paths, secret: &str) -> Option<Client> {
    let mut delay = Duration::from_millis(20);
    loop {
        match Client::connect_unless_stopped(paths).await {
            Ok(mut client) => {
                client.set_secret(secret.to_string());
                return Some(client);
            }
            Err(error) if error.downcast_ref::<crate::client::StoppedOnPurpose>().is_some() => return None,
            Err(error) => {
                tracing::warn!("cannot reach the broker ({error:#}); retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

async fn run_async(paths: Paths, options: Options) -> anyhow::Result<i32> {
    let mut client = Client::connect(&paths, true).await?;
    let working_dir = std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
    let registration = client
        .register(&api::RegisterRequest {
            agent_type: options.profile.name.clone(),
            name: options.name.clone(),
            role: options.role.clone(),
            pid: std::process::id(),
            working_dir,
            port: options.port,
        })
        .await?;
    let agent_id = registration.agent.agent_id.clone();
    let secret = registration.secret.clone();
    let port = registration.agent.port;
    client.set_secret(secret.clone());
    let log = log_path(&paths, &agent_id);

    let result = run_registered(&paths, &options, &agent_id, &secret, port, &log, &registration).await;
    // Deregister whatever happened (best effort: the broker also prunes dead pids).
    if let Some(mut client) = connect_to_leave(&paths, &secret).await {
        let _ = client.deregister(&agent_id).await;
    }
    result
}

async fn run_registered(
    paths: &Paths,
    options: &Options,
    agent_id: &str,
    secret: &str,
    port: u16,
    log: &std::path::Path,
    registration: &api::Registration,
) -> anyhow::Result<i32> {
    let interactive = !options.headless && terminal::is_terminal(0);
    let (rows, cols) = if interactive { terminal::size(0).unwrap_or((24, 80)) } else { HEADLESS_SIZE };
    let pty = portable_pty::native_pty_system()
        .openpty(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 })
        .map_err(|error| anyhow::anyhow!("cannot open a PTY: {error}"))?;
    let program = if options.profile.command == "{synapse}" {
        std::env::current_exe().context("cannot find the synapse executable")?.display().to_string()
    } else {
        options.profile.command.clone()
    };
    let mut command = CommandBuilder::new(&program);
    command.args(&options.profile.args);
    command.args(&options.tool_args);
    if let Ok(dir) = std::env::current_dir() {
        command.cwd(dir);
    }
    // Settings `env` first, so that Synapse's own variables always win.
    for (key, value) in crate::settings::Settings::load_current(&paths.home)?.env()? {
        command.env(key, value);
    }
    command.env("SYNAPSE_AGENT_ID", agent_id);
    command.env("SYNAPSE_AGENT_TYPE", &options.profile.name);
    command.env("SYNAPSE_PORT", port.to_string());
    command.env("SYNAPSE_AGENT_SECRET", secret);
    command.env("SYNAPSE_HOME", &paths.home);
    command.env("SYNAPSE_UDS_DIR", &paths.uds_dir);
    let mut child =
        pty.slave.spawn_command(command).map_err(|error| anyhow::anyhow!("cannot start '{program}': {error}"))?;
    // The slave must go now, or the reader never sees end-of-file.
    drop(pty.slave);
    let child_pid = child.process_id();
    let reader = pty.master.try_clone_reader().map_err(|error| anyhow::anyhow!("PTY reader: {error}"))?;
    let writer = pty.master.take_writer().map_err(|error| anyhow::anyhow!("PTY writer: {error}"))?;

    if options.announce {
        let announce = api::Announce {
            agent_id: agent_id.to_string(),
            pid: std::process::id(),
            child_pid,
            port,
            log: Some(log.display().to_string()),
            socket: registration.socket.clone(),
            endpoint: None,
            secret: secret.to_string(),
        };
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", api::json_line(&announce)?)?;
        stdout.flush()?;
    }

    let (pty_input, pty_queue) = std::sync::mpsc::channel::<PtyWrite>();
    let shared = Arc::new(Shared {
        paths: paths.clone(),
        profile: options.profile.clone(),
        agent_id: agent_id.to_string(),
        secret: secret.to_string(),
        readiness: Mutex::new(Readiness::new(options.profile.idle.clone(), rows, cols)),
        output_changed: watch::channel(0).0,
        pty_input,
        master: Mutex::new(pty.master),
        child_pid,
        log: log.to_path_buf(),
        report_again: std::sync::atomic::AtomicBool::new(false),
        note: Mutex::new(None),
        report_gate: Arc::new(tokio::sync::Mutex::new(())),
        held_keys: Mutex::new(None),
    });

    // Writer thread: the one owner of the PTY writer (dropping it would send EOF to the CLI).
    std::thread::Builder::new().name("pty-writer".into()).spawn(move || {
        let mut writer = writer;
        while let Ok(write) = pty_queue.recv() {
            let ok = writer.write_all(&write.bytes).and_then(|_| writer.flush()).is_ok();
            if let (true, Some((file, content))) = (ok, &write.then_record)
                && let Err(error) = crate::private_files::write(file, content)
            {
                tracing::warn!("cannot write {}: {error}", file.display());
            }
            if let Some(done) = write.done
                && ok
            {
                let _ = done.send(());
            }
        }
    })?;

    // Reader thread: output to the user's terminal (interactive) and always to the log (what
    // `synapse logs` shows, and the watcher's evidence of what was written before a crash).
    if let Some(dir) = log.parent() {
        crate::private_files::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let log_file = crate::private_files::open_append(log).with_context(|| format!("cannot open {}", log.display()))?;
    let sink: Box<dyn Write + Send> =
        if interactive { Box::new(Tee(std::io::stdout(), log_file)) } else { Box::new(log_file) };
    let reader_shared = shared.clone();
    let (output_ended, output_done) = oneshot::channel::<()>();
    std::thread::Builder::new().name("pty-reader".into()).spawn(move || {
        let mut reader = reader;
        let mut sink = sink;
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match reader.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(count) => {
                    let _ = sink.write_all(&buffer[..count]).and_then(|_| sink.flush());
                    reader_shared.lock_readiness().feed(&buffer[..count], Instant::now());
                    reader_shared.output_changed.send_modify(|count| *count += 1);
                }
            }
        }
        let _ = output_ended.send(());
    })?;

    // Waiter thread: nothing else reaps the child.
    let (exited, child_exit) = oneshot::channel::<i32>();
    std::thread::Builder::new().name("pty-waiter".into()).spawn(move || {
        let code = child.wait().map(|status| i32::try_from(status.exit_code()).unwrap_or(1)).unwrap_or(1);
        let _ = exited.send(code);
    })?;

    let _raw = if interactive { Some(terminal::RawMode::enable()?) } else { None };
    if interactive {
        spawn_keyboard(shared.clone());
        spawn_resize(shared.clone());
    }
    tokio::spawn(report_status(shared.clone()));
    tokio::spawn(watch_inbox(shared.clone()));

    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let code = tokio::select! {
        code = child_exit => code.unwrap_or(1),
        _ = terminate.recv() => stop_child(&shared).await,
        _ = hangup.recv() => stop_child(&shared).await,
    };
    // Let the last output reach the terminal or log.
    let _ = tokio::time::timeout(Duration::from_millis(500), output_done).await;
    Ok(code)
}

/// Ends the CLI: SIGTERM to its process group, SIGKILL if it is still there after 3 s.
async fn stop_child(shared: &Arc<Shared>) -> i32 {
    let Some(pid) = shared.child_pid.and_then(|pid| i32::try_from(pid).ok()) else { return 143 };
    crate::process::signal(-pid, libc::SIGTERM);
    crate::process::signal(pid, libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && crate::process::is_pid_alive(pid.unsigned_abs()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    crate::process::signal(-pid, libc::SIGKILL);
    143
}

/// Keeps the broker told of READY / PROCESSING / WAITING as the screen changes.
async fn report_status(shared: Arc<Shared>) {
    let mut client = connect(&shared.paths, &shared.secret).await;
    let mut changes = shared.output_changed.subscribe();
    let mut reported: Option<(AgentStatus, Option<String>)> = None;
    let mut backoff = Backoff::default();
    let mut warned_gone = false;
    loop {
        changes.borrow_and_update();
        // No ticket is between its write and its acknowledgement while this is held.
        let gate = shared.report_gate.lock().await;
        let (status, recheck) = shared.lock_readiness().status(Instant::now());
        let again = shared.report_again.swap(false, std::sync::atomic::Ordering::SeqCst);
        let now = (status, shared.note());
        if status != AgentStatus::Starting && (again || reported.as_ref() != Some(&now)) {
            let update = api::StatusUpdate { status: now.0, note: now.1.clone() };
            match client.set_status(&shared.agent_id, &update).await {
                Ok(_) => {
                    reported = Some(now);
                    backoff.reset();
                    warned_gone = false;
                }
                Err(error) => {
                    if is_gone(&error) && !std::mem::replace(&mut warned_gone, true) {
                        tracing::warn!(
                            "the broker no longer knows agent {} (deregistered?): messages cannot reach it; retrying",
                            shared.agent_id
                        );
                    } else {
                        tracing::debug!("status report failed: {error:#}");
                    }
                    if again {
                        shared.report_again.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    backoff.wait().await;
                    client = connect(&shared.paths, &shared.secret).await;
                    continue;
                }
            }
        }
        drop(gate);
        match recheck {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), changes.changed()).await;
            }
            None => {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Pauses between failed calls to the broker that did answer (a refused status report, a
/// failed acknowledgement): doubling from 50 ms to 5 s, so a persistent refusal does not
/// become a busy loop. Reset by a success.
struct Backoff {
    delay: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const LONGEST: Duration = Duration::from_secs(5);

    fn reset(&mut self) {
        self.delay = Self::FIRST;
    }

    /// The pause to take now; the next one is twice as long (up to [`Self::LONGEST`]).
    fn next_delay(&mut self) -> Duration {
        let delay = self.delay;
        self.delay = (self.delay * 2).min(Self::LONGEST);
        delay
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { delay: Self::FIRST }
    }
}

/// The broker no longer knows the agent (deregistered, or its id taken): 404 or 409.
fn is_gone(error: &ClientError) -> bool {
    error.status().is_some_and(|status| status.as_u16() == 404 || status.as_u16() == 409)
}

/// Instruction files for the start-up message (SPEC §1): `.synapse/*.md` of the working
/// directory, except `delegate.md` unless delegation is enabled and `file-safety.md` unless
/// file safety is on.
pub fn instruction_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let enabled =
        |name: &str| std::env::var(name).is_ok_and(|value| value == "1" || value.eq_ignore_ascii_case("true"));
    let Ok(entries) = std::fs::read_dir(dir.join(".synapse")) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .filter(|path| match path.file_name().and_then(|name| name.to_str()) {
            Some("delegate.md") => enabled("SYNAPSE_DELEGATION_ENABLED"),
            Some("file-safety.md") => enabled("SYNAPSE_FILE_SAFETY_ENABLED"),
            _ => true,
        })
        .collect();
    files.sort();
    files
}

/// The one start-up message written on the first READY when instruction files exist.
fn startup_message(shared: &Shared, files: &[PathBuf]) -> String {
    let list: Vec<String> = files.iter().map(|file| file.display().to_string()).collect();
    format!(
        "You are agent {} ({}). Read your instructions in: {}. Messages from other agents arrive as [A2A:<id>:<sender>] lines; answer those marked :R with `synapse reply \"...\"`.",
        shared.agent_id,
        shared.profile.name,
        list.join(", ")
    )
}

/// Follows the agent's inbox and writes each ticket into the PTY once the CLI is ready.
async fn watch_inbox(shared: Arc<Shared>) {
    let files = std::env::current_dir()
        .map(|dir| {
            let mut files = instruction_files(&dir);
            if let Ok(settings) = crate::settings::Settings::load_current(&shared.paths.home) {
                files.extend(settings.instructions(&dir).into_iter().filter(|file| file.exists()));
            }
            files.dedup();
            files
        })
        .unwrap_or_default();
    if !files.is_empty() {
        if !wait_until_ready(&shared).await {
            return;
        }
        match write_input(&shared, "[SYNAPSE]", &startup_message(&shared, &files), None).await {
            Ok(written) => resubmit_if_unsent(&shared, &written).await,
            Err(error) => {
                tracing::warn!("cannot write the start-up message: {error:#}");
                return;
            }
        }
    }
    let mut client = connect(&shared.paths, &shared.secret).await;
    let mut unacknowledged: Option<u64> = None;
    // Only the first ticket after a start can have been written by a previous wrapper that
    // died before acknowledging it: its records say so, and it is acknowledged without being
    // written again.
    let mut first_after_start = true;
    // The priority-5 ticket last interrupted for: each is interrupted for once.
    let mut interrupted: Option<u64> = None;
    // The report gate, held from a ticket's write to its acknowledgement.
    let mut held: Option<tokio::sync::OwnedMutexGuard<()>> = None;
    let mut backoff = Backoff::default();
    loop {
        if let Some(ticket) = unacknowledged {
            match client.ack(&shared.agent_id, ticket).await {
                Ok(_) => {
                    // The acknowledgement recorded PROCESSING; the reporter reports READY
                    // again once the CLI is back at its prompt, after this event.
                    unacknowledged = None;
                    drop(held.take());
                    shared.report_again.store(true, std::sync::atomic::Ordering::SeqCst);
                    shared.output_changed.send_modify(|count| *count += 1);
                }
                Err(error) if is_gone(&error) => {
                    unacknowledged = None;
                    drop(held.take());
                }
                Err(_) => {
                    backoff.wait().await;
                    client = connect(&shared.paths, &shared.secret).await;
                    continue;
                }
            }
        }
        let inbox = match client.inbox(&shared.agent_id, INBOX_WAIT_MS, Some(1)).await {
            Ok(answer) => {
                backoff.reset();
                answer
            }
            Err(_) => {
                backoff.wait().await;
                client = connect(&shared.paths, &shared.secret).await;
                continue;
            }
        };
        let Some(ticket) = inbox.tickets.into_iter().next() else {
            // Nothing waits: nothing to explain.
            shared.set_note(None);
            continue;
        };
        let number = ticket.ticket;
        if std::mem::take(&mut first_after_start) && written_before_restart(&shared.log, number, &ticket.prefix) {
            tracing::info!("ticket {number} was written before a restart; acknowledging it");
            unacknowledged = Some(number);
            continue;
        }
        let (status, typing) = {
            let mut readiness = shared.lock_readiness();
            (readiness.status(Instant::now()).0, readiness.input_pending())
        };
        if status != AgentStatus::Ready {
            // Priority 5 interrupts a CLI that is working, once per ticket. A CLI that is
            // starting or shows a dialog is never interrupted or written to (the keys could
            // answer the dialog), nor one whose user is typing (they would clear the input).
            if ticket.priority == 5 && status == AgentStatus::Processing && !typing && interrupted != Some(number) {
                interrupted = Some(number);
                shared.interrupt().await;
                let timeout = Duration::from_millis(shared.profile.interrupt_timeout_ms);
                if tokio::time::timeout(timeout, wait_until_ready(&shared)).await.is_err() {
                    let note = format!(
                        "a priority-5 message waits: no prompt {} s after the interrupt (clear the input box or answer the CLI)",
                        shared.profile.interrupt_timeout_ms / 1000
                    );
                    tracing::warn!("ticket {number}: {note}");
                    shared.set_note(Some(note));
                }
            } else {
                match status {
                    AgentStatus::Waiting => {
                        shared.set_note(Some("a dialog is open: messages wait until it is answered".into()))
                    }
                    _ if typing => shared.set_note(Some(
                        "the CLI's input box holds typed text: messages wait until it is sent or cleared".into(),
                    )),
                    _ => {}
                }
                // Until READY, or a second passes: a more urgent ticket (priority 5) may have
                // arrived behind this one, and it must not wait for the CLI's whole task.
                tokio::select! {
                    ready = wait_until_ready(&shared) => if !ready { return },
                    () = tokio::time::sleep(QUEUE_RECHECK) => {}
                }
            }
            // Ask again: the most urgent ticket comes first.
            continue;
        }
        held = Some(shared.report_gate.clone().lock_owned().await);
        let bracketed = shared.lock_readiness().bracketed_paste();
        let text = match ticket_text(&shared, &ticket, bracketed) {
            Ok(text) => text,
            Err(error) => {
                // The message cannot reach this CLI (its file could not be written): its task
                // fails, visibly to the sender, and the next tickets go on.
                let reason = format!("{error:#}");
                tracing::warn!("ticket {number}: {reason}");
                fail_ticket(&mut client, &shared, &ticket, &reason).await;
                unacknowledged = Some(number);
                continue;
            }
        };
        shared.set_note(None);
        let header = ticket.prefix.as_str();
        let record = Some((delivered_path(&shared.log), number.to_string()));
        let written = match write_input(&shared, header, &text, record).await {
            Ok(written) => written,
            Err(error) => {
                tracing::warn!("cannot write ticket {number}: {error:#}");
                return;
            }
        };
        // Acknowledged once the CLI has drawn something after it: a wrapper killed before that
        // leaves the ticket unacknowledged and its successor writes it again (the bytes died
        // unread with the PTY).
        wait_for_reaction(&shared).await;
        resubmit_if_unsent(&shared, &written).await;
        unacknowledged = Some(number);
    }
}

/// Longest wait for a CLI to draw anything after a ticket was written, before acknowledging it
/// anyway (a CLI that draws nothing must not stop deliveries).
const REACTION_WAIT: Duration = Duration::from_secs(2);

async fn wait_for_reaction(shared: &Shared) {
    let mut changes = shared.output_changed.subscribe();
    let deadline = tokio::time::Instant::now() + REACTION_WAIT;
    loop {
        changes.borrow_and_update();
        if shared.lock_readiness().reacted() {
            return;
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// How long the input box may hold a written message, with nothing drawn, before its submit key
/// counts as lost.
const UNSENT_QUIET: Duration = Duration::from_millis(1500);
/// How many times the submit key is sent again for one message.
const RESUBMITS: usize = 2;

/// Sends the submit key again when the message still sits in the CLI's input box after a quiet
/// spell (seen with Gemini under heavy load: the paste shown, its Enter swallowed, the message
/// never sent). Returns at once when the box empties, as it does for a message taken.
async fn resubmit_if_unsent(shared: &Shared, written: &Written) {
    let mut changes = shared.output_changed.subscribe();
    let mut resubmits = 0;
    // The quiet spell is counted from the CLI's last drawing or our last key, whichever is later:
    // a key just sent has not been answered yet.
    let mut last_key = Instant::now();
    loop {
        changes.borrow_and_update();
        let (unsent, last_output) = {
            let readiness = shared.lock_readiness();
            (readiness.holds_unsent(&written.shown, written.pasted), readiness.last_output())
        };
        if !unsent {
            return;
        }
        let quiet_until = last_output.map_or(last_key, |at| at.max(last_key)) + UNSENT_QUIET;
        if Instant::now() < quiet_until {
            let _ = tokio::time::timeout_at(quiet_until.into(), changes.changed()).await;
            continue;
        }
        if resubmits == RESUBMITS {
            tracing::warn!("the message still sits in the input box after {RESUBMITS} more submit keys");
            return;
        }
        resubmits += 1;
        tracing::info!("the message still sits in the input box; sending the submit key again");
        last_key = Instant::now();
        shared.lock_readiness().input_written(last_key);
        if shared.write(written.submit.clone()).await.is_err() {
            return;
        }
    }
}

/// Waits until the screen model says READY (after output, or when a quiet period ends);
/// false when the wrapper is going away.
async fn wait_until_ready(shared: &Arc<Shared>) -> bool {
    let mut changes = shared.output_changed.subscribe();
    loop {
        changes.borrow_and_update();
        let (status, recheck) = shared.lock_readiness().status(Instant::now());
        if status == AgentStatus::Ready {
            return true;
        }
        match recheck {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), changes.changed()).await;
            }
            None => {
                if changes.changed().await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// The text written for a ticket after its header: the message, or a file reference when the
/// message is long (or multi-line and the CLI cannot take a paste).
fn ticket_text(shared: &Shared, ticket: &InboxTicket, bracketed: bool) -> anyhow::Result<String> {
    let text = ticket.text.as_str();
    if text.chars().count() <= long_message_threshold() && (bracketed || !text.contains(['\n', '\r'])) {
        return Ok(text.to_string());
    }
    let dir = shared.paths.home.join("messages").join(&shared.agent_id);
    crate::private_files::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = dir.join(format!("{}-{}.txt", ticket.ticket, crate::event::short_id(&ticket.task_id)));
    crate::private_files::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    Ok(format!("[LONG MESSAGE - FILE ATTACHED] Path: {}", file.display()))
}

/// Marks the task of a ticket that cannot be written as failed, with the reason (best effort:
/// a reply's ticket belongs to a task that is already over).
async fn fail_ticket(client: &mut Client, shared: &Shared, ticket: &InboxTicket, reason: &str) {
    let task_id = &ticket.task_id;
    let update = api::TaskUpdate {
        state: crate::event::TaskState::Failed,
        artifacts: Vec::new(),
        error: Some(format!("not delivered to {}: {reason}", shared.agent_id)),
    };
    if let Err(error) = client.update_task(&shared.agent_id, task_id, &update).await {
        tracing::debug!("cannot mark task {task_id} failed: {error:#}");
    }
}

/// Types `header` and `text` into the CLI like a paste (bracketed when the CLI enabled it), then
/// the submit key after the profile's settle delay (and, right after it, `then_record`). The
/// bytes are decided by [`crate::escape::keystrokes`]: nothing in the text acts as a control.
async fn write_input(
    shared: &Arc<Shared>,
    header: &str,
    text: &str,
    then_record: Option<(PathBuf, String)>,
) -> anyhow::Result<Written> {
    let bracketed = shared.lock_readiness().bracketed_paste();
    shared.lock_readiness().input_written(Instant::now());
    shared.output_changed.send_modify(|count| *count += 1);
    let keys = crate::escape::keystrokes(header, text, bracketed, &shared.profile.submit);
    let shown = String::from_utf8_lossy(&keys.paste).replace("\x1b[200~", "").replace("\x1b[201~", "");
    shared.lock_readiness().remember_input(&shown);
    shared.hold_keys(true);
    let written = async {
        shared.write(keys.paste).await?;
        if shared.profile.settle_ms > 0 {
            // The settle delay counts from the CLI drawing the paste, not from writing it: a CLI
            // starved of CPU reads the paste and the submit key together otherwise, and Gemini
            // takes a return that close behind a paste as a newline inside it.
            wait_for_reaction(shared).await;
            tokio::time::sleep(Duration::from_millis(shared.profile.settle_ms)).await;
        }
        shared.write_then_record(keys.submit.clone(), then_record).await
    }
    .await;
    shared.hold_keys(false);
    written.map(|()| Written { shown, submit: keys.submit, pasted: bracketed })
}

/// What [`write_input`] typed: the text as the CLI shows it, the submit key after it, and
/// whether it went in as a bracketed paste.
struct Written {
    shown: String,
    submit: Vec<u8>,
    pasted: bool,
}

/// The user's keystrokes: `@agent message` lines go to the broker, the rest to the CLI.
fn spawn_keyboard(shared: Arc<Shared>) {
    let (sends, mut to_send) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let keyboard_shared = shared.clone();
    let _ = std::thread::Builder::new().name("keyboard".into()).spawn(move || {
        let mut router = InputRouter::new();
        let mut stdin = std::io::stdin();
        let mut buffer = [0u8; 4096];
        loop {
            let count = match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(count) => count,
            };
            for routed in router.feed(&buffer[..count]) {
                match routed {
                    Routed::Pass(bytes) => keyboard_shared.user_keys(bytes),
                    Routed::Echo(bytes) => {
                        let mut out = std::io::stdout().lock();
                        let _ = out.write_all(&bytes).and_then(|_| out.flush());
                    }
                    Routed::Send { target, message } => {
                        let _ = sends.send((target, message));
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        let mut client = connect(&shared.paths, &shared.secret).await;
        while let Some((target, message)) = to_send.recv().await {
            let request = api::SendRequest {
                from: Some(shared.agent_id.clone()),
                secret: Some(shared.secret.clone()),
                response_expected: true,
                ..api::SendRequest::new(target.clone(), message)
            };
            let line = match client.send(&request).await {
                Ok(answer) => format!(
                    "[synapse] sent to {}: task {}",
                    answer.task.metadata.owner.as_deref().unwrap_or(&target),
                    crate::event::short_id(answer.sender_task.as_ref().map_or("", |task| task.id.as_str()))
                ),
                Err(error) => format!("[synapse] not sent: {error:#}"),
            };
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{line}\r\n");
            let _ = out.flush();
        }
    });
}

/// Follows the user's terminal size.
fn spawn_resize(shared: Arc<Shared>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut winch) = signal(SignalKind::window_change()) else { return };
        while winch.recv().await.is_some() {
            if let Some((rows, cols)) = terminal::size(0) {
                if let Ok(master) = shared.master.lock() {
                    let _ = master.resize(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 });
                }
                shared.lock_readiness().resize(rows, cols);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_counts_as_written_before_a_restart_only_with_its_record_and_its_echo() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bob.log");
        let prefix = "[A2A:c54af1ff:alice:R]";
        std::fs::write(&log, format!("> {prefix} burst-024\r\n[DUMMY] You said: ...\r\n> ")).unwrap();
        assert!(!written_before_restart(&log, 7, prefix), "no record");
        std::fs::write(delivered_path(&log), "6").unwrap();
        assert!(!written_before_restart(&log, 7, prefix), "the record is of another ticket");
        std::fs::write(delivered_path(&log), "7").unwrap();
        assert!(written_before_restart(&log, 7, prefix));
        assert!(!written_before_restart(&log, 7, "[A2A:0000aaaa:alice:R]"), "recorded, but the CLI never showed it");
        assert!(!written_before_restart(&log, 7, ""));
        // Only the end of a long log is read: the ticket was the last thing written.
        let mut long = format!("> {prefix} early\r\n").into_bytes();
        long.resize(long.len() + 2 * LOG_TAIL_BYTES as usize, b'.');
        std::fs::write(&log, long).unwrap();
        assert!(!written_before_restart(&log, 7, prefix));
    }

    #[test]
    fn backoff_doubles_up_to_its_longest_and_resets() {
        let mut backoff = Backoff::default();
        let delays: Vec<Duration> = (0..10).map(|_| backoff.next_delay()).collect();
        assert_eq!(delays[0], Backoff::FIRST);
        assert_eq!(delays[1], Backoff::FIRST * 2);
        assert!(delays.windows(2).all(|pair| pair[1] >= pair[0]));
        assert_eq!(*delays.last().unwrap(), Backoff::LONGEST);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Backoff::FIRST);
    }
}
