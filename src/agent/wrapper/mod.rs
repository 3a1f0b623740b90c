//! The agent wrapper: runs a CLI in a PTY, registers it with the broker, reports its status and
//! writes its tickets into it. This module registers, composes the parts and owns what they
//! share ([`Shared`]); each part lives in its own file:
//! - [`pty`]: spawning the CLI, and the threads that own the PTY's blocking I/O — one reader
//!   (output → terminal or log, and the readiness model), one writer (the only owner of the
//!   PTY's writer; its queue is lossless), one waiter (reaps the child);
//! - [`watcher`]: the inbox loop, writing each ticket once the CLI is ready (exactly once);
//! - [`reporter`]: status reports to the broker;
//! - [`keyboard`]: the user's keystrokes and `@agent` lines, and the terminal's size;
//! - [`connection`]: connecting to the broker as the agent, and the pause between failures.
//!
//! The async side (status reporter, watcher, keyboard router, signals) talks to the threads
//! through channels. The wrapper deregisters its agent however it ends; if it dies, its CLI
//! dies with the PTY.

mod connection;
mod hooks;
mod keyboard;
mod pty;
mod reporter;
mod terminal_log;
mod watcher;

pub(crate) use connection::{Backoff, EXIT_GRACE, connect, connect_to_leave, is_gone};
pub use terminal_log::rotated_path as rotated_log_path;
pub use watcher::instruction_files;

use super::mcp_wiring;
use super::profile::Profile;
use super::readiness::Readiness;
use super::terminal;
use crate::api;
use crate::client::Client;
use crate::config::Paths;
use anyhow::Context;
use keyboard::HeldKeys;
use portable_pty::{CommandBuilder, MasterPty};
use pty::{PtyInput, Screen};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Headless PTY size.
const HEADLESS_SIZE: (u16, u16) = (40, 160);

pub struct Options {
    pub profile: Profile,
    pub port: Option<u16>,
    pub name: Option<String>,
    pub role: Option<String>,
    pub tool_args: Vec<String>,
    /// `--no-mcp`: no Synapse MCP server for the CLI, whatever the settings say.
    pub no_mcp: bool,
    /// No terminal: output goes to `$SYNAPSE_HOME/logs/<agent_id>.log`.
    pub headless: bool,
    /// Print one JSON line with the registration on stdout (for `synapse start`).
    pub announce: bool,
}

