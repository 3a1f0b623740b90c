//! Agent profiles as data: how to start each CLI, how to submit into it, how to tell it is idle.
//!
//! Built in for claude, gemini, codex, opencode, copilot and dummy; a JSON file
//! `$SYNAPSE_HOME/profiles/<name>.json` overrides any field of a built-in profile or defines a
//! new one.

use super::mcp_wiring::McpStyle;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How the wrapper interrupts the CLI for a priority-5 message.
///
/// In a profile file: `"interrupt": "ctrl_c"`, `"interrupt": "signal"`, or
/// `"interrupt": {"keys": ["esc", "esc"]}` (see [`parse_key`] for the key names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptStyle {
    /// SIGINT to the PTY's foreground process group. Most real CLIs exit on it: none of the
    /// built-in profiles of the five CLIs uses it.
    Signal,
    /// Write the Ctrl-C byte (0x03) into the PTY.
    CtrlC,
    /// Write these keys one by one, [`KEY_GAP`] apart (OpenCode interrupts on Esc twice).
    Keys(Vec<String>),
}

impl InterruptStyle {
    /// Does the interrupt write a Ctrl-C, which a second one soon after may turn into an exit
    /// ([`CTRL_C_EXIT_WINDOW`])?
    pub fn writes_ctrl_c(&self) -> bool {
        match self {
            InterruptStyle::CtrlC => true,
            InterruptStyle::Keys(keys) => keys.iter().any(|key| parse_key(key).is_ok_and(|bytes| bytes == [0x03])),
            InterruptStyle::Signal => false,
        }
    }
}

/// Pause between the keys of [`InterruptStyle::Keys`], so that a CLI reads two Esc as two
/// presses, not as one Alt-Esc.
pub const KEY_GAP: std::time::Duration = std::time::Duration::from_millis(120);

/// After a Ctrl-C, how long a second one ends the CLI instead of interrupting it: Gemini CLI
/// exits on a second Ctrl-C within 3 s ("Press Ctrl+C again to exit.", its
/// `WARNING_PROMPT_DURATION_MS`); Claude Code and Codex say "Press Ctrl-C again to exit" and
/// "ctrl + c again to quit" for a shorter while. Two priority-5 messages a third of a second
/// apart ended a busy Gemini this way (the real-CLI soak of 2026-12-08): the second message was
/// lost with it. A Ctrl-C interrupt waits until this long after the last Ctrl-C written into
/// the CLI, its user's too.
pub const CTRL_C_EXIT_WINDOW: std::time::Duration = std::time::Duration::from_millis(3500);

/// What a CLI shows by its input box while a second Ctrl-C would end it.
pub const EXIT_HINTS: [&str; 4] = ["again to exit", "again to quit", "Again to exit", "Again to quit"];

/// How many rows above and below the cursor (in the input box) [`EXIT_HINTS`] are looked for.
pub const EXIT_HINT_ROWS: usize = 6;

/// How long after [`CTRL_C_EXIT_WINDOW`] an [`EXIT_HINTS`] text still holds a Ctrl-C interrupt
/// (the CLI read the Ctrl-C late); after that the interrupt goes (the text is the model's).
pub const EXIT_HINT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the next key of an interrupt waits for the profile's `interrupt_hint`.
pub const INTERRUPT_HINT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The bytes of one named key: `esc`, `enter`, `tab`, `backspace`, `space`, `up`, `down`,
/// `left`, `right`, `ctrl-a` … `ctrl-z`, or a single printable character.
pub fn parse_key(name: &str) -> Result<Vec<u8>, String> {
    let bytes = match name {
        "esc" | "escape" => vec![0x1b],
        "enter" | "return" => vec![b'\r'],
        "tab" => vec![b'\t'],
        "backspace" => vec![0x7f],
        "space" => vec![b' '],
        "up" => b"\x1b[A".to_vec(),
        "down" => b"\x1b[B".to_vec(),
        "right" => b"\x1b[C".to_vec(),
        "left" => b"\x1b[D".to_vec(),
        _ => {
            if let Some(letter) = name.strip_prefix("ctrl-")
                && let [letter] = letter.as_bytes()
                && letter.is_ascii_lowercase()
            {
                vec![letter - b'a' + 1]
            } else {
                let mut chars = name.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) if !crate::escape::is_control(c) => c.to_string().into_bytes(),
                    _ => {
                        return Err(format!(
                            "'{}' is not a key (esc, enter, tab, backspace, space, up, down, left, right, ctrl-a..ctrl-z, or one printable character)",
                            crate::escape::visible_line(name)
                        ));
                    }
                }
            }
        }
    };
    Ok(bytes)
}

