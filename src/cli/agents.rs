//! `synapse <profile>`, `synapse start|stop|logs`, `synapse dummy-agent`.

use crate::agent::{profile, wrapper};
use crate::api::{AgentView, Announce};
use crate::client::Client;
use crate::config::Paths;
use anyhow::{Context, bail};
use clap::Parser;
use std::io::{BufRead, Read, Seek, Write};
use std::time::Duration;

/// Arguments of `synapse <profile> ...` (parsed after the profile name).
#[derive(Parser, Debug, Clone)]
#[command(
    no_binary_name = true,
    name = "synapse <profile>",
    about = "Run an AI CLI (claude, gemini, codex, opencode, copilot, dummy) in a PTY as a Synapse agent"
)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub common: super::StartArgs,
    /// Run without a terminal, logging the CLI's output (what `synapse start` uses)
    #[arg(long, hide = true)]
    pub headless: bool,
    /// Print the registration as one JSON line once running (for `synapse start`)
    #[arg(long, hide = true)]
    pub announce: bool,
}

/// `synapse <profile> [--port N] [--name NAME] [--role ROLE] [-- tool args]`.
///
/// The arguments are checked here (so `--help` and mistakes are answered by `synapse`), then
/// the wrapper's own executable takes this process's place when it is installed beside this
/// one ([`crate::config::WRAPPER_BIN`]: same pid, same terminal, a smaller program for the
/// agent's lifetime); without it, or if it cannot be run, the wrapper runs in this process.
pub fn run_profile(paths: Paths, words: Vec<std::ffi::OsString>) -> anyhow::Result<i32> {
    let (profile, args) = match parse_profile(&paths, words.clone())? {
        Ok(parsed) => parsed,
        Err(code) => return Ok(code),
    };
    let in_place = std::env::var_os(crate::config::WRAPPER_IN_PLACE_ENV).is_some();
    if !in_place
        && let Some(wrapper) = crate::config::wrapper_exe()
        && let Ok(main) = std::env::current_exe()
    {
        let build = std::ffi::OsString::from(crate::config::BUILD_ID);
        let env = [(crate::config::MAIN_EXE_ENV, main.into_os_string()), (crate::config::WRAPPER_BUILD_ENV, build)];
        let error = exec_in_this_process(&wrapper, words.iter().cloned(), &env);
        tracing::warn!("cannot run {}: {error}; the wrapper runs in this process", wrapper.display());
    }
    wrap(paths, profile, args)
}

/// What `synapse-agent` does first: a wrapper of this build, run by `synapse`, goes on (and
/// knows that `synapse`); one of another build (left beside a newer `synapse`, e.g. by `cargo
/// run`) hands the same arguments back to that `synapse`, which runs the wrapper in place.
/// Returns only to go on, or with the error that stopped it.
pub fn check_wrapper_build() -> anyhow::Result<()> {
    use crate::config::{BUILD_ID, MAIN_EXE_ENV, WRAPPER_BUILD_ENV, WRAPPER_IN_PLACE_ENV};
    let Some(main) = std::env::var_os(MAIN_EXE_ENV).map(std::path::PathBuf::from) else {
        bail!("{} is run by `synapse <profile>`: run that instead", crate::config::WRAPPER_BIN);
    };
    if std::env::var(WRAPPER_BUILD_ENV).is_ok_and(|build| build == BUILD_ID) {
        crate::config::set_main_exe(main);
        return Ok(());
    }
    let error = exec_in_this_process(&main, std::env::args_os().skip(1), &[(WRAPPER_IN_PLACE_ENV, "1".into())]);
    Err(anyhow::anyhow!("cannot run {}: {error}", main.display()))
}

/// Runs `program` in this process's place (exec: same pid, terminal and process group) with
/// `args`, this process's `argv[0]` (so `ps` shows what the user typed) and `env` added.
/// Returns only when that failed, with why.
fn exec_in_this_process(
    program: &std::path::Path,
    args: impl IntoIterator<Item = std::ffi::OsString>,
    env: &[(&str, std::ffi::OsString)],
) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(program);
    if let Some(name) = std::env::args_os().next() {
        command.arg0(name);
    }
    command.args(args).envs(env.iter().map(|(name, value)| (name, value))).exec()
}

/// The wrapper's executable: `synapse-agent <profile> [arguments]`, as [`run_profile`] passes
/// them on.
pub fn run_wrapper(paths: Paths, words: Vec<std::ffi::OsString>) -> anyhow::Result<i32> {
    match parse_profile(&paths, words)? {
        Ok((profile, args)) => wrap(paths, profile, args),
        Err(code) => Ok(code),
    }
}

