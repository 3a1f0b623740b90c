//! Trust boundaries that must hold whoever starts the broker and whatever the targets answer
//! (issue 12): security settings that survive a crash, a deliberate stop that stays stopped,
//! outgoing requests that cannot be turned against the broker, secrets kept out of the log,
//! idempotent sends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

#[test]
fn auth_stays_on_after_a_broker_sigkill_and_an_autostart_by_a_client_without_the_settings() {
    let home = Home::new();
    let started = home
        .cmd(&["broker", "start"])
        .env("SYNAPSE_AUTH_ENABLED", "true")
        .env("SYNAPSE_API_KEYS", "key-one")
        .env("SYNAPSE_ALLOW_LOCALHOST", "false")
        .env("SYNAPSE_API_KEY", "key-one")
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let settings = std::fs::read_to_string(home.home().join("broker-settings.json")).unwrap();
    assert!(!settings.contains("key-one"), "the key itself is stored: {settings}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(home.home().join("broker-settings.json")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    home.kill_broker();

    // A client with a key but none of the broker settings in its environment starts the next
    // broker (as a reconnecting wrapper would).
    let listed = home.cmd(&["list"]).env("SYNAPSE_API_KEY", "key-one").output().unwrap();
    assert!(listed.status.success(), "{}", describe(&listed));
    let port = broker_port(&home);
    let (status, answer) = http_tcp(port, "GET", "/agents", None, &[]);
    assert_eq!(status, 401, "the autostarted broker dropped auth: {answer}");
    let (status, _) = home.http("GET", "/agents", None, &[]);
    assert_eq!(status, 401, "the localhost rule was lost");
    let (status, _) = http_tcp(port, "GET", "/agents", None, &[("X-API-Key", "key-one")]);
    assert_eq!(status, 200);

    // Explicit settings on a new `synapse broker start` update the file.
    let stopped = home.cmd(&["broker", "stop"]).env("SYNAPSE_API_KEY", "key-one").output().unwrap();
    assert!(stopped.status.success(), "{}", describe(&stopped));
    let started = home.cmd(&["broker", "start"]).env("SYNAPSE_AUTH_ENABLED", "false").output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let (status, _) = http_tcp(broker_port(&home), "GET", "/agents", None, &[]);
    assert_eq!(status, 200);
}

/// Stops a wrapper when the test ends, however it ends.
struct StopAgent<'a>(&'a Home, String);

impl Drop for StopAgent<'_> {
    fn drop(&mut self) {
        let _ = self.0.cmd(&["stop", &self.1]).output();
    }
}

