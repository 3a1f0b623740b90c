//! `POST /agents/{agent}/tasks/{id}/update`: an agent moves a task it received (working with
//! artifacts, input required, completed, failed), proving its identity with its secret. Used by
//! the scenario agent; the sender's task waiting on it follows in the same commit.

use super::AppState;
use super::a2a_rest::task_outcome;
use super::error::ApiResult;
use super::extract::{Path, Scope, parse_body, secret_of};
use crate::api;
use crate::broker::command::{Command, UpdateTaskRequest};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use std::collections::HashMap;

pub async fn update_task(
    State(state): State<AppState>,
    Scope(agent): Scope,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let update: api::TaskUpdate = parse_body(body)?;
    let request = UpdateTaskRequest {
        agent_id: agent,
        secret: secret_of(&headers),
        task_id: params.get("id").cloned().unwrap_or_default(),
        state: update.state,
        artifacts: update.artifacts,
        error: update.error,
        as_message: update.as_message,
    };
    task_outcome(state.writer.submit(Command::UpdateTask(request)).await?)
}