/// The profile named by the first word and the arguments after it, or the exit status when
/// clap answered (help, or a usage error it printed).
fn parse_profile(
    paths: &Paths,
    words: Vec<std::ffi::OsString>,
) -> anyhow::Result<Result<(profile::Profile, ProfileArgs), i32>> {
    let mut words = words.into_iter();
    let name = words.next().map(|word| word.to_string_lossy().into_owned()).unwrap_or_default();
    let profile = profile::load(&name, &paths.home).map_err(|error| match super::similar_command(&name) {
        Some(command) => anyhow::anyhow!("{error}\nDid you mean `synapse {command}`?"),
        None => anyhow::anyhow!("{error}\nRun 'synapse --help' for the commands."),
    })?;
    match ProfileArgs::try_parse_from(words) {
        Ok(args) => Ok(Ok((profile, args))),
        Err(error) => {
            let _ = error.print();
            Ok(Err(if error.use_stderr() { 2 } else { 0 }))
        }
    }
}

fn wrap(paths: Paths, profile: profile::Profile, args: ProfileArgs) -> anyhow::Result<i32> {
    wrapper::run(
        paths,
        wrapper::Options {
            profile,
            port: args.common.port,
            name: args.common.name,
            role: args.common.role,
            tool_args: args.common.tool_args,
            no_mcp: args.common.no_mcp,
            headless: args.headless,
            announce: args.announce,
        },
    )
}

/// What `synapse start` runs for the scripted A2A agent (`synapse scenario-agent`).
pub const SCENARIO: &str = "scenario";

/// `synapse start <profile> ...`: the same agent in the background.
pub fn start(paths: &Paths, profile_name: &str, args: &ProfileArgs, json: bool) -> anyhow::Result<i32> {
    // The scenario agent (the A2A test agent) is no CLI in a PTY: it runs by itself.
    let scenario = profile_name == SCENARIO;
    if scenario {
        if args.common.role.is_some() || !args.common.tool_args.is_empty() || args.common.no_mcp {
            bail!("the {SCENARIO} agent takes only --port and --name");
        }
    } else {
        profile::load(profile_name, &paths.home)?;
    }
    paths.own_home()?;
    let logs = paths.home.join("logs");
    crate::private_files::create_dir(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let wrapper_log = paths.wrapper_log(profile_name);
    let log = crate::private_files::open_append(&wrapper_log)
        .with_context(|| format!("cannot open {}", wrapper_log.display()))?;
    let start_of_log = log.metadata().map(|meta| meta.len()).unwrap_or(0);
    let exe = crate::config::synapse_exe().context("cannot find the synapse executable")?;
    let mut command = std::process::Command::new(exe);
    if scenario {
        command.arg("scenario-agent");
    } else {
        command.arg(profile_name).args(["--headless", "--announce"]);
    }
    if let Some(port) = args.common.port {
        command.args(["--port", &port.to_string()]);
    }
    if let Some(name) = &args.common.name {
        command.args(["--name", name]);
    }
    if let Some(role) = &args.common.role {
        command.args(["--role", role]);
    }
    if args.common.no_mcp {
        command.arg("--no-mcp");
    }
    if !args.common.tool_args.is_empty() {
        command.arg("--").args(&args.common.tool_args);
    }
    command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().context("cannot start the agent wrapper")?;
    let stdout = child.stdout.take().context("no pipe from the wrapper")?;
    let (line_sender, line) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut first);
        let _ = line_sender.send(first);
    });
    let first = line.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
    let Ok(announce) = serde_json::from_str::<Announce>(&first) else {
        let _ = child.kill();
        let _ = child.wait();
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&wrapper_log) {
            let _ = file.seek(std::io::SeekFrom::Start(start_of_log));
            let _ = file.read_to_string(&mut text);
        }
        // The wrapper's own last words already carry main's "Error: " label: said once.
        let text = text.trim();
        bail!("the {profile_name} agent did not start: {}", text.strip_prefix("Error: ").unwrap_or(text));
    };
    // The wrapper runs on by itself (own process group); it is reaped by init.
    std::mem::forget(child);
    if json {
        // The wrapper's line as it wrote it.
        println!("{}", first.trim_end());
    } else {
        println!(
            "Started {} (pid {}). Terminal output: {}",
            announce.agent_id,
            announce.pid,
            announce.log.as_deref().unwrap_or_default()
        );
    }
    Ok(0)
}

