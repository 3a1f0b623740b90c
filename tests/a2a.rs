//! The A2A endpoints over real HTTP: the v1.0 agent card, the JSON-RPC binding (every method
//! and error, v1.0 and 0.3), and task subscriptions over SSE (issues 6 and 7). The scenario
//! agent answers by rule, so every task state is reached without an AI CLI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::time::Duration;

/// Longest a read from a stream may block before the test fails.
const READ_DEADLINE: Duration = Duration::from_secs(60);

/// A scenario agent run by the test (stopped when dropped).
struct Scenario {
    child: Child,
    id: String,
    port: u16,
}

impl Scenario {
    fn start(home: &Home) -> Scenario {
        let mut child = home.cmd(&["scenario-agent"]).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let announce: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("no registration: {line:?}"));
        Scenario {
            child,
            id: announce["agent_id"].as_str().unwrap().to_string(),
            port: u16::try_from(announce["port"].as_u64().unwrap()).unwrap(),
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        kill(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// One JSON-RPC call on the agent's port; `version` is the `A2A-Version` header.
fn rpc(port: u16, version: Option<&str>, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": "call-1", "method": method, "params": params}).to_string();
    rpc_raw(port, version, body.as_bytes())
}

fn rpc_raw(port: u16, version: Option<&str>, body: &[u8]) -> Value {
    let headers: Vec<(&str, &str)> = version.map(|v| vec![("A2A-Version", v)]).unwrap_or_default();
    let (status, answer) = http_tcp(port, "POST", "/", Some(body), &headers);
    assert_eq!(status, 200, "JSON-RPC answers are HTTP 200: {answer}");
    answer
}

fn v1(port: u16, method: &str, params: Value) -> Value {
    rpc(port, Some("1.0"), method, params)
}

/// The error's code; every error also carries one `google.rpc.ErrorInfo` (A2A v1.0 §9.5) whose
/// reason names that code.
fn error_code(answer: &Value) -> i64 {
    let code = answer["error"]["code"].as_i64().unwrap_or_else(|| panic!("expected an error: {answer}"));
    let info = &answer["error"]["data"][0];
    assert_eq!(info["@type"], "type.googleapis.com/google.rpc.ErrorInfo", "{answer}");
    assert_eq!(info["domain"], "a2a-protocol.org", "{answer}");
    let reason = match code {
        -32700 => "PARSE_ERROR",
        -32600 => "INVALID_REQUEST",
        -32601 => "METHOD_NOT_FOUND",
        -32602 => "INVALID_PARAMS",
        -32001 => "TASK_NOT_FOUND",
        -32002 => "TASK_NOT_CANCELABLE",
        -32003 => "PUSH_NOTIFICATION_NOT_SUPPORTED",
        -32004 => "UNSUPPORTED_OPERATION",
        -32005 => "CONTENT_TYPE_NOT_SUPPORTED",
        -32007 => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        -32009 => "VERSION_NOT_SUPPORTED",
        _ => "INTERNAL",
    };
    assert_eq!(info["reason"], reason, "{answer}");
    code
}

fn text_message(text: &str) -> Value {
    json!({"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER", "parts": [{"text": text}]})
}

fn send_v1(port: u16, text: &str, return_immediately: bool) -> Value {
    let answer = v1(
        port,
        "SendMessage",
        json!({"message": text_message(text), "configuration": {"returnImmediately": return_immediately}}),
    );
    answer["result"]["task"].clone()
}

fn artifact_texts(task: &Value) -> Vec<String> {
    task["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|artifact| artifact["parts"].as_array().unwrap().iter())
        .map(|part| part["text"].as_str().unwrap().to_string())
        .collect()
}

/// One server-sent event.
#[derive(Debug, Clone, Default)]
struct Sse {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

impl Sse {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap()
    }
}

/// An HTTP response read incrementally: the status and headers at once, then the chunked body
/// event by event as the server sends it.
struct Stream {
    status: u16,
    reader: BufReader<std::net::TcpStream>,
    chunked: bool,
    pending: String,
    ended: bool,
}

impl Stream {
    fn open(port: u16, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> Stream {
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        socket.set_read_timeout(Some(READ_DEADLINE)).unwrap();
        let body = body.unwrap_or("");
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()));
        socket.write_all(head.as_bytes()).unwrap();
        let mut reader = BufReader::new(socket);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).unwrap();
        let status = status_line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut chunked = false;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        Stream { status, reader, chunked, pending: String::new(), ended: false }
    }

    /// The whole (non-streamed) body as JSON.
    fn body_json(mut self) -> Value {
        let mut body = String::new();
        if self.chunked {
            while self.read_chunk() {}
            body = std::mem::take(&mut self.pending);
        } else {
            self.reader.read_to_string(&mut body).unwrap();
        }
        serde_json::from_str(&body).unwrap()
    }

    /// Reads one chunk into `pending`; false at the end of the body.
    fn read_chunk(&mut self) -> bool {
        if self.ended {
            return false;
        }
        let mut size = String::new();
        if self.reader.read_line(&mut size).unwrap() == 0 {
            self.ended = true;
            return false;
        }
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        let mut chunk = vec![0; size + 2];
        self.reader.read_exact(&mut chunk).unwrap();
        if size == 0 {
            self.ended = true;
            return false;
        }
        self.pending.push_str(std::str::from_utf8(&chunk[..size]).unwrap());
        true
    }

    /// The next event (keep-alive comments skipped); None when the stream ended.
    fn next_event(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let mut event = Sse::default();
                let mut has_fields = false;
                for line in block.lines() {
                    if let Some((field, value)) = line.split_once(':') {
                        let value = value.strip_prefix(' ').unwrap_or(value);
                        has_fields |= !field.is_empty();
                        match field {
                            "id" => event.id = Some(value.to_string()),
                            "event" => event.event = Some(value.to_string()),
                            "data" => {
                                if !event.data.is_empty() {
                                    event.data.push('\n');
                                }
                                event.data.push_str(value);
                            }
                            _ => {}
                        }
                    }
                }
                if has_fields {
                    return Some(event);
                }
                continue;
            }
            if !self.read_chunk() {
                return None;
            }
        }
    }

    fn rest(&mut self) -> Vec<Sse> {
        std::iter::from_fn(|| self.next_event()).collect()
    }
}

fn rpc_stream(port: u16, version: &str, method: &str, params: Value) -> Stream {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string();
    Stream::open(port, "POST", "/", Some(&body), &[("A2A-Version", version)])
}

#[test]
fn the_agent_card_announces_json_rpc_1_0_with_streaming_on_the_agent_port_and_on_the_broker() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let (status, card) = http_tcp(agent.port, "GET", "/.well-known/agent-card.json", None, &[]);
    assert_eq!(status, 200);
    assert_eq!(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
    assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0");
    assert_eq!(card["supportedInterfaces"][0]["url"], format!("http://127.0.0.1:{}/", agent.port));
    assert_eq!(card["capabilities"]["streaming"], true);
    for field in ["name", "description", "version"] {
        assert!(card[field].as_str().is_some_and(|text| !text.is_empty()), "{field}: {card}");
    }
    assert!(!card["skills"].as_array().unwrap().is_empty());
    assert_eq!(card["defaultInputModes"], json!(["text/plain"]));
    assert_eq!(card["defaultOutputModes"], json!(["text/plain"]));

    let (status, card) = home.http("GET", &format!("/agents/{}/.well-known/agent-card.json", agent.id), None, &[]);
    assert_eq!(status, 200);
    let url = card["supportedInterfaces"][0]["url"].as_str().unwrap().to_string();
    assert!(url.ends_with(&format!("/agents/{}/", agent.id)), "{url}");
    // The URL the broker's card names answers JSON-RPC.
    let broker_path = url.split_once("127.0.0.1:").unwrap().1.split_once('/').unwrap().1;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "abcdef12"}}).to_string();
    let (_, answer) = home.http("POST", &format!("/{broker_path}"), Some(body.as_bytes()), &[("A2A-Version", "1.0")]);
    assert_eq!(error_code(&answer), -32001, "{answer}");
    // The Synapse card stays.
    let (status, synapse_card) = http_tcp(agent.port, "GET", "/.well-known/agent.json", None, &[]);
    assert_eq!(status, 200);
    assert_eq!(synapse_card["extensions"]["synapse"]["agent_id"], agent.id.as_str());
    assert_eq!(synapse_card["capabilities"]["streaming"], true, "it streams, and says so");
    // On the broker an agent is named as a send names it (here by its type): cards and status
    // too, not only its tasks.
    for path in ["/.well-known/agent-card.json", "/.well-known/agent.json", "/status"] {
        let (status, answer) = home.http("GET", &format!("/agents/scenario{path}"), None, &[]);
        assert_eq!(status, 200, "{path}: {answer}");
        let (_, by_id) = home.http("GET", &format!("/agents/{}{path}", agent.id), None, &[]);
        assert_eq!(answer, by_id, "{path}");
    }
    let (status, answer) = home.http("GET", "/agents/nobody/status", None, &[]);
    assert_eq!(status, 404, "{answer}");
}

