//! Which projects' `env` the user trusts, kept in `$SYNAPSE_HOME/trusted-projects.json` (0600).
//!
//! A project's `.synapse/settings.json` and `settings.local.json` come with the project: a
//! cloned repository chooses them. Their `env` reaches every agent's CLI started there, and a
//! variable such as `LD_PRELOAD`, `PATH` or `NODE_OPTIONS` runs code before the CLI's own trust
//! dialog is even drawn. So those variables reach an agent only once the user has run
//! `synapse trust` in that directory, which records a digest of the directory and of the
//! variables with their values; any change to them asks for `synapse trust` again (as direnv
//! does with `.envrc`). The user's own settings (in the home) need no such step.

use crate::settings::Settings;
use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file's name inside `SYNAPSE_HOME`.
pub const FILE_NAME: &str = "trusted-projects.json";

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustedProjects {
    version: u32,
    /// Directory (as shown) → SHA-256 (hex) of the directory's bytes and its variables.
    projects: BTreeMap<String, String>,
}

fn path(home: &Path) -> PathBuf {
    home.join(FILE_NAME)
}

/// The directory a project is known by: its canonical path (the one `getcwd` gives).
fn canonical_dir(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// The path a directory removed since had, as [`canonical_dir`] gave it: its nearest ancestor
/// that still exists made canonical (its links resolved), then the rest (`..` worked out by
/// name).
fn canonical_if_gone(dir: &Path) -> std::io::Result<PathBuf> {
    use std::path::Component;
    let absolute = std::path::absolute(dir)?;
    let parts: Vec<Component> = absolute.components().collect();
    for existing in (1..=parts.len()).rev() {
        let Ok(mut path) = std::fs::canonicalize(parts[..existing].iter().collect::<PathBuf>()) else { continue };
        for part in &parts[existing..] {
            match part {
                Component::ParentDir => {
                    path.pop();
                }
                Component::Normal(name) => path.push(name),
                _ => {}
            }
        }
        return Ok(path);
    }
    Ok(absolute)
}

/// The digest of what is trusted: the directory's bytes and every variable the project's
/// files set, with its value in effect (JSON: no two inputs encode alike).
fn digest(dir: &Path, settings: &Settings, env: &[(String, String)]) -> String {
    use std::os::unix::ffi::OsStrExt;
    let variables: BTreeMap<&str, Option<&str>> = settings
        .project_env_names
        .iter()
        .map(|name| {
            let value = env.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str());
            (name.as_str(), value)
        })
        .collect();
    let bytes: Vec<u8> = dir.as_os_str().as_bytes().to_vec();
    let encoded = serde_json::to_vec(&(bytes, variables)).unwrap_or_default();
    Sha256::digest(&encoded).iter().map(|byte| format!("{byte:02x}")).collect()
}

fn load(home: &Path) -> anyhow::Result<TrustedProjects> {
    let file = path(home);
    let bytes = match crate::private_files::read_own(&file) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(TrustedProjects { version: 1, projects: BTreeMap::new() });
        }
        Err(error) => bail!("cannot read {}: {error}", file.display()),
    };
    let trusted: TrustedProjects = serde_json::from_slice(&bytes).with_context(|| {
        format!("{} is not a list of trusted projects; remove it and run `synapse trust` again", file.display())
    })?;
    if trusted.version != 1 {
        bail!(
            "{} is of version {}, which this build does not know; remove it and run `synapse trust` again",
            file.display(),
            trusted.version
        );
    }
    Ok(trusted)
}

fn save(home: &Path, trusted: &TrustedProjects) -> anyhow::Result<()> {
    let file = path(home);
    let text = serde_json::to_string_pretty(trusted)?;
    crate::private_files::replace(&file, format!("{text}\n"))
        .with_context(|| format!("cannot write {}", file.display()))
}

/// Runs `change` on the list under an exclusive lock (two `synapse trust` at once both land).
fn update(home: &Path, change: impl FnOnce(&mut TrustedProjects)) -> anyhow::Result<()> {
    let lock_path = home.join(".trusted-projects.lock");
    let lock =
        crate::private_files::open_write(&lock_path).with_context(|| format!("cannot open {}", lock_path.display()))?;
    // Released when `lock` is closed.
    lock.lock().with_context(|| format!("cannot lock {}", lock_path.display()))?;
    let mut trusted = load(home)?;
    change(&mut trusted);
    save(home, &trusted)
}

/// The environment for an agent's CLI: [`Settings::env`], refused while the project's own
/// files set variables the user has not trusted for this directory ([`check`]).
pub fn agent_env(home: &Path, settings: &Settings) -> anyhow::Result<Vec<(String, String)>> {
    let env = settings.env()?;
    check(home, settings, &env)?;
    Ok(env)
}

