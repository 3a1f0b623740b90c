//! The five real AI CLIs, end to end against the scripted model (issue 11): each runs in
//! `synapse <cli>` inside a PTY this test owns (it is the user's terminal: it can type and read the
//! screen), configured in a temporary HOME and work dir as tests/common/clis.rs describes.
//!
//! They need `tools/install-clis`; without the CLIs each test is skipped with one line saying
//! so, except under `CI=true`, where a missing CLI is a failure. nextest runs at most two of these
//! at a time (.config/nextest.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::clis::{self, CLI_NAMES, ScriptedModel};
use common::*;
use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest wait for anything a CLI does (start-up of a cold node program included).
const DEADLINE: Duration = Duration::from_secs(90);

/// The CLI's executable, or None (and one line on stderr) when it is not installed; under
/// CI=true a missing CLI fails the test.
fn installed(name: &str) -> Option<PathBuf> {
    if let Some(path) = clis::cli_binary(name) {
        return Some(path);
    }
    let hint = format!("{name} is not installed in {}: run tools/install-clis", clis::clis_dir().display());
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{hint}");
    eprintln!("SKIPPED: {hint}");
    None
}

/// How long one test may wait in all: less than nextest's limit for this binary (240 s,
/// .config/nextest.toml), so a test that waits too long fails with its description instead of
/// being killed without one.
const TEST_DEADLINE: Duration = Duration::from_secs(210);