#[test]
fn a_broker_stopped_on_purpose_stays_stopped_while_an_agent_runs_and_the_wrapper_reconnects_to_the_next() {
    let home = Home::new();
    let output =
        home.cmd(&["start", "dummy", "--name", "bob", "--json"]).env("SYNAPSE_DUMMY_AUTO_REPLY", "1").output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let bob: Value = serde_json::from_slice(&output.stdout).unwrap();
    let _bob = StopAgent(&home, bob["agent_id"].as_str().unwrap().to_string());
    let wrapper = u32::try_from(bob["pid"].as_u64().unwrap()).unwrap();
    let first = home.broker_pid().unwrap();
    // The case of issue 14: the wrapper started the broker, so the broker is its child.
    assert_eq!(parent_of(first), Some(wrapper), "the wrapper did not start the broker");

    home.ok(&["broker", "stop"]);
    assert!(!is_alive(first));
    // Issue 14: the stopped broker stayed `<defunct>` under the wrapper; the wrapper reaps it.
    wait_until("the wrapper to reap its stopped broker", || zombie_children(wrapper).is_empty());
    // The old wrapper restarted a broker within half a second; watch well past its retry delay.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert!(
            std::os::unix::net::UnixStream::connect(home.socket()).is_err(),
            "a broker was started after 'synapse broker stop'"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A command inside an agent (its CLI's `synapse send`, its MCP server) does not start it
    // again either; the user's own commands do.
    let inside = home.cmd(&["list"]).env("SYNAPSE_AGENT_ID", bob["agent_id"].as_str().unwrap()).output().unwrap();
    assert_eq!(inside.status.code(), Some(1), "{}", describe(&inside));
    assert!(stderr(&inside).contains("stopped on purpose"), "{}", describe(&inside));
    assert!(std::os::unix::net::UnixStream::connect(home.socket()).is_err(), "an agent's command started a broker");
    // Nor a model's tool call through `synapse mcp` outside any agent (an ordinary CLI session
    // with the server registered): the model did not decide to start the broker, the user did
    // decide to stop it.
    let answer = mcp_call(&home, "list_agents");
    assert!(answer.contains("stopped on purpose"), "{answer}");
    assert!(std::os::unix::net::UnixStream::connect(home.socket()).is_err(), "a tool call started a broker");

    // `synapse broker start` is typed on purpose: it starts the broker, inside an agent too.
    let started =
        home.cmd(&["broker", "start"]).env("SYNAPSE_AGENT_ID", bob["agent_id"].as_str().unwrap()).output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    // The round trip needs bob's wrapper connected to the new broker (its watcher injects).
    let answer = home.ok(&["send", "bob", "are you back?", "--wait", "30"]);
    assert!(answer.contains("Auto-reply"), "{answer}");
}

/// The parent of process `pid`, from `/proc` (None once it is gone).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the fields follow the last ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The children of `parent` that have exited and were not waited for (`ps` shows `<defunct>`,
/// state Z).
fn zombie_children(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            let fields: Vec<&str> =
                stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
            fields.first() == Some(&"Z") && fields.get(1).and_then(|ppid| ppid.parse().ok()) == Some(parent)
        })
        .collect()
}

/// One request a test server got, and whether its whole answer could be written.
struct Served {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    answer_written: bool,
}

impl Served {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
}

/// A local HTTP server answering every request 200 with a body of `answer_bytes` bytes.
fn server(answer_bytes: usize) -> (u16, std::sync::mpsc::Receiver<Served>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sender, served) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut headers = Vec::new();
            let mut length = 0;
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                let header = header.trim_end();
                if header.is_empty() {
                    break;
                }
                let (key, value) = header.split_once(':').unwrap();
                if key.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
                headers.push((key.to_string(), value.trim().to_string()));
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let mut answer_written =
                write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {answer_bytes}\r\nConnection: close\r\n\r\n")
                    .is_ok();
            let chunk = vec![b'x'; 64 * 1024];
            let mut left = answer_bytes;
            while answer_written && left > 0 {
                let now = left.min(chunk.len());
                answer_written = stream.write_all(&chunk[..now]).is_ok();
                left -= now;
            }
            if sender.send(Served { headers, body, answer_written }).is_err() {
                break;
            }
        }
    });
    (port, served)
}

fn register_hook(home: &Home, body: Value) -> (u16, Value) {
    home.http("POST", "/webhooks", Some(body.to_string().as_bytes()), &[])
}

