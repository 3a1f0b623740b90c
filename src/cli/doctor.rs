//! `synapse doctor`: what a user checks when something does not work, each line OK, a warning,
//! or a problem with what to do. Problems make the exit status 1; a CLI that is not installed is
//! only a warning (the user may never run it).

use crate::agent::profile;
use crate::client::Client;
use crate::config::Paths;
use serde::Serialize;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a CLI gets to print its version.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub level: Level,
    pub what: String,
    pub detail: String,
}

fn check(level: Level, what: impl Into<String>, detail: impl Into<String>) -> Check {
    Check { level, what: what.into(), detail: detail.into() }
}

pub async fn run(paths: &Paths, json: bool) -> anyhow::Result<i32> {
    let mut checks = Vec::new();
    checks.push(private_dir("home", &paths.home, true));
    checks.push(private_dir("socket directory", &paths.uds_dir, false));
    checks.push(broker(paths).await);
    // Another user's home decides its settings and the commands its profiles run: nothing of it
    // is read, and no profile's command is run to ask its version.
    let foreign = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&paths.home).is_ok_and(|meta| meta.uid() != crate::private_files::my_uid())
    };
    if foreign {
        checks.push(check(Level::Fail, "settings and profiles", "not read: the home belongs to another user"));
    } else {
        checks.extend(settings(paths));
        checks.extend(profiles(paths));
    }
    let failed = checks.iter().any(|check| check.level == Level::Fail);
    if json {
        println!("{}", serde_json::json!({"ok": !failed, "checks": checks}));
    } else {
        for check in &checks {
            let label = match check.level {
                Level::Ok => "OK  ",
                Level::Warn => "WARN",
                Level::Fail => "FAIL",
            };
            println!("{label}  {:<24} {}", check.what, crate::escape::visible_line(&check.detail));
        }
    }
    Ok(i32::from(failed))
}

/// A directory that must be the user's own and closed to others (`missing_ok`: created on
/// first use).
fn private_dir(what: &str, dir: &Path, must_exist: bool) -> Check {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Err(_) if !must_exist => check(Level::Ok, what, format!("{shown} (created on first use)")),
        Err(_) => check(Level::Ok, what, format!("{shown} (created when the broker first starts)")),
        Ok(meta) if !meta.is_dir() => {
            check(Level::Fail, what, format!("{shown} is not a directory: remove it or point the variable elsewhere"))
        }
        Ok(meta) if meta.uid() != crate::private_files::my_uid() => check(
            Level::Fail,
            what,
            format!("{shown} belongs to uid {}, not to you: use a directory of your own", meta.uid()),
        ),
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => check(
            Level::Warn,
            what,
            format!(
                "{shown} is open to others (mode {:o}): chmod 700 {shown} (the broker tightens the home at start)",
                meta.permissions().mode() & 0o777
            ),
        ),
        Ok(_) => check(Level::Ok, what, format!("{shown} (mode 700, yours)")),
    }
}

async fn broker(paths: &Paths) -> Check {
    let Some(mut client) = Client::try_connect(paths).await else {
        return check(Level::Ok, "broker", "not running (it starts on demand with the first command)");
    };
    let info = match client.health().await {
        Ok(info) => info,
        Err(error) => {
            return check(
                Level::Fail,
                "broker",
                format!("answers but not as expected: {error} (synapse broker stop, then retry)"),
            );
        }
    };
    // Another home's broker at this home's socket (two homes share a socket folder): this
    // home's commands refuse it.
    if let Err(mismatch) = crate::client::ensure_home(paths, &info) {
        return check(Level::Fail, "broker", format!("{mismatch:#}"));
    }
    if info.version != crate::api::VERSION {
        return check(
            Level::Fail,
            "broker",
            format!(
                "pid {} runs version {}, this synapse is {}: synapse broker stop, then retry",
                info.pid,
                info.version,
                crate::api::VERSION
            ),
        );
    }
    if info.healthy {
        return check(
            Level::Ok,
            "broker",
            format!("running: pid {}, version {}, port {}, {} events", info.pid, info.version, info.port, info.head),
        );
    }
    check(
        Level::Fail,
        "broker",
        format!(
            "pid {} cannot store: {} (free disk space; it recovers by itself)",
            info.pid,
            info.write_failure.as_ref().map_or("unknown reason", |failure| failure.reason.as_str())
        ),
    )
}

