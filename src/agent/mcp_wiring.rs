//! Registering `synapse mcp` with the CLI an agent runs, for that session only, through the CLI's
//! own per-session mechanism (docs/cli-integration.md): a flag naming a file in the agent's own
//! directory (`$SYNAPSE_HOME/agents/<agent_id>.<wrapper pid>/`, 0700, removed when the agent
//! stops, or by the broker once it finds the wrapper gone), `-c`
//! overrides (Codex), or a variable naming a settings file (Gemini, OpenCode). The user's own
//! configuration files are never written.
//!
//! Each mechanism also allows the Synapse tools without a permission dialog: they act only as
//! this agent, through the broker's own rules, so asking the user for each would defeat them.
//! The agent's secret never goes on a command line (visible in `ps`): a CLI that passes its
//! environment to the server gets nothing more; one that may not (Gemini's redaction, OpenCode,
//! Copilot) gets the identity in the 0600 file.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::path::Path;

/// The name the server is registered under in every CLI (its tools become `mcp__synapse__reply`,
/// `synapse_reply`, ...).
pub const SERVER_NAME: &str = "synapse";

/// Longest a tool call may take, in seconds: above `send`'s longest wait (600 s).
pub const TOOL_TIMEOUT_SECS: u64 = 620;

/// The variables that carry the agent's identity and its broker to the server.
pub const IDENTITY_VARIABLES: [&str; 4] =
    ["SYNAPSE_AGENT_ID", "SYNAPSE_AGENT_SECRET", "SYNAPSE_HOME", "SYNAPSE_UDS_DIR"];

/// The settings read from the environment by `synapse mcp` and by a broker it starts: Codex
/// gives a server only the variables it names, so these are named too (the other CLIs pass
/// their whole environment on). Without them Codex's server could run with file safety off
/// while its agent had it on, or start a broker without the user's auth settings.
pub const SETTINGS_VARIABLES: [&str; 21] = [
    "SYNAPSE_FILE_SAFETY_ENABLED",
    "SYNAPSE_HISTORY_ENABLED",
    "SYNAPSE_CLIENT_TIMEOUT_MS",
    "SYNAPSE_API_KEY",
    "SYNAPSE_LOG",
    "SYNAPSE_BROKER_PORT",
    "SYNAPSE_AUTH_ENABLED",
    "SYNAPSE_API_KEYS",
    "SYNAPSE_ALLOW_LOCALHOST",
    "SYNAPSE_ALLOW_OTHER_USERS",
    "SYNAPSE_ALLOWED_ORIGINS",
    "SYNAPSE_ALLOWED_HOSTS",
    "SYNAPSE_OUTBOUND_ALLOW_PRIVATE",
    "SYNAPSE_EXTERNAL_TIMEOUT_MS",
    "SYNAPSE_INBOX_HOLD_SECONDS",
    "SYNAPSE_HTTP_MAX_CONNECTIONS",
    "SYNAPSE_HTTP_IDLE_TIMEOUT_MS",
    "SYNAPSE_HTTP_HEADER_TIMEOUT_MS",
    "SYNAPSE_HTTP_BODY_TIMEOUT_MS",
    "SYNAPSE_HTTP_WRITE_STALL_MS",
    "SYNAPSE_HTTP_CLOSING_GRACE_MS",
];

/// What `synapse doctor` says about hooks: where they hand busy messages over, and why not
/// elsewhere.
pub const HOOKS_ON: &str =
    "claude and gemini get messages that arrive while they are busy at their next tool boundary (synapse hook)";
pub const HOOKS_OFF: &str = "codex runs hooks only after a one-time approval in its TUI (/hooks), and opencode and copilot have no command hook that adds context: their busy messages wait for the prompt and are typed";

/// How a CLI takes an extra MCP server for one session (a profile field, `"mcp": "claude"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpStyle {
    /// `--mcp-config=<file>` and `--settings=<file>` allowing `mcp__synapse`.
    Claude,
    /// `-c mcp_servers.synapse.*` overrides, the tools approved by `default_tools_approval_mode`.
    Codex,
    /// `GEMINI_CLI_SYSTEM_DEFAULTS_PATH=<file>` with a trusted server.
    Gemini,
    /// `OPENCODE_CONFIG=<file>` with the server and `synapse_*` allowed.
    Opencode,
    /// `--additional-mcp-config=@<file>` and `--allow-tool=synapse`.
    Copilot,
}