/// When the CLI counts as idle (READY).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleStrategy {
    /// Text the line under the cursor ends with when the CLI waits for input (e.g. `> `). Only
    /// what is left of the cursor counts, so a half-typed line (`> fix the`) is not a prompt:
    /// the user's input is never merged with a message.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Milliseconds without output before the CLI counts as idle.
    #[serde(default)]
    pub quiet_ms: Option<u64>,
    /// Idle only once the CLI has enabled bracketed paste (`ESC[?2004h`).
    #[serde(default)]
    pub needs_bracketed_paste: bool,
    /// Text anywhere on screen that means the CLI asks the user something (WAITING): nothing is
    /// written while one shows, so no message's keystrokes can answer a dialog. A dialog's own
    /// furniture (`Esc to cancel`, `enter to select`): it counts wherever it shows, the echo of a
    /// message included (a message that carried it cannot hide the real dialog later); such a
    /// message is written as a file, so that its echo never holds the agent WAITING.
    #[serde(default)]
    pub waiting_patterns: Vec<String>,
    /// Questions a dialog asks in words (`Do you want to`, `(y/n)`), which a message or a model's
    /// answer may ask too: WAITING while one shows, unless it is the echo of a message, or the
    /// CLI sits at its empty prompt (a dialog takes the input box's place; an answer that ends
    /// with a question leaves the box there, and messages must not wait for good).
    #[serde(default)]
    pub question_patterns: Vec<String>,
    /// Text anywhere on screen that means the CLI is working (its "esc to interrupt" hint):
    /// PROCESSING whatever the quiet period says, so the quiet period can be short.
    #[serde(default)]
    pub busy_patterns: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    /// The program to run; `{synapse}` stands for this synapse executable.
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    pub port_range: (u16, u16),
    /// Bytes that submit the typed text (`\r` for most CLIs, `\n` for the dummy).
    pub submit: String,
    /// Milliseconds between writing the text and the submit key.
    #[serde(default)]
    pub settle_ms: u64,
    pub idle: IdleStrategy,
    pub interrupt: InterruptStyle,
    /// After an interrupt, how long to wait for the prompt to come back before giving up on
    /// this try (the message stays queued and the agent's status says why).
    #[serde(default = "default_interrupt_timeout_ms")]
    pub interrupt_timeout_ms: u64,
    /// Text the CLI shows once it has taken a key of a `keys` interrupt (OpenCode: "esc again
    /// to interrupt"): the next key waits until it shows (at most [`INTERRUPT_HINT_WAIT`]), so
    /// that a CLI slow to read its input never reads two presses as one.
    #[serde(default)]
    pub interrupt_hint: Option<String>,
    /// How the CLI takes Synapse's MCP server for one session (`claude`, `codex`, `gemini`,
    /// `opencode`, `copilot`); none: it gets no server.
    #[serde(default)]
    pub mcp: Option<McpStyle>,
    /// A message that arrives while the CLI is busy is handed to the model by the CLI's own hook
    /// at the next tool boundary (`synapse hook`), registered with the MCP server; else it waits
    /// for the prompt and is typed. Only where the CLI runs such hooks without an approval.
    #[serde(default)]
    pub hooks: bool,
}