/// Text of the project's (its path, its files, its variables) for the user's terminal, on one
/// line: controls and invisible formatting (a right-to-left override) shown as escapes, so that
/// nothing in it can hide or reorder what the user is asked to trust.
fn shown(text: &str) -> String {
    crate::escape::visible_line(text)
        .chars()
        .map(
            |c| {
                if crate::escape::is_invisible_format(c) {
                    format!("\\u{{{:04x}}}", u32::from(c))
                } else {
                    c.to_string()
                }
            },
        )
        .collect()
}

fn shown_files(settings: &Settings) -> String {
    let files: Vec<String> = settings.project_env_files.iter().map(|file| shown(&file.display().to_string())).collect();
    files.join(" and ")
}

/// Refuses the project's variables unless the user trusted exactly these for this directory.
pub fn check(home: &Path, settings: &Settings, env: &[(String, String)]) -> anyhow::Result<()> {
    if settings.project_env_names.is_empty() {
        return Ok(());
    }
    let dir = canonical_dir(&settings.project_dir);
    let trusted = load(home)?;
    let known = trusted.projects.get(&dir.display().to_string());
    if known.is_some_and(|recorded| *recorded == digest(&dir, settings, env)) {
        return Ok(());
    }
    let names = shown(&settings.project_env_names.join(", "));
    let what = if known.is_some() { "changed since you trusted them" } else { "not trusted yet" };
    bail!(
        "{} set{} env for the agents started in {} ({names}), {what}. A project's env can run code in \
         every agent's CLI (LD_PRELOAD, PATH, NODE_OPTIONS), so Synapse passes it on only once you trust \
         it: read the file, then run `synapse trust` in that directory (again after any change to its env).",
        shown_files(settings),
        if settings.project_env_files.len() == 1 { "s" } else { "" },
        shown(&dir.display().to_string())
    )
}

/// What `synapse trust` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Trust,
    Revoke,
    List,
}

