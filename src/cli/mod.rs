//! Command-line definitions (clap) and dispatch. Each command group lives in its own module.
//!
//! Exit codes: 0 success, 1 user error (bad input, unknown agent, refused by the broker),
//! 2 usage (clap). Raw flags become validated values here, before anything talks to the broker.

mod agents;
pub use agents::{check_wrapper_build, run_wrapper};
mod dashboard;
mod demo;
mod doctor;
mod external;
mod file_safety;
mod history;
mod messaging;
pub mod reference;
mod setup;
mod system;
mod table;

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "synapse",
    version,
    about = "Let AI coding CLIs work together: send, reply, interrupt, look back",
    long_about = "Synapse runs AI coding CLIs side by side and carries messages between them.\n\
Every message, reply and state change is an event in one durable log kept by a broker\n\
(started on demand). State lives in SYNAPSE_HOME (default ~/.synapse); sockets in\n\
SYNAPSE_UDS_DIR (default /tmp/synapse-a2a).\n\n\
Run an agent with `synapse <profile> [--name NAME] [--port N] [-- tool args]`, where the profile is\n\
claude, gemini, codex, opencode, copilot or dummy (or one in SYNAPSE_HOME/profiles).\n\
New here? `synapse demo` shows two agents talking."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Parses this process's arguments ([`parse_from`]).
pub fn parse_args() -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Parses a command line. `synapse send` and `synapse reply`, the commands agents run most,
/// are first tried against a tree of those two commands alone: clap builds every argument of
/// every subcommand before it parses, which took about 0.3 ms of a 2 ms `synapse send` here
/// (issue 16). Anything that tree does not accept as it stands (`--help`, a mistake, a flag it
/// does not know) is parsed again by the whole tree, so help and errors read as they always did.
pub fn parse_from(args: impl IntoIterator<Item = OsString>) -> Result<Cli, clap::Error> {
    let args: Vec<OsString> = args.into_iter().collect();
    if matches!(args.get(1).and_then(|word| word.to_str()), Some("send" | "reply"))
        && let Ok(parsed) = FrequentCli::try_parse_from(&args)
    {
        let command = match parsed.command {
            FrequentCommand::Send(args) => Command::Send(args),
            FrequentCommand::Reply(args) => Command::Reply(args),
        };
        return Ok(Cli { command });
    }
    Cli::try_parse_from(args)
}

/// The part of [`Cli`] that [`parse_from`] tries first: the same argument types, so a command
/// line it accepts means what the whole tree makes of it.
#[derive(Parser, Debug)]
#[command(name = "synapse")]
struct FrequentCli {
    #[command(subcommand)]
    command: FrequentCommand,
}

