//! Gemini (`POST /v1beta/models/{model}:streamGenerateContent?alt=sse`, Gemini CLI): SSE of
//! `GenerateContentResponse` objects, `candidates[0].content.parts[]` holding text or a
//! `functionCall {name, args}`, the last with `finishReason` and `usageMetadata`. Also
//! `:generateContent` (one response) and `:countTokens`.

use super::record::{Entry, parse_body};
use super::script::{self, Action, Tool, Turn};
use super::{SharedState, sse_frame, sse_response, text_pieces, token_estimate};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;

/// The last turn of a Gemini request.
pub fn turn_of(body: &Value) -> Turn {
    let contents = body.get("contents").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let parts_of = |content: &Value| content.get("parts").and_then(Value::as_array).cloned().unwrap_or_default();
    let has_tool_result = contents
        .last()
        .is_some_and(|content| parts_of(content).iter().any(|part| part.get("functionResponse").is_some()));
    let last_user_text =
        contents.iter().rev().find(|content| content.get("role").is_none_or(|role| role == "user")).and_then(
            |content| {
                let texts: Vec<String> = parts_of(content)
                    .iter()
                    .filter_map(|part| part.get("text").and_then(Value::as_str).map(str::to_string))
                    .collect();
                script::user_text(texts.iter().map(String::as_str))
            },
        );
    // Text beside the function response in the last turn is a new message.
    let is_after_tool_result = has_tool_result && last_user_text.is_none();
    Turn { last_user_text, is_after_tool_result }
}

/// The function declarations a Gemini request offers.
pub fn tools_of(body: &Value) -> Vec<Tool> {
    body.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| tool.get("functionDeclarations").and_then(Value::as_array))
        .flatten()
        .filter_map(|declaration| {
            let name = declaration.get("name")?.as_str()?.to_string();
            let schema = declaration.get("parametersJsonSchema").or_else(|| declaration.get("parameters")).cloned();
            Some(Tool { name, schema: schema.unwrap_or(Value::Null) })
        })
        .collect()
}

/// `POST /v1beta/models/{model}:{method}`.
pub async fn model_action(
    State(state): State<SharedState>,
    Path(model_action): Path<String>,
    uri: Uri,
    body: Bytes,
) -> Response {
    let body = parse_body(&body);
    let (model, method) = model_action.split_once(':').unwrap_or((model_action.as_str(), ""));
    let model = model.to_string();
    let turn = turn_of(&body);
    let tools = tools_of(&body);
    let prompt_tokens = token_estimate(&body);
    let mut entry = Entry {
        api: "gemini",
        path: uri.to_string(),
        model: Some(model.clone()),
        has_tools: !tools.is_empty(),
        last_user_text: turn.new_user_text(),
        action: "count_tokens",
        tool: None,
        body: &body,
    };
    if method == "countTokens" {
        state.recorder.push(entry);
        return Json(json!({"totalTokens": prompt_tokens})).into_response();
    }
    if method != "generateContent" && method != "streamGenerateContent" {
        entry.action = "not_found";
        state.recorder.push(entry);
        let message = format!("the scripted model does not serve :{method}");
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": {"code": 404, "message": message, "status": "NOT_FOUND"}})),
        )
            .into_response();
    }
    let action = script::decide(&turn, &tools);
    entry.action = action.label();
    if let Action::ToolCall { tool, .. } = &action {
        entry.tool = Some(tool.clone());
    }
    state.recorder.push(entry);
    let action = match action {
        Action::Internal => {
            let schema = body
                .pointer("/generationConfig/responseJsonSchema")
                .or_else(|| body.pointer("/generationConfig/responseSchema"));
            Action::Text(super::internal_text(schema))
        }
        other => other,
    };
    let usage =
        json!({"promptTokenCount": prompt_tokens, "candidatesTokenCount": 5, "totalTokenCount": prompt_tokens + 5});
    let response = move |parts: Value, finish: bool| {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        let mut response = json!({"modelVersion": model});
        if finish {
            candidate["finishReason"] = json!("STOP");
            response["usageMetadata"] = usage.clone();
        }
        response["candidates"] = json!([candidate]);
        response
    };
    let is_sse = method == "streamGenerateContent" && uri.query().is_some_and(|query| query.contains("alt=sse"));
    if !is_sse {
        let parts = match &action {
            Action::ToolCall { tool, arguments } => json!([{"functionCall": {"name": tool, "args": arguments}}]),
            Action::Text(text) => json!([{"text": text}]),
            Action::Slow | Action::Late | Action::Internal => json!([{"text": script::DEFAULT_TEXT}]),
        };
        let whole = response(parts, true);
        return if method == "streamGenerateContent" { Json(json!([whole])) } else { Json(whole) }.into_response();
    }
    let pieces = text_pieces(state, &action);
    let stream = async_stream::stream! {
        if let Action::ToolCall { tool, arguments } = &action {
            let parts = json!([{"functionCall": {"name": tool, "args": arguments}}]);
            yield Ok::<_, Infallible>(sse_frame(None, &response(parts, true)));
        } else {
            let mut pieces = std::pin::pin!(pieces);
            while let Some(piece) = tokio_stream::StreamExt::next(&mut pieces).await {
                yield Ok(sse_frame(None, &response(json!([{"text": piece}]), false)));
            }
            yield Ok(sse_frame(None, &response(json!([{"text": ""}]), true)));
        }
    };
    sse_response(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_response_is_a_tool_result() {
        let body = json!({"contents": [
            {"role": "user", "parts": [{"text": "please run: ls"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command", "response": {}}}]}]});
        let turn = turn_of(&body);
        assert!(turn.is_after_tool_result);
        assert_eq!(turn.new_user_text(), None);
        let tools = tools_of(&json!({"tools": [{"functionDeclarations": [{"name": "run_shell_command",
            "parametersJsonSchema": {"type": "object"}}]}]}));
        assert_eq!(tools[0].name, "run_shell_command");
    }
}
