//! OpenAI Chat Completions (`POST /v1/chat/completions`, OpenCode and Copilot CLI): SSE of
//! `chat.completion.chunk` deltas (text, or `tool_calls` with index, id, function name and
//! arguments), a `finish_reason`, a usage chunk when `stream_options.include_usage` asks for
//! one, then `data: [DONE]`. Also `GET /v1/models`.

use super::record::{Entry, parse_body};
use super::script::{self, Action, Tool, Turn};
use super::{SharedState, new_id, sse_frame, sse_response, text_pieces, token_estimate};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;

/// The model id `GET /v1/models` lists.
pub const MODEL_ID: &str = "fake-model";

/// The last turn of a Chat Completions request.
pub fn turn_of(body: &Value) -> Turn {
    let messages = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let is_after_tool_result = messages
        .last()
        .is_some_and(|message| matches!(message.get("role").and_then(Value::as_str), Some("tool") | Some("function")));
    let last_user_text =
        messages.iter().rev().find(|message| message.get("role") == Some(&json!("user"))).and_then(|message| {
            let texts: Vec<String> = match message.get("content") {
                Some(Value::String(text)) => vec![text.clone()],
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|part| part.get("text").and_then(Value::as_str).map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            };
            script::user_text(texts.iter().map(String::as_str))
        });
    Turn { last_user_text, is_after_tool_result }
}

/// The function tools a Chat Completions request offers.
pub fn tools_of(body: &Value) -> Vec<Tool> {
    body.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| {
            let function = tool.get("function")?;
            let name = function.get("name")?.as_str()?.to_string();
            Some(Tool { name, schema: function.get("parameters").cloned().unwrap_or(Value::Null) })
        })
        .collect()
}

/// `POST /v1/chat/completions`.
pub async fn completions(State(state): State<SharedState>, uri: Uri, body: Bytes) -> Response {
    let body = parse_body(&body);
    let model = body.get("model").and_then(Value::as_str).unwrap_or(MODEL_ID).to_string();
    let schema = body.pointer("/response_format/json_schema/schema");
    let action = super::decide_and_record(
        &state,
        "chat",
        uri.path().to_string(),
        &model,
        &body,
        (turn_of(&body), tools_of(&body)),
        schema,
    );
    let prompt_tokens = token_estimate(&body);
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5});
    let id = new_id("chatcmpl-");
    let created = super::now_ms() / 1000;
    if body.get("stream") != Some(&json!(true)) {
        let (message, finish_reason) = match &action {
            Action::ToolCall { tool, arguments } => (
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": new_id("call_"), "type": "function",
                    "function": {"name": tool, "arguments": arguments.to_string()}}]}),
                "tool_calls",
            ),
            Action::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
            Action::Slow | Action::Late | Action::Internal => {
                (json!({"role": "assistant", "content": script::DEFAULT_TEXT}), "stop")
            }
        };
        return Json(json!({"id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}], "usage": usage}))
        .into_response();
    }
    let include_usage = body.pointer("/stream_options/include_usage") == Some(&json!(true));
    let pieces = text_pieces(state, &action);
    let stream = async_stream::stream! {
        let chunk = |delta: Value, finish_reason: Value| {
            let data = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]});
            Ok::<_, Infallible>(sse_frame(None, &data))
        };
        yield chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        let finish_reason = if let Action::ToolCall { tool, arguments } = &action {
            let call = json!({"index": 0, "id": new_id("call_"), "type": "function",
                "function": {"name": tool, "arguments": ""}});
            yield chunk(json!({"tool_calls": [call]}), Value::Null);
            let arguments = json!({"index": 0, "function": {"arguments": arguments.to_string()}});
            yield chunk(json!({"tool_calls": [arguments]}), Value::Null);
            "tool_calls"
        } else {
            let mut pieces = std::pin::pin!(pieces);
            while let Some(piece) = tokio_stream::StreamExt::next(&mut pieces).await {
                yield chunk(json!({"content": piece}), Value::Null);
            }
            "stop"
        };
        yield chunk(json!({}), json!(finish_reason));
        if include_usage {
            let data = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [], "usage": usage});
            yield Ok(sse_frame(None, &data));
        }
        yield Ok(axum::body::Bytes::from_static(b"data: [DONE]\n\n"));
    };
    sse_response(stream)
}

/// `GET /v1/models`: one model, [`MODEL_ID`].
pub async fn models(State(state): State<SharedState>, uri: Uri) -> Json<Value> {
    state.recorder.push(Entry {
        api: "chat",
        path: uri.path().to_string(),
        model: None,
        has_tools: false,
        last_user_text: None,
        action: "models",
        tool: None,
        body: &Value::Null,
    });
    Json(json!({"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "synapse"}]}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_message_is_a_tool_result() {
        let body = json!({"messages": [{"role": "system", "content": "be slow"},
            {"role": "user", "content": [{"type": "text", "text": "what is 1+1"}]},
            {"role": "assistant", "tool_calls": []}, {"role": "tool", "content": "2"}]});
        let turn = turn_of(&body);
        assert!(turn.is_after_tool_result);
        assert_eq!(turn.last_user_text.as_deref(), Some("what is 1+1"));
        assert_eq!(turn.new_user_text(), None);
    }
}