/// Shared by the watcher and the reporter so that a READY seen before a ticket was written
/// never lands in the log after that ticket's acknowledgement (which records PROCESSING): the
/// acknowledgement waits while such a report is on its way. A report decided after the write
/// (the CLI back at its prompt, or busy with the ticket) may land on either side of it: the
/// reporter reports the current status again after every acknowledgement. A hook's hand-over
/// counts as a write and waits the same way before its acknowledgements. Nothing waits for a
/// report otherwise: a ticket is written while the last status is still being posted.
#[derive(Default)]
struct ReportOrder {
    counts: Mutex<Counts>,
    /// Woken when a READY has been posted.
    posted: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Counts {
    /// Writes counted so far (a ticket's keys, or its submit key sent again).
    writes: u64,
    /// The `writes` count when the READY being posted now was decided, while one is.
    ready_posting: Option<u64>,
}

impl ReportOrder {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `record` (the screen model told of the write, so that it shows the CLI busy until
    /// its prompt is drawn again) and counts a write, in one step against [`ReportOrder::decide`];
    /// returns what `record` returned.
    fn count_write<T>(&self, record: impl FnOnce() -> T) -> T {
        let mut counts = self.counts();
        let recorded = record();
        counts.writes += 1;
        recorded
    }

    /// Runs `decide` in one step against [`ReportOrder::count_write`]; when it says a READY
    /// will be posted, that READY is marked with the writes counted so far until
    /// [`ReportOrder::posted`].
    fn decide<T>(&self, decide: impl FnOnce() -> (T, bool)) -> T {
        let mut counts = self.counts();
        let (value, ready) = decide();
        if ready {
            counts.ready_posting = Some(counts.writes);
        }
        value
    }

    /// The READY being posted has its answer (or failed).
    fn posted(&self) {
        self.counts().ready_posting = None;
        self.posted.notify_waiters();
    }

    /// Waits until no READY decided before the last write is on its way to the broker.
    async fn no_ready_from_before_the_last_write(&self) {
        loop {
            let posted = self.posted.notified();
            tokio::pin!(posted);
            // Registered before the check, so a post between the two is not missed.
            posted.as_mut().enable();
            let waiting = {
                let counts = self.counts();
                counts.ready_posting.is_some_and(|decided_at| decided_at < counts.writes)
            };
            if !waiting {
                return;
            }
            posted.await;
        }
    }
}

impl Shared {
    /// Records on the screen model that a ticket's keys are about to be written (the CLI counts
    /// as busy until it draws its prompt again), and counts the write; returns the time recorded.
    /// The time is taken inside the step: output stamped after it was read after it, so a
    /// prompt drawn before the write cannot make a READY that counts as decided after it.
    fn input_written(&self) -> Instant {
        let now = self.report_order.count_write(|| {
            let now = Instant::now();
            self.screen.lock().input_written(now);
            now
        });
        self.screen.notify();
        now
    }
}

/// What the wrapper's parts share, behind one `Arc`.
struct Shared {
    paths: Paths,
    profile: Profile,
    agent_id: String,
    secret: String,
    /// The readiness model of the CLI's screen, fed by the reader thread, and the counter that
    /// wakes the reporter and anyone waiting for the CLI to react.
    screen: Arc<Screen>,
    /// The way to the PTY writer thread.
    input: PtyInput,
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
    /// Orders status reports before acknowledgements: a READY seen before a ticket was written
    /// cannot land in the log after that ticket's acknowledgement ([`ReportOrder`]).
    report_order: ReportOrder,
    /// The user's keystrokes held back while a message is typed (between its paste and its
    /// submit key), then passed on: they can never land inside a message and be sent with it.
    held_keys: HeldKeys,
    /// The CLI was given Synapse's MCP tools (the start-up message says so).
    mcp_tools: bool,
    /// The delivery lock: held by the watcher from taking a ticket to write until its
    /// acknowledgement, and by a hook while it hands tickets over; holds the numbers of the
    /// tickets hooks handed over, which the watcher must not write.
    delivery: Arc<tokio::sync::Mutex<std::collections::BTreeSet<u64>>>,
    /// Tickets a hook handed over whose acknowledgement failed (the broker restarting): the
    /// watcher acknowledges them as soon as it reaches the broker, while the CLI still works,
    /// so that a cancel landing meanwhile is told to the model that has the message.
    handovers_unacknowledged: Mutex<std::collections::BTreeSet<u64>>,
    /// Wakes the watcher from its wait on the inbox when a hook fills
    /// [`Shared::handovers_unacknowledged`].
    handovers_waiting: tokio::sync::Notify,
    /// When the broker registered this run of the agent (its clock, as tickets are stamped).
    registered_ms: u64,
}

impl Shared {
    /// A cancel notice issued before this run of the agent registered: about a task the CLI
    /// before a restart worked on (the notice waited behind a dialog, say, when it stopped).
    /// Acknowledged without being written or handed over: this CLI never saw that task.
    fn stale_notice(&self, ticket: &crate::api::InboxTicket) -> bool {
        ticket.cancel_notice
            && crate::time::parse_rfc3339_ms(&ticket.issued_at).is_some_and(|issued| issued < self.registered_ms)
    }

