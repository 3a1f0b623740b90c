//! `synapse scripted-model`: each API streams what the script says, tool calls carry arguments
//! fitted to the offered schema, slow answers stop when the client goes away, every request is
//! recorded.

mod common;

use common::clis::{ScriptedModel, read_request_log};
use common::http_tcp;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

/// POSTs `body` and returns the `data:` payloads of the SSE answer, parsed (`[DONE]` as a string).
fn stream(model: &ScriptedModel, path: &str, body: &Value) -> Vec<Value> {
    let (status, answer) = http_tcp(model.port, "POST", path, Some(body.to_string().as_bytes()), &[]);
    assert_eq!(status, 200, "{answer}");
    let text = answer.as_str().expect("an SSE body is not JSON").to_string();
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or(Value::String(data.to_string())))
        .collect()
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

#[test]
fn anthropic_answers_a_reply_expected_sum_with_a_bash_tool_use() {
    let model = ScriptedModel::start(None);
    let body = json!({"model": "claude-x", "stream": true, "max_tokens": 100,
        "tools": [{"name": "Read", "input_schema": schema(json!({"path": {"type": "string"}}), &["path"])},
                  {"name": "Bash", "input_schema": schema(json!({"command": {"type": "string"}}), &["command"])}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                                   {"type": "text", "text": "[A2A:12345678:alice:R] what is 2+2"}]}]});
    let events = stream(&model, "/v1/messages", &body);
    let kinds: Vec<&str> = events.iter().filter_map(|event| event["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[1]["content_block"]["name"], "Bash");
    let input: Value = serde_json::from_str(events[2]["delta"]["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(input, json!({"command": "synapse reply \"4\""}));
    assert_eq!(events[4]["delta"]["stop_reason"], "tool_use");

    let (status, count) =
        http_tcp(model.port, "POST", "/v1/messages/count_tokens", Some(body.to_string().as_bytes()), &[]);
    assert_eq!(status, 200);
    assert!(count["input_tokens"].as_u64().is_some_and(|tokens| tokens > 0));
}

#[test]
fn anthropic_title_request_without_tools_gets_json_for_its_schema_and_is_marked_internal() {
    let model = ScriptedModel::start(None);
    let body = json!({"model": "m", "stream": false, "tools": [],
        "output_config": {"format": {"type": "json_schema", "schema": schema(json!({"title": {"type": "string"}}), &["title"])}},
        "messages": [{"role": "user", "content": "<session>\nwhat is 2+2\n</session>\n\nWrite the title"}]});
    let (status, answer) = http_tcp(model.port, "POST", "/v1/messages", Some(body.to_string().as_bytes()), &[]);
    assert_eq!(status, 200);
    let text: Value = serde_json::from_str(answer["content"][0]["text"].as_str().unwrap()).unwrap();
    assert!(text["title"].is_string());
    assert_eq!(model.requests()[0]["internal"], json!(true));
}

#[test]
fn responses_calls_exec_command_without_a_login_shell_then_ends_with_done() {
    let model = ScriptedModel::start(None);
    let exec = schema(json!({"cmd": {"type": "string"}, "login": {"type": "boolean"}}), &["cmd"]);
    let tools = json!([{"type": "function", "name": "exec_command", "parameters": exec}]);
    let user =
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "please run: echo hi"}]});
    let events =
        stream(&model, "/v1/responses", &json!({"model": "m", "stream": true, "tools": tools, "input": [user]}));
    assert_eq!(events.first().unwrap()["type"], "response.created");
    let done = events.iter().find(|event| event["type"] == "response.output_item.done").unwrap();
    assert_eq!(done["item"]["type"], "function_call");
    assert_eq!(done["item"]["name"], "exec_command");
    let arguments: Value = serde_json::from_str(done["item"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"cmd": "echo hi", "login": false}));
    let completed = events.last().unwrap();
    assert_eq!(completed["type"], "response.completed");
    assert!(completed["response"]["usage"]["total_tokens"].as_u64().is_some());

    let call_id = done["item"]["call_id"].clone();
    let input = json!([user, done["item"], {"type": "function_call_output", "call_id": call_id, "output": "hi"}]);
    let events =
        stream(&model, "/v1/responses", &json!({"model": "m", "stream": true, "tools": tools, "input": input}));
    let text: String = events
        .iter()
        .filter(|event| event["type"] == "response.output_text.delta")
        .filter_map(|event| event["delta"].as_str())
        .collect();
    assert_eq!(text, "Done.");
}