/// What the CLI's command gains: arguments before the user's, and environment variables.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Wiring {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Why the CLI gets no MCP server after all (said once at start); None when wired.
    pub refused: Option<String>,
    /// What the wiring left out and why, said once at start (the CLI is wired all the same).
    pub note: Option<String>,
}

impl Wiring {
    /// The CLI was given the Synapse MCP server.
    pub fn has_tools(&self) -> bool {
        !self.args.is_empty() || !self.env.is_empty()
    }
}

/// The shell command a CLI's hook runs: `'<synapse>' hook <event>`, the path quoted for `sh`.
fn hook_command(synapse: &str, event: &str) -> String {
    format!("'{}' hook {event}", synapse.replace('\'', "'\\''"))
}

/// The `hooks` section of a Claude Code or Gemini CLI settings file: `synapse hook <event>` after
/// every tool.
fn hooks_section(synapse: &str, event: &str) -> Value {
    json!({event: [{"matcher": "*", "hooks": [{"type": "command", "command": hook_command(synapse, event)}]}]})
}

/// Writes what `style` needs into `dir` (created 0700) and says how to pass it. `synapse` is the
/// executable the CLI starts; `identity` the values of [`IDENTITY_VARIABLES`]; `inherited` reads
/// a variable of the wrapper's environment (a file the user already names by Gemini's or
/// OpenCode's variable is merged, not dropped).
pub fn wire(
    style: McpStyle,
    hooks: bool,
    synapse: &Path,
    dir: &Path,
    identity: &[(String, String)],
    inherited: impl Fn(&str) -> Option<String>,
) -> std::io::Result<Wiring> {
    crate::private_files::create_dir(dir)?;
    let command = synapse.display().to_string();
    let env: serde_json::Map<String, Value> =
        identity.iter().map(|(key, value)| (key.clone(), Value::String(value.clone()))).collect();
    let write = |name: &str, value: &Value| -> std::io::Result<String> {
        let path = dir.join(name);
        crate::private_files::write(&path, serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?)?;
        Ok(path.display().to_string())
    };
    Ok(match style {
        McpStyle::Claude => {
            let servers = write(
                "claude-mcp.json",
                &json!({"mcpServers": {SERVER_NAME: {
                    "type": "stdio", "command": command, "args": ["mcp"], "env": env,
                    // Loaded up front, not deferred behind Claude's tool search.
                    "alwaysLoad": true, "timeout": TOOL_TIMEOUT_SECS * 1000,
                }}}),
            )?;
            let mut settings = json!({"permissions": {"allow": [format!("mcp__{SERVER_NAME}")]}});
            if hooks {
                settings["hooks"] = hooks_section(&command, "PostToolUse");
            }
            let settings = write("claude-settings.json", &settings)?;
            // `--flag=value`: both flags take several values, and a separate value would swallow
            // the user's own arguments after it.
            Wiring {
                args: vec![format!("--mcp-config={servers}"), format!("--settings={settings}")],
                ..Wiring::default()
            }
        }
        McpStyle::Codex => {
            // A JSON string is a TOML basic string but for DEL, which TOML wants escaped.
            let toml_string = |text: &str| serde_json::to_string(text).unwrap_or_default().replace('\u{7f}', "\\u007F");
            let names: Vec<String> =
                IDENTITY_VARIABLES.iter().chain(&SETTINGS_VARIABLES).map(|name| toml_string(name)).collect();
            let prefix = format!("mcp_servers.{SERVER_NAME}");
            let overrides = [
                format!("{prefix}.command={}", toml_string(&command)),
                format!("{prefix}.args=[\"mcp\"]"),
                // By name: Codex forwards these from its own environment.
                format!("{prefix}.env_vars=[{}]", names.join(",")),
                format!("{prefix}.tool_timeout_sec={TOOL_TIMEOUT_SECS}"),
                format!("{prefix}.default_tools_approval_mode=\"approve\""),
            ];
            Wiring {
                args: overrides.into_iter().flat_map(|value| ["-c".to_string(), value]).collect(),
                ..Wiring::default()
            }
        }
        McpStyle::Gemini => {
            // Gemini reads a system settings file only when it and every directory above it
            // belong to root and no one else can write them; else it skips the file with a
            // warning. Say so instead of wiring a file it will not read.
            if let Some(reason) = gemini_refuses(dir) {
                return Ok(Wiring {
                    refused: Some(format!(
                        "Gemini CLI reads a per-session settings file only where root owns every directory above it ({reason}): this agent answers with `synapse reply` through its shell instead of the synapse MCP tools"
                    )),
                    ..Wiring::default()
                });
            }
            let variable = "GEMINI_CLI_SYSTEM_DEFAULTS_PATH";
            // The user's file is merged only where Gemini would read it itself: its servers and
            // hooks are commands, and Synapse's copy is a file Gemini trusts.
            let mut note = None;
            let named = inherited(variable).filter(|path| !path.is_empty()).filter(|path| {
                // Where it is, links resolved: a root-owned link into a directory the user can
                // write would pass a check of the path as written.
                let file = std::fs::canonicalize(path).ok();
                match file.and_then(|file| gemini_refuses(&file)) {
                    Some(reason) => {
                        note = Some(format!(
                            "{path} (named by {variable}) is not merged: Gemini CLI skips a system settings file where {reason}"
                        ));
                        false
                    }
                    None => true,
                }
            });
            let mut settings = match inherited_object(variable, named) {
                Ok(settings) => settings,
                Err(reason) => return Ok(kept(reason)),
            };
            merge_object(
                &mut settings,
                "mcpServers",
                json!({"command": command, "args": ["mcp"], "env": env, "trust": true,
                    "timeout": TOOL_TIMEOUT_SECS * 1000}),
            );
            if hooks {
                add_hooks(&mut settings, hooks_section(&command, "AfterTool"));
            }
            let path = write("gemini-settings.json", &settings)?;
            Wiring { env: vec![(variable.to_string(), path)], note, ..Wiring::default() }
        }
        McpStyle::Opencode => {
            let variable = "OPENCODE_CONFIG";
            let users = inherited(variable);
            let mut config = match inherited_object(variable, users.clone()) {
                Ok(config) => config,
                Err(reason) => return Ok(kept(reason)),
            };
            // OpenCode reads `{file:notes.md}` from beside the file that says it: beside the
            // user's file, not beside Synapse's copy.
            let users = users.filter(|path| !path.is_empty()).and_then(|path| std::path::absolute(path).ok());
            if let Some(beside) = users.as_deref().and_then(Path::parent).and_then(Path::to_str) {
                anchor_file_references(&mut config, &resolved(beside, ""), &inherited);
            }
            merge_object(
                &mut config,
                "mcp",
                json!({"type": "local", "command": [command, "mcp"], "enabled": true, "environment": env,
                    "timeout": TOOL_TIMEOUT_SECS * 1000}),
            );
            if let Some(object) = config.as_object_mut() {
                let permission = object.entry("permission").or_insert_with(|| json!({}));
                if let Some(permission) = permission.as_object_mut() {
                    permission.insert(format!("{SERVER_NAME}_*"), json!("allow"));
                }
            }
            let path = write("opencode.json", &config)?;
            Wiring { env: vec![(variable.to_string(), path)], ..Wiring::default() }
        }
        McpStyle::Copilot => {
            let path = write(
                "copilot-mcp.json",
                &json!({"mcpServers": {SERVER_NAME: {
                    "type": "local", "command": command, "args": ["mcp"], "env": env, "tools": ["*"],
                    "timeout": TOOL_TIMEOUT_SECS * 1000,
                }}}),
            )?;
            Wiring {
                args: vec![format!("--additional-mcp-config=@{path}"), format!("--allow-tool={SERVER_NAME}")],
                ..Wiring::default()
            }
        }
    })
}

