//! Anthropic Messages (`POST /v1/messages`, Claude Code): SSE `message_start`,
//! `content_block_start` / `_delta` (`text_delta`, `input_json_delta`) / `_stop`,
//! `message_delta` with the stop reason, `message_stop`; or one JSON message when the request
//! does not ask to stream. `POST /v1/messages/count_tokens` answers a rough estimate.

use super::record::{Entry, parse_body};
use super::script::{self, Action, Tool, Turn};
use super::{SharedState, new_id, sse_frame, sse_response, text_pieces, token_estimate};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;

/// The last turn of a Messages request.
pub fn turn_of(body: &Value) -> Turn {
    let messages = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let blocks_of = |message: &Value| -> Vec<Value> {
        match message.get("content") {
            Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
            Some(Value::Array(blocks)) => blocks.clone(),
            _ => Vec::new(),
        }
    };
    let has_tool_result = messages.last().is_some_and(|message| {
        message.get("role") == Some(&json!("user"))
            && blocks_of(message).iter().any(|block| block.get("type") == Some(&json!("tool_result")))
    });
    let last_user_text =
        messages.iter().rev().find(|message| message.get("role") == Some(&json!("user"))).and_then(|message| {
            let blocks = blocks_of(message);
            let texts: Vec<String> = blocks
                .iter()
                .filter(|block| block.get("type") == Some(&json!("text")))
                .filter_map(|block| block.get("text").and_then(Value::as_str).map(str::to_string))
                .collect();
            script::user_text(texts.iter().map(String::as_str))
        });
    // A user message after a refused or interrupted tool call comes with its tool_result in the
    // same turn: that is a new message, not the end of the tool call.
    let is_after_tool_result = has_tool_result && last_user_text.is_none();
    Turn { last_user_text, is_after_tool_result }
}

/// The tools a Messages request offers.
pub fn tools_of(body: &Value) -> Vec<Tool> {
    body.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| {
            let name = tool.get("name")?.as_str()?.to_string();
            Some(Tool { name, schema: tool.get("input_schema").cloned().unwrap_or(Value::Null) })
        })
        .collect()
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<SharedState>, body: Bytes) -> Response {
    let body = parse_body(&body);
    let model = body.get("model").and_then(Value::as_str).unwrap_or("scripted").to_string();
    let schema = body.pointer("/output_format/schema").or(body.pointer("/output_config/format/schema"));
    let action = super::decide_and_record(
        &state,
        "anthropic",
        "/v1/messages".into(),
        &model,
        &body,
        (turn_of(&body), tools_of(&body)),
        schema,
    );
    let input_tokens = token_estimate(&body);
    if body.get("stream") != Some(&json!(true)) {
        return Json(whole_message(&action, &model, input_tokens)).into_response();
    }
    let pieces = text_pieces(state, &action);
    let message_id = new_id("msg_");
    let stream = async_stream::stream! {
        let start = json!({"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}});
        yield Ok::<_, Infallible>(sse_frame(Some("message_start"), &start));
        let stop_reason = if let Action::ToolCall { tool, arguments } = &action {
            let block = json!({"type": "tool_use", "id": new_id("toolu_"), "name": tool, "input": {}});
            yield Ok(sse_frame(Some("content_block_start"), &json!({"type": "content_block_start", "index": 0, "content_block": block})));
            let delta = json!({"type": "input_json_delta", "partial_json": arguments.to_string()});
            yield Ok(sse_frame(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": 0, "delta": delta})));
            "tool_use"
        } else {
            let block = json!({"type": "text", "text": ""});
            yield Ok(sse_frame(Some("content_block_start"), &json!({"type": "content_block_start", "index": 0, "content_block": block})));
            let mut pieces = std::pin::pin!(pieces);
            while let Some(piece) = tokio_stream::StreamExt::next(&mut pieces).await {
                let delta = json!({"type": "text_delta", "text": piece});
                yield Ok(sse_frame(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": 0, "delta": delta})));
            }
            "end_turn"
        };
        yield Ok(sse_frame(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": 0})));
        let delta = json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": 5}});
        yield Ok(sse_frame(Some("message_delta"), &delta));
        yield Ok(sse_frame(Some("message_stop"), &json!({"type": "message_stop"})));
    };
    sse_response(stream)
}

/// The answer as one (non-streaming) message. A slow answer is sent whole.
fn whole_message(action: &Action, model: &str, input_tokens: u64) -> Value {
    let (content, stop_reason) = match action {
        Action::ToolCall { tool, arguments } => {
            (json!([{"type": "tool_use", "id": new_id("toolu_"), "name": tool, "input": arguments}]), "tool_use")
        }
        Action::Text(text) => (json!([{"type": "text", "text": text}]), "end_turn"),
        Action::Slow | Action::Late | Action::Internal => {
            (json!([{"type": "text", "text": script::DEFAULT_TEXT}]), "end_turn")
        }
    };
    json!({"id": new_id("msg_"), "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": null, "usage": {"input_tokens": input_tokens, "output_tokens": 5}})
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`.
pub async fn count_tokens(State(state): State<SharedState>, body: Bytes) -> Json<Value> {
    let body = parse_body(&body);
    let turn = turn_of(&body);
    state.recorder.push(Entry {
        api: "anthropic",
        path: "/v1/messages/count_tokens".into(),
        model: body.get("model").and_then(Value::as_str).map(str::to_string),
        has_tools: !tools_of(&body).is_empty(),
        last_user_text: turn.new_user_text(),
        action: "count_tokens",
        tool: None,
        body: &body,
    });
    Json(json!({"input_tokens": token_estimate(&body)}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_sent_with_a_refused_tool_result_is_a_new_turn() {
        let turn = turn_of(&json!({"messages": [
            {"role": "user", "content": "please run: touch x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "interrupted", "is_error": true},
                {"type": "text", "text": "[A2A:1234abcd:anonymous] next message"}]}]}));
        assert!(!turn.is_after_tool_result);
        assert_eq!(turn.last_user_text.as_deref(), Some("[A2A:1234abcd:anonymous] next message"));
    }

    #[test]
    fn a_tool_result_ends_the_turn_and_reminders_are_not_user_text() {
        let body = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>slow</system-reminder>"},
                                          {"type": "text", "text": "please run: ls"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]});
        let turn = turn_of(&body);
        assert!(turn.is_after_tool_result);
        // The last user message holds only the tool result: no text of its own.
        assert_eq!(turn.last_user_text, None);
        let first = json!({"messages": [body["messages"][0].clone()]});
        assert_eq!(turn_of(&first).last_user_text.as_deref(), Some("please run: ls"));
    }
}