/// A task whose reply fires `task.replied` webhooks.
fn reply_once(home: &Home) {
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let sent = home.run_as(&alice, &["send", "bob", "question"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let replied = home.run_as(&bob, &["reply", "answer"]);
    assert!(replied.status.success(), "{}", describe(&replied));
}

fn deliveries(home: &Home) -> Vec<Value> {
    let (_, answer) = home.http("GET", "/webhooks/deliveries", None, &[]);
    answer["deliveries"].as_array().cloned().unwrap_or_default()
}

/// Peak resident memory of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_webhook_or_external_agent_aimed_at_the_broker_itself_is_refused_and_the_broker_keeps_running() {
    let home = Home::new();
    home.ok(&["broker", "start"]);
    let port = broker_port(&home);
    let agent = home.register(Some("carol"));
    for url in [
        format!("http://127.0.0.1:{port}/broker/shutdown"),
        format!("http://localhost:{port}/broker/shutdown"),
        format!("http://0.0.0.0:{port}/broker/shutdown"),
        format!("http://[::ffff:127.0.0.1]:{port}/broker/shutdown"),
        format!("http://127.0.0.1:{}/tasks/send", agent.port),
    ] {
        let (status, answer) = register_hook(&home, serde_json::json!({"url": url}));
        assert_eq!(status, 400, "{url}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains("this Synapse broker itself"), "{url}: {answer}");
    }
    let body = serde_json::json!({"url": format!("http://127.0.0.1:{port}")});
    let (status, answer) = home.http("POST", "/external", Some(body.to_string().as_bytes()), &[]);
    assert_eq!(status, 400, "{answer}");
    let (_, listed) = home.http("GET", "/webhooks", None, &[]);
    assert_eq!(listed["webhooks"], serde_json::json!([]));
    // Tasks complete and the broker is still there.
    reply_once(&home);
    let (status, _) = home.http("GET", "/broker/health", None, &[]);
    assert_eq!(status, 200);
}

#[test]
fn loopback_targets_are_refused_unless_the_home_allows_private_targets() {
    let home = Home::new();
    let started = home.cmd(&["broker", "start"]).env("SYNAPSE_OUTBOUND_ALLOW_PRIVATE", "false").output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let (receiver, _served) = server(0);
    let (status, answer) =
        register_hook(&home, serde_json::json!({"url": format!("http://127.0.0.1:{receiver}/hook")}));
    assert_eq!(status, 400, "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("SYNAPSE_OUTBOUND_ALLOW_PRIVATE"), "{answer}");
    let body = serde_json::json!({"url": format!("http://127.0.0.1:{receiver}")});
    let (status, answer) = home.http("POST", "/external", Some(body.to_string().as_bytes()), &[]);
    assert_eq!(status, 400, "{answer}");
}

#[test]
fn a_huge_webhook_answer_is_read_only_up_to_the_cap() {
    let home = Home::new();
    home.ok(&["broker", "start"]);
    let broker = home.broker_pid().unwrap();
    const ANSWER_BYTES: usize = 128 * 1024 * 1024;
    let (receiver, served) = server(ANSWER_BYTES);
    let (status, answer) = register_hook(
        &home,
        serde_json::json!({"url": format!("http://127.0.0.1:{receiver}/hook"), "events": ["task.replied"]}),
    );
    assert_eq!(status, 200, "{answer}");
    let before = peak_rss_kib(broker);
    reply_once(&home);
    let request = served.recv_timeout(Duration::from_secs(30)).expect("a delivery");
    assert!(!request.answer_written, "the broker read the whole {ANSWER_BYTES}-byte answer");
    wait_until("the delivery to be recorded", || deliveries(&home).iter().any(|d| d["state"] == "delivered"));
    let delivery = deliveries(&home).into_iter().find(|d| d["state"] == "delivered").unwrap();
    assert_eq!(delivery["last_status"], 200);
    assert!(
        delivery["last_error"].as_str().unwrap().contains("only the start of the answer's body was read"),
        "{delivery}"
    );
    let grown_kib = peak_rss_kib(broker).saturating_sub(before);
    assert!(grown_kib < 32 * 1024, "the broker's peak memory grew by {grown_kib} KiB");
}

#[test]
fn a_webhook_secret_stays_out_of_the_log_and_still_signs_after_a_restart() {
    let home = Home::new();
    home.ok(&["broker", "start"]);
    let secret = "hunter2-do-not-log-me";
    let (receiver, served) = server(0);
    let (status, answer) = register_hook(
        &home,
        serde_json::json!({"url": format!("http://127.0.0.1:{receiver}/hook"), "events": ["task.replied"], "secret": secret}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["webhook"]["has_secret"], true);
    home.ok(&["broker", "stop"]);
    home.ok(&["broker", "start"]);

    reply_once(&home);
    let request = served.recv_timeout(Duration::from_secs(30)).expect("a delivery");
    let signature = synapse::broker::webhooks::hmac_sha256(secret.as_bytes(), &request.body);
    let expected: String = signature.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(request.header("x-synapse-signature"), Some(format!("sha256={expected}").as_str()));

    let events = home.ok(&["events", "--json"]);
    assert!(events.contains("webhook_registered") && !events.contains(secret), "{events}");
    let log = std::fs::read(home.home().join("synapse.redb")).unwrap();
    assert!(!log.windows(secret.len()).any(|window| window == secret.as_bytes()), "the secret is in the log file");
    use std::os::unix::fs::PermissionsExt;
    let files: Vec<_> = std::fs::read_dir(home.home().join("webhook-secrets")).unwrap().map(|e| e.unwrap()).collect();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].metadata().unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_send_retried_with_its_idempotency_key_returns_the_first_task_and_sends_once() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let body = br#"{"to":"bob","text":"only once","response_expected":true}"#;
    let (status, first) = home.http("POST", "/send", Some(body), &[("Idempotency-Key", "k-1")]);
    assert_eq!(status, 200, "{first}");
    let (status, second) = home.http("POST", "/send", Some(body), &[("Idempotency-Key", "k-1")]);
    assert_eq!(status, 200, "{second}");
    assert_eq!(first["task"]["id"], second["task"]["id"]);
    assert_eq!(first["sender_task"]["id"], second["sender_task"]["id"]);
    // The A2A send endpoint honours the header the same way.
    let message = br#"{"message":{"role":"user","parts":[{"type":"text","text":"a2a once"}]}}"#;
    let (_, a2a_first) = http_tcp(bob.port, "POST", "/tasks/send", Some(message), &[("Idempotency-Key", "k-2")]);
    let (_, a2a_second) = http_tcp(bob.port, "POST", "/tasks/send", Some(message), &[("Idempotency-Key", "k-2")]);
    assert_eq!(a2a_first["task"]["id"], a2a_second["task"]["id"], "{a2a_first} {a2a_second}");
    // And the CLI flag, across a broker restart (the key is in the log).
    let cli = |home: &Home| -> Value {
        serde_json::from_str(&home.ok(&[
            "send",
            "bob",
            "cli once",
            "--no-response",
            "--idempotency-key",
            "k-3",
            "--json",
        ]))
        .unwrap()
    };
    let cli_first = cli(&home);
    home.ok(&["broker", "stop"]);
    home.ok(&["admin", "rebuild"]);
    let cli_second = cli(&home);
    assert_eq!(cli_first["task"]["id"], cli_second["task"]["id"]);
    // A different key is a new send.
    let (_, other) = home.http("POST", "/send", Some(body), &[("Idempotency-Key", "k-4")]);
    assert_ne!(other["task"]["id"], first["task"]["id"]);

    let sent: Vec<Value> = home.events().into_iter().filter(|event| event["event"]["kind"] == "message_sent").collect();
    assert_eq!(sent.len(), 4, "one message per key: {sent:#?}");
    assert_eq!(home.inbox(&bob).len(), 4);
}

/// An idempotency key used again within its window for another message (another text, or
/// another agent) is refused with a clear error, and the first message stays the only one: the
/// second send answered the first one's task and exit 0 ("Sent to <the first agent>"), and its
/// message reached nobody. Anonymous senders share one key space, so this held across clients.
#[test]
fn an_idempotency_key_used_again_for_another_message_is_refused() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let carol = home.register(Some("carol"));
    home.ok(&["send", "bob", "msg one", "--no-response", "--idempotency-key", "K9"]);
    // The same key for another agent, with the same text or another one.
    for (to, text) in [("carol", "msg one"), (carol.id.as_str(), "msg two"), ("bob", "msg two")] {
        let refused = home.run(&["send", to, text, "--no-response", "--idempotency-key", "K9"]);
        assert!(!refused.status.success(), "{}", describe(&refused));
        assert!(stderr(&refused).contains("idempotency key 'K9'"), "{}", describe(&refused));
    }
    // Over HTTP, from another anonymous client: 409 with the reason.
    let body = br#"{"to":"bob","text":"another client's message","response_expected":false}"#;
    let (status, answer) = home.http("POST", "/send", Some(body), &[("Idempotency-Key", "K9")]);
    assert_eq!(status, 409, "{answer}");
    assert!(answer.to_string().contains("idempotency key"), "{answer}");
    // A retry of the first send, naming bob by id, is still the first send.
    home.ok(&["send", &bob.id, "msg one", "--no-response", "--idempotency-key", "K9"]);
    let sent: Vec<Value> = home.events().into_iter().filter(|event| event["event"]["kind"] == "message_sent").collect();
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert_eq!(home.inbox(&bob).len(), 1);
    assert!(home.inbox(&carol).is_empty());
}

/// One tool call through `synapse mcp` (anonymous: no agent's variables); its answer.
fn mcp_call(home: &Home, tool: &str) -> String {
    let mut session =
        McpSession::start(home.cmd(&["mcp"]).env_remove("SYNAPSE_AGENT_ID").env_remove("SYNAPSE_AGENT_SECRET"));
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": {}}}));
    session.answer_to(2).to_string()
}

/// A send through `synapse mcp` tried again after its answer was late (the broker frozen) and
/// its broker then stopped on purpose: the retry does not start a broker again (a model's tool
/// call is not the user deciding to), and the model is told the message may have gone and
/// where to look before sending it again.
#[test]
fn an_mcp_send_tried_again_never_starts_a_broker_stopped_on_purpose() {
    use std::io::BufRead;
    let home = Home::new();
    home.register(Some("bob"));
    let pid = home.broker_pid().expect("broker.json");
    let mut command = home.cmd(&["mcp"]);
    command.env("SYNAPSE_CLIENT_TIMEOUT_MS", "2000").stderr(std::process::Stdio::piped());
    let mut session = McpSession::start(&mut command);
    freeze(pid);
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "send", "arguments": {"to": "bob", "message": "x", "expect_reply": false}}}));
    // Its log, read on a thread of its own: a server that never tries again keeps it open.
    let (lines, log) = std::sync::mpsc::channel();
    let stderr = session.take_stderr();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut read = String::new();
    while !read.contains("trying again with idempotency key") {
        match log.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => read.push_str(&line),
            Err(_) => panic!("the send was not tried again: {read}\n{}", session.answer_to(2)),
        }
    }
    // What `synapse broker stop` leaves, then the broker gone.
    std::fs::write(home.home().join("broker.stopped"), "stopped on request\n").unwrap();
    kill(pid, libc::SIGKILL);
    wait_until_dead(pid);
    let answer = session.answer_to(2).to_string();
    assert!(answer.contains("may have been sent") && answer.contains("idempotency_key"), "{answer}");
    let cause = answer.split("Error: ").nth(1).and_then(|rest| rest.split("; the message may").next()).unwrap();
    assert_eq!(answer.matches(cause).count(), 1, "why it failed, said once: {answer}");
    assert!(home.home().join("broker.stopped").exists(), "the deliberate stop was ended");
    assert!(std::os::unix::net::UnixStream::connect(home.socket()).is_err(), "a broker was started");
}

