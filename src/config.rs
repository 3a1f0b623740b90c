//! Where Synapse keeps things, from the environment (read once, at the edge).

use std::path::{Path, PathBuf};

pub const DEFAULT_BROKER_PORT: u16 = 8099;
pub const DEFAULT_UDS_DIR: &str = "/tmp/synapse-a2a";

/// The agent wrapper's own executable, installed beside `synapse`: `synapse <profile>` runs
/// it in its place (exec, same pid) when it is there and from the same build, so that each
/// wrapper, which lives as long as its agent, maps a 4 MB program instead of the 15 MB one
/// with the broker, the store and the MCP server (release build: about 5 MB of RSS instead of
/// 10).
pub const WRAPPER_BIN: &str = "synapse-agent";

/// This build's id (see `build.rs`): `synapse` and `synapse-agent` of one build share it.
pub const BUILD_ID: &str = env!("SYNAPSE_BUILD_ID");

/// Set by `synapse` for the `synapse-agent` it runs: the `synapse` executable's path ...
pub const MAIN_EXE_ENV: &str = "SYNAPSE_MAIN_EXE";
/// ... and its [`BUILD_ID`]; a `synapse-agent` of another build hands back to `synapse` ...
pub const WRAPPER_BUILD_ENV: &str = "SYNAPSE_WRAPPER_BUILD";
/// ... which then runs the wrapper in its own process.
pub const WRAPPER_IN_PLACE_ENV: &str = "SYNAPSE_WRAPPER_IN_PLACE";
/// The three, which the wrapper keeps from the CLI it runs.
pub const WRAPPER_HANDOVER_ENV: [&str; 3] = [MAIN_EXE_ENV, WRAPPER_BUILD_ENV, WRAPPER_IN_PLACE_ENV];

/// The `synapse` executable that ran this `synapse-agent` (set once, at its start).
static MAIN_EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Records the `synapse` executable that ran this wrapper (its [`MAIN_EXE_ENV`]).
pub fn set_main_exe(path: PathBuf) {
    let _ = MAIN_EXE.set(path);
}

/// The `synapse` executable, for the commands a wrapper starts (the broker, `synapse mcp`,
/// `synapse hook`, the dummy CLI): in `synapse-agent`, the one that ran it; elsewhere, this
/// one.
pub fn synapse_exe() -> std::io::Result<PathBuf> {
    match MAIN_EXE.get() {
        Some(main) => Ok(main.clone()),
        None => std::env::current_exe(),
    }
}

/// The wrapper's executable beside this one, when it is installed there.
pub fn wrapper_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let wrapper = exe.parent()?.join(WRAPPER_BIN);
    wrapper.is_file().then_some(wrapper)
}

/// Paths and ports of one Synapse installation.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `SYNAPSE_HOME` (default `~/.synapse`): the log, settings, logs.
    pub home: PathBuf,
    /// `SYNAPSE_UDS_DIR` (default `/tmp/synapse-a2a`): Unix sockets.
    pub uds_dir: PathBuf,
    /// `SYNAPSE_BROKER_PORT` (default 8099; 0 lets the system choose).
    pub broker_port: u16,
}

impl Paths {
    pub fn from_env() -> anyhow::Result<Paths> {
        let home = match std::env::var_os("SYNAPSE_HOME") {
            // A relative home is taken from here, once: a broker and its clients started in
            // other folders must name the same one.
            Some(home) if !home.is_empty() => std::path::absolute(PathBuf::from(home))
                .map_err(|error| anyhow::anyhow!("SYNAPSE_HOME cannot be made absolute: {error}"))?,
            _ => match std::env::var_os("HOME") {
                Some(user_home) if !user_home.is_empty() => PathBuf::from(user_home).join(".synapse"),
                _ => anyhow::bail!("neither SYNAPSE_HOME nor HOME is set: cannot tell where to keep the log"),
            },
        };
        let uds_dir = match std::env::var_os("SYNAPSE_UDS_DIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => PathBuf::from(DEFAULT_UDS_DIR),
        };
        let broker_port = match std::env::var("SYNAPSE_BROKER_PORT") {
            Ok(port) if !port.trim().is_empty() => port
                .trim()
                .parse::<u16>()
                .map_err(|_| anyhow::anyhow!("SYNAPSE_BROKER_PORT='{port}' is not a port number (0-65535)"))?,
            _ => DEFAULT_BROKER_PORT,
        };
        Ok(Paths { home, uds_dir, broker_port })
    }

