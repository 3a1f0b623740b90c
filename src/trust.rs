//! The broker's security settings, kept in `$SYNAPSE_HOME/broker-settings.json` (0600).
//!
//! Whoever autostarts the broker must not decide its security: a wrapper reconnecting after a
//! broker crash used to start a new broker with its own environment, without auth. So the
//! settings that protect the broker (auth on/off, the API keys as SHA-256 digests, the localhost
//! rule, other users, allowed hosts and origins, file safety, private outgoing targets) live in
//! this file:
//! - written by `synapse broker` / `synapse broker start` / `synapse init`, where the variables
//!   explicitly set in that command's environment update the file (unset ones keep their value);
//! - read by every broker at start, and only from the file: a broker autostarted by a client
//!   (`synapse broker --autostarted`) ignores that client's environment for these settings.
//!
//! A file that cannot be read or parsed stops the broker with a message naming it: a missing
//! security setting never silently falls back to "open".
//!
//! The same home also holds the deliberate-stop marker (`broker.stopped`): written before a
//! broker stops on request, removed when a broker starts. Wrappers do not autostart a broker
//! while it exists.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file's name inside `SYNAPSE_HOME`.
pub const FILE_NAME: &str = "broker-settings.json";
/// The deliberate-stop marker inside `SYNAPSE_HOME`.
pub const STOPPED_MARKER: &str = "broker.stopped";

/// The security settings of every broker of one home. A field the file names that is not one
/// of these (a typo such as `auth_enable`) stops the broker: a setting must never be silently
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustSettings {
    pub version: u32,
    /// `SYNAPSE_AUTH_ENABLED`.
    pub auth_enabled: bool,
    /// SHA-256 digests (hex) of `SYNAPSE_API_KEYS`; the keys themselves are never stored.
    pub api_key_sha256: Vec<String>,
    /// `SYNAPSE_ALLOW_LOCALHOST`: loopback and Unix-socket callers pass without a key.
    pub allow_localhost: bool,
    /// `SYNAPSE_FILE_SAFETY_ENABLED`; None: decided by the settings files.
    pub file_safety_enabled: Option<bool>,
    /// `SYNAPSE_OUTBOUND_ALLOW_PRIVATE`: webhooks and external agents may target loopback and
    /// private addresses.
    pub outbound_allow_private: bool,
    /// `SYNAPSE_ALLOW_OTHER_USERS`: other users' processes may call a broker without auth.
    pub allow_other_users: bool,
    /// `SYNAPSE_ALLOWED_HOSTS` (comma-separated): `Host` names allowed besides loopback ones.
    pub allowed_hosts: Vec<String>,
    /// `SYNAPSE_ALLOWED_ORIGINS` (comma-separated): browser origins allowed besides the
    /// broker's own.
    pub allowed_origins: Vec<String>,
}

impl Default for TrustSettings {
    fn default() -> TrustSettings {
        TrustSettings {
            version: 1,
            auth_enabled: false,
            api_key_sha256: Vec::new(),
            allow_localhost: true,
            file_safety_enabled: None,
            outbound_allow_private: false,
            allow_other_users: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// A comma-separated list, each item trimmed, without a trailing `/`, in lowercase.
fn parse_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|item| item.trim().trim_end_matches('/').to_ascii_lowercase())
        .filter(|item| !item.is_empty())
        .collect()
}

/// SHA-256 of a key (trimmed), as the auth check compares it.
pub fn key_digest(key: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(key.trim().as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (index, slot) in out.iter_mut().enumerate() {
        *slot = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).ok()?;
    }
    Some(out)
}

/// A boolean variable: Some when set to something, None when unset or empty.
fn parse_flag(name: &str, value: Option<String>) -> anyhow::Result<Option<bool>> {
    let Some(value) = value.filter(|value| !value.trim().is_empty()) else { return Ok(None) };
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" => Ok(Some(false)),
        other => anyhow::bail!("{name}='{other}' is not a boolean (true or false)"),
    }
}