/// Why Gemini CLI would skip a system settings file in `dir`: the first of `dir` and its
/// ancestors that is not owned by root or that group or others can write (Gemini's own rule for
/// system settings, `checkPosixStatsSecurity` in its bundle). None: it reads it.
pub fn gemini_refuses(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    for ancestor in dir.ancestors() {
        let meta = match std::fs::metadata(ancestor) {
            Ok(meta) => meta,
            // Not there yet: Synapse creates it, owned by whoever runs it, mode 0700.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => match crate::private_files::my_uid() {
                0 => continue,
                uid => return Some(format!("{} would belong to uid {uid}", ancestor.display())),
            },
            Err(error) => return Some(format!("{}: {error}", ancestor.display())),
        };
        if meta.uid() != 0 {
            return Some(format!("{} belongs to uid {}", ancestor.display(), meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return Some(format!("{} is writable by group or others", ancestor.display()));
        }
    }
    None
}

/// The JSON object in the file `variable` names (JSONC too: comments and trailing commas, as
/// OpenCode and Gemini CLI allow), to be merged into Synapse's file; an empty one when no file
/// is named or there is none. A file that is there but cannot be read as an object is an error:
/// Synapse's file would replace it for the session, and the user's settings (providers, their
/// own MCP servers, permission rules) would be gone without a word.
fn inherited_object(variable: &str, path: Option<String>) -> Result<Value, String> {
    let Some(path) = path.filter(|path| !path.is_empty()) else { return Ok(json!({})) };
    let text = match read_settings_file(Path::new(&path)) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(json!({})),
        Err(error) => return Err(format!("{path} (named by {variable}) cannot be read: {error}")),
    };
    // A byte-order mark, as some editors write: not JSON, but the CLIs read past it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    match serde_json::from_str::<Value>(text).or_else(|_| serde_json::from_str::<Value>(&without_jsonc(text))) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err(format!("{path} (named by {variable}) holds no JSON object")),
        Err(error) => Err(format!("{path} (named by {variable}) is not JSON: {error}")),
    }
}

