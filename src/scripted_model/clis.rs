//! The five real CLIs against the scripted model: where their binaries are and how to configure
//! each in a HOME and work dir of its own (as verified by hand, 2026-11-23, pinned versions in
//! tools/install-clis). Used by tests/real_clis.rs and `tools/bench real-clis`.
//!
//! The setups only write files and return environment and arguments; the caller starts the CLI
//! (in a PTY or tmux) with `PATH` of its own choosing (put the `synapse` to be called first).

use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The CLIs, by binary name.
pub const CLI_NAMES: [&str; 5] = ["claude", "codex", "gemini", "opencode", "copilot"];

/// An API key long enough for every CLI (Claude wants at least 20 characters).
pub const FAKE_API_KEY: &str = "sk-scripted-0123456789abcdefghij";

/// How to start one CLI against the scripted model.
#[derive(Debug, Clone)]
pub struct CliSetup {
    /// Environment to set (HOME included).
    pub env: Vec<(String, String)>,
    /// Arguments for the CLI.
    pub args: Vec<String>,
    /// Screen text that appears once the CLI is ready for input (see each setup's notes: some
    /// also appear inside dialogs or before the CLI is really ready).
    pub ready_text: &'static str,
}

/// `$SYNAPSE_CLIS_DIR`, default `~/.cache/synapse/clis` (where tools/install-clis puts them).
pub fn clis_dir() -> PathBuf {
    match std::env::var_os("SYNAPSE_CLIS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/synapse/clis"),
    }
}

/// The installed binary of a CLI, if there is one.
pub fn cli_binary(name: &str) -> Option<PathBuf> {
    let path = clis_dir().join("node_modules/.bin").join(name);
    path.is_file().then_some(path)
}

/// Writes the CLI's configuration into `home` / `work_dir` and returns how to start it.
pub fn setup(name: &str, home: &Path, work_dir: &Path, model_port: u16) -> std::io::Result<CliSetup> {
    std::fs::create_dir_all(home)?;
    std::fs::create_dir_all(work_dir)?;
    let mut setup = match name {
        "claude" => claude(home, work_dir, model_port)?,
        "codex" => codex(home, work_dir, model_port)?,
        "gemini" => gemini(home, work_dir, model_port)?,
        "opencode" => opencode(home, work_dir, model_port)?,
        "copilot" => copilot(home, work_dir, model_port)?,
        other => return Err(std::io::Error::other(format!("unknown CLI {other}"))),
    };
    setup.env.insert(0, ("HOME".to_string(), home.display().to_string()));
    Ok(setup)
}

fn pairs(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(key, value)| (key.to_string(), value.clone())).collect()
}

fn write_json(path: &Path, value: &Value) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(value).map_err(std::io::Error::other)?)
}

/// Claude Code: onboarding done, the key approved, the work dir trusted (else it ignores the base
/// URL or shows the trust dialog), `Bash(synapse:*)` and `Bash(sleep:*)` (the long tool run of
/// the busy-delivery tests) allowed. Ready: `❯` + no-break space in the
/// input box (the same `❯` marks the choice in its dialogs). Sends a tool-less title request
/// (`output_config.format` JSON schema `{title}`) with the first real message, and `HEAD /`.
pub fn claude(home: &Path, work_dir: &Path, port: u16) -> std::io::Result<CliSetup> {
    let key_tail: String = FAKE_API_KEY.chars().skip(FAKE_API_KEY.chars().count() - 20).collect();
    let work = work_dir.display().to_string();
    write_json(
        &home.join(".claude.json"),
        &json!({
            "hasCompletedOnboarding": true,
            "lastOnboardingVersion": "2.1.197",
            "customApiKeyResponses": {"approved": [key_tail], "rejected": []},
            "projects": {work: {"hasTrustDialogAccepted": true}},
        }),
    )?;
    write_json(
        &home.join(".claude/settings.json"),
        &json!({"permissions": {"allow": ["Bash(synapse:*)", "Bash(sleep:*)"]}}),
    )?;
    Ok(CliSetup {
        env: pairs(&[
            ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
            ("ANTHROPIC_API_KEY", FAKE_API_KEY.to_string()),
            ("DISABLE_AUTOUPDATER", "1".to_string()),
        ]),
        args: Vec::new(),
        ready_text: "❯\u{a0}",
    })
}