fn default_interrupt_timeout_ms() -> u64 {
    15_000
}

impl Profile {
    /// Checks what serde cannot: key names, non-empty patterns and submit key.
    fn validate(&self) -> Result<(), (String, String)> {
        if let InterruptStyle::Keys(keys) = &self.interrupt {
            if keys.is_empty() {
                return Err(("keys".into(), "interrupt keys: the list is empty".into()));
            }
            for key in keys {
                parse_key(key).map_err(|error| (key.clone(), format!("interrupt keys: {error}")))?;
            }
        }
        if let Some(prompt) = &self.idle.prompt
            && prompt.trim().is_empty()
        {
            return Err(("prompt".into(), "idle.prompt: must contain a visible character".into()));
        }
        let idle = &self.idle;
        let lists = [
            ("waiting_patterns", &idle.waiting_patterns),
            ("question_patterns", &idle.question_patterns),
            ("busy_patterns", &idle.busy_patterns),
        ];
        for (list, patterns) in lists {
            for pattern in patterns {
                if pattern.trim().is_empty() {
                    return Err((list.into(), format!("idle.{list}: a pattern is empty")));
                }
                if pattern.chars().any(crate::escape::is_control) {
                    return Err((
                        pattern.clone(),
                        format!("idle.{list}: a pattern contains a control character (screen text never does)"),
                    ));
                }
            }
        }
        if self.submit.is_empty() {
            return Err(("submit".into(), "submit: the submit key is empty".into()));
        }
        Ok(())
    }
}
/// Dialogs of the real CLIs as measured (../shared/REAL_CLIS.md): trust, permission and
/// selection prompts, by what each draws around its choices. Matched anywhere on the screen.
/// Every one of the five CLIs' permission dialogs shows one (their screens, 2026-11-27: Claude
/// `Esc to cancel · Tab to amend`, Codex `Press enter to confirm or esc to cancel`, Copilot
/// `enter to select · esc to cancel`, Gemini `Allow execution of [Shell]? … Allow once`,
/// OpenCode `△ Permission required … Allow once`).
const DIALOGS: &[&str] = &[
    // Claude Code: folder trust, permissions.
    "Esc to cancel",
    "Enter to confirm",
    // Gemini CLI and OpenCode: "Allow execution of [Shell]? ● 1. Allow once", "△ Permission required".
    "Allow execution",
    "Allow once",
    "Permission required",
    // Codex: "Would you like to run the following command? … Press enter to confirm".
    "Press enter to confirm",
    // Copilot CLI: "Confirm folder trust", "Do you want to run this command?", menus.
    "Confirm folder trust",
    "enter to select",
    "Enter to select",
];

/// Questions in words, from the same dialogs and from plain terminal prompts (see
/// [`IdleStrategy::question_patterns`]).
const QUESTIONS: &[&str] = &["(y/n)", "[Y/n]", "[y/N]", "Do you want to", "Would you like to"];

fn idle(prompt: Option<&str>, quiet_ms: u64, needs_bracketed_paste: bool, busy: &[&str]) -> IdleStrategy {
    IdleStrategy {
        prompt: prompt.map(str::to_string),
        quiet_ms: Some(quiet_ms),
        needs_bracketed_paste,
        waiting_patterns: DIALOGS.iter().map(|pattern| pattern.to_string()).collect(),
        question_patterns: QUESTIONS.iter().map(|pattern| pattern.to_string()).collect(),
        busy_patterns: busy.iter().map(|pattern| pattern.to_string()).collect(),
    }
}

