//! OpenAI Responses (`POST /v1/responses`, Codex): SSE `response.created`,
//! `response.output_item.added`, `response.output_text.delta`, `response.output_item.done`,
//! `response.completed` with usage; a tool call is one `function_call` item (`call_id`, `name`,
//! `arguments` as a JSON string). Without `stream: true` the whole response is one JSON object.

use super::record::parse_body;
use super::script::{self, Action, Tool, Turn};
use super::{SharedState, new_id, sse_frame, sse_response, text_pieces, token_estimate};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;

/// The last turn of a Responses request.
pub fn turn_of(body: &Value) -> Turn {
    let items = match body.get("input") {
        Some(Value::String(text)) => vec![json!({"type": "message", "role": "user", "content": text})],
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    let is_after_tool_result = items.last().is_some_and(|item| {
        item.get("type").and_then(Value::as_str).is_some_and(|kind| kind.ends_with("_output"))
            || item.get("role") == Some(&json!("tool"))
    });
    let last_user_text = items.iter().rev().find(|item| item.get("role") == Some(&json!("user"))).and_then(|item| {
        let texts: Vec<String> = match item.get("content") {
            Some(Value::String(text)) => vec![text.clone()],
            Some(Value::Array(parts)) => {
                parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str).map(str::to_string)).collect()
            }
            _ => Vec::new(),
        };
        script::user_text(texts.iter().map(String::as_str))
    });
    Turn { last_user_text, is_after_tool_result }
}

/// Between a namespace and a tool's name in [`Tool::name`]: Codex groups an MCP server's tools
/// in a `namespace` tool (`mcp__synapse` holding `reply`, ...), called by name and namespace.
pub const NAMESPACE_SEPARATOR: &str = "::";

/// The tools a Responses request offers (function tools, or any with a name); a namespace's tools
/// as `<namespace>::<tool>`.
pub fn tools_of(body: &Value) -> Vec<Tool> {
    let mut tools = Vec::new();
    for tool in body.get("tools").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = tool.get("name").or_else(|| tool.pointer("/function/name")).and_then(Value::as_str) else {
            continue;
        };
        if tool.get("type").and_then(Value::as_str) == Some("namespace") {
            for member in tool.get("tools").and_then(Value::as_array).into_iter().flatten() {
                if let Some(member_name) = member.get("name").and_then(Value::as_str) {
                    tools.push(Tool {
                        name: format!("{name}{NAMESPACE_SEPARATOR}{member_name}"),
                        schema: member.get("parameters").cloned().unwrap_or(Value::Null),
                    });
                }
            }
            continue;
        }
        let schema = tool.get("parameters").or_else(|| tool.pointer("/function/parameters")).cloned();
        tools.push(Tool { name: name.to_string(), schema: schema.unwrap_or(Value::Null) });
    }
    tools
}