/// An error of `synapse mcp` that quotes the model's own argument shows its control characters
/// instead of passing them to the terminal that prints the result.
#[test]
fn an_mcp_error_quoting_a_hostile_argument_carries_no_control_character() {
    let home = Home::new();
    home.register(Some("bob"));
    let mut session = McpSession::start(home.cmd(&["mcp"]).env_remove("SYNAPSE_AGENT_ID"));
    let hostile = "x\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let calls = [
        ("send", serde_json::json!({"to": format!("bob{hostile}"), "message": "x"})),
        ("send", serde_json::json!({"to": "bob", "message": "x", "reply_to": hostile})),
        ("task", serde_json::json!({"task_id": hostile})),
        ("history_search", serde_json::json!({"keywords": ["a"], "logic": hostile})),
    ];
    for (id, (tool, arguments)) in (2..).zip(calls) {
        session.send(serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}));
        let answer = session.answer_to(id);
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{tool}: {text:?}");
    }
}

/// `history_search` through `synapse mcp` cuts each long text to its first 4000 characters and
/// says how much it left out: many long messages made a result the model's context could not
/// hold. The task tool still gives the whole text.
#[test]
fn an_mcp_history_search_shows_long_texts_cut_and_the_task_tool_whole() {
    let home = Home::new();
    home.register(Some("bob"));
    let long = format!("needle {}", "é".repeat(9_000));
    home.ok(&["send", "bob", &long, "--no-response"]);
    let mut session = McpSession::start(home.cmd(&["mcp"]).env_remove("SYNAPSE_AGENT_ID"));
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "history_search", "arguments": {"keywords": ["needle"]}}}));
    let answer = session.answer_to(2);
    let records: Value = serde_json::from_str(answer["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    let input = records[0]["input"].as_str().unwrap();
    let kept: String = long.chars().take(4000).collect();
    assert_eq!(input, format!("{kept}\n[cut: 5007 more characters; the task tool gives the whole text]"));
    let task_id = records[0]["task_id"].as_str().unwrap();
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "task", "arguments": {"task_id": task_id}}}));
    let whole = session.answer_to(3);
    assert!(whole["result"]["content"][0]["text"].as_str().unwrap().contains(&long), "the task tool gives it whole");
}

