//! The contract between Synapse's processes: every request and answer that crosses the wire
//! between the CLI, the agent wrappers, the scenario agent, the benchmarks and the broker, as
//! serde types, with the header names and the protocol version.
//!
//! Invariants: each type serializes to exactly the JSON the broker sends or accepts today (the
//! same field names; a field the broker writes as `null` is a field here, not one skipped; a
//! request field that is absent is skipped, which the broker reads as its default), so parsing
//! an answer and writing it again gives the same JSON (tests below and `tests/api_contract.rs`
//! check it). Changes are additive: a new field gets a default. This module imports nothing of
//! Synapse but the event vocabulary (`crate::event`) and the broker's file (`crate::config`).

mod agents;
mod broker;
mod externals;
mod file_safety;
mod history;
mod tasks;
#[cfg(test)]
mod tests;
mod webhooks;

pub use agents::*;
pub use broker::*;
pub use externals::*;
pub use file_safety::*;
pub use history::*;
pub use tasks::*;
pub use webhooks::*;

use serde::{Deserialize, Serialize};

/// The broker's version: a client talks only to a broker of its own version (the health
/// answer's `version`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Header carrying an agent's secret for requests made on its behalf.
pub const SECRET_HEADER: &str = "x-synapse-agent-secret";

/// Header carrying an API key when the broker requires one.
pub const API_KEY_HEADER: &str = "x-api-key";

/// Header of a send that may be retried: a retry with the same key answers the first send.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// The body of every 4xx / 5xx answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The status's reason phrase (`Bad Request`, `Not Found`, ...).
    pub error: String,
    /// What went wrong, for the user.
    pub message: String,
    /// The names a reference could mean (an ambiguous target, task prefix or reply target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<Vec<String>>,
}

/// The answer to a removal (an external agent's alias, a webhook's URL): what was removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Removed {
    pub removed: String,
}

/// `value` as one line of JSON with its keys in the order `serde_json::Value` keeps them
/// (sorted): what the CLI and the wrappers print, unchanged since they printed `Value`s.
/// Every control is escaped, DEL and C1 included (`\u007f`, `\u009b`; serde_json escapes only
/// C0), so that JSON printed on a terminal carries no control a sender wrote.
pub fn json_line<T: Serialize>(value: &T) -> serde_json::Result<String> {
    Ok(crate::escape::json_controls(serde_json::to_string(&serde_json::to_value(value)?)?))
}

/// Like [`json_line`], indented.
pub fn json_pretty<T: Serialize>(value: &T) -> serde_json::Result<String> {
    Ok(crate::escape::json_controls(serde_json::to_string_pretty(&serde_json::to_value(value)?)?))
}
