//! Checks and lookups every decider uses: task references, the sender's proof, message text.

use super::decision::{CommandError, DecideError};
use super::requests::MAX_MESSAGE_BYTES;
use crate::store::{AgentRecord, Projections, TaskRecord};

/// A task id or prefix: hexadecimal digits and dashes, 1 to 36 characters.
pub fn validate_task_ref(reference: &str) -> Result<String, CommandError> {
    let reference = reference.trim().to_ascii_lowercase();
    if reference.is_empty() || reference.len() > 36 || !reference.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(CommandError::bad(format!(
            "Invalid task id '{reference}': expected a task id or its prefix (hexadecimal, e.g. 'abc12345')"
        )));
    }
    Ok(reference)
}

/// Finds one task by full id or unique prefix.
pub fn find_task(view: &Projections<'_>, reference: &str) -> Result<Option<TaskRecord>, DecideError> {
    let reference = validate_task_ref(reference)?;
    Ok(unique_task(&reference, view.tasks_with_prefix(&reference, 11)?)?)
}

/// The task a prefix names among `candidates` (the tasks whose id starts with it): none, the
/// one, or an ambiguity error listing them.
pub fn unique_task(reference: &str, candidates: Vec<TaskRecord>) -> Result<Option<TaskRecord>, CommandError> {
    match candidates.len() {
        0 | 1 => Ok(candidates.into_iter().next()),
        _ => Err(ambiguous_task(reference, &candidates)),
    }
}

pub fn ambiguous_task(reference: &str, candidates: &[TaskRecord]) -> CommandError {
    let ids: Vec<String> = candidates.iter().take(10).map(|task| task.id.clone()).collect();
    CommandError::Ambiguous {
        message: format!(
            "Ambiguous task id '{reference}': {} tasks start with it ({}). Use more characters.",
            if candidates.len() > 10 { "more than 10".to_string() } else { candidates.len().to_string() },
            ids.join(", ")
        ),
        candidates: ids,
    }
}

/// A name an unverified sender gives itself (`metadata.sender.sender_id`): shown in headers and
/// event lines, so 1-64 letters, digits, '-', '_' or '.', nothing that could act on a terminal.
pub fn check_sender_name(id: &str) -> Result<(), CommandError> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(CommandError::bad(format!(
            "sender id '{}' must be 1-64 letters, digits, '-', '_' or '.'",
            crate::event::preview(id, 80)
        )));
    }
    Ok(())
}

/// A sender that names itself without proof: a plain name no registered agent answers to (by
/// id, name or type), and an endpoint without control characters. Returns the name as it is
/// shown (`<name>(unverified)`).
pub fn check_unverified(
    view: &Projections<'_>,
    from: Option<&str>,
    claimed: &super::requests::UnverifiedSender,
) -> Result<String, DecideError> {
    if from.is_some() {
        return Err(CommandError::bad("a send names a verified or an unverified sender, not both").into());
    }
    let id = claimed.id.as_str();
    check_sender_name(id)?;
    if let Some(endpoint) = &claimed.endpoint
        && (endpoint.len() > 512 || endpoint.chars().any(char::is_control))
    {
        return Err(
            CommandError::bad("sender_endpoint must be at most 512 characters without control characters").into()
        );
    }
    if let Some(task_id) = &claimed.task_id
        && (task_id.is_empty() || task_id.len() > 128 || task_id.chars().any(char::is_control))
    {
        return Err(CommandError::bad("sender_task_id must be 1-128 characters without control characters").into());
    }
    // A registered agent speaks only with its secret: its name cannot be borrowed.
    let agents = view.agents()?;
    if view.agent_exists(id)? || resolve_target(&agents, id).is_ok() {
        return Err(CommandError::forbidden(format!(
            "sending as '{id}' requires its secret: '{id}' is a registered agent here"
        ))
        .into());
    }
    Ok(format!("{id}(unverified)"))
}

/// Checks that `from` may speak: anonymous, or a registered agent proving it with its secret.
pub fn check_sender(
    view: &Projections<'_>,
    from: Option<&str>,
    secret: Option<&str>,
) -> Result<Option<AgentRecord>, DecideError> {
    let Some(from) = from else { return Ok(None) };
    let from = agent_id_of(view, from)?;
    let from = from.as_str();
    let Some(agent) = view.agent(from)? else {
        return Err(CommandError::bad(format!(
            "unknown sender '{from}': no registered agent has this id. To send anonymously, name no sender (no --from, and SYNAPSE_AGENT_ID unset)."
        ))
        .into());
    };
    match secret {
        Some(secret) if crate::secret::secret_matches(secret, &agent.secret_hash) => Ok(Some(agent)),
        Some(_) => Err(CommandError::forbidden(format!(
            "the secret does not match agent '{from}'. Only {from} itself (with its SYNAPSE_AGENT_SECRET) can send as it."
        ))
        .into()),
        None => Err(CommandError::forbidden(format!(
            "sending as '{from}' requires its secret. Run the command inside that agent (SYNAPSE_AGENT_SECRET is set there), or leave --from out to send anonymously."
        ))
        .into()),
    }
}

pub fn validate_text(text: &str) -> Result<(), CommandError> {
    if text.trim().is_empty() {
        return Err(CommandError::bad("the message is empty"));
    }
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(CommandError::TooLarge {
            message: format!("the message is {} bytes; the limit is {MAX_MESSAGE_BYTES}", text.len()),
        });
    }
    Ok(())
}

pub use crate::ids::new_id;

/// Target resolution: custom name → agent id → `<type>-<port>` → type; first hit wins.
pub fn resolve_target(agents: &[AgentRecord], target: &str) -> Result<AgentRecord, CommandError> {
    let target = target.trim();
    if target.is_empty() {
        return Err(CommandError::bad("no target given"));
    }
    if let Some(agent) = agents.iter().find(|agent| agent.name.as_deref() == Some(target)) {
        return Ok(agent.clone());
    }
    if let Some(agent) = agents.iter().find(|agent| agent.agent_id == target) {
        return Ok(agent.clone());
    }
    if let Some(agent) = agents.iter().find(|agent| format!("{}-{}", agent.agent_type, agent.port) == target) {
        return Ok(agent.clone());
    }
    let of_type: Vec<&AgentRecord> = agents.iter().filter(|agent| agent.agent_type == target).collect();
    match of_type.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(CommandError::not_found(format!(
            "No agent found matching '{target}'. Run 'synapse list' to see the running agents."
        ))),
        many => {
            let ids: Vec<String> = many.iter().map(|agent| agent.agent_id.clone()).collect();
            Err(CommandError::Ambiguous {
                message: format!(
                    "Ambiguous target '{target}'. Multiple agents found: {}. Use the agent id or name.",
                    ids.join(", ")
                ),
                candidates: ids,
            })
        }
    }
}

/// The id of the live agent `reference` names (id, name, type-port or type, as for a send's
/// target), or `reference` itself when no live agent matches: a departed agent's id still names
/// its records. Several agents of one type are ambiguous, as for a send.
pub fn agent_id_of(view: &Projections<'_>, reference: &str) -> Result<String, DecideError> {
    if view.agent_exists(reference)? {
        return Ok(reference.to_string());
    }
    match resolve_target(&view.agents()?, reference) {
        Ok(agent) => Ok(agent.agent_id),
        Err(CommandError::NotFound { .. }) => Ok(reference.to_string()),
        Err(error) => Err(error.into()),
    }
}
