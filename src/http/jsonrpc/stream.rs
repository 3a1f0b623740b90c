//! The streaming methods (`SendStreamingMessage`, `SubscribeToTask` and their 0.3 names): a
//! task snapshot, then its changes from the log.
//!
//! Invariant: the snapshot is exact at the cursor the stream follows from (the head did not
//! move while it was read), so no change is lost or repeated; every stream ends at a final
//! state, on broker shutdown, or when the agent serving it goes.

use super::methods::{parse_send, submit_send};
use super::params::{find_task, task_id_param};
use super::shapes::{change_responses, task_json};
use super::{
    Call, INTERNAL_ERROR, RpcError, UNSUPPORTED_OPERATION, Version, error_response, result_response, status_body,
};
use crate::event::TaskState;
use crate::http::AppState;
use crate::http::subscribe::{self, StreamEnd};
use crate::store::TaskRecord;
use axum::Json;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::time::Duration;

type SseItem = Result<SseEvent, std::convert::Infallible>;

/// One stream response: inside a JSON-RPC response with the call's `id`, or bare (`None`: the
/// HTTP+JSON binding).
pub(super) fn sse_event(id: &Option<Value>, seq: u64, result: Value) -> SseItem {
    let data = match id {
        Some(id) => result_response(id, result),
        None => result,
    };
    Ok(SseEvent::default().id(seq.to_string()).data(data.to_string()))
}

/// The SSE response of a streaming call: the task snapshot first, then its updates from the
/// log after `cursor`, until the task is done (or the broker stops).
pub(super) fn stream_task(
    state: AppState,
    version: Version,
    id: Option<Value>,
    snapshot: TaskRecord,
    cursor: u64,
    stop_at_input: bool,
    served_by: Option<String>,
) -> Response {
    let changes = subscribe::task_changes(state, snapshot.id.clone(), cursor, snapshot.state.is_final(), served_by);
    let stream = async_stream::stream! {
        let first = task_json(version, &snapshot, None, true);
        yield sse_event(&id, cursor, match version {
            Version::V10 => json!({"task": first}),
            Version::V03 => first,
        });
        if snapshot.state.is_final() || (stop_at_input && snapshot.state == TaskState::InputRequired) {
            return;
        }
        let mut artifact_count = snapshot.artifacts.len();
        let mut last_state = snapshot.state;
        tokio::pin!(changes);
        while let Some(item) = tokio_stream::StreamExt::next(&mut changes).await {
            match item {
                Ok(change) => {
                    for response in change_responses(version, &snapshot, &change, &mut artifact_count, &mut last_state) {
                        yield sse_event(&id, change.seq, response);
                    }
                    if change.state.is_final() || (stop_at_input && change.state == TaskState::InputRequired) {
                        break;
                    }
                }
                Err(StreamEnd::Shutdown) => break,
                Err(StreamEnd::Failed(message)) => {
                    let error = RpcError::new(INTERNAL_ERROR, message);
                    let data = match &id {
                        Some(id) => error_response(id, &error),
                        None => status_body(&error),
                    };
                    yield Ok(SseEvent::default().data(data.to_string()));
                    break;
                }
            }
        }
    };
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

pub(super) async fn stream_send(
    state: AppState,
    agent: String,
    version: Version,
    call: Call,
    served_by: Option<String>,
) -> Response {
    let request = match parse_send(&state, &agent, version, &call.params) {
        Ok(request) => request,
        Err(error) => return Json(error_response(&call.id, &error)).into_response(),
    };
    match submit_send(&state, &agent, version, &request).await {
        Ok((task, seq)) => stream_task(state, version, Some(call.id), task, seq, true, served_by),
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}

/// The task to subscribe to and the log position its snapshot is exact at; a task already
/// final has nothing to follow (UnsupportedOperation).
pub(super) fn task_snapshot(state: &AppState, agent: &str, reference: &str) -> Result<(TaskRecord, u64), RpcError> {
    // A snapshot and the cursor it is exact at: the head did not move while reading.
    // (The log's own head, not the watch: the watch moves only after the commit.)
    let (task, cursor) = loop {
        let before = state.store.head()?;
        let task = find_task(state, agent, reference)?;
        if state.store.head()? == before {
            break (task, before);
        }
    };
    if task.state.is_final() {
        return Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            format!("Task {} is already {}; nothing to subscribe to", task.id, task.state),
        ));
    }
    Ok((task, cursor))
}

pub(super) fn subscribe_task(
    state: AppState,
    agent: String,
    version: Version,
    call: Call,
    served_by: Option<String>,
) -> Response {
    match task_id_param(&call.params).and_then(|reference| task_snapshot(&state, &agent, reference)) {
        Ok((task, cursor)) => {
            let stop_at_input = task.state != TaskState::InputRequired;
            stream_task(state, version, Some(call.id), task, cursor, stop_at_input, served_by)
        }
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}