    pub fn database(&self) -> PathBuf {
        self.home.join("synapse.redb")
    }

    pub fn broker_socket(&self) -> PathBuf {
        self.uds_dir.join("broker.sock")
    }

    pub fn agent_socket(&self, agent_id: &str) -> PathBuf {
        self.uds_dir.join(format!("{agent_id}.sock"))
    }

    /// Creates the home or checks it is the user's before anything is read from it or written
    /// into it ([`crate::private_files::own_home`]).
    pub fn own_home(&self) -> anyhow::Result<()> {
        crate::private_files::own_home(&self.home)
            .map_err(|error| anyhow::anyhow!("cannot use {} as the home: {error}", self.home.display()))
    }

    pub fn broker_log(&self) -> PathBuf {
        self.home.join("broker.log")
    }

    /// The log of a profile's wrappers: a background wrapper's standard error, and an
    /// interactive one's lines once its CLI has the terminal.
    pub fn wrapper_log(&self, profile: &str) -> PathBuf {
        self.home.join("logs").join(format!("{profile}-wrapper.log"))
    }

    pub fn start_lock(&self) -> PathBuf {
        self.home.join("broker.start.lock")
    }

    /// Written by a running broker: pid, version, port (for tools and the TCP fallback).
    pub fn broker_info(&self) -> PathBuf {
        self.home.join("broker.json")
    }
}

/// The directory of one run of an agent (its wrapper's process `pid`), where its session files
/// live. Named by the run, not the id alone: ids are reused (a port, a name taking its queue
/// back), and whoever removes a run's files must never reach the files of the run after it.
pub fn agent_dir(home: &Path, agent_id: &str, pid: u32) -> PathBuf {
    home.join("agents").join(format!("{agent_id}.{pid}"))
}

/// Removes the session directories of runs whose wrapper is gone without removing its own (a
/// SIGKILL): they hold a secret the broker has revoked. A directory whose process still runs is
/// left, and so is anything not named as [`agent_dir`] names it. Returns how many were removed.
pub fn remove_abandoned(home: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(home.join("agents")) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.rsplit_once('.'))
            .filter(|(id, pid)| {
                id.starts_with("synapse-") && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
            })
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // `remove_dir_all` removes a link itself, never what it names.
        if pid != 0 && !crate::process::is_pid_alive(pid) && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// How long a long-message file is kept (`SYNAPSE_MESSAGE_FILE_DAYS`, default 7; 0 keeps them):
/// None when kept for good.
pub fn message_file_lifetime() -> Option<std::time::Duration> {
    let days = std::env::var("SYNAPSE_MESSAGE_FILE_DAYS").ok().and_then(|days| days.trim().parse::<u64>().ok());
    match days.unwrap_or(7) {
        0 => None,
        days => Some(std::time::Duration::from_secs(days.saturating_mul(86_400))),
    }
}