/// `GET path` on `port` with extra request headers: (status, response headers lowercased, body).
fn get_raw(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_lowercase(), value.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// `POST /` on `port` with this `Content-Type` (none when None): (status, body as JSON).
fn post_typed(port: u16, content_type: Option<&str>, body: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let typed = content_type.map(|value| format!("Content-Type: {value}\r\n")).unwrap_or_default();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nA2A-Version: 1.0\r\n{typed}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Issue 15: JSON-RPC takes application/json or application/a2a+json; a body declared as anything
/// else, or not declared, is refused with HTTP 415 (the guard every POST passes, http/guard.rs)
/// before it is read as JSON.
#[test]
fn json_rpc_refuses_a_body_declared_as_another_media_type() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "GetTask", "params": {"id": "0123abcd"}}).to_string();
    for accepted in [Some("application/json"), Some("application/a2a+json"), Some("Application/JSON; charset=utf-8")] {
        let (status, answer) = post_typed(agent.port, accepted, &call);
        assert_eq!((status, error_code(&answer)), (200, -32001), "{accepted:?}: {answer}");
    }
    for refused in [Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("application/jsonx"), None] {
        let (status, answer) = post_typed(agent.port, refused, &call);
        assert_eq!(status, 415, "{refused:?}: {answer}");
        assert!(answer["message"].as_str().is_some_and(|text| text.contains("application/a2a+json")), "{answer}");
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

/// Issue 15: a card can be cached: `Cache-Control` with `max-age`, an `ETag` answered with 304 on
/// `If-None-Match`, and `Last-Modified` answered with 304 on `If-Modified-Since`.
#[test]
fn the_cards_carry_caching_headers_and_answer_304_when_unchanged() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    for path in ["/.well-known/agent-card.json", "/.well-known/agent.json"] {
        let (status, headers, body) = get_raw(agent.port, path, &[]);
        assert_eq!(status, 200, "{path}");
        assert!(!body.is_empty());
        assert!(header(&headers, "cache-control").is_some_and(|value| value.contains("max-age=")), "{headers:?}");
        let etag = header(&headers, "etag").unwrap().to_string();
        assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
        let modified = header(&headers, "last-modified").unwrap().to_string();
        assert!(modified.ends_with(" GMT"), "{modified}");

        let (status, headers, body) = get_raw(agent.port, path, &[("If-None-Match", &etag)]);
        assert_eq!((status, body.as_str()), (304, ""), "{path}");
        assert_eq!(header(&headers, "etag"), Some(etag.as_str()));
        let (status, _, _) = get_raw(agent.port, path, &[("If-None-Match", "\"something-else\"")]);
        assert_eq!(status, 200, "another ETag: the card again");
        let (status, _, _) = get_raw(agent.port, path, &[("If-Modified-Since", &modified)]);
        assert_eq!(status, 304);
        let (status, _, _) = get_raw(agent.port, path, &[("If-Modified-Since", "Thu, 01 Jan 2015 00:00:00 GMT")]);
        assert_eq!(status, 200, "modified since 2015");
        let (status, _, _) = get_raw(agent.port, path, &[("If-Modified-Since", "not a date")]);
        assert_eq!(status, 200, "a bad date is ignored");
    }
}