/// Codex: a provider on the Responses API with a bearer token in the file (`env_key` failed),
/// the work dir trusted. It must run with `--no-daemon` (else commands run in a shared `codex
/// app-server` without the agent's environment): the codex profile passes it. Ready: `Ask Codex to do anything` (the empty box's placeholder),
/// drawn under the splash within a second.
pub fn codex(home: &Path, work_dir: &Path, port: u16) -> std::io::Result<CliSetup> {
    let config = format!(
        "model = \"fake-model\"\nmodel_provider = \"fake\"\n\n[model_providers.fake]\nname = \"fake\"\n\
         base_url = \"http://127.0.0.1:{port}/v1\"\nwire_api = \"responses\"\n\
         experimental_bearer_token = \"{FAKE_API_KEY}\"\n\n[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
        work_dir.display()
    );
    std::fs::create_dir_all(home.join(".codex"))?;
    std::fs::write(home.join(".codex/config.toml"), config)?;
    Ok(CliSetup { env: Vec::new(), args: Vec::new(), ready_text: "Ask Codex to do anything" })
}

/// Gemini CLI: API-key auth, folder trust off (and the dir trusted anyway), `synapse` allowed
/// for the shell tool by a policy file. Ready: `Type your message`. Each turn starts with a tool-less
/// `:generateContent` routing request (JSON schema answer).
pub fn gemini(home: &Path, work_dir: &Path, port: u16) -> std::io::Result<CliSetup> {
    write_json(
        &home.join(".gemini/settings.json"),
        &json!({
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
            "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
            "privacy": {"usageStatisticsEnabled": false},
        }),
    )?;
    write_json(&home.join(".gemini/trustedFolders.json"), &json!({work_dir.display().to_string(): "TRUST_FOLDER"}))?;
    // `synapse` runs without asking; everything else asks (`tools.allowed` in settings.json
    // instead denies every other command without a dialog).
    std::fs::create_dir_all(home.join(".gemini/policies"))?;
    std::fs::write(
        home.join(".gemini/policies/synapse.toml"),
        "[[rule]]\ntoolName = \"run_shell_command\"\ncommandPrefix = \"synapse\"\ndecision = \"allow\"\npriority = 100\n\n\
         [[rule]]\ntoolName = \"run_shell_command\"\ncommandPrefix = \"sleep\"\ndecision = \"allow\"\npriority = 100\n",
    )?;
    Ok(CliSetup {
        env: pairs(&[
            ("GEMINI_API_KEY", FAKE_API_KEY.to_string()),
            ("GOOGLE_GEMINI_BASE_URL", format!("http://127.0.0.1:{port}")),
        ]),
        args: Vec::new(),
        ready_text: "Type your message",
    })
}

/// OpenCode: `opencode.json` in the work dir with an openai-compatible provider, `synapse *`
/// allowed for bash (everything else asks). Ready: `┃` (the input box border; it is also the
/// border of its permission dialog). Sends a tool-less title request with the first message.
pub fn opencode(_home: &Path, work_dir: &Path, port: u16) -> std::io::Result<CliSetup> {
    write_json(
        &work_dir.join("opencode.json"),
        &json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": format!("http://127.0.0.1:{port}/v1"), "apiKey": FAKE_API_KEY},
                "models": {"fake-model": {"name": "Fake model", "tool_call": true}},
            }},
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "permission": {"bash": {"*": "ask", "synapse *": "allow", "sleep *": "allow"}},
            "autoupdate": false,
            "share": "disabled",
        }),
    )?;
    Ok(CliSetup { env: Vec::new(), args: Vec::new(), ready_text: "┃" })
}

/// Copilot CLI: offline with an OpenAI-type provider, the work dir trusted in
/// `~/.copilot/config.json` (else "Confirm folder trust"), `shell(synapse)` and `shell(sleep)` allowed.
/// Ready: `❯` at the start of the input line (its dialogs mark the choice with `❯` too; they
/// say `enter to select`).
pub fn copilot(home: &Path, work_dir: &Path, port: u16) -> std::io::Result<CliSetup> {
    write_json(&home.join(".copilot/config.json"), &json!({"trusted_folders": [work_dir.display().to_string()]}))?;
    Ok(CliSetup {
        env: pairs(&[
            ("COPILOT_OFFLINE", "true".to_string()),
            ("COPILOT_PROVIDER_BASE_URL", format!("http://127.0.0.1:{port}/v1")),
            ("COPILOT_PROVIDER_TYPE", "openai".to_string()),
            ("COPILOT_PROVIDER_API_KEY", FAKE_API_KEY.to_string()),
            ("COPILOT_MODEL", "fake-model".to_string()),
        ]),
        args: vec!["--allow-tool=shell(synapse)".to_string(), "--allow-tool=shell(sleep)".to_string()],
        ready_text: "❯",
    })
}
