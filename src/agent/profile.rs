//! Agent profiles as data: how to start each CLI, how to submit into it, how to tell it is idle.
//!
//! Built in for claude, gemini, codex, opencode, copilot and dummy; a JSON file
//! `$SYNAPSE_HOME/profiles/<name>.json` overrides any field of a built-in profile or defines a
//! new one.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// How the wrapper interrupts the CLI for a priority-5 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptStyle {
    /// SIGINT to the PTY's foreground process group.
    Signal,
    /// Write the Ctrl-C byte (0x03) into the PTY.
    CtrlC,
}

/// When the CLI counts as idle (READY).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleStrategy {
    /// Text the line under the cursor ends with when the CLI waits for input (e.g. `> `).
    #[serde(default)]
    pub prompt: Option<String>,
    /// Milliseconds without output before the CLI counts as idle.
    #[serde(default)]
    pub quiet_ms: Option<u64>,
    /// Idle only once the CLI has enabled bracketed paste (`ESC[?2004h`).
    #[serde(default)]
    pub needs_bracketed_paste: bool,
    /// Text on screen that means the CLI asks the user something (WAITING).
    #[serde(default)]
    pub waiting_patterns: Vec<String>,
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
}

fn quiet(prompt: Option<&str>, quiet_ms: u64, needs_bracketed_paste: bool) -> IdleStrategy {
    IdleStrategy {
        prompt: prompt.map(str::to_string),
        quiet_ms: Some(quiet_ms),
        needs_bracketed_paste,
        waiting_patterns: vec!["(y/n)".into(), "[Y/n]".into(), "Do you want to".into()],
    }
}

/// The built-in profiles (SPEC §1).
pub fn builtin(name: &str) -> Option<Profile> {
    let profile = |command: &str, port_range, submit: &str, settle_ms, idle, interrupt| Profile {
        name: name.to_string(),
        command: command.to_string(),
        args: Vec::new(),
        port_range,
        submit: submit.to_string(),
        settle_ms,
        idle,
        interrupt,
    };
    Some(match name {
        "claude" => profile("claude", (8100, 8109), "\r", 300, quiet(None, 500, true), InterruptStyle::Signal),
        "gemini" => profile("gemini", (8110, 8119), "\r", 300, quiet(None, 3000, true), InterruptStyle::Signal),
        "codex" => profile("codex", (8120, 8129), "\r", 300, quiet(Some("›"), 3000, false), InterruptStyle::Signal),
        "opencode" => profile("opencode", (8130, 8139), "\r", 300, quiet(None, 1000, false), InterruptStyle::Signal),
        "copilot" => profile("copilot", (8140, 8149), "\r", 300, quiet(Some("❯"), 500, true), InterruptStyle::Signal),
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
            },
            interrupt: InterruptStyle::Signal,
        },
        _ => return None,
    })
}

pub const BUILTIN_NAMES: [&str; 6] = ["claude", "gemini", "codex", "opencode", "copilot", "dummy"];

/// The profile `name`: built in, overridden by `<home>/profiles/<name>.json` when present.
pub fn load(name: &str, home: &Path) -> anyhow::Result<Profile> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        anyhow::bail!("Error: '{name}' is not a profile name (lowercase letters, digits, '_')");
    }
    let file = home.join("profiles").join(format!("{name}.json"));
    let base = builtin(name);
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return base.ok_or_else(|| {
                anyhow::anyhow!(
                    "Error: unknown profile '{name}'. Built in: {}; or define {}",
                    BUILTIN_NAMES.join(", "),
                    file.display()
                )
            });
        }
        Err(error) => anyhow::bail!("Error: cannot read {}: {error}", file.display()),
    };
    let overrides: serde_json::Value = serde_json::from_str(&text)
        .map_err(|error| anyhow::anyhow!("Error: {} line {}: {error}", file.display(), error.line()))?;
    let mut merged = match &base {
        Some(base) => serde_json::to_value(base)?,
        None => serde_json::json!({"name": name}),
    };
    merge(&mut merged, overrides);
    serde_json::from_value(merged).map_err(|error| anyhow::anyhow!("Error: {}: {error}", file.display()))
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
        assert!(load("../x", home.path()).is_err());
    }
}