/// `synapse trust [DIR] [--revoke | --list]`.
pub fn run(home: &Path, dir: Option<&Path>, action: Action) -> anyhow::Result<i32> {
    // A damaged list is said before anything is shown as if it would be recorded.
    let trusted = load(home)?;
    if action == Action::List {
        if trusted.projects.is_empty() {
            println!("No project's env is trusted.");
        }
        for dir in trusted.projects.keys() {
            println!("{}", shown(dir));
        }
        return Ok(0);
    }
    let given = dir.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    if action == Action::Revoke {
        // A directory removed since is taken back by the path it had: a new checkout there
        // must not find it trusted.
        let dir = if given.is_dir() { canonical_dir(&given) } else { canonical_if_gone(&given)? };
        let key = dir.display().to_string();
        let mut removed = false;
        update(home, |trusted| removed = trusted.projects.remove(&key).is_some())?;
        if removed {
            println!(
                "No longer trusted: agents started in {} get no env from its settings until `synapse trust`.",
                shown(&key)
            );
        } else {
            println!("{} was not trusted: nothing changed.", shown(&key));
        }
        return Ok(0);
    }
    if !given.is_dir() {
        bail!("{} is not a directory", shown(&given.display().to_string()));
    }
    let dir = canonical_dir(&given);
    let key = dir.display().to_string();
    let settings = Settings::load(home, &dir)?;
    if settings.project_env_names.is_empty() {
        println!("{}/.synapse sets no env for agents: nothing to trust.", shown(&key));
        return Ok(0);
    }
    let env = settings.env()?;
    println!("The env that {} sets for the agents started in {}:", shown_files(&settings), shown(&key));
    for name in &settings.project_env_names {
        let value = env.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str()).unwrap_or_default();
        println!("  {}={}", shown(name), shown(value));
    }
    let recorded = digest(&dir, &settings, &env);
    update(home, |trusted| {
        trusted.projects.insert(key.clone(), recorded);
    })?;
    println!(
        "Trusted. A change to these variables needs `synapse trust` again (a file they name is not watched); \
         `synapse trust --revoke` takes it back."
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project_with(env: &str) -> tempfile::TempDir {
        let project = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(project.path().join(".synapse")).unwrap();
        std::fs::write(project.path().join(".synapse/settings.json"), env).unwrap();
        project
    }

    fn env_in(home: &Path, project: &Path) -> anyhow::Result<Vec<(String, String)>> {
        agent_env(home, &Settings::load(home, project).unwrap())
    }

    #[test]
    fn a_projects_env_reaches_agents_only_as_it_was_trusted_in_its_own_directory() {
        let home = tempfile::tempdir().unwrap();
        let project = project_with(r#"{"env": {"LD_PRELOAD": "/tmp/evil.so", "_comment": "x"}}"#);
        let refused = env_in(home.path(), project.path()).unwrap_err().to_string();
        assert!(refused.contains("LD_PRELOAD") && refused.contains("not trusted yet"), "{refused}");
        assert!(refused.contains("synapse trust"), "{refused}");

        run(home.path(), Some(project.path()), Action::Trust).unwrap();
        let env = env_in(home.path(), project.path()).unwrap();
        assert_eq!(env, vec![("LD_PRELOAD".to_string(), "/tmp/evil.so".to_string())]);

        // The same file in another directory (another clone) is not trusted by it.
        let other = project_with(r#"{"env": {"LD_PRELOAD": "/tmp/evil.so"}}"#);
        assert!(env_in(home.path(), other.path()).is_err());

        // A changed value, or a variable added by the local file, asks again.
        std::fs::write(project.path().join(".synapse/settings.json"), r#"{"env": {"LD_PRELOAD": "/tmp/other.so"}}"#)
            .unwrap();
        let refused = env_in(home.path(), project.path()).unwrap_err().to_string();
        assert!(refused.contains("changed since you trusted them"), "{refused}");
        std::fs::write(project.path().join(".synapse/settings.json"), r#"{"env": {"LD_PRELOAD": "/tmp/evil.so"}}"#)
            .unwrap();
        assert!(env_in(home.path(), project.path()).is_ok());
        std::fs::write(project.path().join(".synapse/settings.local.json"), r#"{"env": {"PATH": "/tmp/bin"}}"#)
            .unwrap();
        let refused = env_in(home.path(), project.path()).unwrap_err().to_string();
        assert!(refused.contains("LD_PRELOAD, PATH") && refused.contains("settings.local.json"), "{refused}");

        // Taken back.
        run(home.path(), Some(project.path()), Action::Trust).unwrap();
        assert!(env_in(home.path(), project.path()).is_ok());
        run(home.path(), Some(project.path()), Action::Revoke).unwrap();
        assert!(env_in(home.path(), project.path()).is_err());
    }

    #[test]
    fn the_users_own_env_and_a_projects_other_settings_need_no_trust() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("settings.json"), r#"{"env": {"PATH": "/usr/bin"}}"#).unwrap();
        let project = project_with(r#"{"env": {"_comment": "none"}, "a2a": {"flow": "oneway"}}"#);
        assert_eq!(env_in(home.path(), project.path()).unwrap(), vec![("PATH".into(), "/usr/bin".into())]);
        // The project overriding the user's variable is the project's.
        std::fs::write(project.path().join(".synapse/settings.json"), r#"{"env": {"PATH": "/tmp/bin"}}"#).unwrap();
        assert!(env_in(home.path(), project.path()).is_err());
        // Run in the directory holding the home, the project's file is the user's own.
        let parent = tempfile::tempdir().unwrap();
        let home = parent.path().join(".synapse");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("settings.json"), r#"{"env": {"PATH": "/usr/bin"}}"#).unwrap();
        assert!(env_in(&home, parent.path()).is_ok());
    }

    #[test]
    fn a_damaged_list_refuses_rather_than_trusts() {
        let home = tempfile::tempdir().unwrap();
        let project = project_with(r#"{"env": {"A": "1"}}"#);
        for damaged in ["{not json", r#"{"version": 7, "projects": {}}"#] {
            std::fs::write(home.path().join(FILE_NAME), damaged).unwrap();
            let refused = format!("{:#}", env_in(home.path(), project.path()).unwrap_err());
            assert!(refused.contains(FILE_NAME), "{refused}");
            assert!(run(home.path(), Some(project.path()), Action::Trust).is_err());
        }
    }

    /// A project's env adds to the user's: it cannot take the user's away (`"env": null` did,
    /// without any trust), and what it sets must be variable names.
    #[test]
    fn a_project_cannot_remove_the_users_env_or_set_what_is_no_variable() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("settings.json"), r#"{"env": {"HTTPS_PROXY": "http://proxy:3128"}}"#).unwrap();
        for env in ["null", "\"\"", "[]"] {
            let project = project_with(&format!(r#"{{"env": {env}}}"#));
            let refused = Settings::load(home.path(), project.path()).unwrap_err().to_string();
            assert!(refused.contains("cannot take it away"), "{env}: {refused}");
        }
        for name in ["", "A=B", "A\\u0000"] {
            let project = project_with(&format!(r#"{{"env": {{"{name}": "x"}}}}"#));
            let refused = Settings::load(home.path(), project.path()).unwrap_err().to_string();
            assert!(refused.contains("no variable name"), "{name:?}: {refused}");
        }
    }

    /// What `synapse trust` shows of a project cannot hide or reorder itself on the terminal.
    #[test]
    fn shown_text_escapes_controls_and_invisible_formatting() {
        assert_eq!(shown("a\u{1b}[8mb\u{202e}c"), "a^[[8mb\\u{202e}c");
    }
}