#[derive(Subcommand, Debug)]
enum FrequentCommand {
    Send(SendArgs),
    Reply(ReplyArgs),
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the broker in the foreground, or control the running one
    Broker(BrokerArgs),
    /// Send a message to an agent
    Send(SendArgs),
    /// Reply to the agent waiting for your answer
    Reply(ReplyArgs),
    /// Cancel a task: a queued message is never written, and the other side of the exchange
    /// ends too (a `send --wait` on it returns)
    Cancel {
        /// Task id, or its 8-character prefix (as `synapse send` and the terminal show it)
        task_id: String,
        /// Print the canceled task as one JSON document
        #[arg(long)]
        json: bool,
    },
    /// List the running agents
    List {
        /// One JSON object with every agent
        #[arg(long)]
        json: bool,
    },
    /// Print the event log (and follow it)
    Events(EventsArgs),
    /// Print the address of the live web dashboard, with the key that lets the page act as you
    /// (the broker serves it on its port)
    Dashboard {
        /// Open it in a browser too (when the machine has one; the opener gets the address, key
        /// included, on its command line)
        #[arg(long)]
        open: bool,
        /// Print {"url": ...} as one JSON document
        #[arg(long)]
        json: bool,
    },
    /// Maintenance: rebuild or verify the projections, index the history
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
        /// Print the report as one JSON document
        #[arg(long, global = true)]
        json: bool,
    },
    /// Start an agent in the background (terminal output goes to a log)
    Start {
        /// Profile: claude, gemini, codex, opencode, copilot, dummy (or one in SYNAPSE_HOME/profiles),
        /// or scenario (the scripted A2A agent)
        profile: String,
        #[command(flatten)]
        args: StartArgs,
        /// Print the registration (with the agent's secret) as JSON
        #[arg(long)]
        json: bool,
    },
    /// Stop a background agent: SIGTERM, then SIGKILL after 5 s
    Stop {
        /// Agent id, name, or profile (type)
        target: String,
        /// Stop every agent the target matches
        #[arg(long)]
        all: bool,
        /// One JSON document: {"stopped": [...], "refused": [...]}
        #[arg(long)]
        json: bool,
    },
    /// Show a background agent's terminal output
    ///
    /// The log is kept within SYNAPSE_TERMINAL_LOG_MB (16 MB, read by the agent's wrapper when it
    /// starts; 0 for no bound): at that size it becomes <agent_id>.log.1, replacing the one
    /// before, and a new log begins. Both are shown, the older first; --follow goes on into the
    /// new one.
    Logs {
        /// Agent id or name
        agent: String,
        /// Keep printing new output
        #[arg(short, long)]
        follow: bool,
        /// Print the log's bytes as they are (escape sequences act on your terminal)
        #[arg(long)]
        raw: bool,
    },
    /// Watch Synapse work: a broker and two dummy agents in a temporary home
    Demo {
        /// Keep the temporary home instead of deleting it
        #[arg(long)]
        keep: bool,
    },
    /// Look back: list, show, search, stats, export, cleanup
    History {
        #[command(subcommand)]
        command: history::HistoryCommand,
    },
    /// File safety: locks and modification records between agents
    #[command(name = "file-safety")]
    FileSafety {
        #[command(subcommand)]
        command: file_safety::FileSafetyCommand,
        /// Print the answer as one JSON document
        #[arg(long, global = true)]
        json: bool,
    },
    /// External A2A agents: add, list, info, send, remove
    External {
        #[command(subcommand)]
        command: external::ExternalCommand,
        /// Print the answer as one JSON document
        #[arg(long, global = true)]
        json: bool,
    },
    /// Write a commented settings template (user: ~/.synapse, project: ./.synapse)
    Init {
        /// Which settings file: user (~/.synapse), project (./.synapse) or local (not committed)
        #[arg(long, default_value = "project", value_parser = ["user", "project", "local"])]
        scope: String,
        /// Overwrite an existing file
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Trust the env a project's settings set for its agents (a cloned repository's are refused until then)
    Trust {
        /// The project's directory (default: the current one)
        dir: Option<std::path::PathBuf>,
        /// Take the trust back: its env is refused again
        #[arg(long, conflicts_with = "list")]
        revoke: bool,
        /// List the directories whose env is trusted
        #[arg(long, conflicts_with = "dir")]
        list: bool,
    },
    /// Restore the default settings of a scope (removes its settings file)
    Reset {
        /// Which settings file: user (~/.synapse), project (./.synapse) or local (not committed)
        #[arg(long, default_value = "project", value_parser = ["user", "project", "local"])]
        scope: String,
        /// Do not ask for confirmation
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Check the installation: broker, settings in effect, paths and their permissions, each
    /// profile's CLI on PATH (with its version) and its free ports
    Doctor {
        /// One JSON document: {"ok": bool, "checks": [...]}
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (e.g. `synapse completions bash > ~/.local/share/bash-completion/completions/synapse`)
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write every command's page into a directory
    Man {
        /// Write synapse.1, synapse-send.1, ... into this directory
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// The command reference as Markdown (what docs/commands.md holds)
    #[command(hide = true)]
    Reference,
    /// The built-in dummy agent (what the `dummy` profile runs)
    #[command(name = "dummy-agent", hide = true)]
    DummyAgent,
    /// The built-in scenario agent: no PTY, answers by rule (fail, input, stream, wait, message,
    /// file, data, else complete); prints its registration as one JSON line
    #[command(name = "scenario-agent", hide = true)]
    ScenarioAgent {
        /// Port for the agent's endpoints (default: any free port)
        #[arg(long)]
        port: Option<u16>,
        /// A custom name other agents can use as the target
        #[arg(long)]
        name: Option<String>,
    },
    /// A scripted model server (Anthropic, Responses, Chat Completions, Gemini) for tests with
    /// the real CLIs; prints {"port":N} and serves until killed
    #[command(name = "scripted-model", hide = true)]
    ScriptedModel {
        /// Port on 127.0.0.1 (0: any free port)
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Append every request to this file, one JSON line each
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Run an agent: synapse <profile> [--port N] [--name NAME] [--role ROLE] [-- tool args]
    #[command(external_subcommand)]
    Profile(Vec<OsString>),
    /// Serve Synapse's tools (send, reply, list_agents, ...) to an AI CLI over MCP on stdio,
    /// acting as the agent it runs in (SYNAPSE_AGENT_ID), else anonymously
    Mcp,
    /// Run by an AI CLI's hook at a tool boundary (PostToolUse, AfterTool): prints the messages
    /// that arrived while its agent was busy, for the model; nothing outside an agent
    Hook {
        /// The CLI's hook event name (PostToolUse, AfterTool, ...)
        event: String,
    },
    /// The agent registration contract (used by agent wrappers and tests)
    #[command(hide = true)]
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
}

#[derive(Args, Debug, Clone)]
pub struct StartArgs {
    /// Port for the agent's endpoints (default: first free one of the profile's range; 0: one
    /// the system chooses)
    #[arg(long)]
    pub port: Option<u16>,
    /// A custom name other agents can use as the target
    #[arg(long)]
    pub name: Option<String>,
    /// A role shown in `synapse list`
    #[arg(long)]
    pub role: Option<String>,
    /// Do not give the CLI Synapse's MCP tools for this session (the `mcp` setting, default on)
    #[arg(long)]
    pub no_mcp: bool,
    /// Arguments for the CLI itself, after `--`
    #[arg(last = true)]
    pub tool_args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct BrokerArgs {
    #[command(subcommand)]
    pub command: Option<BrokerCommand>,
    /// Print the answer as one JSON document
    #[arg(long, global = true)]
    pub json: bool,
    /// Started by a client (autostart): the security settings come only from
    /// `$SYNAPSE_HOME/broker-settings.json`, never from this process's environment
    #[arg(long, hide = true)]
    pub autostarted: bool,
}

#[derive(Subcommand, Debug)]
pub enum BrokerCommand {
    /// Stop the running broker cleanly (one that does not answer within the client timeout is
    /// sent SIGTERM, then SIGKILL)
    Stop,
    /// Show whether a broker runs, its pid, version and head
    Status,
    /// Start the broker in the background if it is not running
    Start,
}

#[derive(Args, Debug)]
pub struct SendArgs {
    /// Target agent: custom name, agent id, <type>-<port> or type; else an external agent's alias
    pub target: String,
    /// The message (or use --message-file / --stdin)
    pub message: Option<String>,
    /// Send as this agent (default: SYNAPSE_AGENT_ID)
    #[arg(long)]
    pub from: Option<String>,
    /// Priority 1-5 (5 interrupts the target first)
    #[arg(short = 'p', long, default_value = "3", allow_hyphen_values = true)]
    pub priority: String,
    /// Expect a reply (the default, unless the a2a.flow setting says oneway)
    #[arg(long, visible_alias = "notify", conflicts_with = "no_response")]
    pub response: bool,
    /// Fire and forget: no reply expected
    #[arg(long, visible_alias = "silent")]
    pub no_response: bool,
    /// Block until the reply arrives and print it: at most SECONDS if given (0 or none: no limit)
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "0", conflicts_with = "no_response")]
    pub wait: Option<u64>,
    /// Answer this task (full id or the 8-character prefix shown in the terminal)
    #[arg(long, value_name = "TASK_ID")]
    pub reply_to: Option<String>,
    /// Read the message from a file ('-' for standard input)
    #[arg(short = 'F', long, value_name = "PATH")]
    pub message_file: Option<PathBuf>,
    /// Read the message from standard input
    #[arg(long)]
    pub stdin: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// A retry with the same key within 24 h returns the first send's task instead of sending
    /// again; the key used again for another message or agent is refused (default: a fresh key,
    /// used when this command retries a broken connection or a late answer)
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
}

#[derive(Args, Debug)]
pub struct ReplyArgs {
    /// The reply (or use --message-file / --stdin)
    pub message: Option<String>,
    /// Reply to this sender when several are waiting: its id or name, or the task id its
    /// message showed ([A2A:<id8>:<sender>:R]; the one way to name a sender shown as `anonymous`
    /// when several such wait)
    #[arg(long, value_name = "SENDER_ID")]
    pub to: Option<String>,
    /// List the agents waiting for your reply
    #[arg(long, conflicts_with_all = ["message", "message_file", "stdin", "to"])]
    pub list_targets: bool,
    /// Reply as this agent (default: SYNAPSE_AGENT_ID)
    #[arg(long)]
    pub from: Option<String>,
    /// Read the reply from a file ('-' for standard input)
    #[arg(short = 'F', long, value_name = "PATH")]
    pub message_file: Option<PathBuf>,
    /// Read the reply from standard input
    #[arg(long)]
    pub stdin: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// A retry with the same key within 24 h returns the first reply's task instead of replying
    /// again (default: a fresh key, used when this command retries a broken connection or a
    /// late answer)
    #[arg(long, value_name = "KEY", conflicts_with = "list_targets")]
    pub idempotency_key: Option<String>,
}

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Start after this sequence number
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Keep printing new events as they are appended, across broker restarts (exit 1 if the
    /// log was replaced meanwhile, or the next broker is of another version or home)
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// One JSON object per line
    #[arg(long)]
    pub json: bool,
    /// Only events about this agent (name, id, type-port or type)
    #[arg(long)]
    pub agent: Option<String>,
    /// Only these kinds (comma-separated, e.g. message_sent,reply_posted)
    #[arg(long)]
    pub kind: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Drop every projection and replay the whole log
    Rebuild,
    /// Replay into scratch tables and compare with the live projections (exit 1 on a difference)
    Verify,
    /// Bring the history search index up to the newest event (the broker also does it by itself,
    /// in the background; searches are exact either way)
    Index,
}

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Register an agent; prints the registration (with its secret) as JSON
    Register {
        /// The agent's profile (claude, codex, dummy, ...)
        #[arg(long = "type")]
        agent_type: String,
        /// The process the registration belongs to (its liveness keeps the agent listed)
        #[arg(long)]
        pid: u32,
        /// A custom name other agents can use as the target
        #[arg(long)]
        name: Option<String>,
        /// A role shown in `synapse list`
        #[arg(long)]
        role: Option<String>,
        /// Fixed port (0: any free port); default: the profile's range
        #[arg(long)]
        port: Option<u16>,
    },
    /// Report the agent's status (READY, PROCESSING, WAITING)
    Status {
        /// The agent's id
        agent_id: String,
        /// READY, PROCESSING or WAITING
        status: String,
    },
    /// Print the agent's inbox as JSON
    Inbox {
        /// The agent's id
        agent_id: String,
        /// Wait up to this many milliseconds for a ticket
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
    /// Acknowledge that a ticket was written into the agent's PTY
    Ack {
        /// The agent's id
        agent_id: String,
        /// The ticket number from the inbox
        ticket: u64,
    },
    /// Deregister the agent
    Deregister {
        /// The agent's id
        agent_id: String,
    },
}

/// Runs a parsed command; returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let paths = crate::config::Paths::from_env()?;
    let command = match cli.command {
        Command::Broker(BrokerArgs { command: None, autostarted, .. }) => {
            return system::run_broker(paths, autostarted);
        }
        Command::DummyAgent => return crate::agent::dummy::run(),
        Command::Completions { shell } => return reference::completions(shell),
        Command::Man { out } => return reference::man(out.as_deref()),
        Command::Reference => {
            print!("{}", reference::markdown());
            return Ok(0);
        }
        Command::Init { scope, force } => return setup::init(&paths, &scope, force),
        Command::Reset { scope, force } => return setup::reset(&paths, &scope, force),
        Command::Trust { dir, revoke, list } => {
            paths.own_home()?;
            let action = match (revoke, list) {
                (true, _) => crate::project_trust::Action::Revoke,
                (_, true) => crate::project_trust::Action::List,
                _ => crate::project_trust::Action::Trust,
            };
            return crate::project_trust::run(&paths.home, dir.as_deref(), action);
        }
        Command::ScenarioAgent { port, name } => return crate::agent::scenario::run(paths, port, name),
        Command::Profile(words) => return agents::run_profile(paths, words),
        Command::ScriptedModel { port, log } => return crate::scripted_model::run(port, log),
        Command::Start { profile, args, json } => {
            let args = agents::ProfileArgs { common: args, headless: true, announce: true };
            return agents::start(&paths, &profile, &args, json);
        }
        Command::Demo { keep } => return demo::run(keep),
        other => {
            crate::client::warn_of_other_builds();
            other
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        match command {
            Command::Broker(args) => system::broker_control(&paths, args.command, args.json).await,
            Command::Stop { target, all, json } => agents::stop(&paths, &target, all, json).await,
            Command::Logs { agent, follow, raw } => agents::logs(&paths, &agent, follow, raw).await,
            Command::Send(args) => messaging::send(&paths, args).await,
            Command::Reply(args) => messaging::reply(&paths, args).await,
            Command::List { json } => messaging::list(&paths, json).await,
            Command::Cancel { task_id, json } => messaging::cancel(&paths, &task_id, json).await,
            Command::Doctor { json } => doctor::run(&paths, json).await,
            Command::Events(args) => system::events(&paths, args).await,
            Command::Dashboard { open, json } => dashboard::run(&paths, open, json).await,
            Command::Admin { command, json } => system::admin(&paths, command, json).await,
            Command::Agent { command } => system::agent(&paths, command).await,
            Command::External { command, json } => external::run(&paths, command, json).await,
            Command::FileSafety { command, json } => file_safety::run(&paths, command, json).await,
            Command::History { command } => history::run(&paths, command).await,
            Command::Mcp => crate::mcp::serve(paths).await,
            Command::Hook { event } => Ok(crate::agent::hook::run(&paths.uds_dir, &event)),
            Command::DummyAgent
            | Command::Completions { .. }
            | Command::Man { .. }
            | Command::Reference
            | Command::Init { .. }
            | Command::Reset { .. }
            | Command::Trust { .. }
            | Command::ScenarioAgent { .. }
            | Command::ScriptedModel { .. }
            | Command::Profile(_)
            | Command::Start { .. }
            | Command::Demo { .. } => {
                anyhow::bail!("internal: command dispatched twice")
            }
        }
    })
}

/// The command or built-in profile a mistyped first word was probably meant to be (`lsit` →
/// `list`): the closest name at most two edits away, or one it is the start of.
pub(crate) fn similar_command(word: &str) -> Option<String> {
    use clap::CommandFactory;
    let word = word.to_lowercase();
    if word.is_empty() {
        return None;
    }
    let command = Cli::command();
    let names = command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set())
        .map(|sub| sub.get_name().to_string())
        .chain(crate::agent::profile::BUILTIN_NAMES.iter().map(|name| name.to_string()));
    names
        .filter_map(|name| {
            let distance = edit_distance(&word, &name);
            let close = distance <= 2 && distance < name.len().max(2) || (word.len() >= 3 && name.starts_with(&word));
            close.then_some((distance, name))
        })
        .min()
        .map(|(_, name)| name)
}