#[test]
fn send_message_waits_for_the_agent_and_get_task_shows_the_artifact_in_v1_shapes() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let answer = v1(agent.port, "SendMessage", json!({"message": text_message("hello")}));
    assert_eq!(answer["jsonrpc"], "2.0");
    assert_eq!(answer["id"], "call-1");
    let task = &answer["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    assert_eq!(artifact_texts(task), ["scenario agent: done: hello"]);
    assert_eq!(task["history"][0]["role"], "ROLE_USER");
    assert_eq!(task["history"][0]["parts"][0]["text"], "hello");
    assert!(task["artifacts"][0]["artifactId"].as_str().is_some());
    // Every key Synapse writes in the A2A payload is camelCase, its own metadata included.
    assert_eq!(task["metadata"]["synapse"]["agentId"], agent.id.as_str(), "{task}");
    assert!(task["metadata"]["synapse"]["createdAt"].is_string(), "{task}");
    fn snake_keys(value: &Value, path: &str, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map {
                    if key.contains('_') {
                        found.push(format!("{path}.{key}"));
                    }
                    snake_keys(inner, &format!("{path}.{key}"), found);
                }
            }
            Value::Array(items) => items.iter().for_each(|item| snake_keys(item, path, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    snake_keys(&answer["result"], "result", &mut found);
    assert!(found.is_empty(), "snake_case keys: {found:?}");

    let got = v1(agent.port, "GetTask", json!({"id": task["id"]}));
    assert_eq!(got["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(artifact_texts(&got["result"]), ["scenario agent: done: hello"]);
    let short = v1(agent.port, "GetTask", json!({"id": &task["id"].as_str().unwrap()[..8], "historyLength": 0}));
    assert_eq!(short["result"]["id"], task["id"], "a unique prefix finds the task");
    assert!(short["result"].get("history").is_none(), "historyLength 0 leaves the history out");
    // The same task is the sender side of an ordinary Synapse send: the REST view agrees.
    let (_, rest) = home.http("GET", &format!("/tasks/{}", task["id"].as_str().unwrap()), None, &[]);
    assert_eq!(rest["task"]["status"], "completed");
    assert_eq!(rest["task"]["metadata"]["peer"], agent.id.as_str());
}

/// Issue 15: an agent that answers at once gives a `Message` result, not a task (both protocol
/// versions and the HTTP+JSON binding); artifacts carry file and data parts in each version's
/// shape.
#[test]
fn an_agent_answering_at_once_gives_a_message_and_artifacts_carry_file_and_data_parts() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let answer = v1(agent.port, "SendMessage", json!({"message": text_message("a message, please")}));
    let message = &answer["result"]["message"];
    assert!(answer["result"].get("task").is_none(), "a message, not a task: {answer}");
    assert_eq!(message["role"], "ROLE_AGENT", "{answer}");
    assert_eq!(message["parts"][0]["text"], "scenario agent: a message for you: a message, please", "{answer}");
    assert!(message["messageId"].as_str().is_some_and(|id| !id.is_empty()), "{answer}");
    assert!(message.get("taskId").is_none(), "the message names no task: {answer}");

    let old = rpc(
        agent.port,
        None,
        "message/send",
        json!({"message": {"kind": "message", "messageId": "m-03",
        "role": "user", "parts": [{"kind": "text", "text": "message in 0.3"}]}}),
    );
    assert_eq!(old["result"]["kind"], "message", "{old}");
    assert_eq!(old["result"]["role"], "agent", "{old}");
    assert_eq!(
        old["result"]["parts"][0],
        json!({"kind": "text", "text": "scenario agent: a message for you: message in 0.3"})
    );

    let (status, rest_answer) =
        rest(agent.port, "POST", "/v1/message:send", Some(json!({"message": text_message("message over REST")})));
    assert_eq!(status, 200, "{rest_answer}");
    assert_eq!(rest_answer["message"]["role"], "ROLE_AGENT", "{rest_answer}");
    assert!(rest_answer.get("task").is_none(), "{rest_answer}");

    // A file part: the 1.0 shape names it by url, filename and mediaType; 0.3 nests a file.
    let task = send_v1(agent.port, "the file, please", false);
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let parts = &task["artifacts"][0]["parts"];
    assert_eq!(parts[0]["text"], "scenario agent: the report is attached", "{task}");
    assert_eq!(parts[1]["filename"], "report.txt", "{task}");
    assert_eq!(parts[1]["mediaType"], "text/plain", "{task}");
    assert!(parts[1]["url"].as_str().unwrap().starts_with("data:text/plain;base64,"), "{task}");
    let id = task["id"].as_str().unwrap();
    let old = rpc(agent.port, None, "tasks/get", json!({"id": id}));
    let file = &old["result"]["artifacts"][0]["parts"][1];
    assert_eq!(file["kind"], "file", "{old}");
    assert_eq!(file["file"]["name"], "report.txt", "{old}");
    assert_eq!(file["file"]["mimeType"], "text/plain", "{old}");

    // A data part: structured JSON, carried as it is.
    let task = send_v1(agent.port, "some data, please", false);
    let data = &task["artifacts"][0]["parts"][1]["data"];
    assert_eq!(data["answer"], 42, "{task}");
    assert_eq!(data["items"], json!(["a", "b"]), "{task}");
    let old = rpc(agent.port, None, "tasks/get", json!({"id": task["id"]}));
    assert_eq!(old["result"]["artifacts"][0]["parts"][1]["kind"], "data", "{old}");
    assert_eq!(old["result"]["artifacts"][0]["parts"][1]["data"]["answer"], 42, "{old}");
}

/// A client that sends the same message again (same `messageId`: a retry after a lost answer)
/// gets the first task back; no second message reaches the agent (issue 12, idempotency).
#[test]
fn a_message_sent_again_with_the_same_message_id_is_the_same_task() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let message = json!({"messageId": "retry-7", "role": "ROLE_USER", "parts": [{"text": "wait here"}]});
    let params = json!({"message": message, "configuration": {"returnImmediately": true}});
    let first = v1(agent.port, "SendMessage", params.clone());
    let again = v1(agent.port, "SendMessage", params);
    assert_eq!(first["result"]["task"]["id"], again["result"]["task"]["id"], "{first} {again}");
    let sent = home.events().iter().filter(|event| event["event"]["kind"] == "message_sent").count();
    assert_eq!(sent, 1, "one message in the log");
    let other = v1(
        agent.port,
        "SendMessage",
        json!({"message": text_message("wait here"), "configuration": {"returnImmediately": true}}),
    );
    assert_ne!(other["result"]["task"]["id"], first["result"]["task"]["id"], "another messageId is another message");
    // A client that reuses a messageId for another message: a new message, not the first one
    // again (its message never reached the agent).
    let reused = json!({"messageId": "retry-7", "role": "ROLE_USER", "parts": [{"text": "wait, something else"}]});
    let second =
        v1(agent.port, "SendMessage", json!({"message": reused, "configuration": {"returnImmediately": true}}));
    assert_ne!(second["result"]["task"]["id"], first["result"]["task"]["id"], "{second}");
    let sent = home.events().iter().filter(|event| event["event"]["kind"] == "message_sent").count();
    assert_eq!(sent, 3, "the reused id's message is in the log");
    // A follow-up under the first message's id names its own task: it is that task's, not the
    // first message's task returned again.
    let asking = send_v1(agent.port, "I need input", false);
    let follow_up =
        json!({"messageId": "retry-7", "role": "ROLE_USER", "taskId": asking["id"], "parts": [{"text": "wait here"}]});
    let continued =
        v1(agent.port, "SendMessage", json!({"message": follow_up, "configuration": {"returnImmediately": true}}));
    assert_eq!(continued["result"]["task"]["id"], asking["id"], "{continued}");
    // A messageId is bounded and one line.
    let long = json!({"messageId": "m".repeat(201), "role": "ROLE_USER", "parts": [{"text": "hi"}]});
    assert_eq!(error_code(&v1(agent.port, "SendMessage", json!({"message": long}))), -32602);
    let control = json!({"messageId": "a\nb", "role": "ROLE_USER", "parts": [{"text": "hi"}]});
    assert_eq!(error_code(&v1(agent.port, "SendMessage", json!({"message": control}))), -32602);
}

#[test]
fn the_scenario_agent_reaches_failed_and_input_required_and_stays_working_until_canceled() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let failed = send_v1(agent.port, "please fail", false);
    assert_eq!(failed["status"]["state"], "TASK_STATE_FAILED");
    assert!(failed["status"]["message"]["parts"][0]["text"].as_str().unwrap().contains("failing as asked"));
    assert_eq!(failed["status"]["message"]["role"], "ROLE_AGENT");

    let asking = send_v1(agent.port, "I need input", false);
    assert_eq!(asking["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    assert!(asking["status"]["message"]["parts"][0]["text"].as_str().unwrap().contains("which input"));
    let (_, rest) = home.http("GET", &format!("/tasks/{}", asking["id"].as_str().unwrap()), None, &[]);
    assert_eq!(rest["task"]["status"], "input_required");

    let waiting = send_v1(agent.port, "wait for me", true);
    assert_eq!(waiting["status"]["state"], "TASK_STATE_WORKING");
    let canceled = v1(agent.port, "CancelTask", json!({"id": waiting["id"]}));
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED", "{canceled}");
    let again = v1(agent.port, "CancelTask", json!({"id": waiting["id"]}));
    assert_eq!(error_code(&again), -32002);
    let finished = v1(agent.port, "CancelTask", json!({"id": failed["id"]}));
    assert_eq!(error_code(&finished), -32002, "a failed task is not cancelable");
    // The agent's own side of the exchange is canceled too.
    let (_, receiver) = home.http("GET", &format!("/agents/{}/tasks", agent.id), None, &[]);
    let wait_task = receiver["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|task| task["message"]["parts"][0]["text"] == "wait for me")
        .unwrap();
    assert_eq!(wait_task["status"], "canceled");
}

#[test]
fn send_streaming_message_streams_the_task_then_each_artifact_then_the_final_status() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let mut stream =
        rpc_stream(agent.port, "1.0", "SendStreamingMessage", json!({"message": text_message("stream please")}));
    assert_eq!(stream.status, 200);
    let events = stream.rest();
    let results: Vec<Value> = events.iter().map(|event| event.json()["result"].clone()).collect();
    assert_eq!(results[0]["task"]["status"]["state"], "TASK_STATE_WORKING", "{results:#?}");
    let artifacts: Vec<&Value> = results.iter().filter_map(|r| r.get("artifactUpdate")).collect();
    assert_eq!(artifacts.len(), 4, "three chunks and the answer: {results:#?}");
    let ids: Vec<&str> = artifacts.iter().map(|a| a["artifact"]["artifactId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["artifact-0", "artifact-1", "artifact-2", "artifact-3"]);
    assert_eq!(results.last().unwrap()["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED");
    // SSE ids are log sequence numbers, in order.
    let seqs: Vec<u64> = events.iter().map(|e| e.id.as_ref().unwrap().parse().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] <= pair[1]), "{seqs:?}");
    // The stream ended by itself after the final status (rest() returned).
}

#[test]
fn subscribe_to_task_follows_a_working_task_until_it_is_canceled_and_refuses_finished_or_unknown_ones() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let waiting = send_v1(agent.port, "wait here", true);
    let mut stream = rpc_stream(agent.port, "1.0", "SubscribeToTask", json!({"id": waiting["id"]}));
    let first = stream.next_event().unwrap().json();
    assert_eq!(first["id"], 7);
    assert_eq!(first["result"]["task"]["id"], waiting["id"]);
    assert_eq!(
        v1(agent.port, "CancelTask", json!({"id": waiting["id"]}))["result"]["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    let rest = stream.rest();
    let last = rest.last().expect("an update after the cancel").json();
    assert_eq!(last["result"]["statusUpdate"]["status"]["state"], "TASK_STATE_CANCELED");

    let finished = Stream::open(
        agent.port,
        "POST",
        "/",
        Some(
            &json!({"jsonrpc": "2.0", "id": 8, "method": "SubscribeToTask", "params": {"id": waiting["id"]}})
                .to_string(),
        ),
        &[("A2A-Version", "1.0")],
    );
    assert_eq!(error_code(&finished.body_json()), -32004);
    let unknown = v1(agent.port, "SubscribeToTask", json!({"id": "0123abcd"}));
    assert_eq!(error_code(&unknown), -32001);
}

#[test]
fn list_tasks_lists_this_agents_a2a_tasks_newest_first_with_filters_and_pages() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let context = "ctx-list-1";
    let with_context = |text: &str| {
        let message = json!({"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER", "parts": [{"text": text}], "contextId": context});
        v1(agent.port, "SendMessage", json!({"message": message}))["result"]["task"].clone()
    };
    let first = with_context("one");
    let second = with_context("please fail");
    let third = send_v1(agent.port, "need input", false);
    let all = v1(agent.port, "ListTasks", json!({}))["result"].clone();
    assert_eq!(all["totalSize"], 3);
    let ids: Vec<&Value> = all["tasks"].as_array().unwrap().iter().map(|t| &t["id"]).collect();
    assert_eq!(ids, [&third["id"], &second["id"], &first["id"]]);
    assert!(all["tasks"][0].get("artifacts").is_none(), "artifacts only with includeArtifacts");
    assert_eq!(all["nextPageToken"], "");

    let in_context =
        v1(agent.port, "ListTasks", json!({"contextId": context, "includeArtifacts": true}))["result"].clone();
    assert_eq!(in_context["totalSize"], 2);
    assert!(in_context["tasks"][1]["artifacts"].is_array());
    let failed = v1(agent.port, "ListTasks", json!({"status": "TASK_STATE_FAILED"}))["result"].clone();
    assert_eq!(failed["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(failed["tasks"][0]["id"], second["id"]);

    let page = v1(agent.port, "ListTasks", json!({"pageSize": 2}))["result"].clone();
    assert_eq!(page["tasks"].as_array().unwrap().len(), 2);
    let next =
        v1(agent.port, "ListTasks", json!({"pageSize": 2, "pageToken": page["nextPageToken"]}))["result"].clone();
    assert_eq!(next["tasks"][0]["id"], first["id"]);
    assert_eq!(next["nextPageToken"], "");
}

/// A page holds at most about 4 MiB of texts (at least one task), whatever `pageSize` says, and
/// goes on where it stopped: a page of 100 tasks of 16 MB messages was built whole in memory,
/// on the thread that serves every command.
#[test]
fn list_tasks_pages_hold_a_bounded_amount_of_text_and_go_on_where_they_stopped() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let long = |letter: &str| letter.repeat(3 << 20);
    let mut sent = Vec::new();
    for letter in ["a", "b", "c"] {
        let message = json!({"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER", "parts": [{"text": long(letter)}]});
        sent.push(v1(agent.port, "SendMessage", json!({"message": message}))["result"]["task"]["id"].clone());
    }
    let ids =
        |page: &Value| page["tasks"].as_array().unwrap().iter().map(|task| task["id"].clone()).collect::<Vec<_>>();
    let first = v1(agent.port, "ListTasks", json!({"pageSize": 100}))["result"].clone();
    assert_eq!(first["totalSize"], 3);
    assert_eq!(ids(&first), [sent[2].clone(), sent[1].clone()], "two tasks reach the bound");
    assert_eq!(first["nextPageToken"], "2");
    let rest =
        v1(agent.port, "ListTasks", json!({"pageSize": 100, "pageToken": first["nextPageToken"]}))["result"].clone();
    assert_eq!(ids(&rest), [sent[0].clone()]);
    assert_eq!(rest["nextPageToken"], "");
}

#[test]
fn json_rpc_errors_carry_the_a2a_and_json_rpc_codes() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let port = agent.port;
    // JSON-RPC layer.
    assert_eq!(error_code(&rpc_raw(port, Some("1.0"), b"{not json")), -32700);
    assert_eq!(error_code(&rpc_raw(port, Some("1.0"), b"[]")), -32600, "batches are refused");
    assert_eq!(error_code(&rpc_raw(port, Some("1.0"), br#"{"id":1,"method":"GetTask"}"#)), -32600);
    assert_eq!(error_code(&rpc_raw(port, Some("1.0"), br#"{"jsonrpc":"2.0","id":1,"method":5}"#)), -32600);
    assert_eq!(error_code(&v1(port, "NoSuchMethod", json!({}))), -32601);
    assert_eq!(error_code(&rpc(port, None, "SendMessage", json!({}))), -32601, "1.0 names need the 1.0 header");
    assert_eq!(error_code(&rpc(port, Some("1.0"), "message/send", json!({}))), -32601);
    assert_eq!(
        error_code(&rpc_raw(port, Some("1.0"), br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#)),
        -32602
    );
    // Invalid params.
    assert_eq!(error_code(&v1(port, "SendMessage", json!({}))), -32602, "no message");
    assert_eq!(error_code(&v1(port, "SendMessage", json!({"message": {"role": "ROLE_USER", "parts": []}}))), -32602);
    assert_eq!(error_code(&v1(port, "SendMessage", json!({"message": text_message("   ")}))), -32602, "empty text");
    assert_eq!(error_code(&v1(port, "GetTask", json!({}))), -32602, "no id");
    assert_eq!(error_code(&v1(port, "ListTasks", json!({"pageSize": 0}))), -32602);
    assert_eq!(error_code(&v1(port, "ListTasks", json!({"pageSize": 101}))), -32602);
    assert_eq!(error_code(&v1(port, "ListTasks", json!({"status": "TASK_STATE_NOPE"}))), -32602);
    assert_eq!(error_code(&v1(port, "ListTasks", json!({"pageToken": "x"}))), -32602);
    // A page past the end is empty, however far (the next token's sum overflowed).
    let far = v1(port, "ListTasks", json!({"pageToken": u64::MAX.to_string()}));
    assert_eq!(
        (far["result"]["tasks"].as_array().map(Vec::len), far["result"]["nextPageToken"].as_str()),
        (Some(0), Some("")),
        "{far}"
    );
    // A2A errors.
    let unknown = v1(port, "GetTask", json!({"id": "0123abcd"}));
    assert_eq!(error_code(&unknown), -32001);
    assert_eq!(unknown["error"]["data"][0]["metadata"], json!({"taskId": "0123abcd"}), "{unknown}");
    assert_eq!(error_code(&v1(port, "GetTask", json!({"id": "not a task id"}))), -32001);
    assert_eq!(error_code(&v1(port, "CancelTask", json!({"id": "0123abcd"}))), -32001);
    let file = json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"url": "file:///etc/passwd"}]}});
    assert_eq!(error_code(&v1(port, "SendMessage", file)), -32005);
    // A push config the URL rules refuse refuses the send (an unknown host here).
    let push = json!({"message": text_message("hi"),
                      "configuration": {"taskPushNotificationConfig": {"url": "http://no-such-host.invalid/"}}});
    assert_eq!(error_code(&v1(port, "SendMessage", push)), -32602);
    assert_eq!(error_code(&v1(port, "GetExtendedAgentCard", json!({}))), -32007);
    let done = send_v1(port, "hello", false);
    let follow_up =
        json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "more"}], "taskId": done["id"]}});
    let refused = v1(port, "SendMessage", follow_up);
    assert_eq!(error_code(&refused), -32004, "a completed task takes no further message: {refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("completed"), "{refused}");
    let unknown_task =
        json!({"message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "more"}], "taskId": "0123abcd"}});
    assert_eq!(error_code(&v1(port, "SendMessage", unknown_task)), -32001, "continuing an unknown task");
    let tasks_now = v1(port, "ListTasks", json!({}))["result"]["totalSize"].clone();
    assert_eq!(tasks_now, 1, "a refused follow-up makes no new task");
    for version in ["2.0", "0.2", "banana"] {
        let answer = rpc(port, Some(version), "GetTask", json!({"id": done["id"]}));
        assert_eq!(error_code(&answer), -32009, "{version}: {answer}");
        assert_eq!(answer["error"]["data"][0]["metadata"]["requestedVersion"], version);
        assert_eq!(answer["id"], "call-1");
    }
}

/// Issue 15: the spec's multi-turn flow. The scenario agent asks for input; the client's next
/// message names the task (no contextId: it is inferred); the task goes back to working, a
/// subscriber sees it, and the agent's answer to the follow-up completes it. The history holds
/// both messages with the client's ids and the agent's question between them.
#[test]
fn a_follow_up_with_the_task_id_continues_a_task_that_asks_for_input_in_v1_shapes() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let first = json!({"messageId": "turn-1", "role": "ROLE_USER", "parts": [{"text": "I need input"}]});
    let asking = v1(agent.port, "SendMessage", json!({"message": first}))["result"]["task"].clone();
    assert_eq!(asking["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{asking}");
    let question = asking["status"]["message"].clone();
    assert_eq!(asking["history"][0]["messageId"], "turn-1", "the client's messageId is kept: {asking}");

    let mut stream = rpc_stream(agent.port, "1.0", "SubscribeToTask", json!({"id": asking["id"]}));
    let snapshot = stream.next_event().unwrap().json();
    assert_eq!(snapshot["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{snapshot}");

    let follow_up = json!({
        "messageId": "turn-2", "role": "ROLE_USER", "parts": [{"text": "use the blue one"}], "taskId": asking["id"],
    });
    let answer = v1(agent.port, "SendMessage", json!({"message": follow_up.clone()}));
    let task = &answer["result"]["task"];
    assert_eq!(task["id"], asking["id"], "the same task: {answer}");
    assert_eq!(task["contextId"], asking["contextId"], "the context is inferred from the task");
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    assert_eq!(artifact_texts(task).last().unwrap(), "scenario agent: done: use the blue one");
    let history = task["history"].as_array().unwrap();
    let summary: Vec<(&str, &str, &str)> = history
        .iter()
        .map(|m| {
            (m["role"].as_str().unwrap(), m["messageId"].as_str().unwrap(), m["parts"][0]["text"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("ROLE_USER", "turn-1", "I need input"),
            ("ROLE_AGENT", question["messageId"].as_str().unwrap(), question["parts"][0]["text"].as_str().unwrap()),
            ("ROLE_USER", "turn-2", "use the blue one"),
        ],
        "{task}"
    );
    assert!(history.iter().all(|m| m["taskId"] == asking["id"] && m["contextId"] == asking["contextId"]));
    let newest = v1(agent.port, "GetTask", json!({"id": asking["id"], "historyLength": 1}));
    assert_eq!(newest["result"]["history"].as_array().unwrap().len(), 1);
    assert_eq!(newest["result"]["history"][0]["messageId"], "turn-2", "historyLength keeps the newest");

    // The subscriber saw the task go back to work, then complete; then its stream ended.
    let states: Vec<Value> = stream
        .rest()
        .iter()
        .filter_map(|e| e.json()["result"]["statusUpdate"]["status"]["state"].as_str().map(Value::from))
        .collect();
    assert_eq!(states, ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"], "{states:?}");

    // The follow-up sent again (same messageId) is the same message: the same task, nothing new.
    let again = v1(agent.port, "SendMessage", json!({"message": follow_up}));
    assert_eq!(again["result"]["task"]["id"], asking["id"], "{again}");
    assert_eq!(again["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{again}");
    let continued = home.events().iter().filter(|e| e["event"]["kind"] == "task_continued").count();
    assert_eq!(continued, 1, "one follow-up in the log");
    // The follow-up's words are searched like the first message's (both sides of the task).
    let found: Value = serde_json::from_str(&home.ok(&["history", "search", "blue", "--json"])).unwrap();
    let found = found.to_string();
    assert!(found.contains(asking["id"].as_str().unwrap()), "the follow-up is searchable: {found}");
    assert!(home.ok(&["history", "search", "turquoise"]).contains("No records."));
    // The legacy task view shows the follow-up too, after the first message.
    let (_, legacy) = home.http("GET", &format!("/tasks/{}", asking["id"].as_str().unwrap()), None, &[]);
    assert_eq!(legacy["task"]["message"]["parts"][0]["text"], "I need input", "{legacy}");
    assert_eq!(legacy["task"]["follow_ups"][0]["parts"][0]["text"], "use the blue one", "{legacy}");
    // A new follow-up to the completed task is refused, and makes no task.
    let late =
        json!({"messageId": "turn-3", "role": "ROLE_USER", "parts": [{"text": "and red?"}], "taskId": asking["id"]});
    assert_eq!(error_code(&v1(agent.port, "SendMessage", json!({"message": late}))), -32004);
    assert_eq!(v1(agent.port, "ListTasks", json!({}))["result"]["totalSize"], 1);

    // A follow-up naming another context is refused; the task still asks for input.
    let asking = send_v1(agent.port, "more input please", false);
    let other_context = json!({
        "messageId": "ctx-1", "role": "ROLE_USER", "parts": [{"text": "x"}], "taskId": asking["id"], "contextId": "not-the-tasks",
    });
    assert_eq!(error_code(&v1(agent.port, "SendMessage", json!({"message": other_context}))), -32602);
    let still = v1(agent.port, "GetTask", json!({"id": asking["id"]}));
    assert_eq!(still["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    // A follow-up that asks again gets another question: a third turn.
    let again = json!({"messageId": "ctx-2", "role": "ROLE_USER", "parts": [{"text": "what input?"}], "taskId": asking["id"], "contextId": asking["contextId"]});
    let asked_again = v1(agent.port, "SendMessage", json!({"message": again}))["result"]["task"].clone();
    assert_eq!(asked_again["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{asked_again}");
    assert_eq!(asked_again["history"].as_array().unwrap().len(), 3, "{asked_again}");

    // The log replays into the same projections.
    let output = home.cmd(&["admin", "verify"]).output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
}

#[test]
fn a_follow_up_continues_a_task_in_0_3_shapes_and_streams_its_updates() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let asking = json!({"kind": "message", "messageId": "legacy-1", "role": "user", "parts": [{"kind": "text", "text": "input?"}]});
    let asked = rpc(agent.port, None, "message/send", json!({"message": asking}))["result"].clone();
    assert_eq!(asked["status"]["state"], "input-required", "{asked}");
    let follow_up = json!({
        "kind": "message", "messageId": "legacy-2", "role": "user", "parts": [{"kind": "text", "text": "green"}],
        "taskId": asked["id"], "contextId": asked["contextId"],
    });
    let mut stream = rpc_stream(agent.port, "0.3", "message/stream", json!({"message": follow_up}));
    let results: Vec<Value> = stream.rest().iter().map(|event| event.json()["result"].clone()).collect();
    assert_eq!(results[0]["kind"], "task", "{results:#?}");
    assert_eq!(results[0]["id"], asked["id"]);
    assert_eq!(results[0]["status"]["state"], "working", "the follow-up took the task back to work");
    let last = results.last().unwrap();
    assert_eq!((last["kind"].as_str(), last["status"]["state"].as_str()), (Some("status-update"), Some("completed")));
    assert_eq!(last["final"], true);
    let got = rpc(agent.port, None, "tasks/get", json!({"id": asked["id"]}))["result"].clone();
    let roles: Vec<&str> = got["history"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "agent", "user"], "{got}");
    assert_eq!(got["history"][2]["messageId"], "legacy-2");
    assert_eq!(got["history"][2]["kind"], "message");
    assert_eq!(artifact_texts(&got).last().unwrap(), "scenario agent: done: green");
}

#[test]
fn without_an_a2a_version_header_the_0_3_methods_and_shapes_are_served() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let message = json!({"kind": "message", "messageId": uuid::Uuid::new_v4().to_string(), "role": "user", "parts": [{"kind": "text", "text": "hello"}]});
    let sent = rpc(agent.port, None, "message/send", json!({"message": message}));
    let task = &sent["result"];
    assert_eq!(task["kind"], "task", "{sent}");
    assert_eq!(task["status"]["state"], "completed");
    assert_eq!(task["artifacts"][0]["parts"][0], json!({"kind": "text", "text": "scenario agent: done: hello"}));
    assert_eq!(task["history"][0]["role"], "user");
    let got = rpc(agent.port, Some("0.3"), "tasks/get", json!({"id": task["id"]}));
    assert_eq!(got["result"]["status"]["state"], "completed");
    assert_eq!(error_code(&rpc(agent.port, None, "tasks/resubscribe", json!({"id": task["id"]}))), -32004);

    let asking = json!({"kind": "message", "messageId": uuid::Uuid::new_v4().to_string(), "role": "user", "parts": [{"kind": "text", "text": "input?"}]});
    let asked = rpc(agent.port, None, "message/send", json!({"message": asking}));
    assert_eq!(asked["result"]["status"]["state"], "input-required");

    let waiting = json!({"kind": "message", "messageId": uuid::Uuid::new_v4().to_string(), "role": "user", "parts": [{"kind": "text", "text": "wait"}]});
    let sent = rpc(agent.port, None, "message/send", json!({"message": waiting, "configuration": {"blocking": false}}));
    assert_eq!(sent["result"]["status"]["state"], "working");
    let canceled = rpc(agent.port, None, "tasks/cancel", json!({"id": sent["result"]["id"]}));
    assert_eq!(canceled["result"]["status"]["state"], "canceled");

    let streamed = json!({"kind": "message", "messageId": uuid::Uuid::new_v4().to_string(), "role": "user", "parts": [{"kind": "text", "text": "stream"}]});
    let mut stream = rpc_stream(agent.port, "0.3", "message/stream", json!({"message": streamed}));
    let results: Vec<Value> = stream.rest().iter().map(|event| event.json()["result"].clone()).collect();
    assert_eq!(results[0]["kind"], "task");
    assert_eq!(results.iter().filter(|r| r["kind"] == "artifact-update").count(), 4);
    let last = results.last().unwrap();
    assert_eq!(last["kind"], "status-update");
    assert_eq!(last["status"]["state"], "completed");
    assert_eq!(last["final"], true);
}

#[test]
fn an_a2a_message_is_written_into_a_dummy_agents_pty_and_its_reply_completes_the_task() {
    let home = Home::new();
    let output =
        home.cmd(&["start", "dummy", "--name", "bob", "--json"]).env("SYNAPSE_DUMMY_AUTO_REPLY", "1").output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let bob: Value = serde_json::from_slice(&output.stdout).unwrap();
    let bob_id = bob["agent_id"].as_str().unwrap().to_string();
    struct Stop<'a>(&'a Home, String);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.cmd(&["stop", &self.1]).output();
        }
    }
    let _stop = Stop(&home, bob_id.clone());
    let port = u16::try_from(bob["port"].as_u64().unwrap()).unwrap();
    let task = send_v1(port, "what is 6 x 7?", false);
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let id8 = &task["id"].as_str().unwrap()[..8];
    assert_eq!(artifact_texts(&task), [format!("[DUMMY] Auto-reply to {id8}: what is 6 x 7?")]);
    // The wrapper's reader thread logs the terminal's output on its own: the reply can reach the
    // broker before the echo of the message reaches the log file.
    let expected = format!("[A2A:{id8}:anonymous:R] what is 6 x 7?");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut screen = String::new();
    while std::time::Instant::now() < deadline {
        screen = std::fs::read_to_string(bob["log"].as_str().unwrap()).unwrap();
        if screen.contains(&expected) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(screen.contains(&expected), "{screen}");
}

// ---- GET /tasks/{id}/subscribe (SSE, issue 6) ----

fn subscribe(port: u16, task_id: &str, last_event_id: Option<u64>) -> Stream {
    let resume = last_event_id.map(|seq| seq.to_string());
    let headers: Vec<(&str, &str)> = resume.as_deref().map(|seq| vec![("Last-Event-ID", seq)]).unwrap_or_default();
    Stream::open(port, "GET", &format!("/tasks/{task_id}/subscribe"), None, &headers)
}

#[test]
fn task_subscribe_replays_status_and_artifacts_with_log_sequence_ids_and_ends_after_the_final_state() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let task = send_v1(agent.port, "stream please", false);
    let task_id = task["id"].as_str().unwrap();
    let mut stream = subscribe(agent.port, task_id, None);
    assert_eq!(stream.status, 200);
    let events = stream.rest();
    let states: Vec<String> = events.iter().map(|e| e.json()["state"].as_str().unwrap().to_string()).collect();
    assert_eq!(states, ["working", "working", "working", "working", "completed"], "{events:#?}");
    assert_eq!(events.last().unwrap().event.as_deref(), Some("final"));
    assert_eq!(events.last().unwrap().json()["final"], true);
    let chunks: Vec<Value> = events.iter().flat_map(|e| e.json()["artifacts"].as_array().unwrap().clone()).collect();
    assert_eq!(chunks.len(), 4);
    // Each id is the sequence number of the event in the log.
    let log = home.events();
    for event in &events {
        let seq: u64 = event.id.as_ref().unwrap().parse().unwrap();
        let logged = log.iter().find(|e| e["seq"] == seq).unwrap();
        assert_eq!(logged["event"]["data"]["task_id"], task_id, "{logged}");
        assert_eq!(event.json()["seq"], seq);
    }
    // The broker path serves the same stream.
    let (status, _) = home.http("GET", &format!("/agents/{}/tasks/{task_id}/subscribe", agent.id), None, &[]);
    assert_eq!(status, 200);
}

#[test]
fn task_subscribe_resumes_after_a_dropped_connection_from_last_event_id_without_gaps_or_repeats() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let task = send_v1(agent.port, "wait until canceled", true);
    let task_id = task["id"].as_str().unwrap().to_string();
    let mut stream = subscribe(agent.port, &task_id, None);
    let first = stream.next_event().unwrap();
    assert_eq!(first.json()["state"], "working");
    let seen: u64 = first.id.unwrap().parse().unwrap();
    drop(stream); // the connection drops
    // A resume from past the head (a client's bad cursor) sees what comes next: it waited for
    // events past that number, never came to the task's end and outlived the agent.
    let mut from_the_future = subscribe(agent.port, &task_id, Some(u64::MAX));
    assert_eq!(from_the_future.status, 200);

    // While no one listens, the task changes and ends.
    let canceled = v1(agent.port, "CancelTask", json!({"id": task_id}));
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");
    let ended = from_the_future.rest();
    assert_eq!(ended.last().map(|event| event.json()["state"].clone()), Some(json!("canceled")), "{ended:#?}");

    let mut resumed = subscribe(agent.port, &task_id, Some(seen));
    let rest = resumed.rest();
    let seqs: Vec<u64> = rest.iter().map(|e| e.id.as_ref().unwrap().parse().unwrap()).collect();
    assert!(seqs.iter().all(|seq| *seq > seen), "no repeat: {seqs:?} after {seen}");
    let expected: Vec<u64> = home
        .events()
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap() > seen)
        .filter(|e| e["event"]["data"]["task_id"] == task_id.as_str())
        .filter(|e| matches!(e["event"]["kind"].as_str(), Some("task_state_changed" | "task_canceled")))
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, expected, "no gap");
    assert_eq!(rest.last().unwrap().json()["state"], "canceled");

    // Resuming after the final event gives an empty stream that ends at once.
    let last = *seqs.last().unwrap();
    assert!(subscribe(agent.port, &task_id, Some(last)).rest().is_empty());
}

#[test]
fn task_subscribe_of_an_unknown_task_or_a_bad_last_event_id_is_refused_before_streaming() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let unknown = subscribe(agent.port, "0123abcd", None);
    assert_eq!(unknown.status, 404);
    assert!(unknown.body_json()["message"].as_str().unwrap().contains("not found"));
    let task = send_v1(agent.port, "hello", false);
    let bad = Stream::open(
        agent.port,
        "GET",
        &format!("/tasks/{}/subscribe", task["id"].as_str().unwrap()),
        None,
        &[("Last-Event-ID", "yesterday")],
    );
    assert_eq!(bad.status, 400);
    let (status, _) = http_tcp(agent.port, "GET", "/tasks/not-hex!/subscribe", None, &[]);
    assert_eq!(status, 400);
}

#[test]
fn open_task_streams_end_promptly_when_the_broker_stops() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let task = send_v1(agent.port, "wait forever", true);
    let task_id = task["id"].as_str().unwrap();
    let mut sse = subscribe(agent.port, task_id, None);
    assert!(sse.next_event().is_some());
    let mut rpc_sse = rpc_stream(agent.port, "1.0", "SubscribeToTask", json!({"id": task_id}));
    assert!(rpc_sse.next_event().is_some());
    let started = std::time::Instant::now();
    home.ok(&["broker", "stop"]);
    assert!(sse.rest().is_empty(), "no more events, and the stream ended");
    assert!(rpc_sse.rest().is_empty());
    assert!(started.elapsed() < Duration::from_secs(10), "streams ended in {:?}", started.elapsed());
}

#[test]
fn five_hundred_concurrent_task_subscribers_each_see_every_change_once() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let task = send_v1(agent.port, "wait for the crowd", true);
    let task_id = task["id"].as_str().unwrap().to_string();
    // Every subscriber is connected and has caught up (its first event) before the change.
    let mut streams: Vec<Stream> = (0..500).map(|_| subscribe(agent.port, &task_id, None)).collect();
    let firsts: Vec<String> = streams.iter_mut().map(|stream| stream.next_event().unwrap().id.unwrap()).collect();
    assert!(firsts.iter().all(|id| *id == firsts[0]));
    let canceled = v1(agent.port, "CancelTask", json!({"id": task_id}));
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");
    for (index, stream) in streams.iter_mut().enumerate() {
        let rest = stream.rest();
        assert_eq!(rest.len(), 1, "subscriber {index}: {rest:?}");
        assert_eq!(rest[0].json()["state"], "canceled");
    }
}

#[test]
fn streams_and_blocking_sends_on_an_agents_port_end_when_the_agent_goes() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let task = send_v1(agent.port, "wait a moment", true);
    let task_id = task["id"].as_str().unwrap().to_string();
    let mut sse = subscribe(agent.port, &task_id, None);
    assert!(sse.next_event().is_some());
    let mut rpc_sse = rpc_stream(agent.port, "1.0", "SubscribeToTask", json!({"id": task_id}));
    assert!(rpc_sse.next_event().is_some());
    let port = agent.port;
    let blocked = std::thread::spawn(move || send_v1(port, "wait with me", false));
    // The blocking send is in: its task exists before the agent goes.
    let mut events = Stream::open(broker_port(&home), "GET", "/events?follow=true&kind=task_created", None, &[]);
    while !events.next_event().is_some_and(|event| event.data.contains("wait with me")) {}
    drop(agent); // SIGTERM: the scenario agent deregisters
    assert!(sse.rest().is_empty(), "the SSE stream ended");
    assert!(rpc_sse.rest().is_empty(), "the JSON-RPC stream ended");
    let answered = blocked.join().unwrap();
    assert_eq!(answered["status"]["state"], "TASK_STATE_WORKING", "the blocking send returned: {answered}");
}