/// The most of a user's settings file that is read: no real one comes near it.
const SETTINGS_FILE_MAX_BYTES: u64 = 16 << 20;

/// The text of a settings file: a regular file (a FIFO or a device named by mistake would hold
/// the wrapper's start for ever, or fill its memory), of at most [`SETTINGS_FILE_MAX_BYTES`].
fn read_settings_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Opened without waiting (a FIFO opens at once), then its kind read from what was opened: a
    // file swapped for a FIFO between a check and the open cannot hold the start.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    file.take(SETTINGS_FILE_MAX_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > SETTINGS_FILE_MAX_BYTES {
        return Err(std::io::Error::other(format!("larger than {} MB", SETTINGS_FILE_MAX_BYTES >> 20)));
    }
    Ok(text)
}

/// JSONC made JSON: comments (`//` to the end of the line, `/* ... */`) and commas right before
/// a closing bracket taken out, outside strings.
fn without_jsonc(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            plain.push(c);
            match c {
                '\\' => plain.extend(chars.next()),
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                plain.push(c);
            }
            ('/', Some('/')) => while chars.next_if(|next| *next != '\n').is_some() {},
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for next in chars.by_ref() {
                    if last == '*' && next == '/' {
                        break;
                    }
                    last = next;
                }
                plain.push(' ');
            }
            _ => plain.push(c),
        }
    }
    // Trailing commas: a comma whose next non-blank character closes an object or an array.
    let mut out = String::with_capacity(plain.len());
    let mut in_string = false;
    let mut escaped = false;
    for (at, c) in plain.char_indices() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            in_string = true;
        } else if c == ',' && matches!(plain[at + 1..].trim_start().chars().next(), Some('}' | ']')) {
            continue;
        }
        out.push(c);
    }
    out
}

/// Makes every relative `{file:<path>}` in the strings of `value` name the same file from
/// `beside`, the directory of the user's file: OpenCode resolves such a path against the
/// directory of the file it reads, and it reads Synapse's copy. OpenCode's rule is followed:
/// `{env:NAME}` parts are replaced first (their values read by `variable`; the copy keeps them
/// unreplaced), a path that then starts with `/` or `~/` is left as it is, and another is
/// joined to the directory with `.` and `..` taken out as text (Node's `path.resolve`, which
/// does not follow symbolic links). A directory whose name would end the reference (`}`) or be
/// escaped in the JSON text OpenCode matches (`"`, `\`, control characters) is left alone.
fn anchor_file_references(value: &mut Value, beside: &str, variable: &dyn Fn(&str) -> Option<String>) {
    if beside.chars().any(|c| matches!(c, '}' | '"' | '\\') || c.is_control()) {
        return;
    }
    match value {
        Value::String(text) if text.contains(FILE_REFERENCE) => *text = anchored(text, beside, variable),
        Value::Array(items) => items.iter_mut().for_each(|item| anchor_file_references(item, beside, variable)),
        Value::Object(fields) => fields.values_mut().for_each(|field| anchor_file_references(field, beside, variable)),
        _ => {}
    }
}

const FILE_REFERENCE: &str = "{file:";
const ENV_REFERENCE: &str = "{env:";