/// Edits (insert, delete, substitute, swap two neighbours) from `a` to `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// Reads the message from exactly one source: the argument, a file, or standard input.
/// A `-p/--priority` value: 1-5.
pub(crate) fn parse_priority(text: &str) -> anyhow::Result<u8> {
    match text.trim().parse::<i64>() {
        Ok(priority) if (1..=5).contains(&priority) => Ok(u8::try_from(priority)?),
        _ => anyhow::bail!("priority must be between 1 and 5 (got '{text}')"),
    }
}

pub(crate) fn read_message(positional: Option<String>, file: Option<&PathBuf>, stdin: bool) -> anyhow::Result<String> {
    let sources = usize::from(positional.is_some()) + usize::from(file.is_some()) + usize::from(stdin);
    if sources == 0 {
        anyhow::bail!("no message given: pass it as an argument, with --message-file PATH, or with --stdin");
    }
    if sources > 1 {
        anyhow::bail!("give the message in exactly one way: an argument, --message-file, or --stdin");
    }
    if let Some(text) = positional {
        return Ok(text);
    }
    let from_stdin = stdin || file.is_some_and(|path| path.as_os_str() == "-");
    let bytes = if from_stdin {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)?;
        bytes
    } else {
        let path = file.ok_or_else(|| anyhow::anyhow!("no message file"))?;
        std::fs::read(path).map_err(|error| anyhow::anyhow!("cannot read {}: {error}", path.display()))?
    };
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("the message is not valid UTF-8 text"))
}

