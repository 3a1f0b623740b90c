//! The broker's own endpoints: health (the version handshake), shutdown, admin reports.

use serde::{Deserialize, Serialize};

/// `GET /broker/health` (and `broker.json` in the home): who the broker is and whether it can store (answered with 503 and
/// the same body while it cannot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerInfo {
    pub pid: u32,
    pub version: String,
    pub schema: u32,
    pub home: String,
    pub socket: String,
    pub port: u16,
    pub head: u64,
    /// The build the broker runs (`config::BUILD_ID`); empty from a broker older than it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub build: String,
    /// False while the broker cannot store (its last write failed and none has succeeded since).
    #[serde(default = "is_true")]
    pub healthy: bool,
    /// Why it cannot store, and since when (absent when healthy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_failure: Option<WriteFailure>,
}

/// `GET /broker/health` for a caller that is not known to be the user: no pid, home, socket,
/// port or failure text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerHealth {
    pub version: String,
    pub schema: u32,
    pub healthy: bool,
}

fn is_true() -> bool {
    true
}

/// Why the broker cannot store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteFailure {
    pub reason: String,
    /// When the first of the failures in a row happened (ms since the epoch).
    pub since_ms: u64,
}

/// `GET /dashboard/page-key` (the user only): the key `synapse dashboard` puts in the page's
/// address, which makes the page the user's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PageKey {
    pub key: String,
}

/// `POST /broker/shutdown`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stopping {
    pub stopping: bool,
    pub pid: u32,
}

/// `POST /admin/rebuild`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RebuildReport {
    pub events: u64,
    pub elapsed_ms: f64,
}

/// `POST /admin/verify`: no differences means replaying the log gives the live projections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub events: u64,
    pub differences: Vec<String>,
}

/// `GET|POST /admin/index`: where the history search index stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexProgress {
    pub indexed_through: u64,
    pub head: u64,
    pub segments: u64,
}