/// A tool call whose text was cut in the middle of an emoji (a lone `\uD83D`, as JavaScript's
/// and Python's encoders write it) is answered, the half character replaced: it was invalid
/// JSON to the SDK, which answered nothing, and the model's call waited for the CLI's limit.
#[test]
fn an_mcp_call_with_a_lone_surrogate_in_its_text_is_answered() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let mut session = McpSession::start(home.cmd(&["mcp"]).env_remove("SYNAPSE_AGENT_ID"));
    session.send_raw(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"send","arguments":{"to":"bob","message":"cut \uD83D","expect_reply":false}}}"#,
    );
    let answer = session.answer_within(2, Duration::from_secs(60));
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(home.inbox(&bob)[0]["text"], "cut \u{fffd}");
}

/// `synapse mcp` outside an agent tells the model where a reply will be: in the task, not
/// "your input", which nothing types into.
#[test]
fn an_anonymous_mcp_send_says_where_the_reply_will_be() {
    let home = Home::new();
    home.register(Some("bob"));
    let mut session = McpSession::start(home.cmd(&["mcp"]).env_remove("SYNAPSE_AGENT_ID"));
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "send", "arguments": {"to": "bob", "message": "q", "expect_reply": true}}}));
    let answer = session.answer_to(2);
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("look for it with the task tool") && !text.contains("your input"), "{text}");
}

/// `synapse mcp` started in a directory that was removed (a CLI left in a deleted worktree)
/// still serves its tools; it used to exit before the handshake, and the model had none.
#[test]
fn synapse_mcp_in_a_removed_directory_still_serves_its_tools() {
    let home = Home::new();
    home.register(Some("bob"));
    let gone = home.dir.path().join("gone");
    std::fs::create_dir(&gone).unwrap();
    let mut command = home.cmd(&["mcp"]);
    command.env_remove("SYNAPSE_AGENT_ID");
    let mut shell = std::process::Command::new("/bin/sh");
    shell.args(["-c", "cd \"$1\" && rmdir \"$1\" && exec \"$0\" mcp"]).arg(BIN).arg(&gone);
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => shell.env(key, value),
            None => shell.env_remove(key),
        };
    }
    let mut session = McpSession::start(&mut shell);
    session.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "list_agents", "arguments": {}}}));
    let answer = session.answer_within(2, Duration::from_secs(60));
    assert!(answer["result"]["content"][0]["text"].as_str().unwrap().contains("bob"), "{answer}");
}
