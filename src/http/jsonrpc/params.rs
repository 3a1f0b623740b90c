//! The parameters of the A2A methods: typed readers of a request's JSON (each refusal an
//! InvalidParams naming the field) and the lookup of the task a request names, which every
//! method that takes a task shares.

use super::RpcError;
use crate::http::AppState;
use crate::http::subscribe;
use crate::store::TaskRecord;
use serde_json::Value;

pub(super) fn string_param<'a>(params: &'a Value, name: &str) -> Result<Option<&'a str>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(RpcError::params(format!("'{name}' must be a string"))),
    }
}

pub(super) fn count_param(params: &Value, name: &str) -> Result<Option<usize>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .and_then(|count| usize::try_from(count).ok())
            .map(Some)
            .ok_or_else(|| RpcError::params(format!("'{name}' must be a number of 0 or more"))),
    }
}

pub(super) fn bool_param(params: &Value, name: &str) -> Result<Option<bool>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(_) => Err(RpcError::params(format!("'{name}' must be true or false"))),
    }
}

pub(super) fn task_id_param(params: &Value) -> Result<&str, RpcError> {
    string_param(params, "id")?
        .filter(|id| !id.is_empty())
        .ok_or_else(|| RpcError::params("'id' (the task id) is required"))
}

/// The task `reference` names among this agent's tasks.
pub(super) fn find_task(state: &AppState, agent: &str, reference: &str) -> Result<TaskRecord, RpcError> {
    if crate::broker::command::validate_task_ref(reference).is_err() {
        return Err(RpcError::task_not_found(reference));
    }
    subscribe::find_task_of_agent(state, agent, reference)?.ok_or_else(|| RpcError::task_not_found(reference))
}
