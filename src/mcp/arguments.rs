//! The MCP tools' arguments as a model sends them, and their validation into ready requests:
//! the same rules and words as the CLI's flags (`synapse send`, `reply`, `history search`,
//! `file-safety`), decided here without I/O so that unit tests cover every refusal.
//!
//! Invariants: a refusal is a sentence a model can act on (what was wrong, what is allowed);
//! message text is never changed (trimmed only to decide whether it is empty); unknown argument
//! names are refused (by serde), so a misspelt option is an error, not silently ignored.

use crate::api::{DEFAULT_PRIORITY, SendRequest};
use crate::settings::Flow;
use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;
use std::path::Path;

/// The longest a tool call may wait (for a reply, or for a file to be free): MCP clients give
/// up on a tool call after their own timeout, and a call must end before that to be read.
pub const MAX_WAIT_SECONDS: i64 = 600;

/// The most history records one search returns.
pub const MAX_HISTORY_LIMIT: i64 = 200;

/// The history records a search returns without a `limit`, as `synapse history search`.
const DEFAULT_HISTORY_LIMIT: usize = 20;

/// Seconds a lock lasts without `duration_seconds`, as `synapse file-safety lock`.
const DEFAULT_LOCK_SECONDS: u64 = 300;

/// A refusal, in words for the model.
pub type Refusal = String;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendArguments {
    /// The agent to message: its name, its agent id (synapse-<type>-<port>), <type>-<port>, or
    /// its type when only one agent of that type runs. See list_agents.
    pub to: String,
    /// The message, sent exactly as written (any length, several lines allowed).
    pub message: String,
    /// 1 to 5, default 3. 5 interrupts what the target is doing first: use it only when the
    /// target must stop now.
    #[schemars(range(min = 1, max = 5))]
    pub priority: Option<i64>,
    /// Do you expect an answer? Default: yes (unless the settings' a2a.flow is oneway). The
    /// target then sees the R flag and its reply reaches you.
    pub expect_reply: Option<bool>,
    /// Wait up to this many seconds (1 to 600) for the reply and return it as this tool's
    /// result. Without it the tool returns at once and the reply arrives later in your input.
    #[schemars(range(min = 1, max = 600))]
    pub wait_seconds: Option<i64>,
    /// Answer this task (its 8-character id from an [A2A:<id8>:...] prefix, or the full id)
    /// instead of starting a new exchange. The reply tool does this for you; use reply_to only
    /// to answer an older message than the newest one of its sender.
    pub reply_to: Option<String>,
    /// Only to send again a message whose send said it may have been sent: the key it named.
    /// The broker then answers with that message if it made it, and never makes it twice.
    pub idempotency_key: Option<String>,
}

/// A send, ready for the broker (without the sender, which is the server's identity).
#[derive(Debug, Clone, PartialEq)]
pub struct SendPlan {
    pub request: SendRequest,
    /// Seconds to wait for the reply, if the caller waits.
    pub wait_seconds: Option<u64>,
}

impl SendArguments {
    /// The request, with `a2a.flow` deciding whether a reply is expected when the caller did
    /// not say (as `synapse send` does without --response / --no-response). Unlike the CLI,
    /// `roundtrip` does not make the call wait: a tool call cannot block without a bound.
    pub fn validate(self, flow: Flow) -> Result<SendPlan, Refusal> {
        if self.to.trim().is_empty() {
            return Err("'to' is empty: name the agent to message (list_agents shows them)".into());
        }
        if self.message.trim().is_empty() {
            return Err("the message is empty".into());
        }
        let priority = priority(self.priority)?;
        let wait_seconds = self.wait_seconds.map(|seconds| bounded_seconds("wait_seconds", seconds)).transpose()?;
        let response_expected = match (self.expect_reply, wait_seconds) {
            (Some(false), Some(_)) => {
                return Err("wait_seconds waits for a reply, but expect_reply is false: drop one of them".into());
            }
            (_, Some(_)) => true,
            (Some(expected), None) => expected,
            (None, None) => flow != Flow::Oneway,
        };
        let reply_to = match self.reply_to {
            Some(id) if id.trim().is_empty() => {
                return Err("'reply_to' is empty: give a task id or leave it out".into());
            }
            other => other.map(|id| id.trim().to_string()),
        };
        let request = SendRequest {
            priority,
            response_expected,
            reply_to,
            idempotency_key: self.idempotency_key,
            ..SendRequest::new(self.to.trim(), self.message)
        };
        Ok(SendPlan { request, wait_seconds })
    }
}

/// 1 to 5 (absent: [`DEFAULT_PRIORITY`]), in the words of `synapse send --priority`.
fn priority(priority: Option<i64>) -> Result<u8, Refusal> {
    match priority {
        None => Ok(DEFAULT_PRIORITY),
        Some(priority) => u8::try_from(priority)
            .ok()
            .filter(|priority| (1..=5).contains(priority))
            .ok_or_else(|| format!("priority must be between 1 and 5 (got {priority})")),
    }
}