/// `text` with its relative file references joined to `beside` (see [`anchor_file_references`]).
fn anchored(text: &str, beside: &str, variable: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len() + beside.len());
    let mut rest = text;
    while let Some(at) = rest.find(FILE_REFERENCE) {
        let (before, reference) = rest.split_at(at + FILE_REFERENCE.len());
        out.push_str(before);
        rest = reference;
        let Some(end) = reference_end(reference) else { continue };
        let path = &reference[..end];
        let expanded = with_variables(path, variable);
        if expanded.is_empty() || expanded.starts_with('/') || expanded.starts_with("~/") {
            out.push_str(path);
        } else if path.contains(ENV_REFERENCE) {
            // Its parts are known only once OpenCode replaces them: joined, not resolved.
            out.push_str(beside);
            out.push('/');
            out.push_str(path);
        } else {
            out.push_str(&resolved(beside, path));
        }
        out.push('}');
        rest = &reference[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Where the path of a file reference ends (`reference` follows `{file:`): at the first `}`
/// that does not close an `{env:NAME}` inside it. None: the reference is never closed.
fn reference_end(reference: &str) -> Option<usize> {
    let mut at = 0;
    loop {
        let rest = &reference[at..];
        if rest.starts_with(ENV_REFERENCE) {
            let close = rest.find('}')?;
            if close > ENV_REFERENCE.len() {
                at += close + 1;
                continue;
            }
        }
        match rest.chars().next()? {
            '}' => return Some(at),
            c => at += c.len_utf8(),
        }
    }
}

/// `path` with each `{env:NAME}` replaced by the variable's value (empty when unset), as
/// OpenCode does before it reads file references.
fn with_variables(path: &str, variable: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(at) = rest.find(ENV_REFERENCE) {
        let after = &rest[at + ENV_REFERENCE.len()..];
        match after.find('}').filter(|close| *close > 0) {
            Some(close) => {
                out.push_str(&rest[..at]);
                out.push_str(&variable(&after[..close]).unwrap_or_default());
                rest = &after[close + 1..];
            }
            // `{env:}` names no variable: kept as text, and the search goes on after it.
            None => {
                out.push_str(&rest[..at + ENV_REFERENCE.len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `relative` joined to the absolute directory `base`, with `.`, `..` and empty parts taken
/// out as text.
fn resolved(base: &str, relative: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in base.split('/').chain(relative.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// No MCP server, for a user's file that Synapse cannot merge into its own: the user's file
/// stays in effect.
fn kept(reason: String) -> Wiring {
    Wiring {
        refused: Some(format!(
            "{reason}: your file stays in effect, and this agent answers with `synapse reply` through its shell instead of the synapse MCP tools"
        )),
        ..Wiring::default()
    }
}

/// Adds the hook entries of `ours` (`{event: [entries]}`) to `document.hooks`, after the entries
/// an inherited file already has for the same event: the user's own hooks keep running.
fn add_hooks(document: &mut Value, ours: Value) {
    let (Some(object), Value::Object(ours)) = (document.as_object_mut(), ours) else { return };
    let section = object.entry("hooks").or_insert_with(|| json!({}));
    if !section.is_object() {
        *section = json!({});
    }
    let Some(section) = section.as_object_mut() else { return };
    for (event, entries) in ours {
        let slot = section.entry(event).or_insert_with(|| json!([]));
        if !slot.is_array() {
            *slot = json!([]);
        }
        if let (Some(slot), Value::Array(entries)) = (slot.as_array_mut(), entries) {
            slot.extend(entries);
        }
    }
}

/// Sets `document[section][synapse] = server`, keeping the section's other entries.
fn merge_object(document: &mut Value, section: &str, server: Value) {
    let Some(object) = document.as_object_mut() else { return };
    let entry = object.entry(section).or_insert_with(|| json!({}));
    if !entry.is_object() {
        *entry = json!({});
    }
    if let Some(servers) = entry.as_object_mut() {
        servers.insert(SERVER_NAME.to_string(), server);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// As long as a real secret: a short one ("s3", until 2026-11-27) can occur by chance in
    /// the random name of the test's temporary directory, which the arguments name (the likely
    /// cause of one failure in a full run).
    const SECRET: &str = "5e0c7d1a9b3f42e68a0d17c5b2e94f3a";

    fn identity() -> Vec<(String, String)> {
        vec![("SYNAPSE_AGENT_ID".into(), "synapse-claude-8100".into()), ("SYNAPSE_AGENT_SECRET".into(), SECRET.into())]
    }

    fn read(path: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn claude_gets_two_files_by_flag_with_the_tools_allowed_and_no_secret_on_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agents/a");
        let wiring = wire(McpStyle::Claude, true, Path::new("/bin/syn apse"), &agent, &identity(), |_| None).unwrap();
        assert_eq!(wiring.args.len(), 2);
        assert!(wiring.args.iter().all(|arg| !arg.contains(SECRET)), "{:?}", wiring.args);
        let servers = read(wiring.args[0].strip_prefix("--mcp-config=").unwrap());
        assert_eq!(servers["mcpServers"]["synapse"]["command"], "/bin/syn apse");
        assert_eq!(servers["mcpServers"]["synapse"]["alwaysLoad"], true);
        let settings = read(wiring.args[1].strip_prefix("--settings=").unwrap());
        assert_eq!(settings["permissions"]["allow"], json!(["mcp__synapse"]));
        assert_eq!(settings["hooks"]["PostToolUse"][0]["hooks"][0]["command"], "'/bin/syn apse' hook PostToolUse");
        assert_eq!(hook_command("/a'b", "X"), r"'/a'\''b' hook X");
        let mode = std::fs::metadata(agent.join("claude-mcp.json")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&agent).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn codex_gets_overrides_that_forward_the_identity_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let wiring =
            wire(McpStyle::Codex, false, Path::new("/x/\"q\"/synapse"), dir.path(), &identity(), |_| None).unwrap();
        assert!(wiring.args.iter().all(|arg| !arg.contains(SECRET)));
        // DEL, which a JSON string may hold as is and a TOML one may not.
        let del =
            wire(McpStyle::Codex, false, Path::new("/x\u{7f}/synapse"), dir.path(), &identity(), |_| None).unwrap();
        assert!(del.args.contains(&r#"mcp_servers.synapse.command="/x\u007F/synapse""#.to_string()), "{:?}", del.args);
        assert!(
            wiring.args.contains(&r#"mcp_servers.synapse.command="/x/\"q\"/synapse""#.to_string()),
            "{:?}",
            wiring.args
        );
        assert!(wiring.args.iter().any(|arg| arg.contains("env_vars=[\"SYNAPSE_AGENT_ID\",\"SYNAPSE_AGENT_SECRET\"")));
        // The settings the server and a broker it starts read: the server's tools are the agent's.
        for name in ["SYNAPSE_FILE_SAFETY_ENABLED", "SYNAPSE_HISTORY_ENABLED", "SYNAPSE_AUTH_ENABLED"] {
            assert!(wiring.args.iter().any(|arg| arg.contains(&format!("\"{name}\""))), "{name}: {:?}", wiring.args);
        }
        assert_eq!(wiring.args.iter().filter(|arg| *arg == "-c").count(), 5);
    }

    /// OpenCode and Gemini read JSONC: a comment made the user's file unreadable here, so
    /// Synapse's file replaced it (providers, MCP servers, permission rules gone). The user's
    /// order is kept (OpenCode's last matching permission rule wins), and a file that cannot be
    /// read at all is left in effect, without the MCP server.
    #[test]
    fn a_users_jsonc_file_is_merged_in_its_order_and_an_unreadable_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("own.jsonc");
        std::fs::write(
            &own,
            "// mine\n{\"theme\": \"dark // not a comment\", /* x */ \"permission\": {\"git push *\": \"ask\", \"git *\": \"allow\",},\n \"url\": \"http://a/*b*/\\\"\",}\n",
        )
        .unwrap();
        let own_path = own.display().to_string();
        let wiring = wire(McpStyle::Opencode, false, Path::new("/s"), &dir.path().join("b"), &identity(), |name| {
            (name == "OPENCODE_CONFIG").then(|| own_path.clone())
        })
        .unwrap();
        assert!(wiring.refused.is_none(), "{:?}", wiring.refused);
        let written = std::fs::read_to_string(&wiring.env[0].1).unwrap();
        let config: Value = serde_json::from_str(&written).unwrap();
        assert_eq!(config["theme"], "dark // not a comment");
        assert_eq!(config["url"], "http://a/*b*/\"");
        assert_eq!(config["permission"]["synapse_*"], "allow");
        let (push, any) = (written.find("git push *").unwrap(), written.find("\"git *\"").unwrap());
        assert!(push < any, "the user's rule order: {written}");

        // Gemini's file must be in a directory only root can write to (not under /tmp): the
        // repository's, when it and those above it are root's (as root only, as below).
        let gemini_base = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        for (style, variable, base) in [
            (McpStyle::Opencode, "OPENCODE_CONFIG", dir.path()),
            (McpStyle::Gemini, "GEMINI_CLI_SYSTEM_DEFAULTS_PATH", gemini_base.path()),
        ] {
            let agent = base.join("c");
            if style == McpStyle::Gemini && gemini_refuses(&agent).is_some() {
                continue;
            }
            // The user's file where Gemini would read it too (it skips one under /tmp).
            let own = base.join("own.jsonc");
            std::fs::write(&own, "{ this is not json").unwrap();
            let own_path = own.display().to_string();
            let wiring = wire(style, false, Path::new("/s"), &agent, &identity(), |name| {
                (name == variable).then(|| own_path.clone())
            })
            .unwrap();
            assert!(wiring.env.is_empty() && wiring.args.is_empty(), "{style:?}: {:?}", wiring.env);
            let refused = wiring.refused.unwrap_or_default();
            assert!(refused.contains(&own_path) && refused.contains("stays in effect"), "{refused}");
        }
    }

    #[test]
    fn a_file_the_user_names_by_the_variable_is_merged_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("own.json");
        let original = r#"{"mcp": {"mine": {"command": ["x"]}}, "theme": "dark"}"#;
        std::fs::write(&own, original).unwrap();
        let own_path = own.display().to_string();
        let wiring = wire(McpStyle::Opencode, false, Path::new("/s"), &dir.path().join("b"), &identity(), |name| {
            (name == "OPENCODE_CONFIG").then(|| own_path.clone())
        })
        .unwrap();
        assert_eq!(wiring.env[0].0, "OPENCODE_CONFIG");
        let config = read(&wiring.env[0].1);
        assert_eq!(config["mcp"]["mine"]["command"], json!(["x"]));
        assert_eq!(config["theme"], "dark");
        assert_eq!(config["mcp"]["synapse"]["command"], json!(["/s", "mcp"]));
        assert_eq!(config["mcp"]["synapse"]["environment"]["SYNAPSE_AGENT_SECRET"], SECRET);
        assert_eq!(config["permission"]["synapse_*"], "allow");
        assert_eq!(std::fs::read_to_string(&own).unwrap(), original, "the user's file is untouched");
    }

    /// OpenCode reads `{file:prompt.md}` beside the file that names it. Copied into the
    /// agent's directory, a relative reference named a file there that does not exist, and
    /// OpenCode refused the whole file ("bad file reference").
    #[test]
    fn relative_file_references_in_a_users_opencode_file_still_name_the_users_files() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("conf/own.json");
        std::fs::create_dir_all(own.parent().unwrap()).unwrap();
        std::fs::write(
            &own,
            r#"{"agent": {"a": {"prompt": "{file:./p.md} and {file:../q.md}"}},
                "keys": ["{file:/abs/k}", "{file:~/h}", "{file:}", "{file:x"],
                "env": ["{file:{env:SYN_T_ABS}/k}", "{file:{env:SYN_T_REL}/k}", "{file:d/{env:SYN_T_ABS}.md}"],
                "plain": "file:y"}"#,
        )
        .unwrap();
        // The user's file named through a `..`: Node's path.resolve takes it out as text.
        let own_path = dir.path().join("conf/../conf/own.json").display().to_string();
        let wiring =
            wire(McpStyle::Opencode, false, Path::new("/s"), &dir.path().join("b"), &identity(), |name| match name {
                "OPENCODE_CONFIG" => Some(own_path.clone()),
                "SYN_T_ABS" => Some("/abs".into()),
                "SYN_T_REL" => Some("rel".into()),
                _ => None,
            })
            .unwrap();
        let config = read(&wiring.env[0].1);
        let base = dir.path().display().to_string();
        assert_eq!(config["agent"]["a"]["prompt"], format!("{{file:{base}/conf/p.md}} and {{file:{base}/q.md}}"));
        assert_eq!(config["keys"], json!(["{file:/abs/k}", "{file:~/h}", "{file:}", "{file:x"]));
        assert_eq!(
            config["env"],
            json!([
                "{file:{env:SYN_T_ABS}/k}",
                format!("{{file:{base}/conf/{{env:SYN_T_REL}}/k}}"),
                format!("{{file:{base}/conf/d/{{env:SYN_T_ABS}}.md}}"),
            ])
        );
        assert_eq!(config["plain"], "file:y");
        // A directory whose name would break the reference is left alone.
        let mut config = json!({"p": "{file:p.md}"});
        anchor_file_references(&mut config, "/a}b", &|_| None);
        assert_eq!(config["p"], "{file:p.md}");
        assert_eq!(resolved("/a/b/", "../../../c/./d/"), "/c/d");
        let abs = |name: &str| (name == "A").then(|| "/abs".to_string());
        assert_eq!(with_variables("{env:}x/{env:A}", &abs), "{env:}x//abs");
    }

    #[test]
    fn gemini_is_wired_only_where_it_reads_the_file() {
        // /tmp is writable by everyone: Gemini would skip the file, so nothing is wired, and why
        // is said.
        let open = tempfile::tempdir_in("/tmp").unwrap();
        let wiring =
            wire(McpStyle::Gemini, false, Path::new("/s"), &open.path().join("a"), &identity(), |_| None).unwrap();
        let refused = wiring.refused.clone().unwrap_or_default();
        assert!(refused.contains("/tmp is writable by group or others"), "{refused}");
        assert!(wiring.env.is_empty() && wiring.args.is_empty());
        // Where Gemini would read it (root owns the path: this build's own directory when the
        // tests run as root), the file holds a trusted server.
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
        // (It may not exist yet: a fresh checkout built into another CARGO_TARGET_DIR.)
        std::fs::create_dir_all(&base).unwrap();
        if gemini_refuses(&base).is_none() {
            let dir = tempfile::tempdir_in(&base).unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
            let wiring =
                wire(McpStyle::Gemini, false, Path::new("/s"), &dir.path().join("a"), &identity(), |_| None).unwrap();
            assert_eq!(wiring.refused, None);
            assert_eq!(wiring.env[0].0, "GEMINI_CLI_SYSTEM_DEFAULTS_PATH");
            assert_eq!(read(&wiring.env[0].1)["mcpServers"]["synapse"]["trust"], true);
        }
    }

    #[test]
    fn a_users_gemini_file_is_merged_only_where_gemini_would_read_it() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
        std::fs::create_dir_all(&base).unwrap();
        if gemini_refuses(&base).is_some() {
            return; // Not root: Gemini is not wired at all (the test above).
        }
        let dir = tempfile::tempdir_in(&base).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let users = json!({"mcpServers": {"corp": {"command": "corp-mcp"}}});
        // In /tmp (writable by everyone) Gemini skips the file: so does Synapse, and says so.
        let open = tempfile::tempdir_in("/tmp").unwrap();
        let skipped = open.path().join("gem.json");
        std::fs::write(&skipped, users.to_string()).unwrap();
        let trusted = dir.path().join("gem.json");
        std::fs::write(&trusted, users.to_string()).unwrap();
        for (file, merged) in [(&skipped, false), (&trusted, true)] {
            let named = file.display().to_string();
            let wiring = wire(McpStyle::Gemini, false, Path::new("/s"), &dir.path().join("a"), &identity(), |_| {
                Some(named.clone())
            })
            .unwrap();
            let settings = read(&wiring.env[0].1);
            assert_eq!(settings["mcpServers"]["corp"].is_object(), merged, "{named}: {settings}");
            assert!(settings["mcpServers"]["synapse"].is_object());
            assert_eq!(wiring.note.is_some(), !merged, "{:?}", wiring.note);
        }
    }

    #[test]
    fn a_users_file_that_is_not_a_regular_file_or_starts_with_a_bom_is_read_with_care() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let refused = inherited_object("OPENCODE_CONFIG", Some(fifo.display().to_string())).unwrap_err();
        assert!(refused.contains("not a regular file"), "{refused}");
        let bom = dir.path().join("bom.json");
        std::fs::write(&bom, "\u{feff}{\"a\": 1}").unwrap();
        assert_eq!(inherited_object("OPENCODE_CONFIG", Some(bom.display().to_string())).unwrap(), json!({"a": 1}));
    }

    #[test]
    fn synapse_hooks_come_after_the_users_own_for_the_same_event() {
        let mut settings = json!({"hooks": {"AfterTool": [{"matcher": "x", "hooks": []}], "BeforeAgent": [1]}});
        add_hooks(&mut settings, hooks_section("/s", "AfterTool"));
        let after = settings["hooks"]["AfterTool"].as_array().unwrap();
        assert_eq!(after.len(), 2, "{settings}");
        assert_eq!(after[0]["matcher"], "x", "the user's entry stays first");
        assert_eq!(after[1]["hooks"][0]["command"], "'/s' hook AfterTool");
        assert_eq!(settings["hooks"]["BeforeAgent"], json!([1]));
        let mut fresh = json!({});
        add_hooks(&mut fresh, hooks_section("/s", "AfterTool"));
        assert_eq!(fresh["hooks"]["AfterTool"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn copilot_gets_a_file_by_flag_and_its_tools_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let wiring = wire(McpStyle::Copilot, false, Path::new("/s"), dir.path(), &identity(), |_| None).unwrap();
        assert_eq!(wiring.args[1], "--allow-tool=synapse");
        let config = read(wiring.args[0].strip_prefix("--additional-mcp-config=@").unwrap());
        assert_eq!(config["mcpServers"]["synapse"]["args"], json!(["mcp"]));
    }
}