/// The built-in profiles (SPEC §1), fitted to the real CLIs' screens (REAL_CLIS.md): Ctrl-C or
/// keys to interrupt (a SIGINT to the process group ends every one of them), the input box's
/// prompt so that READY means "empty input box", 300 ms between the paste and the Enter.
pub fn builtin(name: &str) -> Option<Profile> {
    let profile = |command: &str, args: &[&str], port_range, idle, interrupt| Profile {
        name: name.to_string(),
        command: command.to_string(),
        args: args.iter().map(|arg| arg.to_string()).collect(),
        port_range,
        submit: "\r".to_string(),
        settle_ms: 300,
        idle,
        interrupt,
        interrupt_timeout_ms: default_interrupt_timeout_ms(),
        interrupt_hint: None,
        mcp: Some(match name {
            "claude" => McpStyle::Claude,
            "codex" => McpStyle::Codex,
            "gemini" => McpStyle::Gemini,
            "opencode" => McpStyle::Opencode,
            _ => McpStyle::Copilot,
        }),
        // Claude Code (PostToolUse) and Gemini CLI (AfterTool) add a hook's output to the
        // model's context; Codex runs hooks only after a one-time approval in its TUI, OpenCode
        // has JS plugins, not commands, and Copilot's hooks cannot add context.
        hooks: matches!(name, "claude" | "gemini"),
    };
    let esc_twice = || InterruptStyle::Keys(vec!["esc".into(), "esc".into()]);
    Some(match name {
        "claude" => profile(
            "claude",
            &[],
            (8100, 8109),
            idle(Some("❯"), 500, true, &["esc to interrupt"]),
            InterruptStyle::CtrlC,
        ),
        // Gemini's box: ` >   Type your message`, the cursor right after `> `.
        "gemini" => {
            profile("gemini", &[], (8110, 8119), idle(Some(">"), 500, true, &["esc to cancel"]), InterruptStyle::CtrlC)
        }
        // --no-daemon: without it Codex runs shell commands in a shared `codex app-server` that
        // outlives the agent and lacks its SYNAPSE_AGENT_ID (two Codex agents shared one identity).
        // Its sandbox refuses every socket unless network access is on, and `synapse reply`
        // talks to the broker over a Unix socket.
        "codex" => profile(
            "codex",
            &["--no-daemon", "-c", "sandbox_workspace_write.network_access=true"],
            (8120, 8129),
            idle(Some("›"), 500, false, &["esc to interrupt"]),
            InterruptStyle::CtrlC,
        ),
        // OpenCode exits on Ctrl-C; Esc twice interrupts it. READY only once its input box
        // (the `┃` border at the cursor) is drawn: before that a message is lost.
        // The second Esc waits for "esc again to interrupt": under load OpenCode could read both
        // in one go, as one Alt-Esc, and go on answering (seen once in the suite).
        // Busy while it says `esc interrupt` (`esc again to interrupt` after one Esc) under its
        // box: a spinner stalled for the quiet period under load read as READY otherwise.
        "opencode" => Profile {
            interrupt_hint: Some("again to interrupt".into()),
            ..profile(
                "opencode",
                &[],
                (8130, 8139),
                idle(Some("┃"), 1000, false, &["esc interrupt", "esc again to interrupt"]),
                esc_twice(),
            )
        },
        // Copilot draws `◎ Working esc esc edit prompt` (before the model's first words) or
        // `◎ Working · 80 B esc esc interrupt` under its input box while it works: its spinner
        // alone kept it from looking quiet, and a spinner stalled half a second under load read
        // as READY, so a priority-5 message was typed in without an interrupt (and queued).
        "copilot" => profile(
            "copilot",
            &[],
            (8140, 8149),
            idle(Some("❯"), 500, true, &["esc esc interrupt", "esc esc edit prompt"]),
            InterruptStyle::CtrlC,
        ),
        "dummy" => Profile {
            name: "dummy".into(),
            command: "{synapse}".into(),
            args: vec!["dummy-agent".into()],
            port_range: (8190, 8199),
            submit: "\n".into(),
            settle_ms: 0,
            idle: IdleStrategy {
                prompt: Some("> ".into()),
                quiet_ms: None,
                needs_bracketed_paste: false,
                waiting_patterns: Vec::new(),
                question_patterns: Vec::new(),
                busy_patterns: Vec::new(),
            },
            interrupt: InterruptStyle::Signal,
            interrupt_timeout_ms: default_interrupt_timeout_ms(),
            interrupt_hint: None,
            mcp: None,
            hooks: false,
        },
        _ => return None,
    })
}