#[test]
fn chat_completions_stream_a_bash_tool_call_usage_and_done() {
    let model = ScriptedModel::start(None);
    let bash = schema(
        json!({"command": {"type": "string"}, "description": {"type": "string"},
               "mode": {"type": "string", "enum": ["sync", "async"]}}),
        &["command", "description"],
    );
    let body = json!({"model": "fake-model", "stream": true, "stream_options": {"include_usage": true},
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": bash}}],
        "messages": [{"role": "system", "content": "be slow"},
                     {"role": "user", "content": "[A2A:12345678:alice:R] what is 19+23"}]});
    let events = stream(&model, "/v1/chat/completions", &body);
    assert_eq!(events.last().unwrap(), &json!("[DONE]"));
    let calls: Vec<&Value> = events
        .iter()
        .filter_map(|event| event["choices"][0]["delta"]["tool_calls"][0].as_object().map(|_| event))
        .collect();
    let first = &calls[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(first["function"]["name"], "bash");
    assert!(first["id"].is_string());
    let arguments: String = calls
        .iter()
        .filter_map(|event| event["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    let arguments: Value = serde_json::from_str(&arguments).unwrap();
    assert_eq!(arguments, json!({"command": "synapse reply \"42\"", "description": "Run a shell command"}));
    assert!(events.iter().any(|event| event["choices"][0]["finish_reason"] == "tool_calls"));
    assert!(events.iter().any(|event| event["usage"]["total_tokens"].is_u64()));

    let (status, models) = http_tcp(model.port, "GET", "/v1/models", None, &[]);
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "fake-model");
}

#[test]
fn gemini_streams_a_run_shell_command_call_and_plain_sums_as_text() {
    let model = ScriptedModel::start(None);
    let shell = schema(json!({"command": {"type": "string"}, "description": {"type": "string"}}), &["command"]);
    let tools = json!([{"functionDeclarations": [{"name": "run_shell_command", "parametersJsonSchema": shell}]}]);
    let path = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse";
    let body = json!({"tools": tools, "contents": [{"role": "user", "parts": [{"text": "[A2A:1:a:R] what is 2+2"}]}]});
    let events = stream(&model, path, &body);
    let last = events.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert!(last["usageMetadata"]["totalTokenCount"].is_u64());
    let call = &events[0]["candidates"][0]["content"]["parts"][0]["functionCall"];
    assert_eq!(call["name"], "run_shell_command");
    assert_eq!(call["args"], json!({"command": "synapse reply \"4\""}));

    let body = json!({"tools": tools, "contents": [{"role": "user", "parts": [{"text": "what is 2+2"}]}]});
    let text: String = stream(&model, path, &body)
        .iter()
        .filter_map(|event| event["candidates"][0]["content"]["parts"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, "4");
}

#[test]
fn a_slow_answer_stops_streaming_when_the_client_disconnects() {
    let model = ScriptedModel::start(None);
    let body = json!({"stream": true, "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        "messages": [{"role": "user", "content": "answer slow please"}]})
    .to_string();
    let mut connection = std::net::TcpStream::connect(("127.0.0.1", model.port)).unwrap();
    write!(
        connection,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(connection.try_clone().unwrap());
    let started = Instant::now();
    let mut ticks = 0;
    while ticks < 3 {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended early");
        ticks += usize::from(line.contains("tick "));
    }
    // Three chunks, 200 ms apart: the answer is really slow, not sent at once.
    assert!(started.elapsed() >= Duration::from_millis(350), "{:?}", started.elapsed());
    let (_, active) = http_tcp(model.port, "GET", "/_synapse/slow_streams", None, &[]);
    assert_eq!(active["active"], 1);
    drop(reader);
    connection.shutdown(std::net::Shutdown::Both).unwrap();
    drop(connection);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (_, active) = http_tcp(model.port, "GET", "/_synapse/slow_streams", None, &[]);
        if active["active"] == 0 {
            assert_eq!(active["cut"], 1, "the stream the client left is counted as cut: {active}");
            break;
        }
        assert!(Instant::now() < deadline, "the slow stream is still running after the client left");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_request_is_recorded_in_memory_and_in_the_log_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let model = ScriptedModel::start(Some(&log));
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {}}}]);
    for text in ["hello", "what is 1+2"] {
        let body = json!({"model": "fake-model", "stream": true, "tools": tools,
            "messages": [{"role": "user", "content": text}]});
        stream(&model, "/v1/chat/completions", &body);
    }
    let (status, _) = http_tcp(model.port, "POST", "/v1/unheard_of", Some(b"{}"), &[]);
    assert_eq!(status, 404);
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["api"], "chat");
    assert_eq!(requests[0]["model"], "fake-model");
    assert_eq!(requests[0]["has_tools"], true);
    assert_eq!(requests[1]["last_user_text"], "what is 1+2");
    assert_eq!(requests[1]["body"]["messages"][0]["content"], "what is 1+2");
    assert!(requests[1]["time_ms"].as_u64().is_some());
    assert_eq!(requests[2]["api"], "unknown");
    assert_eq!(requests[2]["path"], "POST /v1/unheard_of");
    assert_eq!(model.count_user_text("what is 1+2"), 1);
    assert_eq!(read_request_log(&log), requests);
}