impl TrustSettings {
    pub fn path(home: &Path) -> PathBuf {
        home.join(FILE_NAME)
    }

    /// The digests as bytes (malformed entries were refused at load).
    pub fn key_digests(&self) -> Vec<[u8; 32]> {
        self.api_key_sha256.iter().filter_map(|text| unhex(text)).collect()
    }

    /// Reads the file; the defaults when it does not exist.
    pub fn load(home: &Path) -> anyhow::Result<TrustSettings> {
        let path = TrustSettings::path(home);
        let bytes = match crate::private_files::read_own(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(TrustSettings::default()),
            Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
        };
        let settings: TrustSettings = serde_json::from_slice(&bytes).with_context(|| {
            format!("{} is not valid broker settings; fix or remove it (and restart the broker)", path.display())
        })?;
        if let Some(bad) = settings.api_key_sha256.iter().find(|text| unhex(text).is_none()) {
            anyhow::bail!("{}: '{bad}' is not a SHA-256 digest in hex", path.display());
        }
        Ok(settings)
    }

    /// Applies the variables explicitly set in `lookup` (the environment of a command typed by
    /// the user); unset ones keep their value.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
        if let Some(on) = parse_flag("SYNAPSE_AUTH_ENABLED", lookup("SYNAPSE_AUTH_ENABLED"))? {
            self.auth_enabled = on;
        }
        if let Some(keys) = lookup("SYNAPSE_API_KEYS").filter(|keys| !keys.trim().is_empty()) {
            self.api_key_sha256 =
                keys.split(',').filter(|key| !key.trim().is_empty()).map(|key| hex(&key_digest(key))).collect();
        }
        if let Some(on) = parse_flag("SYNAPSE_ALLOW_LOCALHOST", lookup("SYNAPSE_ALLOW_LOCALHOST"))? {
            self.allow_localhost = on;
        }
        if let Some(on) = parse_flag("SYNAPSE_FILE_SAFETY_ENABLED", lookup("SYNAPSE_FILE_SAFETY_ENABLED"))? {
            self.file_safety_enabled = Some(on);
        }
        if let Some(on) = parse_flag("SYNAPSE_OUTBOUND_ALLOW_PRIVATE", lookup("SYNAPSE_OUTBOUND_ALLOW_PRIVATE"))? {
            self.outbound_allow_private = on;
        }
        if let Some(on) = parse_flag("SYNAPSE_ALLOW_OTHER_USERS", lookup("SYNAPSE_ALLOW_OTHER_USERS"))? {
            self.allow_other_users = on;
        }
        // Lists: set (even empty, which clears them) replaces.
        if let Some(hosts) = lookup("SYNAPSE_ALLOWED_HOSTS") {
            self.allowed_hosts = parse_list(&hosts);
        }
        if let Some(origins) = lookup("SYNAPSE_ALLOWED_ORIGINS") {
            self.allowed_origins = parse_list(&origins);
        }
        Ok(())
    }

    /// Writes the file atomically (temporary file, fsync, rename), readable only by the user.
    /// The home is created 0700 if missing (`synapse init` may be the first to make it).
    pub fn save(&self, home: &Path) -> anyhow::Result<()> {
        crate::private_files::create_dir(home).with_context(|| format!("cannot create {}", home.display()))?;
        let path = TrustSettings::path(home);
        let mut text = serde_json::to_vec_pretty(self)?;
        text.push(b'\n');
        crate::private_files::replace(&path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    /// What `synapse broker`/`broker start`/`init` do: the file, updated by this process's
    /// environment, written back when it changed (or did not exist). Returns the settings and
    /// whether the file changed.
    pub fn update_from_env(home: &Path) -> anyhow::Result<(TrustSettings, bool)> {
        let existed = TrustSettings::path(home).exists();
        let mut settings = TrustSettings::load(home)?;
        let before = settings.clone();
        settings.apply_env(|name| std::env::var(name).ok())?;
        let changed = settings != before;
        if changed || !existed {
            settings.save(home)?;
        }
        Ok((settings, changed && existed))
    }
}

/// Records that the broker was stopped on purpose (before it stops answering).
pub fn mark_stopped(home: &Path) -> std::io::Result<()> {
    crate::private_files::write(&home.join(STOPPED_MARKER), b"stopped on request\n")
}

/// Was the last broker of this home stopped on purpose (and none started since)?
pub fn is_stopped_on_purpose(home: &Path) -> bool {
    home.join(STOPPED_MARKER).exists()
}

/// A broker starts: the deliberate stop is over.
pub fn clear_stopped(home: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(home.join(STOPPED_MARKER)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_explicit_variables_change_the_file_and_keys_are_stored_as_digests() {
        let home = tempfile::tempdir().unwrap();
        let mut settings = TrustSettings::default();
        settings
            .apply_env(|name| match name {
                "SYNAPSE_AUTH_ENABLED" => Some("true".into()),
                "SYNAPSE_API_KEYS" => Some("alpha, beta".into()),
                _ => None,
            })
            .unwrap();
        settings.save(home.path()).unwrap();
        let text = std::fs::read_to_string(TrustSettings::path(home.path())).unwrap();
        assert!(!text.contains("alpha") && !text.contains("beta"), "{text}");
        let mut loaded = TrustSettings::load(home.path()).unwrap();
        assert_eq!(loaded, settings);
        assert_eq!(loaded.key_digests(), vec![key_digest("alpha"), key_digest("beta")]);
        loaded.apply_env(|name| (name == "SYNAPSE_ALLOW_LOCALHOST").then(|| "false".into())).unwrap();
        assert!(loaded.auth_enabled && !loaded.allow_localhost && loaded.key_digests().len() == 2);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(TrustSettings::path(home.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_malformed_file_is_an_error_never_the_defaults() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(TrustSettings::path(home.path()), "{\"auth_enabled\": tru").unwrap();
        assert!(TrustSettings::load(home.path()).is_err());
        std::fs::write(TrustSettings::path(home.path()), r#"{"api_key_sha256":["xyz"]}"#).unwrap();
        assert!(TrustSettings::load(home.path()).is_err());
        let mut settings = TrustSettings::default();
        assert!(settings.apply_env(|_| Some("maybe".into())).is_err());
        // A misspelt setting is refused, not ignored (auth would stay off).
        std::fs::write(TrustSettings::path(home.path()), r#"{"auth_enable": true}"#).unwrap();
        let refused = TrustSettings::load(home.path()).err().map(|error| format!("{error:#}")).unwrap_or_default();
        assert!(refused.contains("auth_enable"), "{refused}");
        // A file of an older version (without the newer fields) still loads.
        std::fs::write(TrustSettings::path(home.path()), r#"{"version": 1, "auth_enabled": true}"#).unwrap();
        assert!(TrustSettings::load(home.path()).is_ok_and(|loaded| loaded.auth_enabled && !loaded.allow_other_users));
    }

    #[test]
    fn other_users_hosts_and_origins_come_from_the_variables_and_an_empty_list_clears() {
        let mut settings = TrustSettings::default();
        settings
            .apply_env(|name| match name {
                "SYNAPSE_ALLOW_OTHER_USERS" => Some("true".into()),
                "SYNAPSE_ALLOWED_HOSTS" => Some(" DevBox , other:8100 ".into()),
                "SYNAPSE_ALLOWED_ORIGINS" => Some("https://OK.example/".into()),
                _ => None,
            })
            .unwrap();
        assert!(settings.allow_other_users);
        assert_eq!(settings.allowed_hosts, vec!["devbox".to_string(), "other:8100".to_string()]);
        assert_eq!(settings.allowed_origins, vec!["https://ok.example".to_string()]);
        settings.apply_env(|name| (name == "SYNAPSE_ALLOWED_ORIGINS").then(String::new)).unwrap();
        assert!(settings.allowed_origins.is_empty() && settings.allowed_hosts.len() == 2);
    }
}
