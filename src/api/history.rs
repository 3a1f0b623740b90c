//! The history views `synapse history` reads.

use crate::event::TaskState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `GET /history`, `/history/search`, `/history/{id}`, `/threads/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRecords {
    pub records: Vec<HistoryRecord>,
}

/// One side of one exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRecord {
    pub task_id: String,
    /// "sent" or "received".
    pub side: String,
    pub agent: String,
    pub peer: String,
    pub input: String,
    #[serde(default)]
    pub output: String,
    pub status: TaskState,
    pub priority: u8,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// `GET /history/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryStats {
    pub total: usize,
    pub by_status: BTreeMap<String, usize>,
    /// completed / (completed + failed); none before anything completed or failed.
    #[serde(default)]
    pub success_rate: Option<f64>,
    /// Per agent, per side ("sent", "received"): the number of records.
    pub by_agent: BTreeMap<String, BTreeMap<String, usize>>,
    #[serde(default)]
    pub first: Option<String>,
    #[serde(default)]
    pub last: Option<String>,
    pub text_bytes: usize,
}

/// `POST /history/cleanup`: `days` or `max_size_mb`, not both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryCleanup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub days: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size_mb: Option<i64>,
    #[serde(default)]
    pub dry_run: bool,
}

/// The answer to a history cleanup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryCleanupAnswer {
    /// Set by a dry run (and when nothing was old enough).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_remove: Option<usize>,
    pub removed: usize,
    /// The cut: records last updated before it go.
    pub before: String,
}