pub const BUILTIN_NAMES: [&str; 6] = ["claude", "gemini", "codex", "opencode", "copilot", "dummy"];

/// The profile `name`: built in, overridden by `<home>/profiles/<name>.json` when present.
pub fn load(name: &str, home: &Path) -> anyhow::Result<Profile> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        anyhow::bail!("'{name}' is not a profile name (lowercase letters, digits, '_')");
    }
    let file = home.join("profiles").join(format!("{name}.json"));
    let base = builtin(name);
    let text = match crate::private_files::read_own(&file)
        .and_then(|bytes| String::from_utf8(bytes).map_err(std::io::Error::other))
    {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return base.ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown profile '{name}'. Built in: {}; or define {}",
                    BUILTIN_NAMES.join(", "),
                    file.display()
                )
            });
        }
        Err(error) => anyhow::bail!("cannot read {}: {error}", file.display()),
    };
    let overrides: serde_json::Value = serde_json::from_str(&text)
        .map_err(|error| anyhow::anyhow!("{} line {}: {error}", file.display(), error.line()))?;
    let mut merged = match &base {
        Some(base) => serde_json::to_value(base)?,
        None => serde_json::json!({"name": name}),
    };
    merge(&mut merged, overrides);
    // A profile is named by its file, whatever the file says (the name becomes file names).
    if let Some(fields) = merged.as_object_mut() {
        fields.insert("name".into(), serde_json::Value::String(name.to_string()));
    }
    let profile: Profile =
        serde_json::from_value(merged).map_err(|error| anyhow::anyhow!("{}: {error}", file.display()))?;
    profile.validate().map_err(|(needle, error)| match line_of(&text, &needle) {
        Some(line) => anyhow::anyhow!("{} line {line}: {error}", file.display()),
        None => anyhow::anyhow!("{}: {error}", file.display()),
    })?;
    Ok(profile)
}

/// The first line of `text` (1-based) that holds `needle` as a JSON string or key.
fn line_of(text: &str, needle: &str) -> Option<usize> {
    let quoted = serde_json::to_string(needle).ok()?;
    text.lines().position(|line| line.contains(&quoted)).map(|index| index + 1)
}