/// The exit status of a command whose output pipe was closed (128 + SIGPIPE, as for tools
/// that die of the signal).
pub const CLOSED_PIPE_EXIT: i32 = 141;

/// How a command ends when writing its output failed: a closed pipe (`| head`) quietly, with
/// [`CLOSED_PIPE_EXIT`]; anything else (a full disk) as an error, never as a success.
pub fn output_failed(error: &std::io::Error) -> anyhow::Result<i32> {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        return Ok(CLOSED_PIPE_EXIT);
    }
    anyhow::bail!("cannot write the output: {error}; what was printed is incomplete")
}

/// The line shown for a failed command. A message that already carries its label (the broker's
/// messages did, until they lost their `Error: ` prefix; a broker of that time may still answer)
/// is shown as it is, so the label never appears twice.
/// An error as the user reads it on stderr: labelled once, and with its controls made visible
/// (an error may quote others' text: a remote agent's answer, a name).
pub fn user_message(message: &str) -> String {
    let message = crate::escape::visible(message);
    if message.starts_with("Error") || message.starts_with("Warning") { message } else { format!("Error: {message}") }
}

#[cfg(test)]
mod tests {
    use super::{similar_command, user_message};
    use std::ffi::OsString;

    #[test]
    fn an_error_is_labelled_once() {
        assert_eq!(user_message("no message given"), "Error: no message given");
        assert_eq!(user_message("Error: No reply target."), "Error: No reply target.");
        assert_eq!(user_message("remote said \u{1b}]52;c;eA==\u{7}\nbye"), "Error: remote said ^[]52;c;eA==^G\nbye");
    }