/// Removes the long-message files (`messages/<agent>/`, written for the CLIs to read) last
/// changed more than `lifetime` ago: each message longer than the threshold left one for good (a
/// soak: 2,400 files an hour). A CLI reads its file when the message arrives; one resumed weeks
/// later finds it gone. Only files directly in an agent's directory go; a link there is removed
/// itself, and a link as `messages/` or in it is never followed. Stops early when `stopping`
/// says so (checked between files). Returns how many went.
pub fn remove_old_message_files(home: &Path, lifetime: std::time::Duration, stopping: impl Fn() -> bool) -> usize {
    let messages = home.join("messages");
    if !messages.symlink_metadata().is_ok_and(|meta| meta.is_dir()) {
        return 0;
    }
    let Ok(agents) = std::fs::read_dir(messages) else { return 0 };
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for agent in agents.flatten() {
        if !agent.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(agent.path()) else { continue };
        for file in files.flatten() {
            if stopping() {
                return removed;
            }
            // The entry's own times (a link's, not its target's).
            let old = file
                .metadata()
                .ok()
                .filter(|meta| !meta.is_dir())
                .and_then(|meta| meta.modified().ok())
                .and_then(|modified| now.duration_since(modified).ok())
                .is_some_and(|age| age > lifetime);
            if old && std::fs::remove_file(file.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the directories of runs whose process is gone go; a link goes, never what it names.
    #[test]
    fn abandoned_session_directories_are_removed_and_nothing_else() {
        let home = tempfile::tempdir().unwrap();
        let agents = home.path().join("agents");
        // Above any pid_max Linux allows (2^22): no such process can run.
        let gone = 4_194_305_u32;
        let mine = std::process::id();
        let target = home.path().join("elsewhere");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("keep"), "x").unwrap();
        for name in [
            format!("synapse-dummy-1.{gone}"),
            format!("synapse-dummy-2.{mine}"),
            "synapse-dummy-3".to_string(),
            format!("other.{gone}"),
            format!("synapse-dummy-4.+{gone}"),
        ] {
            std::fs::create_dir_all(agents.join(&name)).unwrap();
            std::fs::write(agents.join(&name).join("claude-mcp.json"), "{}").unwrap();
        }
        std::os::unix::fs::symlink(&target, agents.join(format!("synapse-dummy-5.{gone}"))).unwrap();
        assert_eq!(agent_dir(home.path(), "synapse-dummy-2", mine), agents.join(format!("synapse-dummy-2.{mine}")));

        assert_eq!(remove_abandoned(home.path()), 2);
        let mut left: Vec<String> = std::fs::read_dir(&agents)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                format!("other.{gone}"),
                format!("synapse-dummy-2.{mine}"),
                "synapse-dummy-3".into(),
                format!("synapse-dummy-4.+{gone}")
            ]
        );
        assert!(target.join("keep").exists(), "a link's target is untouched");
        assert_eq!(remove_abandoned(&home.path().join("none")), 0, "no agents directory: nothing to do");
    }
    /// A stop ends the removal between files (a home holding a great many held a broker's stop
    /// for 13 s); `messages` as a link is not followed.
    #[test]
    fn old_message_files_go_until_a_stop_and_never_through_a_link() {
        let home = tempfile::tempdir().unwrap();
        let agent = home.path().join("messages/synapse-dummy-1");
        std::fs::create_dir_all(&agent).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(8 * 86_400);
        for number in 0..3 {
            let file = agent.join(format!("{number}.txt"));
            std::fs::write(&file, "x").unwrap();
            std::fs::File::options().write(true).open(&file).unwrap().set_modified(old).unwrap();
        }
        let week = std::time::Duration::from_secs(7 * 86_400);
        assert_eq!(remove_old_message_files(home.path(), week, || true), 0, "stopping: nothing removed");
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::rename(home.path().join("messages"), elsewhere.path().join("messages")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("messages"), home.path().join("messages")).unwrap();
        assert_eq!(remove_old_message_files(home.path(), week, || false), 0, "messages/ as a link");
        std::fs::remove_file(home.path().join("messages")).unwrap();
        std::fs::rename(elsewhere.path().join("messages"), home.path().join("messages")).unwrap();
        assert_eq!(remove_old_message_files(home.path(), week, || false), 3);
    }
}