fn merge(base: &mut serde_json::Value, overrides: serde_json::Value) {
    match (base, overrides) {
        (serde_json::Value::Object(base), serde_json::Value::Object(overrides)) => {
            for (key, value) in overrides {
                merge(base.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (slot, value) => *slot = value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_loads_and_has_its_port_range() {
        let home = tempfile::tempdir().unwrap();
        for name in BUILTIN_NAMES {
            let profile = load(name, home.path()).unwrap();
            assert_eq!(Some(profile.port_range), crate::broker::agents::port_range(name));
        }
    }

    #[test]
    fn the_five_real_clis_are_never_interrupted_by_a_signal() {
        for name in ["claude", "gemini", "codex", "opencode", "copilot"] {
            let profile = builtin(name).unwrap();
            assert_ne!(profile.interrupt, InterruptStyle::Signal, "{name}");
            assert_eq!(profile.settle_ms, 300, "{name}");
            assert!(profile.validate().is_ok(), "{name}");
        }
        assert_eq!(builtin("opencode").unwrap().interrupt, InterruptStyle::Keys(vec!["esc".into(), "esc".into()]));
        assert!(builtin("codex").unwrap().args.contains(&"--no-daemon".to_string()));
        assert_eq!(parse_key("esc").unwrap(), vec![0x1b]);
        assert_eq!(parse_key("ctrl-c").unwrap(), vec![0x03]);
        // Only those that write a Ctrl-C wait out a CLI's double-press exit.
        let keys = |keys: &[&str]| InterruptStyle::Keys(keys.iter().map(|key| key.to_string()).collect());
        assert!(InterruptStyle::CtrlC.writes_ctrl_c() && keys(&["esc", "ctrl-c"]).writes_ctrl_c());
        assert!(!InterruptStyle::Signal.writes_ctrl_c() && !keys(&["esc", "esc"]).writes_ctrl_c());
        assert_eq!(parse_key("é").unwrap(), "é".as_bytes());
        assert!(parse_key("\u{1b}").is_err() && parse_key("").is_err() && parse_key("ctrl-").is_err());
    }

    /// A profile's name becomes part of file names (its wrappers' log): the file's own name
    /// decides it, never a `name` inside, and a file that is no object is an error, no panic.
    #[test]
    fn a_profile_is_named_by_its_file() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(home.path().join("profiles")).unwrap();
        std::fs::write(home.path().join("profiles/mine.json"), r#"{"name": "../../x", "command": "true", "port_range": [8180, 8189], "submit": "\r", "idle": {}, "interrupt": "ctrl_c"}"#).unwrap();
        assert_eq!(load("mine", home.path()).unwrap().name, "mine");
        std::fs::write(home.path().join("profiles/claude.json"), r#"{"name": "/tmp/y"}"#).unwrap();
        assert_eq!(load("claude", home.path()).unwrap().name, "claude");
        std::fs::write(home.path().join("profiles/list.json"), "[1]").unwrap();
        assert!(load("list", home.path()).is_err());
    }

    #[test]
    fn a_profile_file_overrides_single_fields_and_a_bad_one_names_its_line() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(home.path().join("profiles")).unwrap();
        std::fs::write(home.path().join("profiles/claude.json"), r#"{"settle_ms": 50, "idle": {"quiet_ms": 900}}"#)
            .unwrap();
        let profile = load("claude", home.path()).unwrap();
        assert_eq!(profile.settle_ms, 50);
        assert_eq!(profile.idle.quiet_ms, Some(900));
        assert!(profile.idle.needs_bracketed_paste, "untouched fields keep the built-in value");
        std::fs::write(home.path().join("profiles/codex.json"), "{\n  \"settle_ms\": ,\n}").unwrap();
        let error = load("codex", home.path()).unwrap_err().to_string();
        assert!(error.contains("codex.json line 2"), "{error}");
        assert!(load("nosuch", home.path()).unwrap_err().to_string().contains("unknown profile"));
        std::fs::write(
            home.path().join("profiles/opencode.json"),
            "{\n  \"settle_ms\": 10,\n  \"interrupt\": {\"keys\": [\"esc\", \"hyper-x\"]}\n}",
        )
        .unwrap();
        let error = load("opencode", home.path()).unwrap_err().to_string();
        assert!(error.contains("opencode.json line 3") && error.contains("'hyper-x' is not a key"), "{error}");
        std::fs::write(home.path().join("profiles/gemini.json"), "{\"idle\": {\n\"waiting_patterns\": [\"\"]}}")
            .unwrap();
        let error = load("gemini", home.path()).unwrap_err().to_string();
        assert!(error.contains("gemini.json line 2") && error.contains("empty"), "{error}");
        std::fs::write(home.path().join("profiles/copilot.json"), r#"{"interrupt": {"keys": ["esc", "ctrl-c", "x"]}}"#)
            .unwrap();
        assert_eq!(
            load("copilot", home.path()).unwrap().interrupt,
            InterruptStyle::Keys(vec!["esc".into(), "ctrl-c".into(), "x".into()])
        );
        std::fs::write(home.path().join("profiles/copilot.json"), r#"{"interrupt": "sigint"}"#).unwrap();
        assert!(load("copilot", home.path()).unwrap_err().to_string().contains("copilot.json"));
        assert!(load("../x", home.path()).is_err());
    }
}