/// The live agents a target names: id or name exactly, else every agent of a type.
async fn resolve(paths: &Paths, target: &str) -> anyhow::Result<Vec<AgentView>> {
    let mut client = Client::connect(paths, true).await?;
    let agents = client.agents().await?.agents;
    let exact: Vec<AgentView> = agents
        .iter()
        .filter(|agent| agent.agent_id == target || agent.name.as_deref() == Some(target))
        .cloned()
        .collect();
    if !exact.is_empty() {
        return Ok(exact);
    }
    Ok(agents.into_iter().filter(|agent| agent.agent_type == target).collect())
}

/// Why `synapse stop` may signal a registered agent's pid, or None when it may.
///
/// The rule: only a process Synapse itself started and that is still the registered agent —
/// it runs this very executable or the wrapper's beside it (`/proc/<pid>/exe` is the same
/// file as one of ours) and started at the time recorded when the broker checked its registration (so a pid
/// reused by another process is never signalled). A registration naming any other process (a
/// shell, a test, an editor) is listed and reachable, but never killed by `synapse stop`.
fn refusal_to_stop(agent: &AgentView, pid: u32) -> Option<String> {
    use crate::process;
    let Some(recorded) = agent.pid_start else {
        return Some(format!("its registration has no process start time to check pid {pid} against"));
    };
    if process::start_ticks(pid) != Some(recorded) {
        return Some(format!("process {pid} is not the one that registered (its pid was reused)"));
    }
    let synapse: Vec<std::path::PathBuf> =
        crate::config::synapse_exe().ok().into_iter().chain(crate::config::wrapper_exe()).collect();
    if !process::runs_one_of(pid, &synapse) {
        return Some(format!("process {pid} is not a synapse wrapper; Synapse stops only the agents it started"));
    }
    None
}

