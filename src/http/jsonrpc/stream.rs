//! The streaming methods (`SendStreamingMessage`, `SubscribeToTask` and their 0.3 names): a
//! task snapshot, then its changes from the log.
//!
//! Invariant: the snapshot is exact at the cursor the stream follows from (the head did not
//! move while it was read), so no change is lost or repeated; every stream ends at a final
//! state, on broker shutdown, or when the agent serving it goes.

use super::*;

type SseItem = Result<SseEvent, std::convert::Infallible>;

pub(super) fn sse_event(id: &Value, seq: u64, result: Value) -> SseItem {
    Ok(SseEvent::default().id(seq.to_string()).data(result_response(id, result).to_string()))
}

/// The SSE response of a streaming call: the task snapshot first, then its updates from the
/// log after `cursor`, until the task is done (or the broker stops).
pub(super) fn stream_task(
    state: AppState,
    version: Version,
    id: Value,
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
                    yield Ok(SseEvent::default().data(error_response(&id, &error).to_string()));
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
    match submit_send(&state, &agent, &request).await {
        Ok((task, seq)) => stream_task(state, version, call.id, task, seq, true, served_by),
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}

pub(super) fn subscribe_task(
    state: AppState,
    agent: String,
    version: Version,
    call: Call,
    served_by: Option<String>,
) -> Response {
    let snapshot = (|| {
        let reference = task_id_param(&call.params)?;
        // A snapshot and the cursor it is exact at: the head did not move while reading.
        // (The log's own head, not the watch: the watch moves only after the commit.)
        loop {
            let before = state.store.head()?;
            let task = find_task(&state, &agent, reference)?;
            if state.store.head()? == before {
                return Ok((task, before));
            }
        }
    })();
    match snapshot {
        Ok((task, _)) if task.state.is_final() => Json(error_response(
            &call.id,
            &RpcError::new(
                UNSUPPORTED_OPERATION,
                format!("Task {} is already {}; nothing to subscribe to", task.id, task.state),
            ),
        ))
        .into_response(),
        Ok((task, cursor)) => {
            let stop_at_input = task.state != TaskState::InputRequired;
            stream_task(state, version, call.id, task, cursor, stop_at_input, served_by)
        }
        Err(error) => Json(error_response(&call.id, &error)).into_response(),
    }
}