#[test]
fn only_the_receiving_agent_with_its_secret_moves_its_task_and_the_senders_task_follows() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let eve = home.register(Some("eve"));
    let body = json!({"to": "bob", "text": "hi", "response_expected": true}).to_string();
    let (status, sent) = home.http("POST", "/send", Some(body.as_bytes()), &[]);
    assert_eq!(status, 200, "{sent}");
    let task_id = sent["task"]["id"].as_str().unwrap().to_string();
    let sender_task_id = sent["sender_task"]["id"].as_str().unwrap().to_string();
    let update = |agent: &Agent, secret: Option<&str>, body: Value| {
        let headers: Vec<(&str, &str)> = secret.map(|s| vec![("x-synapse-agent-secret", s)]).unwrap_or_default();
        let path = format!("/agents/{}/tasks/{task_id}/update", agent.id);
        home.http("POST", &path, Some(body.to_string().as_bytes()), &headers)
    };
    let half = json!({"state": "working", "artifacts": [{"parts": [{"type": "text", "text": "half"}]}]});
    assert_eq!(update(&bob, None, half.clone()).0, 403, "no secret");
    assert_eq!(update(&bob, Some(&eve.secret), half.clone()).0, 403, "someone else's secret");
    assert_eq!(update(&eve, Some(&eve.secret), half.clone()).0, 403, "not eve's task");
    assert_eq!(update(&bob, Some(&bob.secret), json!({"state": "submitted"})).0, 400);
    assert_eq!(update(&bob, Some(&bob.secret), json!({"state": "canceled"})).0, 400);
    assert_eq!(update(&bob, Some(&bob.secret), json!({"state": "bogus"})).0, 400);
    let (status, moved) = update(&bob, Some(&bob.secret), half);
    assert_eq!(status, 200, "{moved}");
    let (_, sender_task) = home.http("GET", &format!("/tasks/{sender_task_id}"), None, &[]);
    assert_eq!(sender_task["task"]["status"], "working");
    assert_eq!(sender_task["task"]["artifacts"][0]["parts"][0]["text"], "half");
    let done = json!({"state": "completed", "artifacts": [{"parts": [{"type": "text", "text": "all"}]}]});
    assert_eq!(update(&bob, Some(&bob.secret), done.clone()).0, 200);
    let (_, sender_task) = home.http("GET", &format!("/tasks/{sender_task_id}"), None, &[]);
    assert_eq!(sender_task["task"]["status"], "completed");
    assert_eq!(sender_task["task"]["artifacts"].as_array().unwrap().len(), 2);
    assert_eq!(update(&bob, Some(&bob.secret), done).0, 409, "a final task never changes again");
}

