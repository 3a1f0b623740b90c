//! File safety: locks and modification records that `synapse file-safety` reads and writes.

use crate::event::ChangeType;
use serde::{Deserialize, Serialize};

/// `GET /file-safety/status`: how many locks and modification records there are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSafetyStatus {
    pub locks: usize,
    pub modifications: usize,
}

/// `GET /file-safety/locks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Locks {
    pub locks: Vec<LockEntry>,
}

/// A lock, and whether its time has passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockEntry {
    pub lock: FileLock,
    pub expired: bool,
}

/// A lock on a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileLock {
    pub path: String,
    pub agent_id: String,
    pub expires_ms: u64,
    pub acquired_ms: u64,
    #[serde(default)]
    pub intent: Option<String>,
    #[serde(default)]
    pub task_id: Option<String>,
}

/// `POST /file-safety/lock`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockRequest {
    /// An absolute, normalised path.
    pub path: String,
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Wait up to this long for the file to be free instead of failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
}

/// The answer to a granted lock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Locked {
    pub locked: bool,
    #[serde(default)]
    pub lock: Option<FileLock>,
}

/// `POST /file-safety/unlock`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnlockRequest {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// The answer to an unlock: the path released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unlocked {
    pub unlocked: String,
}

/// `GET /file-safety/history` (with `path`) and `/file-safety/recent` (without).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Modifications {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub modifications: Vec<Modification>,
}

/// A recorded change to a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Modification {
    pub path: String,
    pub agent_id: String,
    pub task_id: String,
    pub change_type: ChangeType,
    #[serde(default)]
    pub intent: Option<String>,
    pub time_ms: u64,
    pub seq: u64,
}

/// `POST /file-safety/record`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordRequest {
    pub path: String,
    pub agent_id: String,
    pub task_id: String,
    /// CREATE, MODIFY (the default) or DELETE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
}

/// The answer to a record: the path and the change recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    pub recorded: String,
    pub change_type: ChangeType,
}

/// `POST /file-safety/validate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidateRequest {
    pub path: String,
    pub agent_id: String,
}

/// May this agent write this file? With the reason and the file's recent modifications.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    pub path: String,
    pub agent_id: String,
    pub allowed: bool,
    pub reason: String,
    #[serde(default)]
    pub lock: Option<FileLock>,
    pub recent_modifications: Vec<Modification>,
}

/// `POST /file-safety/cleanup`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileCleanup {
    /// Keep modification records of the last `days` days (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub days: Option<i64>,
}

/// The answer to a file-safety cleanup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileCleanupAnswer {
    pub released: usize,
    pub pruned: usize,
}

/// The longest path file safety takes, in bytes: Linux's `PATH_MAX`, which no path the kernel
/// opens exceeds.
pub const PATH_MAX_BYTES: usize = 4096;

/// Refuses a path longer than [`PATH_MAX_BYTES`] as written: the kernel opens none, and resolving
/// it would cost the broker time for nothing. (What it resolves to may be longer, through a
/// link: that is still a file.)
pub fn check_length(path: &str) -> Result<(), String> {
    match path.len() {
        len if len > PATH_MAX_BYTES => {
            Err(format!("the path is {len} bytes long; a path is at most {PATH_MAX_BYTES} bytes"))
        }
        _ => Ok(()),
    }
}

/// An absolute path with `.` and `..` removed (lexically: the file need not exist). Control
/// characters are refused: no real file name of a project has them, and they would act on the
/// terminal that shows the path.
pub fn normalize(path: &str) -> Result<String, String> {
    if path.trim().is_empty() {
        return Err("the path is empty".into());
    }
    if path.chars().any(crate::escape::is_control) {
        return Err(format!("'{}' contains a control character", crate::escape::visible_line(path)));
    }
    if !path.starts_with('/') {
        return Err(format!("'{path}' is not an absolute path"));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}