fn settings(paths: &Paths) -> Vec<Check> {
    let mut checks = Vec::new();
    match crate::settings::Settings::load_current(&paths.home) {
        Ok(settings) if settings.sources.is_empty() => {
            checks.push(check(Level::Ok, "settings", "built-in defaults (no settings file; synapse init writes one)"));
            checks.push(mcp_check(paths, settings.mcp()));
            checks.push(hooks_check());
        }
        Ok(settings) => {
            let files: Vec<String> = settings.sources.iter().map(|file| file.display().to_string()).collect();
            checks.push(check(Level::Ok, "settings", files.join(", ")));
            for warning in &settings.warnings {
                checks.push(check(Level::Warn, "settings", warning.clone()));
            }
            match settings.flow() {
                Ok(flow) => checks.push(check(Level::Ok, "a2a.flow", format!("{flow:?}").to_lowercase())),
                Err(error) => checks.push(check(Level::Fail, "a2a.flow", error.to_string())),
            }
            checks.push(mcp_check(paths, settings.mcp()));
            checks.push(hooks_check());
            if !settings.project_env_names.is_empty() {
                checks.push(match crate::project_trust::agent_env(&paths.home, &settings) {
                    Ok(_) => check(Level::Ok, "project env", "trusted (synapse trust --revoke takes it back)"),
                    Err(error) => check(Level::Fail, "project env", format!("{error:#}")),
                });
            }
        }
        Err(error) => checks.push(check(Level::Fail, "settings", format!("{error:#}"))),
    }
    match crate::trust::TrustSettings::load(&paths.home) {
        Ok(trust) => checks.push(check(
            Level::Ok,
            "security",
            format!(
                "auth {}, file safety {}, private outbound targets {}",
                if trust.auth_enabled { "on" } else { "off" },
                match trust.file_safety_enabled {
                    Some(true) => "on",
                    Some(false) => "off",
                    None => "per settings",
                },
                if trust.outbound_allow_private { "allowed" } else { "refused" }
            ),
        )),
        Err(error) => checks.push(check(Level::Fail, "security", format!("{error:#}"))),
    }
    checks
}

/// Whether agents get the Synapse MCP tools, and where one CLI cannot take them.
fn mcp_check(paths: &Paths, setting: anyhow::Result<bool>) -> Check {
    match setting {
        Err(error) => check(Level::Fail, "mcp", error.to_string()),
        Ok(false) => check(Level::Ok, "mcp", "off: agents answer with `synapse reply` through their shell"),
        Ok(true) => match crate::agent::mcp_wiring::gemini_refuses(&paths.home) {
            None => {
                check(Level::Ok, "mcp", "on: each CLI gets the synapse tools for its session (--no-mcp turns it off)")
            }
            Some(reason) => check(
                Level::Warn,
                "mcp",
                format!(
                    "on, except for gemini: it reads a per-session settings file only where root owns every directory above it ({reason}); gemini agents answer through their shell"
                ),
            ),
        },
    }
}

/// Which CLIs take messages for a busy agent by hook, and why the others do not.
fn hooks_check() -> Check {
    check(
        Level::Ok,
        "hooks",
        format!("{}; {}", crate::agent::mcp_wiring::HOOKS_ON, crate::agent::mcp_wiring::HOOKS_OFF),
    )
}

/// Each built-in profile: its CLI on PATH (with its version) and free ports in its range.
fn profiles(paths: &Paths) -> Vec<Check> {
    let handles: Vec<_> = profile::BUILTIN_NAMES
        .iter()
        .filter(|name| **name != "dummy")
        .map(|name| {
            let name = name.to_string();
            let home = paths.home.clone();
            std::thread::spawn(move || profile_check(&name, &home))
        })
        .collect();
    handles.into_iter().filter_map(|handle| handle.join().ok()).flatten().collect()
}

fn profile_check(name: &str, home: &Path) -> Vec<Check> {
    let profile = match profile::load(name, home) {
        Ok(profile) => profile,
        Err(error) => return vec![check(Level::Fail, format!("profile {name}"), format!("{error:#}"))],
    };
    let mut checks = Vec::new();
    match on_path(&profile.command) {
        None => checks.push(check(
            Level::Warn,
            format!("{name} CLI"),
            format!("'{}' is not on PATH (needed only to run synapse {name})", profile.command),
        )),
        Some(path) => {
            let version = version_of(&path).unwrap_or_else(|| "version unknown".into());
            checks.push(check(Level::Ok, format!("{name} CLI"), format!("{} ({version})", path.display())));
        }
    }
    let (low, high) = profile.port_range;
    let free = (low..=high).filter(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok()).count();
    let total = usize::from(high - low) + 1;
    checks.push(if free == 0 {
        check(
            Level::Warn,
            format!("{name} ports"),
            format!("{low}-{high}: all taken (pass --port 0 for any free port, or set port_range in a profile file)"),
        )
    } else {
        check(Level::Ok, format!("{name} ports"), format!("{low}-{high}: {free} of {total} free"))
    });
    checks
}

/// The file `command` names, looked up like a shell does.
fn on_path(command: &str) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(PathBuf::from(command)).filter(|path| path.is_file());
    }
    let search = std::env::var_os("PATH")?;
    std::env::split_paths(&search)
        .map(|dir| dir.join(command))
        .find(|path| std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0))
}

/// The first line of `<cli> --version`, if it answers in time.
fn version_of(path: &Path) -> Option<String> {
    let mut child = std::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + VERSION_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut output = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut output).ok()?;
    output.lines().map(str::trim).find(|line| !line.is_empty()).map(str::to_string)
}