    /// Issue 14: many arguments had no help (`--agent`, `--limit`, `<FILE>`, `<AGENT>`).
    #[test]
    fn every_argument_a_user_can_see_has_help() {
        use clap::CommandFactory;
        fn missing(command: &clap::Command, path: &str, out: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    out.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
                missing(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
        let mut out = Vec::new();
        missing(&super::Cli::command(), "synapse", &mut out);
        missing(&super::agents::ProfileArgs::command(), "synapse <profile>", &mut out);
        assert!(out.is_empty(), "arguments without help: {out:#?}");
    }

    /// The narrow tree `parse_from` tries first must read a command line exactly as the whole
    /// tree does, and refuse (leaving it to the whole tree) whatever it cannot read that way.
    #[test]
    fn send_and_reply_parse_alike_through_the_narrow_tree_and_the_whole_one() {
        use clap::Parser;
        let lines: &[&[&str]] = &[
            &["send", "bob", "hello", "--no-response"],
            &["send", "bob", "hi", "-p", "5", "--json", "--from", "me"],
            &["send", "bob", "--wait", "--", "-starts with a dash"],
            &["send", "bob", "x", "--wait", "30", "--reply-to", "abcd1234", "--idempotency-key", "k"],
            &["send", "bob", "--stdin", "-p", "-1"],
            &["send", "bob", "-F", "note.txt", "--notify"],
            &["reply", "done", "--to", "alice", "--json"],
            &["reply", "--list-targets"],
            &["reply", "-F", "-"],
            // Refused by both, or only meaningful to the whole tree.
            &["send", "--help"],
            &["send"],
            &["send", "bob", "x", "--response", "--no-response"],
            &["send", "bob", "x", "--bogus"],
            &["send", "bob", "x", "-p"],
            &["reply", "--help"],
            &["--version"],
            &["list", "--json"],
        ];
        let mut narrow_accepted = 0;
        for line in lines {
            let argv: Vec<OsString> =
                std::iter::once("synapse").chain(line.iter().copied()).map(OsString::from).collect();
            let render = |parsed: Result<super::Cli, clap::Error>| match parsed {
                Ok(cli) => format!("ok {cli:?}"),
                Err(error) => format!("error {:?}: {}", error.kind(), error.render()),
            };
            let fast = render(super::parse_from(argv.clone()));
            let whole = render(super::Cli::try_parse_from(argv.clone()));
            assert_eq!(fast, whole, "{line:?}");
            if super::FrequentCli::try_parse_from(&argv).is_ok() {
                narrow_accepted += 1;
                assert!(whole.starts_with("ok "), "the narrow tree accepted what the whole one refuses: {line:?}");
            }
        }
        // The common forms do take the short way (else the narrow tree is dead weight).
        assert_eq!(narrow_accepted, 9);
    }

    /// Whatever is added to `send` or `reply` later (an argument, a setting, a global flag on
    /// the whole tree) must reach both trees alike, or the lines above stop being a sample of
    /// everything.
    #[test]
    fn the_narrow_tree_builds_send_and_reply_as_the_whole_one_does() {
        use clap::CommandFactory;
        let (mut narrow, mut whole) = (super::FrequentCli::command(), super::Cli::command());
        narrow.build();
        whole.build();
        for name in ["send", "reply"] {
            let (Some(fast), Some(full)) = (narrow.find_subcommand(name), whole.find_subcommand(name)) else {
                panic!("{name} is missing from a tree");
            };
            // Help text and place in the list are for `--help`, which the whole tree answers.
            let plain = |command: &clap::Command| format!("{:?}", command.clone().about(None::<&str>).display_order(0));
            assert_eq!(plain(fast), plain(full), "{name}");
        }
        let globals = |command: &clap::Command| {
            command
                .get_arguments()
                .filter(|arg| arg.is_global_set())
                .map(|arg| arg.get_id().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(globals(&narrow), globals(&whole));
    }

    #[test]
    fn a_mistyped_command_gets_a_suggestion_and_a_new_word_none() {
        assert_eq!(similar_command("lsit").as_deref(), Some("list"));
        assert_eq!(similar_command("sned").as_deref(), Some("send"));
        assert_eq!(similar_command("histroy").as_deref(), Some("history"));
        assert_eq!(similar_command("claud").as_deref(), Some("claude"));
        assert_eq!(similar_command("myagent"), None);
        assert_eq!(similar_command("zzzzzz"), None);
    }
}