/// 1 to [`MAX_WAIT_SECONDS`].
fn bounded_seconds(name: &str, seconds: i64) -> Result<u64, Refusal> {
    if (1..=MAX_WAIT_SECONDS).contains(&seconds) {
        Ok(seconds.unsigned_abs())
    } else {
        Err(format!("{name} must be between 1 and {MAX_WAIT_SECONDS} seconds (got {seconds})"))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyArguments {
    /// Your answer, sent exactly as written.
    pub message: String,
    /// Whom you answer: the <sender> of its [A2A:<id8>:<sender>:R] prefix, or its <id8> (the
    /// only way when the sender shows as `anonymous` and several wait). Needed only when several
    /// senders wait; reply_targets lists them.
    pub to: Option<String>,
    /// Only to reply again after a reply said it may have been sent: the key it named. The
    /// broker then answers with that reply if it made it, and never makes it twice.
    pub idempotency_key: Option<String>,
}

/// A reply, ready for the broker (without the replier, which is the server's identity).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyPlan {
    pub to: Option<String>,
    pub text: String,
    pub idempotency_key: Option<String>,
}

impl ReplyArguments {
    pub fn validate(self) -> Result<ReplyPlan, Refusal> {
        if self.message.trim().is_empty() {
            return Err("the reply is empty".into());
        }
        let to = match self.to {
            Some(to) if to.trim().is_empty() => {
                return Err("'to' is empty: give the sender's agent id, or leave it out to answer the only one".into());
            }
            other => other.map(|to| to.trim().to_string()),
        };
        Ok(ReplyPlan { to, text: self.message, idempotency_key: self.idempotency_key })
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistorySearchArguments {
    /// Keywords to look for in messages and replies, as typed, from the start of a word
    /// (`pars` finds "Parser"; punctuation and spaces count: `foo-bar`, "hello parser").
    pub keywords: Vec<String>,
    /// OR (any keyword, the default) or AND (every keyword).
    pub logic: Option<String>,
    /// Match upper and lower case exactly (default: no).
    pub case_sensitive: Option<bool>,
    /// Only records of this agent (id or name).
    pub agent: Option<String>,
    /// At most this many records, newest first (1 to 200, default 20).
    #[schemars(range(min = 1, max = 200))]
    pub limit: Option<i64>,
}

/// A history search, ready for the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct HistorySearchPlan {
    pub keywords: Vec<String>,
    pub logic: &'static str,
    pub case_sensitive: bool,
    pub agent: Option<String>,
    pub limit: usize,
}

impl HistorySearchArguments {
    pub fn validate(self) -> Result<HistorySearchPlan, Refusal> {
        let keywords: Vec<String> =
            self.keywords.iter().map(|word| word.trim().to_string()).filter(|word| !word.is_empty()).collect();
        if keywords.is_empty() {
            return Err("give at least one keyword".into());
        }
        let logic = match self.logic.as_deref().map(|logic| logic.trim().to_ascii_uppercase()).as_deref() {
            None | Some("OR") => "OR",
            Some("AND") => "AND",
            Some(other) => return Err(format!("logic must be OR or AND (got '{other}')")),
        };
        let limit = match self.limit {
            None => DEFAULT_HISTORY_LIMIT,
            Some(limit) if (1..=MAX_HISTORY_LIMIT).contains(&limit) => {
                usize::try_from(limit).map_err(|_| format!("limit {limit} is too large"))?
            }
            Some(limit) => return Err(format!("limit must be between 1 and {MAX_HISTORY_LIMIT} (got {limit})")),
        };
        let agent = self.agent.map(|agent| agent.trim().to_string()).filter(|agent| !agent.is_empty());
        Ok(HistorySearchPlan { keywords, logic, case_sensitive: self.case_sensitive.unwrap_or(false), agent, limit })
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArguments {
    /// The task's id: the full id, or a unique prefix such as the 8 characters of an
    /// [A2A:<id8>:...] prefix.
    pub task_id: String,
}

impl TaskArguments {
    pub fn validate(self) -> Result<String, Refusal> {
        let id = self.task_id.trim();
        if id.is_empty() {
            return Err("'task_id' is empty: give a task id or its 8-character prefix".into());
        }
        Ok(id.to_string())
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LockArguments {
    /// The file to lock (absolute, or relative to the working directory).
    pub path: String,
    /// Seconds the lock lasts (default 300). Locking again renews it.
    pub duration_seconds: Option<i64>,
    /// What you are about to do, shown to the other agents.
    pub intent: Option<String>,
    /// The task this change belongs to.
    pub task_id: Option<String>,
    /// Wait up to this many seconds (1 to 600) for the file to be free instead of failing at
    /// once when another agent holds it.
    #[schemars(range(min = 1, max = 600))]
    pub wait_seconds: Option<i64>,
}

/// A lock, ready for the broker (without the agent, which is the server's identity).
#[derive(Debug, Clone, PartialEq)]
pub struct LockPlan {
    pub path: String,
    pub duration_seconds: u64,
    pub intent: Option<String>,
    pub task_id: Option<String>,
    pub wait_seconds: Option<u64>,
}

impl LockArguments {
    pub fn validate(self, working_dir: Option<&Path>) -> Result<LockPlan, Refusal> {
        let path = absolute(&self.path, working_dir)?;
        let duration_seconds = match self.duration_seconds {
            None => DEFAULT_LOCK_SECONDS,
            Some(seconds) if seconds > 0 => seconds.unsigned_abs(),
            Some(seconds) => {
                return Err(format!("the duration must be a positive number of seconds (got {seconds})"));
            }
        };
        let wait_seconds = self.wait_seconds.map(|seconds| bounded_seconds("wait_seconds", seconds)).transpose()?;
        Ok(LockPlan { path, duration_seconds, intent: self.intent, task_id: self.task_id, wait_seconds })
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileArguments {
    /// The file (absolute, or relative to the working directory).
    pub path: String,
}

impl FileArguments {
    pub fn validate(self, working_dir: Option<&Path>) -> Result<String, Refusal> {
        absolute(&self.path, working_dir)
    }
}

/// `file` made absolute against `working_dir` (none: the server's was removed, and only an
/// absolute path is taken); the broker normalises and checks it further (`..`, control
/// characters), as for `synapse file-safety`.
fn absolute(file: &str, working_dir: Option<&Path>) -> Result<String, Refusal> {
    if file.trim().is_empty() {
        return Err("the path is empty".into());
    }
    let path = Path::new(file);
    let joined = match working_dir {
        _ if path.is_absolute() => path.to_path_buf(),
        Some(working_dir) => working_dir.join(path),
        None => {
            return Err(format!(
                "'{file}' is relative, and this server's working directory no longer exists: give the absolute path"
            ));
        }
    };
    Ok(joined.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn send(arguments: serde_json::Value) -> Result<SendPlan, Refusal> {
        serde_json::from_value::<SendArguments>(arguments).map_err(|error| error.to_string())?.validate(Flow::Auto)
    }

    #[test]
    fn a_send_with_only_target_and_message_expects_a_reply_at_priority_3_and_does_not_wait() {
        let plan = send(serde_json::json!({"to": " bob ", "message": "  hi\n there "})).unwrap();
        assert_eq!(plan.request.to, "bob");
        assert_eq!(plan.request.text, "  hi\n there ", "the text goes to the broker untouched");
        assert_eq!(plan.request.priority, 3);
        assert!(plan.request.response_expected);
        assert_eq!(plan.wait_seconds, None);
    }

    #[test]
    fn the_flow_setting_decides_whether_a_reply_is_expected_unless_the_caller_says() {
        let quiet = serde_json::json!({"to": "bob", "message": "fyi"});
        let oneway = serde_json::from_value::<SendArguments>(quiet.clone()).unwrap().validate(Flow::Oneway).unwrap();
        assert!(!oneway.request.response_expected);
        let roundtrip = serde_json::from_value::<SendArguments>(quiet).unwrap().validate(Flow::Roundtrip).unwrap();
        assert!(roundtrip.request.response_expected);
        assert_eq!(roundtrip.wait_seconds, None, "a tool call never waits without a bound");
        let no = send(serde_json::json!({"to": "bob", "message": "fyi", "expect_reply": false})).unwrap();
        assert!(!no.request.response_expected);
    }

    #[test]
    fn waiting_implies_a_reply_and_is_bounded() {
        let plan = send(serde_json::json!({"to": "bob", "message": "q", "wait_seconds": 30})).unwrap();
        assert!(plan.request.response_expected);
        assert_eq!(plan.wait_seconds, Some(30));
        for seconds in [0, -1, 601] {
            let refusal = send(serde_json::json!({"to": "bob", "message": "q", "wait_seconds": seconds})).unwrap_err();
            assert!(refusal.contains("wait_seconds must be between 1 and 600"), "{refusal}");
        }
        let both = send(serde_json::json!({"to": "bob", "message": "q", "wait_seconds": 5, "expect_reply": false}));
        assert!(both.unwrap_err().contains("expect_reply is false"));
    }

    #[test]
    fn a_priority_outside_1_to_5_is_refused_in_the_clis_words() {
        for priority in [0, 6, -3, 300, i64::MAX] {
            let refusal = send(serde_json::json!({"to": "bob", "message": "m", "priority": priority})).unwrap_err();
            assert_eq!(refusal, format!("priority must be between 1 and 5 (got {priority})"));
        }
        let five = send(serde_json::json!({"to": "bob", "message": "m", "priority": 5})).unwrap();
        assert_eq!(five.request.priority, 5);
    }

    #[test]
    fn empty_targets_messages_and_task_ids_are_refused() {
        assert!(send(serde_json::json!({"to": " ", "message": "m"})).unwrap_err().contains("'to' is empty"));
        assert_eq!(send(serde_json::json!({"to": "bob", "message": " \n "})).unwrap_err(), "the message is empty");
        assert!(
            send(serde_json::json!({"to": "bob", "message": "m", "reply_to": ""})).unwrap_err().contains("reply_to")
        );
        assert!(TaskArguments { task_id: "  ".into() }.validate().is_err());
        assert_eq!(TaskArguments { task_id: " abcd1234 ".into() }.validate().unwrap(), "abcd1234");
    }

    #[test]
    fn misspelt_missing_or_mistyped_arguments_are_refused_by_name() {
        let unknown = send(serde_json::json!({"to": "bob", "text": "m"})).unwrap_err();
        assert!(unknown.contains("unknown field `text`"), "{unknown}");
        let missing = send(serde_json::json!({"to": "bob"})).unwrap_err();
        assert!(missing.contains("missing field `message`"), "{missing}");
        let mistyped = send(serde_json::json!({"to": "bob", "message": "m", "priority": "high"})).unwrap_err();
        assert!(mistyped.contains("invalid type"), "{mistyped}");
    }

    #[test]
    fn a_reply_needs_text_and_names_its_target_only_when_given() {
        let plan = ReplyArguments { message: "4".into(), to: None, idempotency_key: None }.validate().unwrap();
        assert_eq!(plan, ReplyPlan { to: None, text: "4".into(), idempotency_key: None });
        let to =
            ReplyArguments { message: "4".into(), to: Some(" synapse-claude-8100 ".into()), idempotency_key: None }
                .validate()
                .unwrap();
        assert_eq!(to.to.as_deref(), Some("synapse-claude-8100"));
        assert_eq!(
            ReplyArguments { message: "".into(), to: None, idempotency_key: None }.validate().unwrap_err(),
            "the reply is empty"
        );
        assert!(ReplyArguments { message: "x".into(), to: Some("".into()), idempotency_key: None }.validate().is_err());
    }

    #[test]
    fn a_history_search_needs_a_keyword_and_takes_or_and_and_a_bounded_limit() {
        let search =
            |value: serde_json::Value| serde_json::from_value::<HistorySearchArguments>(value).unwrap().validate();
        let plan = search(serde_json::json!({"keywords": [" deploy ", ""]})).unwrap();
        assert_eq!(plan.keywords, vec!["deploy"]);
        assert_eq!((plan.logic, plan.case_sensitive, plan.limit), ("OR", false, 20));
        assert_eq!(search(serde_json::json!({"keywords": ["a"], "logic": "and"})).unwrap().logic, "AND");
        assert!(search(serde_json::json!({"keywords": ["a"], "logic": "XOR"})).unwrap_err().contains("OR or AND"));
        assert!(search(serde_json::json!({"keywords": [" "]})).unwrap_err().contains("at least one keyword"));
        assert!(search(serde_json::json!({"keywords": ["a"], "limit": 0})).unwrap_err().contains("between 1 and 200"));
    }

    #[test]
    fn file_paths_become_absolute_and_a_lock_lasts_a_positive_time() {
        let dir = Some(Path::new("/work/project"));
        let plan = LockArguments {
            path: "src/main.rs".into(),
            duration_seconds: None,
            intent: None,
            task_id: None,
            wait_seconds: None,
        }
        .validate(dir)
        .unwrap();
        assert_eq!(plan.path, "/work/project/src/main.rs");
        assert_eq!(plan.duration_seconds, 300);
        let refused = LockArguments {
            path: "/a".into(),
            duration_seconds: Some(0),
            intent: None,
            task_id: None,
            wait_seconds: None,
        }
        .validate(dir)
        .unwrap_err();
        assert_eq!(refused, "the duration must be a positive number of seconds (got 0)");
        assert_eq!(FileArguments { path: "/etc/hosts".into() }.validate(dir).unwrap(), "/etc/hosts");
        assert_eq!(FileArguments { path: " ".into() }.validate(dir).unwrap_err(), "the path is empty");
        let gone = FileArguments { path: "src/x.rs".into() }.validate(None).unwrap_err();
        assert!(gone.contains("working directory no longer exists"), "{gone}");
        assert_eq!(FileArguments { path: "/etc/hosts".into() }.validate(None).unwrap(), "/etc/hosts");
    }
}
