//! Settings: built-in defaults < `~/.synapse/settings.json` (user) < `./.synapse/settings.json`
//! (project) < `./.synapse/settings.local.json` (local), SPEC §6.
//!
//! Read lazily by the commands that need them (never by projections). A malformed file is an
//! error naming the file and the line, never a silent default. Also here: whether file safety
//! and the history views are on, which the CLI and the MCP server decide alike.

use anyhow::bail;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// How `synapse send` behaves by default (`a2a.flow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Expect a reply and wait for it.
    Roundtrip,
    /// Fire and forget.
    Oneway,
    /// Expect a reply (it comes back into the sender's PTY); do not block.
    Auto,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// The merged settings document.
    pub merged: Value,
    /// The files that were read, lowest precedence first.
    pub sources: Vec<PathBuf>,
    /// Keys no version of Synapse reads (a typo, most likely), one line per key and file.
    pub warnings: Vec<String>,
    /// The project's directory, as given (the current one for an agent).
    pub project_dir: PathBuf,
    /// The names of the `env` variables the project's own files set (`settings.json`,
    /// `settings.local.json`): a cloned repository chooses them, so they reach an agent only
    /// once the user trusts them (`project_trust`).
    pub project_env_names: Vec<String>,
    /// The project's files that set them.
    pub project_env_files: Vec<PathBuf>,
}

/// The keys Synapse reads, at the top and inside each section. Keys starting with `_` are
/// comments (JSON has none).
const KNOWN_KEYS: &[(&str, &[&str])] =
    &[("env", &[]), ("instructions", &[]), ("a2a", &["flow"]), ("file_safety", &["enabled"]), ("mcp", &[])];

/// The keys of one settings file that Synapse does not read.
fn unknown_keys(path: &Path, value: &Value) -> Vec<String> {
    let mut warnings = Vec::new();
    let Some(object) = value.as_object() else { return warnings };
    let known: Vec<&str> = KNOWN_KEYS.iter().map(|(key, _)| *key).collect();
    for (key, inner) in object {
        if key.starts_with('_') {
            continue;
        }
        match KNOWN_KEYS.iter().find(|(name, _)| name == key) {
            None => warnings.push(format!(
                "{}: unknown key '{key}' is ignored (known: {})",
                path.display(),
                known.join(", ")
            )),
            // env holds any variable names; the others have fixed keys.
            Some((section, keys)) if !keys.is_empty() => {
                for inner_key in inner.as_object().into_iter().flat_map(|inner| inner.keys()) {
                    if !inner_key.starts_with('_') && !keys.contains(&inner_key.as_str()) {
                        warnings.push(format!(
                            "{}: unknown key '{section}.{inner_key}' is ignored (known: {})",
                            path.display(),
                            keys.iter().map(|key| format!("{section}.{key}")).collect::<Vec<_>>().join(", ")
                        ));
                    }
                }
            }
            Some(_) => {}
        }
    }
    warnings
}

/// The variables one file's `env` section sets (its `_` keys are comments).
fn env_names(value: &Value) -> Vec<String> {
    match value.get("env") {
        Some(Value::Object(map)) => map.keys().filter(|key| !key.starts_with('_')).cloned().collect(),
        _ => Vec::new(),
    }
}