/// `synapse stop <agent|profile> [--all]`: SIGTERM, then SIGKILL after 5 s, only to wrappers
/// that Synapse started (see [`refusal_to_stop`]).
pub async fn stop(paths: &Paths, target: &str, all: bool, json: bool) -> anyhow::Result<i32> {
    let agents = resolve(paths, target).await?;
    if agents.is_empty() {
        bail!("No agent found matching '{target}'. Run 'synapse list' to see the running agents.");
    }
    if agents.len() > 1 && !all {
        let ids: Vec<&str> = agents.iter().map(|agent| agent.agent_id.as_str()).collect();
        bail!("'{target}' matches several agents: {}. Name one, or pass --all.", ids.join(", "));
    }
    let mut refused = Vec::new();
    let mut stopped = Vec::new();
    for agent in agents {
        let id = agent.agent_id.as_str();
        let Ok(pid) = i32::try_from(agent.pid) else { continue };
        if let Some(reason) = refusal_to_stop(&agent, pid.unsigned_abs()) {
            // Reported here and the others still stopped; the exit status says one was refused.
            if !json {
                eprintln!("Error: not stopping {id}: {reason}");
            }
            refused.push(serde_json::json!({"agent_id": id, "reason": reason}));
            continue;
        }
        crate::process::signal(pid, libc::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while crate::process::is_pid_alive(pid.unsigned_abs()) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let killed = crate::process::is_pid_alive(pid.unsigned_abs());
        if killed {
            crate::process::signal(pid, libc::SIGKILL);
        }
        if json {
            stopped.push(serde_json::json!({"agent_id": id, "pid": pid, "killed": killed}));
        } else if killed {
            println!("Killed {id} (pid {pid}) after 5 s");
        } else {
            println!("Stopped {id} (pid {pid})");
        }
    }
    if json {
        println!("{}", serde_json::json!({"stopped": stopped, "refused": refused}));
    }
    Ok(if refused.is_empty() { 0 } else { 1 })
}

/// Can `word` name an agent (id or name), and so never a path? Only letters, digits, `-`, `_`,
/// `.` and `@`, not starting with a dot: no `/`, no `..`, no control characters.
fn is_agent_word(word: &str) -> bool {
    !word.is_empty()
        && word.len() <= 128
        && !word.starts_with('.')
        && word.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

/// `synapse logs <agent> [--follow] [--raw]`: the agent's terminal log, its controls made visible
/// unless `--raw` (the log holds what the CLI printed, and through it what others sent).
pub async fn logs(paths: &Paths, target: &str, follow: bool, raw: bool) -> anyhow::Result<i32> {
    // A target that could be an id picks its file under logs/ directly (a stopped agent's log
    // too); anything else (a name such as `a/b`, which `start --name` takes) is asked of the
    // broker, never made into a path.
    let direct = is_agent_word(target).then(|| wrapper::log_path(paths, target)).filter(|path| path.is_file());
    let path = if let Some(direct) = direct {
        direct
    } else {
        let agents = resolve(paths, target).await?;
        match agents.as_slice() {
            [agent] => {
                let id = agent.agent_id.as_str();
                if !is_agent_word(id) {
                    bail!("the broker named agent '{}', which is not a valid id", crate::escape::visible_line(id));
                }
                wrapper::log_path(paths, id)
            }
            [] => bail!("No agent or log found matching '{target}'"),
            many => bail!(
                "'{target}' matches several agents: {}",
                many.iter().map(|agent| agent.agent_id.as_str()).collect::<Vec<_>>().join(", ")
            ),
        }
    };
    use std::os::unix::fs::MetadataExt;
    let open = crate::private_files::open_regular;
    let mut file = open(&path).with_context(|| format!("no terminal log at {}", path.display()))?;
    let mut inode = file.metadata()?.ino();
    let rotated = wrapper::rotated_log_path(&path);
    // The log before this one (its wrapper started a new one at its bound) comes first, unless
    // that is the file just opened, renamed since.
    let older = open(&rotated).ok().filter(|older| older.metadata().is_ok_and(|meta| meta.ino() != inode));
    let mut out = LogOutput { raw, buffer: vec![0u8; 64 * 1024], escaper: crate::escape::VisibleStream::default() };
    // The logs shown that may still be the one before the current one, kept open: an inode is
    // not given to a new file while its file is open, so one shown is known again by its inode.
    let mut shown: Vec<std::fs::File> = Vec::new();
    if let Some(mut older) = older {
        if let Err(error) = out.copy(&mut older)? {
            return super::output_failed(&error);
        }
        shown.push(older);
    }
    loop {
        if let Err(error) = out.copy(&mut file)? {
            return super::output_failed(&error);
        }
        if !follow {
            return Ok(out.finish());
        }
        // Like `tail -F`: the log is a plain file written by another process, which renames it
        // at its bound and begins a new one. The renamed one is read to its end first.
        let renamed = std::fs::metadata(&path).is_ok_and(|meta| meta.ino() != inode);
        let next = renamed.then(|| open(&path).ok()).flatten();
        let Some(next) = next else {
            // No change, or the new log not there yet (or not one that can be read).
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if let Err(error) = out.copy(&mut file)? {
            return super::output_failed(&error);
        }
        let next_inode = next.metadata()?.ino();
        let was_shown = |candidate: u64| {
            shown.iter().chain([&file]).any(|seen| seen.metadata().is_ok_and(|meta| meta.ino() == candidate))
        };
        // Rotated twice since it was last looked at: the log between the two, now the one
        // before the current one, comes first (not one shown already: the log removed by hand
        // leaves the older one in place).
        let between = open(&rotated)
            .ok()
            .filter(|between| between.metadata().is_ok_and(|meta| meta.ino() != next_inode && !was_shown(meta.ino())));
        let finished = std::mem::replace(&mut file, next);
        // Those shown that are still the log before the current one stay known (the log may be
        // removed by hand again before any rotation); the others are let go.
        let older = std::fs::metadata(&rotated).ok().map(|meta| meta.ino());
        shown.retain(|seen| seen.metadata().is_ok_and(|meta| Some(meta.ino()) == older));
        shown.push(finished);
        if let Some(mut between) = between {
            if let Err(error) = out.copy(&mut between)? {
                return super::output_failed(&error);
            }
            shown.push(between);
        }
        inode = next_inode;
        // What the new log already holds is shown next, after the log between.
    }
}

/// `synapse logs`' output: the log's bytes as they are (`--raw`) or with their controls made
/// visible.
struct LogOutput {
    raw: bool,
    buffer: Vec<u8>,
    escaper: crate::escape::VisibleStream,
}

impl LogOutput {
    /// Writes what `file` holds from where it was read last to its end. The log that cannot be
    /// read is the error; the output that cannot be written, the inner one.
    fn copy(&mut self, file: &mut std::fs::File) -> anyhow::Result<std::io::Result<()>> {
        let mut stdout = std::io::stdout();
        loop {
            let count = file.read(&mut self.buffer).context("cannot read the terminal log")?;
            if count == 0 {
                return Ok(Ok(()));
            }
            let chunk = &self.buffer[..count];
            let written =
                if self.raw { stdout.write_all(chunk) } else { stdout.write_all(self.escaper.push(chunk).as_bytes()) };
            if let Err(error) = written.and_then(|_| stdout.flush()) {
                return Ok(Err(error));
            }
        }
    }

    /// Ends the output (what the escaper still holds); the exit code.
    fn finish(mut self) -> i32 {
        if !self.raw {
            let rest = self.escaper.finish();
            let mut stdout = std::io::stdout();
            let _ = stdout.write_all(rest.as_bytes()).and_then(|_| stdout.flush());
        }
        0
    }
}