    /// The tickets a hook handed over and could not acknowledge ([`Shared::handovers_unacknowledged`]).
    fn unacknowledged_handovers(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.handovers_unacknowledged.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After an acknowledgement (which records PROCESSING in the broker): the reporter reports
    /// the status again, after that event (READY once the CLI is back at its prompt).
    fn report_after_acknowledgement(&self) {
        self.report_again.store(true, std::sync::atomic::Ordering::SeqCst);
        self.screen.notify();
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
            self.screen.notify();
        }
    }
}

pub fn log_path(paths: &Paths, agent_id: &str) -> PathBuf {
    paths.home.join("logs").join(format!("{agent_id}.log"))
}

/// Runs the wrapper until the CLI exits or the wrapper is told to stop; returns the exit code.
pub fn run(paths: Paths, options: Options) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = runtime.block_on(run_async(paths, options));
    // Blocking work still under way must not keep a finished wrapper alive.
    runtime.shutdown_timeout(EXIT_GRACE);
    result
}

async fn run_async(paths: Paths, options: Options) -> anyhow::Result<i32> {
    // A broker already serving the socket directory does not check this home for us: nothing
    // of this session (logs, the MCP registration and its secret) goes into another user's.
    paths.own_home()?;
    // Settings the CLI could not start with are refused before the agent is registered.
    crate::project_trust::agent_env(&paths.home, &crate::settings::Settings::load_current(&paths.home)?)?;
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
            // The profile's range reaches the broker: a custom profile needs no built-in one.
            port_range: Some(options.profile.port_range),
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
    // The session's files (the MCP registration, which may hold the secret) go with the agent.
    let _ = std::fs::remove_dir_all(crate::config::agent_dir(&paths.home, &agent_id, std::process::id()));
    result
}

/// The CLI's program (`{synapse}` stands for this executable) and its command: the profile's
/// arguments, then the user's, in the current directory, with the settings' environment and
/// Synapse's own variables.
fn cli_command(
    paths: &Paths,
    options: &Options,
    agent_id: &str,
    secret: &str,
    port: u16,
) -> anyhow::Result<(String, CommandBuilder, mcp_wiring::Wiring)> {
    let program = if options.profile.command == "{synapse}" {
        crate::config::synapse_exe().context("cannot find the synapse executable")?.display().to_string()
    } else {
        options.profile.command.clone()
    };
    let settings = crate::settings::Settings::load_current(&paths.home)?;
    let identity: Vec<(String, String)> = [
        ("SYNAPSE_AGENT_ID", agent_id.to_string()),
        ("SYNAPSE_AGENT_SECRET", secret.to_string()),
        ("SYNAPSE_HOME", paths.home.display().to_string()),
        ("SYNAPSE_UDS_DIR", paths.uds_dir.display().to_string()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect();
    let settings_env = crate::project_trust::agent_env(&paths.home, &settings)?;
    let wiring = match options.profile.mcp {
        Some(style) if !options.no_mcp && settings.mcp()? => {
            let synapse = crate::config::synapse_exe().context("cannot find the synapse executable")?;
            // Those of a run killed before it could remove them go first: a secret revoked.
            crate::config::remove_abandoned(&paths.home);
            let dir = crate::config::agent_dir(&paths.home, agent_id, std::process::id());
            // The CLI's environment as it will be: the settings' `env` over this process's.
            let lookup = |name: &str| {
                settings_env
                    .iter()
                    .find(|(key, _)| key == name)
                    .map(|(_, value)| value.clone())
                    .or_else(|| std::env::var(name).ok())
            };
            mcp_wiring::wire(style, options.profile.hooks, &synapse, &dir, &identity, lookup)
                .with_context(|| format!("cannot write the MCP registration in {}", dir.display()))?
        }
        _ => mcp_wiring::Wiring::default(),
    };
    for said in wiring.refused.iter().chain(&wiring.note) {
        eprintln!("synapse: {said}");
    }
    if options.profile.mcp == Some(mcp_wiring::McpStyle::Codex) && !options.profile.hooks {
        eprintln!(
            "synapse: Codex runs hooks only after a one-time approval in its TUI: messages that arrive while it works wait for its prompt"
        );
    }
    let mut command = CommandBuilder::new(&program);
    // What `synapse` told its wrapper is not the CLI's to inherit.
    for name in crate::config::WRAPPER_HANDOVER_ENV {
        command.env_remove(name);
    }
    command.args(&options.profile.args);
    command.args(&wiring.args);
    let extra_env = wiring.env.clone();
    command.args(&options.tool_args);
    if let Ok(dir) = std::env::current_dir() {
        command.cwd(dir);
    }
    // Settings `env` first, so that Synapse's own variables always win.
    for (key, value) in settings_env.into_iter().chain(extra_env) {
        command.env(key, value);
    }
    command.env("SYNAPSE_AGENT_TYPE", &options.profile.name);
    command.env("SYNAPSE_PORT", port.to_string());
    for (key, value) in &identity {
        command.env(key, value);
    }
    Ok((program, command, wiring))
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
    let (program, command, wiring) = cli_command(paths, options, agent_id, secret, port)?;
    // The socket is served whenever the profile hands busy messages over by hook: the CLI's
    // hooks are registered where its wiring allows, and an unused socket costs nothing.
    let (mcp_tools, hook_delivery) = (wiring.has_tools(), options.profile.hooks);
    // From here the CLI draws in the user's terminal: the wrapper's own lines go to a file, when
    // they would go to that terminal (a file that cannot be opened does not end the session:
    // they stay where they were).
    if interactive
        && std::io::IsTerminal::is_terminal(&std::io::stderr())
        && let Err(error) = crate::logging::to_file(&paths.wrapper_log(&options.profile.name))
    {
        tracing::warn!("{error:#}: the wrapper's log stays on standard error");
    }
    let cli = pty::spawn(&program, command, (rows, cols))?;
    let child_pid = cli.child_pid;

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

    let input = pty::spawn_writer(cli.writer)?;
    let shared = Arc::new(Shared {
        paths: paths.clone(),
        profile: options.profile.clone(),
        agent_id: agent_id.to_string(),
        secret: secret.to_string(),
        screen: Arc::new(Screen::new(Readiness::new(options.profile.idle.clone(), rows, cols))),
        input,
        master: Mutex::new(cli.master),
        child_pid,
        log: log.to_path_buf(),
        report_again: std::sync::atomic::AtomicBool::new(false),
        note: Mutex::new(None),
        report_order: ReportOrder::default(),
        held_keys: HeldKeys::default(),
        mcp_tools,
        delivery: Arc::default(),
        handovers_unacknowledged: Mutex::default(),
        handovers_waiting: tokio::sync::Notify::new(),
        registered_ms: registration.agent.registered_ms,
    });

    // Reader thread: output to the user's terminal (interactive) and always to the log (what
    // `synapse logs` shows, and the watcher's evidence of what was written before a crash).
    if let Some(dir) = log.parent() {
        crate::private_files::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // What the wrapper before this one left in the log is read before anything of this one's
    // goes in.
    let (before_restart, log_file) =
        watcher::open_log(log, terminal_log::max_bytes()).with_context(|| format!("cannot open {}", log.display()))?;
    let sink: Box<dyn Write + Send> =
        if interactive { Box::new(pty::Tee(std::io::stdout(), log_file)) } else { Box::new(log_file) };
    let output_done = pty::spawn_reader(cli.reader, sink, shared.screen.clone())?;
    let child_exit = pty::spawn_waiter(cli.child)?;

    let _raw = if interactive { Some(terminal::RawMode::enable()?) } else { None };
    if interactive {
        keyboard::spawn_keyboard(shared.clone());
        keyboard::spawn_resize(shared.clone());
    }
    tokio::spawn(reporter::report_status(shared.clone()));
    tokio::spawn(watcher::watch_inbox(shared.clone(), before_restart));
    if hook_delivery {
        tokio::spawn(hooks::serve(shared.clone()));
    }

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

#[cfg(test)]
mod tests {
    use super::ReportOrder;
    use std::time::Duration;

    /// Does the acknowledgement's wait end without anything else happening? (A zero timeout
    /// polls the wait once.)
    async fn acknowledgement_may_go(order: &ReportOrder) -> bool {
        tokio::time::timeout(Duration::ZERO, order.no_ready_from_before_the_last_write()).await.is_ok()
    }

    #[tokio::test]
    async fn an_acknowledgement_waits_for_a_ready_decided_before_the_write_and_only_for_that() {
        let order = ReportOrder::default();
        assert!(acknowledgement_may_go(&order).await, "nothing posted, nothing written");

        // READY decided at the prompt, then a ticket written while it is on its way: the
        // acknowledgement waits until that READY has its answer.
        assert_eq!(order.decide(|| ("ready", true)), "ready");
        order.count_write(|| {});
        assert!(!acknowledgement_may_go(&order).await, "the READY from before the write may land after it");
        let order = std::sync::Arc::new(order);
        let waiting = tokio::spawn({
            let order = order.clone();
            async move { order.no_ready_from_before_the_last_write().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the acknowledgement went before the READY had its answer");
        order.posted();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the acknowledgement still waits after the READY's answer")
            .unwrap();
        assert!(acknowledgement_may_go(&order).await);

        // A READY decided after the write (the CLI back at its prompt) does not hold it up.
        order.decide(|| ((), true));
        assert!(acknowledgement_may_go(&order).await, "a READY from after the write held the acknowledgement");
        // Nor does a report that is not READY, decided before a later write.
        order.posted();
        order.decide(|| ((), false));
        order.count_write(|| {});
        assert!(acknowledgement_may_go(&order).await, "a PROCESSING report held the acknowledgement");
    }

    #[test]
    fn a_write_is_counted_in_one_step_with_what_it_records() {
        let order = ReportOrder::default();
        order.count_write(|| assert!(order.counts.try_lock().is_err(), "recorded outside the step"));
        assert_eq!(order.counts().writes, 1);
        order.decide(|| (assert!(order.counts.try_lock().is_err(), "decided outside the step"), false));
    }
}