#[test]
fn the_broker_path_accepts_the_agents_name_as_well_as_its_id() {
    let home = Home::new();
    let mut child = home.cmd(&["scenario-agent", "--name", "scen"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _agent = Scenario { child, id: String::new(), port: 0 };
    let call = |method: &str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        home.http("POST", "/agents/scen/", Some(body.as_bytes()), &[("A2A-Version", "1.0")]).1
    };
    let sent = call("SendMessage", json!({"message": text_message("by name")}));
    assert_eq!(sent["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    let got = call("GetTask", json!({"id": sent["result"]["task"]["id"]}));
    assert_eq!(artifact_texts(&got["result"]), ["scenario agent: done: by name"]);
}

/// Issue 15: `synapse start scenario` starts the scripted A2A agent in the background like any
/// profile (it answers A2A at once), `synapse stop` stops it, and what it cannot take is refused.
#[test]
fn synapse_start_scenario_runs_the_scenario_agent_like_a_profile() {
    let home = Home::new();
    let output = home.cmd(&["start", "scenario", "--name", "scen", "--json"]).output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let started: Value = serde_json::from_slice(&output.stdout).unwrap();
    let port = u16::try_from(started["port"].as_u64().unwrap()).unwrap();
    let task = send_v1(port, "hello", false);
    assert_eq!(artifact_texts(&task), ["scenario agent: done: hello"]);
    let stopped = home.cmd(&["stop", "scen"]).output().unwrap();
    assert!(stopped.status.success(), "{}", describe(&stopped));
    wait_until_dead(u32::try_from(started["pid"].as_u64().unwrap()).unwrap());
    let refused = home.cmd(&["start", "scenario", "--role", "x"]).output().unwrap();
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("takes only --port and --name"), "{}", describe(&refused));
}

/// `method path` on `port` with a JSON body and the 1.0 header: (status, body as JSON).
fn rest(port: u16, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|body| body.to_string());
    http_tcp(port, method, path, body.as_deref().map(str::as_bytes), &[("A2A-Version", "1.0")])
}

/// An HTTP+JSON error: its HTTP status, `google.rpc.Status` name and ErrorInfo reason.
fn rest_error(answer: &(u16, Value)) -> (u16, String, String) {
    let (status, body) = answer;
    assert_eq!(body["error"]["code"].as_u64(), Some(u64::from(*status)), "{body}");
    assert_eq!(body["error"]["details"][0]["domain"], "a2a-protocol.org", "{body}");
    (
        *status,
        body["error"]["status"].as_str().unwrap_or_default().to_string(),
        body["error"]["details"][0]["reason"].as_str().unwrap_or_default().to_string(),
    )
}

/// Issue 15: the HTTP+JSON binding of A2A 1.0 under `/v1` (the card names it), with the same
/// behaviour as JSON-RPC and errors as `google.rpc.Status`.
#[test]
fn the_http_json_binding_serves_the_same_methods_under_v1() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let port = agent.port;
    let (_, card) = http_tcp(port, "GET", "/.well-known/agent-card.json", None, &[]);
    let interface =
        card["supportedInterfaces"].as_array().unwrap().iter().find(|i| i["protocolBinding"] == "HTTP+JSON");
    assert_eq!(interface.unwrap()["url"], format!("http://127.0.0.1:{port}/v1"), "{card}");

    let (status, sent) = rest(port, "POST", "/v1/message:send", Some(json!({"message": text_message("hello")})));
    assert_eq!(status, 200, "{sent}");
    let task = &sent["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert_eq!(artifact_texts(task), ["scenario agent: done: hello"]);
    let id = task["id"].as_str().unwrap();

    let (status, got) = rest(port, "GET", &format!("/v1/tasks/{id}?historyLength=0"), None);
    assert_eq!((status, got["id"].as_str()), (200, Some(id)), "{got}");
    assert!(got.get("history").is_none());
    rest(port, "POST", "/v1/message:send", Some(json!({"message": text_message("again")})));
    let (status, page) = rest(port, "GET", "/v1/tasks?pageSize=1", None);
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(page["totalSize"], 2);

    // The same errors as JSON-RPC, in this binding's shape and statuses.
    let unknown = rest(port, "GET", "/v1/tasks/0123abcd", None);
    assert_eq!(rest_error(&unknown), (404, "NOT_FOUND".into(), "TASK_NOT_FOUND".into()));
    let done = rest(port, "POST", &format!("/v1/tasks/{id}:cancel"), Some(json!({})));
    assert_eq!(rest_error(&done), (409, "FAILED_PRECONDITION".into(), "TASK_NOT_CANCELABLE".into()));
    let bad = rest(port, "GET", "/v1/tasks?pageSize=0", None);
    assert_eq!(rest_error(&bad), (400, "INVALID_ARGUMENT".into(), "INVALID_PARAMS".into()));
    let empty = rest(port, "POST", "/v1/message:send", Some(json!({"message": text_message("  ")})));
    assert_eq!(rest_error(&empty).0, 400);
    let (status, push) = rest(port, "GET", &format!("/v1/tasks/{id}/pushNotificationConfigs"), None);
    assert_eq!((status, push["configs"].as_array().map(Vec::len)), (200, Some(0)), "{push}");
    let nowhere = rest(port, "GET", "/v1/nowhere", None);
    assert_eq!(rest_error(&nowhere).0, 404);
    let (status, old) = http_tcp(port, "GET", "/v1/tasks", None, &[("A2A-Version", "0.3")]);
    assert_eq!((status, old["error"]["details"][0]["reason"].as_str()), (400, Some("VERSION_NOT_SUPPORTED")), "{old}");

    // A stream: the task, then its updates, each a bare StreamResponse.
    let body = json!({"message": text_message("stream please")}).to_string();
    let mut stream = Stream::open(port, "POST", "/v1/message:stream", Some(&body), &[("A2A-Version", "1.0")]);
    assert_eq!(stream.status, 200);
    let results: Vec<Value> = stream.rest().iter().map(|event| event.json()).collect();
    assert_eq!(results[0]["task"]["status"]["state"], "TASK_STATE_WORKING", "{results:#?}");
    assert!(results[0].get("jsonrpc").is_none(), "no JSON-RPC envelope");
    assert_eq!(results.last().unwrap()["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED");

    // The broker serves the same binding under /agents/{agent}/v1.
    let (status, via_broker) =
        home.http("GET", &format!("/agents/{}/v1/tasks/{id}", agent.id), None, &[("A2A-Version", "1.0")]);
    assert_eq!((status, via_broker["id"].as_str()), (200, Some(id)), "{via_broker}");
}

// ---- push notifications (issue 15) ----

/// Issue 15: push notification configs in both bindings (create, get, list, delete), and a
/// task's change posted to the config's URL with the client's token and credentials, which
/// are never answered back nor written into the log.
#[test]
fn push_notification_configs_are_kept_and_a_change_is_posted_with_the_clients_token() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let port = agent.port;
    let (_, card) = http_tcp(port, "GET", "/.well-known/agent-card.json", None, &[]);
    assert_eq!(card["capabilities"]["pushNotifications"], true, "{card}");
    let (receiver_port, received) = receiver(std::sync::Arc::new(std::sync::atomic::AtomicU16::new(200)));
    let url = format!("http://127.0.0.1:{receiver_port}/notify");
    let task = send_v1(port, "wait here", true);
    let id = task["id"].as_str().unwrap().to_string();

    let created = v1(
        port,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "cfg-1", "url": url, "token": "tok-123",
               "authentication": {"scheme": "Bearer", "credentials": "cred-xyz"}}),
    );
    let config = &created["result"];
    assert_eq!((config["id"].as_str(), config["taskId"].as_str()), (Some("cfg-1"), Some(id.as_str())), "{created}");
    assert_eq!(config["authentication"]["scheme"], "Bearer");
    assert!(!created.to_string().contains("tok-123") && !created.to_string().contains("cred-xyz"), "{created}");
    let got = v1(port, "GetTaskPushNotificationConfig", json!({"taskId": id, "id": "cfg-1"}));
    assert_eq!(got["result"]["url"], url.as_str(), "{got}");
    // The HTTP+JSON binding sees and changes the same configs.
    let (status, second) = rest(
        port,
        "POST",
        &format!("/v1/tasks/{id}/pushNotificationConfigs"),
        Some(json!({"id": "cfg-2", "url": url, "token": "tok-2"})),
    );
    assert_eq!((status, second["id"].as_str()), (200, Some("cfg-2")), "{second}");
    let (_, listed) = rest(port, "GET", &format!("/v1/tasks/{id}/pushNotificationConfigs"), None);
    assert_eq!(listed["configs"].as_array().map(Vec::len), Some(2), "{listed}");
    for _ in 0..2 {
        // Deleting is idempotent.
        let (status, deleted) = rest(port, "DELETE", &format!("/v1/tasks/{id}/pushNotificationConfigs/cfg-2"), None);
        assert_eq!((status, deleted), (200, json!({})));
    }
    let listed = v1(port, "ListTaskPushNotificationConfigs", json!({"taskId": id}));
    let ids: Vec<&str> =
        listed["result"]["configs"].as_array().unwrap().iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids, ["cfg-1"], "{listed}");
    // A2A 0.3 names and shapes: the same configs.
    let set = rpc(
        port,
        None,
        "tasks/pushNotificationConfig/set",
        json!({"taskId": id, "pushNotificationConfig": {"id": "old-1", "url": url, "authentication": {"schemes": ["Bearer"], "credentials": "c"}}}),
    );
    assert_eq!(set["result"]["pushNotificationConfig"]["authentication"]["schemes"], json!(["Bearer"]), "{set}");
    let old =
        rpc(port, None, "tasks/pushNotificationConfig/get", json!({"id": id, "pushNotificationConfigId": "old-1"}));
    assert_eq!(old["result"]["pushNotificationConfig"]["url"], url.as_str(), "{old}");
    let removed =
        rpc(port, None, "tasks/pushNotificationConfig/delete", json!({"id": id, "pushNotificationConfigId": "old-1"}));
    assert!(removed.get("error").is_none(), "{removed}");
    let listed = rpc(port, None, "tasks/pushNotificationConfig/list", json!({"id": id}));
    assert_eq!(listed["result"].as_array().map(Vec::len), Some(1), "{listed}");
    let (status, gone) = rest(port, "GET", &format!("/v1/tasks/{id}/pushNotificationConfigs/cfg-2"), None);
    assert_eq!(rest_error(&(status, gone)).2, "TASK_NOT_FOUND");

    // Bad configs are refused with the spec's errors; nothing is kept.
    let unknown_task = v1(port, "CreateTaskPushNotificationConfig", json!({"taskId": "0123abcd", "url": url}));
    assert_eq!(error_code(&unknown_task), -32001);
    for bad in [
        json!({"taskId": id, "url": "ftp://example.test/"}),
        json!({"taskId": id, "url": url, "token": "tok\r\nX-Injected: 1"}),
        json!({"taskId": id, "url": url, "authentication": {"credentials": "no scheme"}}),
        json!({"taskId": id, "url": url, "id": "../../etc"}),
        json!({"taskId": id}),
    ] {
        assert_eq!(error_code(&v1(port, "CreateTaskPushNotificationConfig", bad.clone())), -32602, "{bad}");
    }
    let missing = v1(port, "GetTaskPushNotificationConfig", json!({"taskId": id, "id": "nope"}));
    assert_eq!(error_code(&missing), -32001);

    // The task changes: its config's URL gets the new status, with the client's token and
    // credentials.
    let canceled = v1(port, "CancelTask", json!({"id": id}));
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED", "{canceled}");
    let notification = loop {
        let request = received.recv_timeout(READ_DEADLINE).expect("a push notification");
        if request.json()["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED" {
            break request;
        }
    };
    let update = &notification.json()["statusUpdate"];
    assert_eq!(update["taskId"], id.as_str());
    assert_eq!(update["contextId"], task["contextId"]);
    assert_eq!(notification.header("x-a2a-notification-token"), Some("tok-123"));
    assert_eq!(notification.header("authorization"), Some("Bearer cred-xyz"));
    // The deleted config got no delivery of it.
    let (_, deliveries) = home.http("GET", "/webhooks/deliveries", None, &[]);
    let owners: Vec<&str> =
        deliveries["deliveries"].as_array().unwrap().iter().filter_map(|d| d["webhook_id"].as_str()).collect();
    assert!(owners.iter().all(|owner| !owner.ends_with(":cfg-2")), "{deliveries}");
    assert!(owners.iter().any(|owner| owner.ends_with(":cfg-1")), "{deliveries}");
    // The log knows the configs, not their secrets.
    let events = home.ok(&["events", "--json"]);
    assert!(events.contains("push_config_set"), "{events}");
    assert!(!events.contains("tok-123") && !events.contains("cred-xyz") && !events.contains("tok-2"), "{events}");
    // The task is over and its notification delivered: its secret files go, as did those of
    // the deleted configs, while the config itself stays listed.
    let secrets = home.home().join("webhook-secrets");
    wait_until_no_secret_files(&secrets);
    let listed = v1(port, "ListTaskPushNotificationConfigs", json!({"taskId": id}));
    assert_eq!(listed["result"]["configs"][0]["id"], "cfg-1", "{listed}");
    // A config set on the task that ended gets no notification: it is listed, and its token's
    // file goes at once (it would stay for good otherwise).
    let late = v1(
        port,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "late", "url": url, "token": "tok-late"}),
    );
    assert!(late.get("error").is_none(), "{late}");
    let events = home.ok(&["events", "--json"]);
    assert!(events.contains("\"task_ended\":true"), "{events}");
    wait_until_no_secret_files(&secrets);
    let listed = v1(port, "ListTaskPushNotificationConfigs", json!({"taskId": id}));
    assert_eq!(listed["result"]["configs"].as_array().map(Vec::len), Some(2), "{listed}");
}

