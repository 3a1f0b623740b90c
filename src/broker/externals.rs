//! External A2A agents (SPEC §6): agents on other machines (or other Synapse brokers) known by
//! an alias. Additions and removals are events; the list is an in-memory projection of the log
//! kept by the same tail task as the webhook outbox.

use super::command::decision::{Answer, CommandError, DecideError, Decision};
use crate::event::{Envelope, Event};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Clone)]
pub enum ExternalCommand {
    Add { alias: String, url: String, name: String, description: Option<String> },
    Remove { alias: String },
}

/// An external agent known by its alias, as the API shows it.
pub use crate::api::External;

pub fn is_valid_alias(alias: &str) -> bool {
    !alias.is_empty()
        && alias.len() <= 64
        && alias.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// An alias from an agent's name: lowercase letters and digits joined by dashes.
pub fn alias_from_name(name: &str) -> String {
    let mut alias = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            alias.push(c.to_ascii_lowercase());
        } else if !alias.ends_with('-') && !alias.is_empty() {
            alias.push('-');
        }
    }
    let alias = alias.trim_end_matches('-').to_string();
    if alias.is_empty() { "external".to_string() } else { alias.chars().take(64).collect() }
}

pub fn decide(command: &ExternalCommand) -> Result<Decision, DecideError> {
    let event = match command {
        ExternalCommand::Add { alias, url, name, description } => {
            if !is_valid_alias(alias) {
                return Err(CommandError::bad(format!(
                    "Invalid alias '{alias}': letters, digits, '-', '_' or '.', at most 64"
                ))
                .into());
            }
            super::outbound::parse_url(url).map_err(|message| CommandError::bad(format!("Invalid URL {message}")))?;
            Event::ExternalAgentAdded {
                alias: alias.clone(),
                url: url.clone(),
                name: name.clone(),
                description: description.clone(),
            }
        }
        ExternalCommand::Remove { alias } => Event::ExternalAgentRemoved { alias: alias.clone() },
    };
    Ok(Decision { actor: None, events: vec![event], answer: Answer::Appended })
}

/// The known external agents, by alias.
#[derive(Default)]
pub struct Externals {
    agents: Mutex<BTreeMap<String, External>>,
}

impl Externals {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, External>> {
        self.agents.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies one event. Pure: the same log gives the same list. A change here changes
    /// `broker::delivery::SNAPSHOT_VERSION` too (the list is in the delivery worker's snapshot).
    pub fn apply(&self, envelope: &Envelope) {
        match &envelope.event {
            Event::ExternalAgentAdded { alias, url, name, description } => {
                self.lock().insert(
                    alias.clone(),
                    External {
                        alias: alias.clone(),
                        url: url.clone(),
                        name: name.clone(),
                        description: description.clone(),
                        added_seq: envelope.seq,
                    },
                );
            }
            Event::ExternalAgentRemoved { alias } => {
                self.lock().remove(alias);
            }
            _ => {}
        }
    }

    pub fn get(&self, alias: &str) -> Option<External> {
        self.lock().get(alias).cloned()
    }

    pub fn list(&self) -> Vec<External> {
        self.lock().values().cloned().collect()
    }

    /// Puts back the list of a snapshot (the delivery worker's, at its start).
    pub fn restore(&self, list: Vec<External>) {
        *self.lock() = list.into_iter().map(|external| (external.alias.clone(), external)).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_come_from_names_and_must_be_simple() {
        assert_eq!(alias_from_name("Claude Code (Reviewer)"), "claude-code-reviewer");
        assert_eq!(alias_from_name("!!!"), "external");
        assert!(is_valid_alias("bob-2.remote"));
        assert!(!is_valid_alias("has space"));
        assert!(!is_valid_alias(""));
    }
}