std::thread_local! {
    /// When this test's waiting ends ([`TEST_DEADLINE`] after its [`World`] was made).
    static WAITING_ENDS: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Waits until `done` holds, checking every 50 ms, or fails with `what` and `describe()`: after
/// [`DEADLINE`], or sooner when the test's own deadline comes first.
fn wait_for(what: &str, mut done: impl FnMut() -> bool, describe: impl Fn() -> String) {
    let own = Instant::now() + DEADLINE;
    let deadline = WAITING_ENDS.get().map_or(own, |ends| ends.min(own));
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", describe());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Synapse home and a scripted model, shared by the sessions of one test.
struct World {
    home: Home,
    model: ScriptedModel,
}

impl World {
    fn new() -> Arc<World> {
        WAITING_ENDS.set(Some(Instant::now() + TEST_DEADLINE));
        let home = Home::new_in(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("real-clis"));
        let model = ScriptedModel::start(Some(&home.dir.path().join("model.jsonl")));
        Arc::new(World { home, model })
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.home.run(&["broker", "stop"]);
    }
}

/// One real CLI wrapped by `synapse <cli>` in a PTY of ours.
struct Session {
    world: Arc<World>,
    cli: &'static str,
    name: String,
    agent_id: String,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    keyboard: Box<dyn Write + Send>,
    screen: Arc<Mutex<vt100::Parser>>,
    /// The wrapper's standard error (its tracing log).
    wrapper_log: PathBuf,
    _master: Box<dyn MasterPty + Send>,
}

/// PATH for the CLI: this build's `synapse` first (the model's shell tool calls it), then the
/// installed CLIs, then the system's.
fn search_path() -> String {
    let synapse_dir = Path::new(BIN).parent().unwrap().display().to_string();
    let clis_bin = clis::clis_dir().join("node_modules/.bin").display().to_string();
    format!("{synapse_dir}:{clis_bin}:{}", std::env::var("PATH").unwrap_or_default())
}

impl Session {
    /// Starts `synapse <cli> --name <name>` in a new home with a new scripted model; None when the
    /// CLI is not installed (skipped).
    fn start(cli: &'static str, name: &str) -> Option<Session> {
        installed(cli)?;
        Some(Session::start_in(World::new(), cli, name))
    }

    fn start_in(world: Arc<World>, cli: &'static str, name: &str) -> Session {
        Session::start_with(world, cli, name, &[], &[])
    }

    /// [`Session::start_in`] with more flags for `synapse <cli>` (`--no-mcp`) and more
    /// environment variables (after the set-up's).
    fn start_with(
        world: Arc<World>,
        cli: &'static str,
        name: &str,
        flags: &[&str],
        more_env: &[(&str, String)],
    ) -> Session {
        let (home, model) = (&world.home, &world.model);
        let cli_home = home.dir.path().join(format!("{name}-home"));
        let work = home.dir.path().join(format!("{name}-work"));
        let setup = clis::setup(cli, &cli_home, &work, model.port).unwrap();
        let pty =
            native_pty_system().openpty(PtySize { rows: 40, cols: 120, pixel_width: 0, pixel_height: 0 }).unwrap();
        // The wrapper's own log (standard error) goes to a file the failure description shows,
        // not onto the screen under test: `sh` points it there and becomes the wrapper (whose
        // log, not on a terminal, then stays there).
        let wrapper_log = home.dir.path().join(format!("{name}-wrapper.log"));
        let mut command = CommandBuilder::new("/bin/sh");
        command.args(["-c", "exec \"$0\" \"$@\" 2>>\"$SYNAPSE_TEST_WRAPPER_LOG\"", BIN]);
        command.env("SYNAPSE_TEST_WRAPPER_LOG", &wrapper_log);
        command.args([cli, "--name", name]);
        command.args(flags);
        // The profile passes its own arguments (Codex: --no-daemon); the set-up's follow `--`.
        if !setup.args.is_empty() {
            command.arg("--");
            command.args(&setup.args);
        }
        command.cwd(&work);
        command.env("SYNAPSE_HOME", home.home());
        command.env("SYNAPSE_UDS_DIR", home.uds());
        command.env("SYNAPSE_BROKER_PORT", "0");
        command.env("PATH", search_path());
        command.env("TERM", "xterm-256color");
        command.env_remove("SYNAPSE_AGENT_ID");
        command.env_remove("SYNAPSE_AGENT_SECRET");
        command.env_remove("CI");
        for (key, value) in &setup.env {
            command.env(key, value);
        }
        for (key, value) in more_env {
            command.env(key, value);
        }
        let child = pty.slave.spawn_command(command).unwrap();
        drop(pty.slave);
        let screen = Arc::new(Mutex::new(vt100::Parser::new(40, 120, 0)));
        let mut reader = pty.master.try_clone_reader().unwrap();
        let collected = screen.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 8192];
            while let Ok(count) = reader.read(&mut buffer) {
                if count == 0 {
                    break;
                }
                collected.lock().unwrap().process(&buffer[..count]);
            }
        });
        let keyboard = pty.master.take_writer().unwrap();
        let mut session = Session {
            world: world.clone(),
            cli,
            name: name.to_string(),
            agent_id: String::new(),
            child,
            keyboard,
            screen,
            wrapper_log,
            _master: pty.master,
        };
        session.agent_id = session.wait_registered();
        session
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    /// The agent as `synapse list --json` shows it.
    fn agent(&self) -> Option<Value> {
        let output = self.world.home.run(&["list", "--json"]);
        let list: Value = serde_json::from_slice(&output.stdout).ok()?;
        let agents = list["agents"].as_array().cloned().or_else(|| list.as_array().cloned())?;
        agents.into_iter().find(|agent| agent["name"] == self.name.as_str())
    }

    fn status(&self) -> String {
        self.agent().and_then(|agent| agent["status"].as_str().map(str::to_string)).unwrap_or_default()
    }

    fn describe(&self) -> String {
        let cursor = self.screen.lock().unwrap().screen().cursor_position();
        format!(
            "{} ({}) status {:?}\n--- screen (cursor at row, column {:?}) ---\n{}\n--- wrapper log ---\n{}\n--- model requests ---\n{}",
            self.cli,
            self.agent_id,
            self.status(),
            cursor,
            self.screen(),
            std::fs::read_to_string(&self.wrapper_log).unwrap_or_default(),
            self.world
                .model
                .requests()
                .iter()
                .map(|request| format!(
                    "{} internal={} {:?}",
                    request["path"],
                    request["internal"],
                    request["last_user_text"].as_str().unwrap_or_default()
                ))
                .collect::<Vec<_>>()
                .join("\n")
        )
    }

    fn wait_registered(&self) -> String {
        let mut id = String::new();
        wait_for(
            "the agent to register",
            || match self.agent() {
                Some(agent) => {
                    id = agent["agent_id"].as_str().unwrap_or_default().to_string();
                    true
                }
                None => false,
            },
            || self.screen(),
        );
        id
    }

    fn wait_status(&self, status: &str) {
        wait_for(&format!("{} {status}", self.cli), || self.status() == status, || self.describe());
    }

    fn wait_screen(&self, text: &str) {
        wait_for(&format!("{text:?} on {}'s screen", self.cli), || self.screen().contains(text), || self.describe());
    }

    /// How many of the model's requests brought `needle` as the user's new turn.
    fn reached_model(&self, needle: &str) -> usize {
        self.world.model.count_user_text(needle)
    }

    fn wait_reached_model(&self, needle: &str) {
        wait_for(&format!("{needle:?} to reach the model"), || self.reached_model(needle) > 0, || self.describe());
    }

    fn type_keys(&mut self, bytes: &[u8]) {
        self.keyboard.write_all(bytes).unwrap();
        self.keyboard.flush().unwrap();
    }

    /// `synapse send <agent> ...` from the user's shell (no agent identity).
    fn send(&self, args: &[&str]) -> String {
        let mut full = vec!["send", self.agent_id.as_str()];
        full.extend_from_slice(args);
        self.world.home.ok(&full)
    }

    /// The ticket numbers still queued for the agent.
    fn queued(&self) -> usize {
        self.world
            .home
            .inbox(&Agent { id: self.agent_id.clone(), secret: String::new(), port: 0, socket: PathBuf::new() })
            .len()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start → READY; a plain message reaches the model exactly once; a multi-line and a long
/// (file-reference) message arrive intact; `send --response --wait` gets the answer the model
/// gave through the CLI's own shell tool (`synapse reply "4"`), which also proves the shell knows
/// which agent it is in.
fn round_trip(cli: &'static str) {
    let Some(session) = Session::start(cli, "solo") else { return };
    session.wait_status("READY");

    session.send(&["plain-marker-one hello", "--no-response"]);
    session.wait_reached_model("plain-marker-one");
    session.wait_status("READY");
    assert_eq!(session.reached_model("plain-marker-one"), 1, "{}", session.describe());

    let lines = "multi-marker first line\nsecond line\nthird line";
    session.send(&[lines, "--no-response"]);
    session.wait_reached_model("multi-marker");
    let request = session
        .world
        .model
        .requests()
        .into_iter()
        .rev()
        .find(|request| request["last_user_text"].as_str().is_some_and(|text| text.contains("multi-marker")));
    let text = request.as_ref().and_then(|request| request["last_user_text"].as_str()).unwrap_or_default();
    assert!(text.contains("multi-marker first line\nsecond line\nthird line"), "{text:?}\n{}", session.describe());
    session.wait_status("READY");

    let long: String = format!("long-marker {}", "0123456789 ".repeat(40));
    session.send(&[&long, "--no-response"]);
    session.wait_reached_model("[LONG MESSAGE - FILE ATTACHED]");
    let files = std::fs::read_dir(session.world.home.home().join("messages").join(&session.agent_id)).unwrap();
    let contents: Vec<String> = files.map(|file| std::fs::read_to_string(file.unwrap().path()).unwrap()).collect();
    assert!(contents.contains(&long), "the long message's file holds it whole");
    session.wait_status("READY");

    let answer = session.send(&["[q] what is 2+2", "--response", "--wait", "60"]);
    assert_eq!(answer.lines().last().map(str::trim), Some("4"), "{answer}\n{}", session.describe());
    assert_eq!(session.reached_model("what is 2+2"), 1, "{}", session.describe());
    // The model answered with the Synapse MCP tool the CLI was given at start (not its shell),
    // and no permission dialog stopped it (the answer came back). Gemini reads its per-session
    // settings only where root owns every directory above them: elsewhere it says so at start
    // and the answer goes through the shell.
    let calls: Vec<String> = session
        .world
        .model
        .requests()
        .iter()
        .filter_map(|request| request["tool"].as_str().map(str::to_string))
        .collect();
    let refused = cli == "gemini"
        && synapse::agent::mcp_wiring::gemini_refuses(&session.world.home.home().join("agents")).is_some();
    if refused {
        assert!(calls.iter().any(|tool| tool == "run_shell_command"), "{calls:?}\n{}", session.describe());
    } else {
        assert!(
            calls.iter().any(|tool| tool.contains("synapse") && tool.ends_with("reply") || tool == "reply"),
            "no call of the MCP reply tool: {calls:?}\n{}",
            session.describe()
        );
    }
}

/// The model asks to run a command the CLI does not allow by itself: the permission dialog makes
/// the agent WAITING, a message sent meanwhile stays queued (its keystrokes never answer the
/// dialog), and once the test answers the dialog (Esc: deny) the message arrives, once.
fn dialog(cli: &'static str, deny: &[u8]) {
    let Some(mut session) = Session::start(cli, "asker") else { return };
    session.wait_status("READY");
    session.send(&["please run: touch permission-probe", "--no-response"]);
    session.wait_status("WAITING");
    session.send(&["queued-marker while the dialog is up", "--no-response"]);
    // The watcher has taken the ticket and holds it, saying why: nothing is typed.
    wait_for(
        "the watcher to hold the ticket for the dialog",
        || {
            session.agent().is_some_and(|agent| {
                agent["status_note"].as_str().is_some_and(|note| note.contains("a dialog is open"))
            })
        },
        || session.describe(),
    );
    assert_eq!(session.queued(), 1, "{}", session.describe());
    assert_eq!(session.reached_model("queued-marker"), 0, "{}", session.describe());
    assert_eq!(session.status(), "WAITING", "{}", session.describe());
    session.type_keys(deny);
    session.wait_reached_model("queued-marker");
    session.wait_status("READY");
    assert_eq!(session.reached_model("queued-marker"), 1, "{}", session.describe());
    assert!(
        !session.world.home.dir.path().join("asker-work/permission-probe").exists(),
        "the command was not approved"
    );
}

/// Priority 5 during a slow streamed answer interrupts it (Ctrl-C, or Esc twice for OpenCode); the
/// CLI survives, and the priority-5 message then reaches the model once.
fn interrupt(cli: &'static str) {
    let Some(session) = Session::start(cli, "busy") else { return };
    session.wait_status("READY");
    session.send(&["slow-marker please answer slow", "--no-response"]);
    session.wait_reached_model("slow-marker");
    // The answer is streaming (an interrupt before the first words makes Claude put the message
    // back into its input box, where it waits for the user like half-typed text).
    session.wait_screen("tick 2");
    session.wait_status("PROCESSING");
    session.send(&["urgent-marker stop now", "--no-response", "-p", "5"]);
    // The interrupt cut the slow answer short (it would run about 60 s): the CLI went away from
    // its stream. Without it, the message would still arrive, after the whole answer.
    wait_for("the slow answer cut short", || session.world.model.slow_answers_cut() >= 1, || session.describe());
    session.wait_reached_model("urgent-marker");
    session.wait_status("READY");
    assert_eq!(session.reached_model("urgent-marker"), 1, "{}", session.describe());
    assert!(session.agent().is_some(), "the CLI survived the interrupt: {}", session.describe());
}

/// Two priority-5 messages right behind each other while the CLI works: each interrupts the work
/// before it (the first a slow answer, the second the first's own slow answer), and the CLI
/// survives both. A second Ctrl-C soon after the first ends Gemini CLI (within 3 s) and others:
/// the real-CLI soak of 2026-12-08 lost the second message with the CLI; the second interrupt now
/// waits until a Ctrl-C interrupts again.
fn two_interrupts(cli: &'static str) {
    let Some(session) = Session::start(cli, "busy") else { return };
    session.wait_status("READY");
    session.send(&["slow-marker please answer slow", "--no-response"]);
    session.wait_reached_model("slow-marker please");
    session.wait_screen("tick 2");
    session.wait_status("PROCESSING");
    session.send(&["urgent-one slow-marker again", "--no-response", "-p", "5"]);
    session.send(&["urgent-two stop now", "--no-response", "-p", "5"]);
    wait_for("both slow answers cut short", || session.world.model.slow_answers_cut() >= 2, || session.describe());
    session.wait_reached_model("urgent-two");
    session.wait_status("READY");
    wait_for("both tickets acknowledged", || session.queued() == 0, || session.describe());
    assert_eq!(session.reached_model("urgent-one"), 1, "{}", session.describe());
    assert_eq!(session.reached_model("urgent-two"), 1, "{}", session.describe());
    assert!(session.agent().is_some(), "the CLI survived both interrupts: {}", session.describe());
}

/// Priority 5 right behind a message the model has not begun to answer (it is silent for a
/// minute): the interrupt cuts that request, and the priority-5 message reaches the model once,
/// without the user's help. (Claude puts an interrupted message the model had not answered back
/// into its input box; the priority-5 message goes in with it, so the first one is not lost.)
fn interrupt_before_the_first_words(cli: &'static str) {
    let Some(session) = Session::start(cli, "busy") else { return };
    session.wait_status("READY");
    session.send(&["hesitate-marker take your time", "--no-response"]);
    session.wait_reached_model("hesitate-marker");
    session.send(&["urgent-marker stop now", "--no-response", "-p", "5"]);
    wait_for("the silent answer cut short", || session.world.model.slow_answers_cut() >= 1, || session.describe());
    session.wait_reached_model("urgent-marker");
    session.wait_status("READY");
    assert_eq!(session.reached_model("urgent-marker"), 1, "{}", session.describe());
    wait_for("both tickets acknowledged", || session.queued() == 0, || session.describe());
    if cli == "claude" {
        // The message Claude put back went to the model again, in the same turn, on a line
        // before the priority-5 one.
        let requests = session.world.model.requests();
        let urgent = requests
            .iter()
            .filter_map(|request| request["last_user_text"].as_str())
            .find(|text| text.contains("urgent-marker"))
            .unwrap_or_default();
        let first = urgent.find("hesitate-marker");
        assert!(first.is_some_and(|at| urgent[at..].contains("\n[A2A:")), "{urgent:?}\n{}", session.describe());
    }
    assert!(session.agent().is_some(), "the CLI survived the interrupt: {}", session.describe());
}

/// SPEC §3: cancelling the task the CLI works on (a slow streamed answer) interrupts it as
/// priority 5 does; the CLI survives, and the model is told once that the task was canceled.
fn cancel(cli: &'static str) {
    let Some(session) = Session::start(cli, "busy") else { return };
    session.wait_status("READY");
    let sent = session.send(&["slow-marker please answer slow", "--response", "--json"]);
    let sent: Value = serde_json::from_str(&sent).unwrap_or_else(|_| panic!("{sent}"));
    let task = sent["task"]["id"].as_str().unwrap().to_string();
    // The id the message was shown with (the user's own task), which the notice names.
    let shown = sent["sender_task"]["id"].as_str().unwrap().to_string();
    session.wait_reached_model("slow-marker");
    session.wait_screen("tick 2");
    session.wait_status("PROCESSING");
    // Acknowledged as written (the task is working), so the cancel finds the CLI on it.
    let state = || session.world.home.http("GET", &format!("/tasks/{task}"), None, &[]).1["task"]["status"].clone();
    wait_for("the task working", || state() == "working", || session.describe());
    session.world.home.ok(&["cancel", &task]);
    wait_for("the slow answer cut short", || session.world.model.slow_answers_cut() >= 1, || session.describe());
    let notice = format!("[A2A:{}:user:CANCELED] Canceled: canceled by the user", &shown[..8]);
    session.wait_reached_model(&notice);
    session.wait_status("READY");
    assert_eq!(session.reached_model(&notice), 1, "{}", session.describe());
    assert!(session.agent().is_some(), "the CLI survived the interrupt: {}", session.describe());
}

/// A half-typed line of the user is never merged with a message: the message waits until the
/// input box is empty again.
fn half_typed(cli: &'static str) {
    let Some(mut session) = Session::start(cli, "typist") else { return };
    session.wait_status("READY");
    session.type_keys(b"userhalf");
    session.wait_screen("userhalf");
    session.wait_status("PROCESSING");
    session.send(&["merge-marker from another agent", "--no-response"]);
    wait_for("the ticket queued", || session.queued() == 1, || session.describe());
    // The user deletes what they typed: the box is empty, the message goes in alone.
    session.type_keys(&[0x7f; 8]);
    session.wait_reached_model("merge-marker");
    let merged = session
        .world
        .model
        .requests()
        .iter()
        .any(|request| request["last_user_text"].as_str().is_some_and(|text| text.contains("userhalf")));
    assert!(!merged, "{}", session.describe());
}

/// A message sent while the model is in a long tool run (`sleep 4` through the shell tool) reaches
/// the model through the CLI's own hook at the end of that tool (`synapse hook PostToolUse` /
/// `AfterTool`), inside the same turn: never typed as a new turn, acknowledged once, and a
/// message sent after it is typed as usual once the CLI is back at its prompt.
fn hook_delivery(cli: &'static str) {
    let Some(session) = Session::start(cli, "busy") else { return };
    session.wait_status("READY");
    session.send(&["please run: sleep 4", "--no-response"]);
    wait_for(
        "the model to start the long tool run",
        || session.world.model.requests().iter().any(|request| request["tool"].as_str().is_some()),
        || session.describe(),
    );
    session.send(&["hook-marker sent while busy", "--no-response"]);
    let in_a_request = |needle: &str| {
        session.world.model.requests().iter().filter(|request| request["body"].to_string().contains(needle)).count()
    };
    // Gemini runs the hook only where it reads its per-session settings (root owns the path):
    // elsewhere the message waits for the prompt and is typed, once.
    let hooked = cli != "gemini"
        || synapse::agent::mcp_wiring::gemini_refuses(&session.world.home.home().join("agents")).is_none();
    wait_for("the hook to hand the message to the model", || in_a_request("hook-marker") > 0, || session.describe());
    if hooked {
        // The hook ends only once the wrapper has recorded what it printed.
        assert_eq!(session.queued(), 0, "handed over and acknowledged\n{}", session.describe());
    } else {
        // Typed: acknowledged once the CLI has reacted, which can come after the model's request.
        wait_for("the typed message acknowledged", || session.queued() == 0, || session.describe());
    }
    session.wait_status("READY");
    session.send(&["after-marker typed at the prompt", "--no-response"]);
    session.wait_reached_model("after-marker");
    let typed = usize::from(!hooked);
    assert_eq!(session.reached_model("hook-marker"), typed, "typed only without the hook\n{}", session.describe());
    // The last message is acknowledged once the CLI has reacted to it, which can come after the
    // model has its request: wait for the third acknowledgement, then there must be no more.
    let acks =
        || session.world.home.events().iter().filter(|event| event["event"]["kind"] == "ticket_injected").count();
    wait_for("the third acknowledgement", || acks() >= 3, || session.describe());
    session.wait_status("READY");
    assert_eq!(acks(), 3, "three tickets, each acknowledged once\n{}", session.describe());
}

#[test]
fn claude_hands_a_busy_message_over_by_its_hook() {
    hook_delivery("claude");
}

#[test]
fn gemini_hands_a_busy_message_over_by_its_hook() {
    hook_delivery("gemini");
}

macro_rules! per_cli {
    ($($cli:ident),*) => {
        $(
            mod $cli {
                #[test]
                fn round_trip() {
                    super::round_trip(stringify!($cli));
                }
                #[test]
                fn dialog_holds_messages_until_answered() {
                    super::dialog(stringify!($cli), b"\x1b");
                }
                #[test]
                fn priority_five_interrupts_and_the_cli_survives() {
                    super::interrupt(stringify!($cli));
                }
                #[test]
                fn priority_five_right_behind_a_message_reaches_the_model() {
                    super::interrupt_before_the_first_words(stringify!($cli));
                }
                #[test]
                fn cancelling_its_task_interrupts_it() {
                    super::cancel(stringify!($cli));
                }
                #[test]
                fn a_half_typed_line_is_not_merged() {
                    super::half_typed(stringify!($cli));
                }
            }
        )*
    };
}

per_cli!(claude, codex, gemini, opencode, copilot);

/// The CLIs interrupted with Ctrl-C, which a second Ctrl-C soon after may end.
macro_rules! per_ctrl_c_cli {
    ($($cli:ident),*) => {
        $(
            #[test]
            fn $cli() {
                super::two_interrupts(stringify!($cli));
            }
        )*
    };
}

mod two_priority_five_messages_in_a_row_interrupt_twice_and_the_cli_survives {
    per_ctrl_c_cli!(claude, codex, gemini, copilot);
}

#[test]
fn the_five_clis_are_installed() {
    for name in CLI_NAMES {
        let _ = installed(name);
    }
}

/// Claude asks Codex with `--response` through its own shell tool; Codex answers through its
/// shell tool with `synapse reply`; the answer comes back into Claude's terminal as
/// `[A2A:<id8>:<codex agent>:REPLY] 4` (and so reaches Claude's model).
#[test]
fn claude_asks_codex_and_the_reply_comes_back_into_claudes_terminal() {
    if installed("claude").is_none() || installed("codex").is_none() {
        return;
    }
    let world = World::new();
    let codex = Session::start_in(world.clone(), "codex", "coder");
    let claude = Session::start_in(world.clone(), "claude", "lead");
    codex.wait_status("READY");
    claude.wait_status("READY");
    claude.send(&["please run: synapse send coder \"[q] what is 2+2\" --response", "--no-response"]);
    let reply = format!(":{}:REPLY] 4", codex.agent_id);
    claude.wait_reached_model(&reply);
    codex.wait_status("READY");
    assert_eq!(claude.reached_model(&reply), 1, "{}", claude.describe());
    assert_eq!(codex.reached_model(&format!(":{}:R] [q] what is 2+2", claude.agent_id)), 1, "{}", codex.describe());
}

/// A user who names an OpenCode config file of their own (`OPENCODE_CONFIG`) that reads a file
/// beside it (`{file:./who.txt}`): Synapse's copy, with its MCP server added, is elsewhere, and
/// OpenCode resolves such a path against the file it reads. Until 2026-11-28 the reference named
/// a file beside the copy, and OpenCode refused the whole config and did not start.
#[test]
fn opencode_starts_with_a_users_config_that_reads_a_file_beside_it() {
    if installed("opencode").is_none() {
        return;
    }
    let world = World::new();
    let own = world.home.dir.path().join("own-config");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::write(own.join("who.txt"), "tester\n").unwrap();
    std::fs::write(own.join("opencode.jsonc"), "// mine\n{\"username\": \"{file:./who.txt}\"}\n").unwrap();
    let config = own.join("opencode.jsonc").display().to_string();
    let session = Session::start_with(world.clone(), "opencode", "own", &[], &[("OPENCODE_CONFIG", config)]);
    session.wait_status("READY");
    let answer = session.send(&["[q] what is 2+2", "--response", "--wait", "60"]);
    assert_eq!(answer.lines().last().map(str::trim), Some("4"), "{answer}\n{}", session.describe());
    let calls: Vec<String> =
        world.model.requests().iter().filter_map(|request| request["tool"].as_str().map(str::to_string)).collect();
    assert!(calls.iter().any(|tool| tool == "synapse_reply"), "by the MCP tool: {calls:?}\n{}", session.describe());
}

/// Two Codex agents side by side each answer as themselves, one through the Synapse MCP tool it
/// was given, one (`--no-mcp`) through its own shell tool: a `synapse reply` run with the other's
/// identity would find no question to answer (REAL_CLIS.md: Codex's shared app-server once ran
/// one agent's commands with the other's environment).
#[test]
fn two_codex_agents_answer_each_as_itself() {
    if installed("codex").is_none() {
        return;
    }
    let world = World::new();
    let one = Session::start_in(world.clone(), "codex", "one");
    let two = Session::start_with(world.clone(), "codex", "two", &["--no-mcp"], &[]);
    one.wait_status("READY");
    two.wait_status("READY");
    for session in [&one, &two] {
        let answer = session.send(&["[q] what is 2+2", "--response", "--wait", "60"]);
        assert_eq!(answer.lines().last().map(str::trim), Some("4"), "{answer}\n{}", session.describe());
    }
    let replies: Vec<String> = world
        .home
        .events()
        .iter()
        .filter(|event| event["event"]["kind"] == "reply_posted")
        .filter_map(|event| event["actor"].as_str().map(str::to_string))
        .collect();
    assert_eq!(replies, [one.agent_id.clone(), two.agent_id.clone()], "each replied as itself");
    let calls: Vec<String> =
        world.model.requests().iter().filter_map(|request| request["tool"].as_str().map(str::to_string)).collect();
    assert_eq!(calls, ["mcp__synapse::reply", "exec_command"], "one by its MCP tool, two (--no-mcp) by its shell");
    let registrations: Vec<String> = std::fs::read_dir(world.home.home().join("agents"))
        .map(|entries| entries.map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(
        !registrations.iter().any(|name| name.starts_with(&format!("{}.", two.agent_id))),
        "--no-mcp writes no MCP registration: {registrations:?}"
    );
}