/// Waits until `secrets` holds no file (the broker deletes a retired secret file when no
/// pending delivery names it).
fn wait_until_no_secret_files(secrets: &std::path::Path) {
    let deadline = std::time::Instant::now() + READ_DEADLINE;
    loop {
        let left: Vec<String> = std::fs::read_dir(secrets)
            .map(|dir| dir.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "secret files left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 15: a config given with the message (`configuration.taskPushNotificationConfig`)
/// gets the task's changes; a delivery the receiver refuses (503) is retried, and after a
/// broker restart the outbox, rebuilt from the log, delivers it.
#[test]
fn a_push_notification_set_with_the_message_is_retried_across_a_broker_restart() {
    let home = Home::new();
    let started = home.cmd(&["broker", "start"]).env("SYNAPSE_WEBHOOK_RETRY_BASE_MS", "20").output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let agent = Scenario::start(&home);
    let answer = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(503));
    let (receiver_port, received) = receiver(answer.clone());
    let url = format!("http://127.0.0.1:{receiver_port}/notify");
    let sent = v1(
        agent.port,
        "SendMessage",
        json!({"message": text_message("I need input"),
               "configuration": {"taskPushNotificationConfig": {"url": url, "token": "tok-msg"}}}),
    );
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{sent}");
    let id = task["id"].as_str().unwrap();
    let listed = v1(agent.port, "ListTaskPushNotificationConfigs", json!({"taskId": id}));
    assert_eq!(listed["result"]["configs"].as_array().map(Vec::len), Some(1), "{listed}");
    let mut follow_up = text_message("use the blue one");
    follow_up["taskId"] = json!(id);
    let done = v1(agent.port, "SendMessage", json!({"message": follow_up}));
    assert_eq!(done["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    // Refused: the outbox retries.
    let refused = received.recv_timeout(READ_DEADLINE).expect("a first attempt");
    assert_eq!((refused.answered, refused.header("x-a2a-notification-token")), (503, Some("tok-msg")));

    let stopped = home.cmd(&["broker", "stop"]).output().unwrap();
    assert!(stopped.status.success(), "{}", describe(&stopped));
    answer.store(200, std::sync::atomic::Ordering::SeqCst);
    let restarted = home.cmd(&["broker", "start"]).env("SYNAPSE_WEBHOOK_RETRY_BASE_MS", "20").output().unwrap();
    assert!(restarted.status.success(), "{}", describe(&restarted));
    let completed = loop {
        let request = received.recv_timeout(READ_DEADLINE).expect("the completion, delivered after the restart");
        if request.answered == 200 && request.json()["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED" {
            break request;
        }
    };
    assert_eq!(completed.json()["statusUpdate"]["taskId"], id);
}

/// CPU seconds (user + system) a process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    #[allow(unsafe_code)]
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / per_second as f64
}

/// A scenario agent the broker no longer knows (deregistered by hand, or a broker that started
/// again on a fresh home) says so once and retries with a growing pause. It retried at once and
/// spun (half a core, in a test that left one running); SIGTERM still ends it.
#[test]
fn a_scenario_agent_the_broker_forgot_says_so_once_and_does_not_spin() {
    let home = Home::new();
    let log = home.home().join("scenario.err");
    let mut child = home
        .cmd(&["scenario-agent"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let announce: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("no registration: {line:?}"));
    let id = announce["agent_id"].as_str().unwrap();
    let secret = announce["secret"].as_str().unwrap();
    let (status, answer) = home.http("DELETE", &format!("/agents/{id}"), None, &[("X-Synapse-Agent-Secret", secret)]);
    assert_eq!(status, 200, "{answer}");
    let warning = "the broker no longer knows agent";
    let deadline = std::time::Instant::now() + READ_DEADLINE;
    while !std::fs::read_to_string(&log).unwrap_or_default().contains(warning) {
        assert!(std::time::Instant::now() < deadline, "no warning: {}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Watched for a second: a busy loop of status reports used a quarter to a half of a core
    // here, even with both cores loaded; pausing between them uses a few milliseconds.
    let before = cpu_seconds(child.id());
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_seconds(child.id()) - before;
    assert!(used < 0.1, "the agent used {used:.2} s of CPU in 1 s while forgotten");
    kill(child.id(), libc::SIGTERM);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches(warning).count(), 1, "said once:\n{text}");
}

/// A message the user sent from the shell is the user's to cancel (and the receiver's): an
/// anonymous A2A client that finds it in the agent's task list may not. It could (the mark
/// that the user sent it is on the receiver's task, not on the task A2A lists); the refusal
/// is "not cancelable" in JSON-RPC and 403 over HTTP+JSON (not 409: the task's state allows a
/// cancel), never an internal error (the HTTP+JSON binding answered 500), and names the user
/// as the sender.
#[test]
fn an_anonymous_a2a_client_cannot_cancel_a_message_the_user_sent() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let sent: Value =
        serde_json::from_str(&home.ok(&["send", &agent.id, "wait for me", "--response", "--json"])).unwrap();
    let task_id = sent["sender_task"]["id"].as_str().unwrap().to_string();
    let listed = v1(agent.port, "ListTasks", json!({}));
    let ids: Vec<&str> =
        listed["result"]["tasks"].as_array().unwrap().iter().map(|task| task["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&task_id.as_str()), "{listed}");
    let refused = v1(agent.port, "CancelTask", json!({"id": task_id}));
    assert_eq!(error_code(&refused), -32002, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("its sender (the user)"), "{refused}");
    let over_rest = rest(agent.port, "POST", &format!("/v1/tasks/{task_id}:cancel"), Some(json!({})));
    assert_eq!(rest_error(&over_rest), (403, "PERMISSION_DENIED".into(), "TASK_NOT_CANCELABLE".into()));
    let task = v1(agent.port, "GetTask", json!({"id": task_id}));
    assert_eq!(task["result"]["status"]["state"], "TASK_STATE_WORKING", "{task}");
    // The user still may.
    home.ok(&["cancel", &task_id]);
}

/// Where a task's changes are pushed is the business of those who may cancel it: an anonymous
/// client that finds the user's message in the agent's task list may not add, read or delete
/// its push notification configs (it could redirect the reply to any host, or remove the
/// user's); the user may. A client's own task stays its own to configure (the test above).
#[test]
fn push_notification_configs_of_the_users_message_are_refused_to_an_anonymous_client() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let (receiver_port, _received) = receiver(std::sync::Arc::new(std::sync::atomic::AtomicU16::new(200)));
    let url = format!("http://127.0.0.1:{receiver_port}/notify");
    let sent: Value =
        serde_json::from_str(&home.ok(&["send", &agent.id, "wait for me", "--response", "--json"])).unwrap();
    let task_id = sent["sender_task"]["id"].as_str().unwrap().to_string();
    let config = json!({"taskId": task_id, "url": url, "id": "mine", "token": "t"});
    let refused = v1(agent.port, "CreateTaskPushNotificationConfig", config.clone());
    assert_eq!(error_code(&refused), -32602, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("its sender (the user)"), "{refused}");
    let path = format!("/v1/tasks/{task_id}/pushNotificationConfigs");
    let over_rest = rest(agent.port, "POST", &path, Some(json!({"url": url, "id": "mine"})));
    assert_eq!(rest_error(&over_rest).0, 403, "{over_rest:?}");
    // The user sets one, over the broker's socket.
    let call = |method: &str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        let (status, answer) =
            home.http("POST", &format!("/agents/{}/", agent.id), Some(body.as_bytes()), &[("A2A-Version", "1.0")]);
        assert_eq!(status, 200, "{answer}");
        answer
    };
    let created = call("CreateTaskPushNotificationConfig", config);
    assert!(created.get("error").is_none(), "{created}");
    // The anonymous client can neither list nor delete it.
    let listed = v1(agent.port, "ListTaskPushNotificationConfigs", json!({"taskId": task_id}));
    assert_eq!(error_code(&listed), -32602, "{listed}");
    assert_eq!(rest_error(&rest(agent.port, "GET", &path, None)).0, 403);
    let deleted = v1(agent.port, "DeleteTaskPushNotificationConfig", json!({"taskId": task_id, "id": "mine"}));
    assert_eq!(error_code(&deleted), -32602, "{deleted}");
    assert_eq!(rest_error(&rest(agent.port, "DELETE", &format!("{path}/mine"), None)).0, 403);
    let kept = call("ListTaskPushNotificationConfigs", json!({"taskId": task_id}));
    assert_eq!(kept["result"]["configs"].as_array().map(Vec::len), Some(1), "{kept}");
    home.ok(&["cancel", &task_id]);
}

/// A task takes at most ten push notification configs (each is one more POST at every change
/// of the task; any client could add thousands): an eleventh is refused, replacing one of the
/// ten is not, and deleting one makes room.
#[test]
fn a_task_takes_at_most_ten_push_notification_configs() {
    let home = Home::new();
    let agent = Scenario::start(&home);
    let (receiver_port, _received) = receiver(std::sync::Arc::new(std::sync::atomic::AtomicU16::new(200)));
    let url = format!("http://127.0.0.1:{receiver_port}/notify");
    let task = send_v1(agent.port, "wait here", true);
    let id = task["id"].as_str().unwrap().to_string();
    let create = |config: Value| v1(agent.port, "CreateTaskPushNotificationConfig", config);
    for n in 0..10 {
        let created = create(json!({"taskId": id, "url": url, "id": format!("c{n}"), "token": "t"}));
        assert!(created.get("error").is_none(), "{created}");
    }
    let eleventh = create(json!({"taskId": id, "url": url, "token": "t"}));
    assert_eq!(error_code(&eleventh), -32602, "{eleventh}");
    assert!(eleventh["error"]["message"].as_str().unwrap().contains("10 push notification configs"), "{eleventh}");
    let replaced = create(json!({"taskId": id, "url": url, "id": "c3", "token": "t2"}));
    assert!(replaced.get("error").is_none(), "{replaced}");
    let deleted = v1(agent.port, "DeleteTaskPushNotificationConfig", json!({"taskId": id, "id": "c0"}));
    assert!(deleted.get("error").is_none(), "{deleted}");
    let room = create(json!({"taskId": id, "url": url, "token": "t"}));
    assert!(room.get("error").is_none(), "{room}");
    let listed = v1(agent.port, "ListTaskPushNotificationConfigs", json!({"taskId": id}));
    assert_eq!(listed["result"]["configs"].as_array().map(Vec::len), Some(10), "{listed}");
    // A follow-up bringing an eleventh config is refused before it is sent (it reached the
    // agent, and the client was told it failed).
    let asking = send_v1(agent.port, "I need input", false);
    let asking_id = asking["id"].as_str().unwrap().to_string();
    for n in 0..10 {
        let created = create(json!({"taskId": asking_id, "url": url, "id": format!("c{n}"), "token": "t"}));
        assert!(created.get("error").is_none(), "{created}");
    }
    let follow_up = json!({
        "message": {"messageId": "f-1", "role": "ROLE_USER", "taskId": asking_id, "parts": [{"text": "use the blue one"}]},
        "configuration": {"taskPushNotificationConfig": {"url": url, "token": "t"}, "returnImmediately": true}
    });
    assert_eq!(error_code(&v1(agent.port, "SendMessage", follow_up)), -32602);
    let still = v1(agent.port, "GetTask", json!({"id": asking_id}));
    assert_eq!(still["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{still}");
}
