//! The record of every request the scripted model received, so a test can check that a message
//! reached the model (exactly once) and what each CLI calls.
//!
//! Kept in memory (served at `GET /_synapse/requests`) and, with `--log`, appended to a file as
//! one JSON line per request. A body larger than [`MAX_KEPT_BODY_BYTES`] once serialized is kept
//! as the start of its text (`{"truncated": true, "text": ...}`): CLIs resend the whole
//! conversation and tool schemas on every turn.

use serde_json::{Value, json};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// Most bytes of one request body kept in the record.
pub const MAX_KEPT_BODY_BYTES: usize = 256 << 10;

/// One request as the API modules describe it.
#[derive(Debug)]
pub struct Entry<'a> {
    /// `anthropic`, `responses`, `chat`, `gemini` or `unknown`.
    pub api: &'static str,
    pub path: String,
    pub model: Option<String>,
    pub has_tools: bool,
    pub last_user_text: Option<String>,
    /// What the script answered ([`super::script::Action::label`], or `count_tokens`, ...).
    pub action: &'static str,
    /// The tool called, for a tool call.
    pub tool: Option<String>,
    pub body: &'a Value,
}

/// The record: in memory, and appended to the log file if there is one.
#[derive(Debug, Default)]
pub struct Recorder {
    // One lock for both, so the file's order is the array's order.
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: Vec<Value>,
    log: Option<File>,
}

impl Recorder {
    /// A recorder appending to `log` (created if missing).
    pub fn new(log: Option<PathBuf>) -> std::io::Result<Recorder> {
        let log = match log {
            Some(path) => Some(std::fs::OpenOptions::new().create(true).append(true).open(path)?),
            None => None,
        };
        Ok(Recorder { inner: Mutex::new(Inner { entries: Vec::new(), log }) })
    }

    /// Records one request. A failed write to the log file is reported and otherwise ignored: the
    /// in-memory record stays complete.
    pub fn push(&self, entry: Entry<'_>) {
        let internal = !entry.has_tools && entry.api != "unknown";
        let value = json!({
            "time_ms": super::now_ms(),
            "api": entry.api,
            "path": entry.path,
            "model": entry.model,
            "has_tools": entry.has_tools,
            "internal": internal,
            "last_user_text": entry.last_user_text,
            "action": entry.action,
            "tool": entry.tool,
            "body": capped(entry.body),
        });
        let mut inner = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(file) = inner.log.as_mut()
            && let Err(error) = writeln!(file, "{value}")
        {
            tracing::warn!("scripted model: cannot append to the request log: {error}");
        }
        inner.entries.push(value);
    }

    /// Every request recorded so far, oldest first.
    pub fn all(&self) -> Vec<Value> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).entries.clone()
    }
}

/// The body as kept: itself when small, else the start of its JSON text.
fn capped(body: &Value) -> Value {
    let text = body.to_string();
    if text.len() <= MAX_KEPT_BODY_BYTES {
        return body.clone();
    }
    let mut end = MAX_KEPT_BODY_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    json!({"truncated": true, "bytes": text.len(), "text": &text[..end]})
}

/// A request body as JSON; a body that is not JSON is kept as text (or `null` when empty).
pub fn parse_body(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes).unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(bytes)}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_body_is_kept_truncated() {
        let body = json!({"text": "x".repeat(MAX_KEPT_BODY_BYTES * 2)});
        let kept = capped(&body);
        assert_eq!(kept["truncated"], json!(true));
        assert!(kept["text"].as_str().is_some_and(|text| text.len() == MAX_KEPT_BODY_BYTES));
        assert_eq!(capped(&json!({"a": 1})), json!({"a": 1}));
    }

    #[test]
    fn requests_are_appended_to_the_log_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests.jsonl");
        let recorder = Recorder::new(Some(path.clone())).unwrap();
        for api in ["chat", "gemini"] {
            let body = json!({});
            recorder.push(Entry {
                api,
                path: "/x".into(),
                model: None,
                has_tools: true,
                last_user_text: Some("hi".into()),
                action: "text",
                tool: None,
                body: &body,
            });
        }
        let lines: Vec<Value> =
            std::fs::read_to_string(path).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["api"], "gemini");
        assert_eq!(recorder.all(), lines);
    }
}