/// The three scopes, lowest precedence first: (name, file).
pub fn scope_files(home: &Path, project_dir: &Path) -> [(&'static str, PathBuf); 3] {
    [
        ("user", home.join("settings.json")),
        ("project", project_dir.join(".synapse").join("settings.json")),
        ("local", project_dir.join(".synapse").join("settings.local.json")),
    ]
}

pub fn defaults() -> Value {
    serde_json::json!({
        "env": {},
        "instructions": [],
        "a2a": {"flow": "auto"},
        "mcp": true,
    })
}

fn merge(base: &mut Value, overrides: Value) {
    match (base, overrides) {
        (Value::Object(base), Value::Object(overrides)) => {
            for (key, value) in overrides {
                merge(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (slot, value) => *slot = value,
    }
}

/// Reads one settings file; None when it does not exist.
pub fn read_file(path: &Path) -> anyhow::Result<Option<Value>> {
    parse_file(path, std::fs::read_to_string(path))
}

/// Reads the user's settings file (in the home): it must be the user's (its `env` reaches every
/// agent's CLI: `LD_PRELOAD`, `PATH`), see [`crate::private_files::read_own`].
fn read_user_file(path: &Path) -> anyhow::Result<Option<Value>> {
    let text = crate::private_files::read_own(path).and_then(|bytes| {
        String::from_utf8(bytes).map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))
    });
    parse_file(path, text)
}

fn parse_file(path: &Path, text: std::io::Result<String>) -> anyhow::Result<Option<Value>> {
    let text = match text {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => bail!("cannot read {}: {error}", path.display()),
    };
    let value: Value = serde_json::from_str(&text).map_err(|error| {
        anyhow::anyhow!("{} line {} column {}: {error}", path.display(), error.line(), error.column())
    })?;
    if !value.is_object() {
        bail!("{} line 1: the settings must be a JSON object", path.display());
    }
    Ok(Some(value))
}

impl Settings {
    /// Loads and merges every scope.
    pub fn load(home: &Path, project_dir: &Path) -> anyhow::Result<Settings> {
        let mut merged = defaults();
        let mut sources = Vec::new();
        let mut warnings = Vec::new();
        let mut project_env_names = Vec::new();
        let mut project_env_files = Vec::new();
        let [user, project, local] = scope_files(home, project_dir);
        let user_file = user.1.clone();
        // Run in the directory that holds the home (`~` with `~/.synapse`), the project's file
        // is the user's own: read once, as the user's. Looked at only for a project file that
        // exists (`synapse send` reads the settings every time).
        let is_the_users = |path: &Path| {
            std::fs::canonicalize(path)
                .is_ok_and(|path| std::fs::canonicalize(&user_file).is_ok_and(|user| user == path))
        };
        for (scope, path) in [user, project, local] {
            let value = if scope == "user" { read_user_file(&path)? } else { read_file(&path)? };
            if let Some(value) = value
                && (scope == "user" || !is_the_users(&path))
            {
                warnings.extend(unknown_keys(&path, &value));
                if scope != "user" {
                    // Merged, a null or a string would replace the user's whole env section.
                    if value.get("env").is_some_and(|env| !env.is_object()) {
                        bail!(
                            "env in {} must be an object of variables: a project's settings add to your env, \
                             they cannot take it away",
                            path.display()
                        );
                    }
                    let names = env_names(&value);
                    if !names.is_empty() {
                        project_env_names.extend(names);
                        project_env_files.push(path.clone());
                    }
                }
                merge(&mut merged, value);
                sources.push(path);
            }
        }
        project_env_names.sort();
        project_env_names.dedup();
        let settings = Settings {
            merged,
            sources,
            warnings,
            project_dir: project_dir.to_path_buf(),
            project_env_names,
            project_env_files,
        };
        settings.flow()?;
        settings.env()?;
        settings.mcp()?;
        Ok(settings)
    }

    /// Loads from `SYNAPSE_HOME` and the current directory.
    pub fn load_current(home: &Path) -> anyhow::Result<Settings> {
        let project = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        Settings::load(home, &project)
    }

    fn origin(&self) -> String {
        match self.sources.last() {
            Some(path) => path.display().to_string(),
            None => "the built-in settings".to_string(),
        }
    }

    pub fn flow(&self) -> anyhow::Result<Flow> {
        match self.merged.pointer("/a2a/flow") {
            None | Some(Value::Null) => Ok(Flow::Auto),
            Some(Value::String(flow)) => match flow.as_str() {
                "roundtrip" => Ok(Flow::Roundtrip),
                "oneway" => Ok(Flow::Oneway),
                "auto" => Ok(Flow::Auto),
                other => bail!("a2a.flow '{other}' in {} must be roundtrip, oneway or auto", self.origin()),
            },
            Some(other) => bail!("a2a.flow in {} must be a string, not {other}", self.origin()),
        }
    }

    /// Whether agents get Synapse's MCP server in their CLI (`mcp`, default true).
    pub fn mcp(&self) -> anyhow::Result<bool> {
        match self.merged.get("mcp") {
            None | Some(Value::Null) => Ok(true),
            Some(Value::Bool(on)) => Ok(*on),
            Some(other) => bail!("mcp in {} must be true or false, not {other}", self.origin()),
        }
    }

    /// Environment variables for agents (`env` section).
    pub fn env(&self) -> anyhow::Result<Vec<(String, String)>> {
        match self.merged.get("env") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(map)) => map
                .iter()
                .filter(|(key, _)| !key.starts_with('_'))
                .map(|(key, value)| match value {
                    _ if key.is_empty() || key.contains(['=', '\0']) => bail!(
                        "env in {} names '{}', which is no variable name (empty, or with = or NUL)",
                        self.origin(),
                        crate::escape::visible_line(key)
                    ),
                    Value::String(text) => Ok((key.clone(), text.clone())),
                    Value::Number(_) | Value::Bool(_) => Ok((key.clone(), value.to_string())),
                    other => bail!("env.{key} in {} must be a string, not {other}", self.origin()),
                })
                .collect(),
            Some(other) => bail!("env in {} must be an object, not {other}", self.origin()),
        }
    }

    /// Instruction files named in settings (`instructions`), relative to the project.
    pub fn instructions(&self, project_dir: &Path) -> Vec<PathBuf> {
        match self.merged.get("instructions") {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(|path| {
                    let path = PathBuf::from(path);
                    if path.is_absolute() { path } else { project_dir.join(path) }
                })
                .collect(),
            Some(Value::String(path)) => vec![project_dir.join(path)],
            _ => Vec::new(),
        }
    }
}