/// `POST /v1/responses`.
pub async fn responses(State(state): State<SharedState>, body: Bytes) -> Response {
    let body = parse_body(&body);
    let model = body.get("model").and_then(Value::as_str).unwrap_or("scripted").to_string();
    let schema = body.pointer("/text/format/schema");
    let action = super::decide_and_record(
        &state,
        "responses",
        "/v1/responses".into(),
        &model,
        &body,
        (turn_of(&body), tools_of(&body)),
        schema,
    );
    let input_tokens = token_estimate(&body);
    let response_id = new_id("resp_");
    let usage = json!({"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input_tokens + 5});
    let envelope = move |status: &str, output: Value| {
        json!({"id": response_id, "object": "response", "created_at": super::now_ms() / 1000, "status": status,
            "model": model, "output": output, "usage": if status == "completed" { usage.clone() } else { Value::Null }})
    };
    if body.get("stream") != Some(&json!(true)) {
        let item = match &action {
            Action::ToolCall { tool, arguments } => function_call_item(tool, arguments),
            Action::Text(text) => message_item(&new_id("msg_"), text),
            Action::Slow | Action::Late | Action::Internal => message_item(&new_id("msg_"), script::DEFAULT_TEXT),
        };
        return Json(envelope("completed", json!([item]))).into_response();
    }
    let pieces = text_pieces(state, &action);
    let stream = async_stream::stream! {
        let mut sequence = 0u64;
        let mut event = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(sequence);
            sequence += 1;
            Ok::<_, Infallible>(sse_frame(Some(kind), &data))
        };
        yield event("response.created", json!({"response": envelope("in_progress", json!([]))}));
        yield event("response.in_progress", json!({"response": envelope("in_progress", json!([]))}));
        let item = if let Action::ToolCall { tool, arguments } = &action {
            let item = function_call_item(tool, arguments);
            let mut added = item.clone();
            added["arguments"] = json!("");
            added["status"] = json!("in_progress");
            yield event("response.output_item.added", json!({"output_index": 0, "item": added}));
            yield event("response.function_call_arguments.delta",
                json!({"output_index": 0, "item_id": item["id"], "delta": arguments.to_string()}));
            yield event("response.function_call_arguments.done",
                json!({"output_index": 0, "item_id": item["id"], "arguments": arguments.to_string()}));
            item
        } else {
            let item_id = new_id("msg_");
            let mut added = message_item(&item_id, "");
            added["status"] = json!("in_progress");
            added["content"] = json!([]);
            yield event("response.output_item.added", json!({"output_index": 0, "item": added}));
            yield event("response.content_part.added", json!({"output_index": 0, "item_id": item_id, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}));
            let mut text = String::new();
            let mut pieces = std::pin::pin!(pieces);
            while let Some(piece) = tokio_stream::StreamExt::next(&mut pieces).await {
                text.push_str(&piece);
                yield event("response.output_text.delta",
                    json!({"output_index": 0, "item_id": item_id, "content_index": 0, "delta": piece}));
            }
            yield event("response.output_text.done",
                json!({"output_index": 0, "item_id": item_id, "content_index": 0, "text": text}));
            yield event("response.content_part.done", json!({"output_index": 0, "item_id": item_id, "content_index": 0,
                "part": {"type": "output_text", "text": text, "annotations": []}}));
            message_item(&item_id, &text)
        };
        yield event("response.output_item.done", json!({"output_index": 0, "item": item}));
        yield event("response.completed", json!({"response": envelope("completed", json!([item]))}));
    };
    sse_response(stream)
}

fn message_item(id: &str, text: &str) -> Value {
    json!({"type": "message", "id": id, "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn function_call_item(tool: &str, arguments: &Value) -> Value {
    let mut item = json!({"type": "function_call", "id": new_id("fc_"), "call_id": new_id("call_"), "name": tool,
        "arguments": arguments.to_string(), "status": "completed"});
    if let Some((namespace, name)) = tool.split_once(NAMESPACE_SEPARATOR) {
        item["name"] = json!(name);
        item["namespace"] = json!(namespace);
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespaced_tool_is_offered_and_called_with_its_namespace() {
        let body = json!({"tools": [{"type": "function", "name": "exec_command", "parameters": {}},
            {"type": "namespace", "name": "mcp__synapse", "tools": [{"type": "function", "name": "reply", "parameters": {"type": "object"}}]}]});
        let names: Vec<String> = tools_of(&body).into_iter().map(|tool| tool.name).collect();
        assert_eq!(names, ["exec_command", "mcp__synapse::reply"]);
        let item = function_call_item("mcp__synapse::reply", &json!({"message": "4"}));
        assert_eq!((item["name"].as_str(), item["namespace"].as_str()), (Some("reply"), Some("mcp__synapse")));
        assert_eq!(function_call_item("exec_command", &json!({}))["namespace"], Value::Null);
    }

    #[test]
    fn function_call_output_is_a_tool_result_and_context_is_skipped() {
        let body = json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>x</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
            {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"}]});
        let turn = turn_of(&body);
        assert!(turn.is_after_tool_result);
        assert_eq!(turn.last_user_text.as_deref(), Some("hello"));
    }
}
