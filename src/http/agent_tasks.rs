//! `POST /agents/{agent}/tasks/{id}/update`: an agent moves a task it received (working with
//! artifacts, input required, completed, failed), proving its identity with its secret. Used by
//! the scenario agent; the sender's task waiting on it follows in the same commit.

use super::{ApiError, AppState, Scope, parse_body, secret_of, wire};
use crate::broker::command::{Command, Outcome, UpdateTaskRequest};
use crate::event::{Artifact, TaskState};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    state: TaskState,
    #[serde(default)]
    artifacts: Vec<Artifact>,
    #[serde(default)]
    error: Option<String>,
}

pub async fn update_task(
    State(state): State<AppState>,
    Scope(agent): Scope,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body: UpdateBody = parse_body(body)?;
    let request = UpdateTaskRequest {
        agent_id: agent,
        secret: secret_of(&headers),
        task_id: params.get("id").cloned().unwrap_or_default(),
        state: body.state,
        artifacts: body.artifacts,
        error: body.error,
    };
    match state.writer.submit(Command::UpdateTask(request)).await? {
        Outcome::Task { task } => Ok(Json(json!({"task": wire::task_json(&task)}))),
        other => Ok(Json(json!(other))),
    }
}