/// What a file-safety command says when file safety is off.
pub const FILE_SAFETY_HOW_TO_ENABLE: &str = "File safety is disabled. Enable it with SYNAPSE_FILE_SAFETY_ENABLED=true (or \"file_safety\": {\"enabled\": true} in settings).";

/// Is file safety on? `SYNAPSE_FILE_SAFETY_ENABLED`, else the broker's security settings in
/// `home`, else `file_safety.enabled` in the settings of the current directory (default off).
pub fn file_safety_enabled(home: &Path) -> bool {
    let from_env = std::env::var("SYNAPSE_FILE_SAFETY_ENABLED")
        .ok()
        .map(|value| matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
    let from_home = || crate::trust::TrustSettings::load(home).ok().and_then(|trust| trust.file_safety_enabled);
    from_env.or_else(from_home).unwrap_or_else(|| {
        Settings::load_current(home)
            .ok()
            .and_then(|settings| settings.merged.pointer("/file_safety/enabled").and_then(Value::as_bool))
            .unwrap_or(false)
    })
}

/// What a history command says when the history views are off.
pub const HISTORY_DISABLED: &str =
    "history is disabled (SYNAPSE_HISTORY_ENABLED=false). Unset it or set it to true to use the history views.";

/// Are the history views on? Off only when `SYNAPSE_HISTORY_ENABLED` says so.
pub fn history_enabled() -> bool {
    !std::env::var("SYNAPSE_HISTORY_ENABLED")
        .is_ok_and(|value| matches!(value.trim().to_ascii_lowercase().as_str(), "0" | "false" | "no" | "off"))
}

/// The commented template `synapse init` writes (JSON has no comments: `_comment` keys).
pub fn template() -> Value {
    let mut map = Map::new();
    map.insert("_comment".into(), Value::String(
        "Synapse settings. Precedence: built-in < ~/.synapse/settings.json < ./.synapse/settings.json < ./.synapse/settings.local.json".into(),
    ));
    map.insert("env".into(), serde_json::json!({"_comment": "environment variables for the agents' CLIs"}));
    map.insert(
        "_comment_instructions".into(),
        Value::String(
            "instructions: paths of files (relative to the project, or absolute) whose text each agent is given at start, e.g. [\"AGENTS.md\", \"docs/team.md\"]; the paths, not the text".into(),
        ),
    );
    map.insert("instructions".into(), serde_json::json!([]));
    map.insert(
        "a2a".into(),
        serde_json::json!({"_comment": "flow: roundtrip (expect a reply and wait), oneway (no reply), auto (expect a reply, do not wait)", "flow": "auto"}),
    );
    map.insert(
        "_comment_mcp".into(),
        Value::String(
            "mcp: true gives each agent's CLI Synapse's tools (send, reply, ...) over MCP for its session only; false (or synapse start --no-mcp) leaves the CLI as it is".into(),
        ),
    );
    map.insert("mcp".into(), Value::Bool(true));
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_scopes_override_earlier_ones_field_by_field() {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(project.path().join(".synapse")).unwrap();
        std::fs::write(home.path().join("settings.json"), r#"{"a2a":{"flow":"oneway"},"env":{"A":"user","B":"user"}}"#)
            .unwrap();
        std::fs::write(project.path().join(".synapse/settings.json"), r#"{"env":{"B":"project"}}"#).unwrap();
        std::fs::write(project.path().join(".synapse/settings.local.json"), r#"{"a2a":{"flow":"roundtrip"}}"#).unwrap();
        let settings = Settings::load(home.path(), project.path()).unwrap();
        assert_eq!(settings.flow().unwrap(), Flow::Roundtrip);
        let mut env = settings.env().unwrap();
        env.sort();
        assert_eq!(env, vec![("A".into(), "user".into()), ("B".into(), "project".into())]);
        assert_eq!(settings.sources.len(), 3);
        assert!(settings.mcp().unwrap(), "on by default");
        std::fs::write(project.path().join(".synapse/settings.json"), r#"{"mcp": false}"#).unwrap();
        assert!(!Settings::load(home.path(), project.path()).unwrap().mcp().unwrap());
        std::fs::write(project.path().join(".synapse/settings.json"), r#"{"mcp": "yes"}"#).unwrap();
        let error = Settings::load(home.path(), project.path()).unwrap_err().to_string();
        assert!(error.contains("mcp in") && error.contains("true or false"), "{error}");
    }

    #[test]
    fn unknown_keys_are_named_with_their_file_and_comments_are_not() {
        let path = Path::new("/p/.synapse/settings.json");
        let value = serde_json::json!({
            "_comment": "x", "env": {"ANY_NAME": "1"}, "a2a": {"flow": "auto", "flwo": "x"},
            "instruction": ["AGENTS.md"], "file_safety": {"enabled": true}
        });
        let warnings = unknown_keys(path, &value);
        assert_eq!(warnings.len(), 2, "{warnings:#?}");
        assert!(warnings.iter().any(|w| w.contains("'a2a.flwo'") && w.starts_with("/p/.synapse/settings.json")));
        assert!(warnings.iter().any(|w| w.contains("'instruction'") && w.contains("known: env, instructions")));
        assert!(unknown_keys(path, &template()).is_empty(), "the template's own keys are known");
    }

    #[test]
    fn no_files_means_the_built_in_defaults() {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let settings = Settings::load(home.path(), project.path()).unwrap();
        assert_eq!(settings.flow().unwrap(), Flow::Auto);
        assert!(settings.env().unwrap().is_empty());
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_the_file_and_line() {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("settings.json"), "{\n  \"a2a\": {\n    \"flow\": oops\n  }\n}").unwrap();
        let error = Settings::load(home.path(), project.path()).unwrap_err().to_string();
        assert!(error.contains("settings.json line 3"), "{error}");
        std::fs::write(home.path().join("settings.json"), r#"{"a2a":{"flow":"sideways"}}"#).unwrap();
        let error = Settings::load(home.path(), project.path()).unwrap_err().to_string();
        assert!(error.contains("sideways") && error.contains("settings.json"), "{error}");
        std::fs::write(home.path().join("settings.json"), "[1]").unwrap();
        assert!(Settings::load(home.path(), project.path()).is_err());
    }

    #[test]
    fn the_template_is_valid_settings() {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("settings.json"), template().to_string()).unwrap();
        let settings = Settings::load(home.path(), project.path()).unwrap();
        assert_eq!(settings.flow().unwrap(), Flow::Auto);
    }
}
