//! Where Synapse keeps things, from the environment (read once, at the edge).

use std::path::PathBuf;

pub const DEFAULT_BROKER_PORT: u16 = 8099;
pub const DEFAULT_UDS_DIR: &str = "/tmp/synapse-a2a";

/// The main executable's file name.
pub const MAIN_BIN: &str = "synapse";
/// The agent wrapper's own executable, installed beside `synapse`: `synapse <profile>` runs
/// it in its place (exec, same pid) when it is there, so that each wrapper, which lives as
/// long as its agent, maps a 5 MB program instead of the 20 MB one with the broker, the
/// store and the MCP server (about 5 MB of RSS instead of 10).
pub const WRAPPER_BIN: &str = "synapse-agent";

/// The `synapse` executable, from whichever of the two this process runs: for the commands a
/// wrapper starts (the broker, `synapse mcp`, `synapse hook`, the dummy CLI). From the
/// wrapper's executable, the `synapse` beside it; from any other, this one.
pub fn synapse_exe() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    if exe.file_name().is_some_and(|name| name == WRAPPER_BIN)
        && let Some(main) = exe.parent().map(|dir| dir.join(MAIN_BIN))
        && main.is_file()
    {
        return Ok(main);
    }
    Ok(exe)
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
            Some(home) if !home.is_empty() => PathBuf::from(home),
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

    pub fn broker_log(&self) -> PathBuf {
        self.home.join("broker.log")
    }

    pub fn start_lock(&self) -> PathBuf {
        self.home.join("broker.start.lock")
    }

    /// Written by a running broker: pid, version, port (for tools and the TCP fallback).
    pub fn broker_info(&self) -> PathBuf {
        self.home.join("broker.json")
    }
}
