//! Issue 12, local attacks on the HTTP servers, the CLI and the files, through the real binary:
//! web pages (Host, Origin, content type), idle and surplus connections, a broker that never
//! answers, file modes, `synapse logs` with a path, and others' escape sequences on the user's
//! terminal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

/// Sends a raw request (head lines as given, `Connection: close`) and reads the whole answer.
fn raw(stream: &mut (impl Read + Write), method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    (status, answer)
}

fn tcp(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream
}

fn unix(home: &Home) -> std::os::unix::net::UnixStream {
    let stream = std::os::unix::net::UnixStream::connect(home.socket()).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream
}

/// The JSON body of an answer read by [`raw`].
fn json_body(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or(Value::Null)
}

#[test]
fn a_foreign_host_is_refused_on_the_broker_and_agent_ports() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let port = broker_port(&home);
    let (status, answer) = raw(&mut tcp(port), "GET", "/agents", &["Host: attacker.example"], "");
    assert_eq!(status, 421, "{answer}");
    assert!(json_body(&answer)["message"].as_str().unwrap().contains("attacker.example"), "{answer}");
    let (status, _) = raw(&mut tcp(bob.port), "GET", "/tasks", &["Host: attacker.example:8100"], "");
    assert_eq!(status, 421);
    // Text after an IPv6 loopback's brackets; a second Host after a loopback one.
    let (status, _) = raw(&mut tcp(bob.port), "GET", "/tasks", &["Host: [::1]evil.example"], "");
    assert_eq!(status, 421);
    let (status, answer) = raw(&mut tcp(port), "GET", "/agents", &["Host: localhost", "Host: attacker.example"], "");
    assert_eq!(status, 400, "{answer}");
    for host in [format!("localhost:{port}"), "127.0.0.1".to_string(), format!("[::1]:{port}")] {
        let (status, answer) = raw(&mut tcp(port), "GET", "/agents", &[&format!("Host: {host}")], "");
        assert_eq!(status, 200, "{host}: {answer}");
    }
    // The CLI's own socket: no Host needed.
    let (status, answer) = raw(&mut unix(&home), "GET", "/agents", &[], "");
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn a_foreign_origin_is_refused_and_the_broker_origin_and_configured_ones_are_allowed() {
    let home = Home::new();
    // Allowed origins are the home's security settings: an autostart by a client whose
    // environment names one (an agent's CLI, say) allows nothing.
    let autostarted = home.cmd(&["list"]).env("SYNAPSE_ALLOWED_ORIGINS", "https://evil.example").output().unwrap();
    assert!(autostarted.status.success(), "{}", describe(&autostarted));
    let (status, answer) =
        raw(&mut tcp(broker_port(&home)), "GET", "/agents", &["Host: localhost", "Origin: https://evil.example"], "");
    assert_eq!(status, 403, "an autostarting client's environment allowed an origin: {answer}");
    home.ok(&["broker", "stop"]);
    let started = home.cmd(&["broker", "start"]).env("SYNAPSE_ALLOWED_ORIGINS", "https://ok.example").output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let bob = home.register(Some("bob"));
    let port = broker_port(&home);
    let body = r#"{"to": "bob", "text": "from a web page", "response_expected": false}"#;
    let evil = ["Host: localhost", "Origin: https://evil.example", "Content-Type: application/json"];
    let (status, answer) = raw(&mut tcp(port), "POST", "/send", &evil, body);
    assert_eq!(status, 403, "{answer}");
    assert_eq!(json_body(&answer)["error"], "Forbidden");
    let (status, _) = raw(&mut unix(&home), "POST", "/send", &evil, body);
    assert_eq!(status, 403);
    let (status, _) = raw(&mut tcp(bob.port), "GET", "/tasks", &["Host: localhost", "Origin: http://localhost:1"], "");
    assert_eq!(status, 403);
    assert!(home.inbox(&bob).is_empty(), "a refused request must not send");
    let own = format!("Origin: http://127.0.0.1:{port}");
    let (status, answer) =
        raw(&mut tcp(port), "POST", "/send", &["Host: localhost", &own, "Content-Type: application/json"], body);
    assert_eq!(status, 200, "{answer}");
    let (status, _) = raw(&mut tcp(port), "GET", "/agents", &["Host: localhost", "Origin: https://ok.example"], "");
    assert_eq!(status, 200);
}

#[test]
fn a_post_that_is_not_json_is_refused_and_nothing_is_appended() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let port = broker_port(&home);
    let head = home.head();
    let body = r#"{"to": "bob", "text": "simple request", "response_expected": false}"#;
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let headers = ["Host: localhost", &format!("Content-Type: {content_type}")];
        let (status, answer) = raw(&mut tcp(port), "POST", "/send", &headers, body);
        assert_eq!(status, 415, "{content_type}: {answer}");
        assert_eq!(json_body(&answer)["error"], "Unsupported Media Type");
        let (status, _) = raw(&mut tcp(bob.port), "POST", "/tasks/send", &headers, body);
        assert_eq!(status, 415);
    }
    let (status, _) = raw(&mut unix(&home), "POST", "/send", &[], body);
    assert_eq!(status, 415, "a body without a type");
    assert_eq!(home.head(), head, "nothing may be appended to the log");
    let (status, answer) = raw(
        &mut tcp(port),
        "POST",
        "/send",
        &["Host: localhost", "Content-Type: application/json; charset=utf-8"],
        body,
    );
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn every_refusal_is_json_a_segment_that_is_not_utf8_a_wrong_method_and_an_unknown_agent() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    home.ok(&["send", "bob", "for bob", "--no-response"]);
    let refused = |(status, answer): (u16, Value), wanted: u16, words: &str, what: &str| {
        assert_eq!(status, wanted, "{what}: {answer}");
        let message = answer["message"].as_str().unwrap_or_else(|| panic!("{what}: not a JSON error: {answer}"));
        assert!(message.contains(words), "{what}: {answer}");
    };
    // A percent-encoded segment that is not UTF-8, where each path parameter is read.
    for path in
        ["/tasks/%ff", "/history/%ff", "/threads/%ff", "/external/%ff", "/agents/%ff/tasks", "/agents/bob/tasks/%ff"]
    {
        refused(home.http("GET", path, None, &[]), 400, "UTF-8", path);
    }
    refused(http_unix(&bob.socket, "GET", "/tasks/%ff", None, &[]), 400, "UTF-8", "agent socket");
    refused(http_tcp(bob.port, "GET", "/tasks/%fe%ff/subscribe", None, &[]), 400, "UTF-8", "agent port");
    // A path that exists, asked with a method it does not take.
    for (method, path) in
        [("GET", "/send"), ("DELETE", "/tasks/abc"), ("PUT", "/agents"), ("GET", "/agents/bob/tasks/send")]
    {
        refused(home.http(method, path, None, &[]), 405, &format!("does not take {method}"), path);
    }
    refused(http_tcp(bob.port, "GET", "/tasks/send", None, &[]), 405, "does not take GET", "agent port");
    // An agent nobody registered: 404, where it was an empty list.
    for path in ["/agents/ghost/tasks", "/agents/ghost/reply-stack/list", "/agents/ghost/tasks/abcd1234"] {
        refused(home.http("GET", path, None, &[]), 404, "Agent 'ghost' is not registered", path);
    }
    // A registered agent's name is read as its id, as for a send.
    let (status, answer) = home.http("GET", "/agents/bob/tasks", None, &[]);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["tasks"].as_array().map(Vec::len), Some(1), "{answer}");
}

/// Reads from `stream` until `wanted` shows up; panics at the deadline.
fn read_until(stream: &mut TcpStream, wanted: &str, seen: &mut String) {
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    while !seen.contains(wanted) {
        assert!(started.elapsed() < DEADLINE, "never saw {wanted:?} in {seen:?}");
        match stream.read(&mut buffer) {
            Ok(0) => panic!("the stream closed before {wanted:?}: {seen:?}"),
            Ok(count) => seen.push_str(&String::from_utf8_lossy(&buffer[..count])),
            Err(error) => panic!("reading: {error}; seen {seen:?}"),
        }
    }
}

/// Waits until the server closes `stream` (EOF); returns how long that took.
fn wait_for_close(stream: &mut TcpStream) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return started.elapsed(),
            Err(error) => panic!("the idle connection was not closed within {DEADLINE:?}: {error}"),
        }
    }
}

#[test]
fn idle_connections_are_closed_while_long_polls_and_event_streams_stay_open() {
    let home = Home::new();
    start_broker_with(&home, &[("SYNAPSE_HTTP_IDLE_TIMEOUT_MS", "400")]);
    let bob = home.register(Some("bob"));
    let port = broker_port(&home);

    // A long poll and an event stream, both open before the idle connections.
    let mut poll = tcp(port);
    poll.write_all(
        format!(
            "GET /agents/{}/inbox?wait_ms=15000 HTTP/1.1\r\nHost: localhost\r\nx-synapse-agent-secret: {}\r\nConnection: close\r\n\r\n",
            bob.id, bob.secret
        )
        .as_bytes(),
    )
    .unwrap();
    let mut stream = tcp(port);
    let head = home.head();
    stream
        .write_all(format!("GET /events?after={head}&follow=true HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .unwrap();
    let mut seen = String::new();
    read_until(&mut stream, "text/event-stream", &mut seen);

    // A connection that never sends anything, and one that sent a request and sits on keep-alive.
    let mut silent = tcp(port);
    let mut kept = tcp(port);
    kept.write_all(b"GET /broker/health HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut answer = String::new();
    read_until(&mut kept, "\"version\"", &mut answer);
    let silent_closed_after = wait_for_close(&mut silent);
    assert!(silent_closed_after >= Duration::from_millis(300), "closed too early: {silent_closed_after:?}");
    wait_for_close(&mut kept);

    // Both waits outlived the idle timeout; they still deliver.
    home.ok(&["send", "bob", "still-listening", "--no-response"]);
    read_until(&mut stream, "still-listening", &mut seen);
    let mut polled = String::new();
    read_until(&mut poll, "still-listening", &mut polled);
    assert!(polled.starts_with("HTTP/1.1 200"), "{polled}");
}

#[test]
fn connections_beyond_the_limit_get_a_503_and_a_freed_slot_is_reused() {
    let home = Home::new();
    start_broker_with(&home, &[("SYNAPSE_HTTP_MAX_CONNECTIONS", "3")]);
    let port = broker_port(&home);
    let mut held: Vec<TcpStream> = (0..3).map(|_| tcp(port)).collect();
    // Each held connection is served (answers a keep-alive request), so all three count.
    for stream in &mut held {
        stream.write_all(b"GET /broker/health HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut answer = String::new();
        read_until(stream, "\"version\"", &mut answer);
    }
    let (status, answer) = raw(&mut tcp(port), "GET", "/broker/health", &["Host: localhost"], "");
    assert_eq!(status, 503, "{answer}");
    assert!(json_body(&answer)["message"].as_str().unwrap().contains("SYNAPSE_HTTP_MAX_CONNECTIONS"), "{answer}");
    // The CLI's socket has its own budget.
    home.ok(&["list"]);
    // A closed connection frees its slot (once the server has seen the close).
    drop(held.pop());
    let started = Instant::now();
    loop {
        let (status, _) = raw(&mut tcp(port), "GET", "/broker/health", &["Host: localhost"], "");
        if status == 200 {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "the freed slot was never reused");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client that reads nothing of its event stream is dropped once its answer has waited
/// SYNAPSE_HTTP_WRITE_STALL_MS for room (default 60 s): it held a copy of each batch (a 16 MB
/// message twice) and a connection slot for as long as it liked. Here it holds the only TCP
/// slot, which comes free once the stall is over.
#[test]
fn a_stream_whose_client_reads_nothing_is_dropped_and_frees_its_slot() {
    use std::os::fd::AsRawFd;
    let home = Home::new();
    start_broker_with(&home, &[("SYNAPSE_HTTP_MAX_CONNECTIONS", "1"), ("SYNAPSE_HTTP_WRITE_STALL_MS", "500")]);
    home.register(Some("bob"));
    let port = broker_port(&home);
    let mut stuck = tcp(port);
    let small: libc::c_int = 4096;
    #[allow(unsafe_code)]
    // SAFETY: the descriptor is open, and the option's value is a c_int of the size given.
    let set = unsafe {
        libc::setsockopt(
            stuck.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            std::ptr::from_ref(&small).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0);
    let head = home.head();
    stuck
        .write_all(format!("GET /events?after={head}&follow=true HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .unwrap();
    let mut seen = String::new();
    read_until(&mut stuck, "text/event-stream", &mut seen);
    // One message larger than both socket buffers: its frame cannot be written whole.
    let file = home.dir.path().join("long.txt");
    std::fs::write(&file, "s".repeat(15 << 20)).unwrap();
    home.ok(&["send", "bob", "-F", file.to_str().unwrap(), "--no-response"]);
    let waiting = Instant::now();
    loop {
        let (status, _) = raw(&mut tcp(port), "GET", "/broker/health", &["Host: localhost"], "");
        if status == 200 {
            break;
        }
        assert!(waiting.elapsed() < DEADLINE, "the stalled stream kept its slot");
        std::thread::sleep(Duration::from_millis(20));
    }
    // (Its data is left unread: through a 4 KiB window the rest of the frame takes minutes.)
    drop(stuck);
}

/// On the Unix socket (the user's own processes only) a reader that pauses longer than the
/// write-stall limit keeps its answer: `synapse events --json | less` reads as fast as its
/// pager, which waits for the user. (The pause is the condition under test.)
#[test]
fn a_unix_socket_reader_that_pauses_is_not_dropped() {
    let home = Home::new();
    start_broker_with(&home, &[("SYNAPSE_HTTP_WRITE_STALL_MS", "200")]);
    home.register(Some("bob"));
    let file = home.dir.path().join("long.txt");
    std::fs::write(&file, "u".repeat(8 << 20)).unwrap();
    home.ok(&["send", "bob", "-F", file.to_str().unwrap(), "--no-response"]);
    home.ok(&["send", "bob", "THE-LAST-ONE", "--no-response"]);
    let mut stream = std::os::unix::net::UnixStream::connect(home.socket()).unwrap();
    stream.write_all(b"GET /events HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut first = [0_u8; 1024];
    assert!(stream.read(&mut first).unwrap() > 0);
    std::thread::sleep(Duration::from_millis(1_500));
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(String::from_utf8_lossy(&rest).contains("THE-LAST-ONE"), "the answer was cut: {} bytes", rest.len());
}

/// The broker raises its limit of open files to what its connection limits need (twice
/// SYNAPSE_HTTP_MAX_CONNECTIONS and 1,024 more), as far as the hard limit allows: under the
/// usual soft limit of 1,024 a flood on both transports used every descriptor, and every
/// accept failed until one closed.
#[test]
fn the_broker_raises_its_limit_of_open_files_to_what_its_connections_need() {
    let home = Home::new();
    let started = std::process::Command::new("sh")
        .args(["-c", &format!("ulimit -Sn 1024 && exec '{BIN}' broker start")])
        .env("SYNAPSE_HOME", home.home())
        .env("SYNAPSE_UDS_DIR", home.uds())
        .env("SYNAPSE_BROKER_PORT", "0")
        .env_remove("SYNAPSE_AGENT_ID")
        .env_remove("SYNAPSE_AGENT_SECRET")
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let pid = home.broker_pid().expect("broker.json");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|line| line.starts_with("Max open files")).unwrap();
    let numbers: Vec<u64> = line.split_whitespace().filter_map(|word| word.parse().ok()).collect();
    let (soft, hard) = (numbers[0], numbers[1]);
    assert_eq!(soft, hard.min(2 * 512 + 1024), "{line}");
}

#[test]
fn the_cli_gives_up_on_a_broker_that_never_answers() {
    let home = Home::new();
    std::fs::create_dir_all(home.uds()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(home.socket()).unwrap();
    // Accepts every connection and never answers.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let started = Instant::now();
    let output = home.cmd(&["list"]).env("SYNAPSE_CLIENT_TIMEOUT_MS", "500").output().unwrap();
    let elapsed = started.elapsed();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("timed out after 500 ms"), "{}", describe(&output));
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    let output = home.cmd(&["send", "bob", "hello"]).env("SYNAPSE_CLIENT_TIMEOUT_MS", "500").output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("timed out"), "{}", describe(&output));
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every directory and regular file under `dir`, with its mode.
fn modes(dir: &Path, out: &mut Vec<(String, bool, u32)>) {
    out.push((dir.display().to_string(), true, mode(dir)));
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            modes(&entry.path(), out);
        } else if kind.is_file() {
            out.push((entry.path().display().to_string(), false, mode(&entry.path())));
        }
    }
}

/// `synapse args...` with umask 022, as most shells have it.
fn with_umask_022(home: &Path, uds: &Path, args: &[&str]) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg("umask 022 && exec \"$0\" \"$@\"")
        .arg(BIN)
        .args(args)
        .env("SYNAPSE_HOME", home)
        .env("SYNAPSE_UDS_DIR", uds)
        .env("SYNAPSE_BROKER_PORT", "0")
        .env_remove("SYNAPSE_AGENT_ID")
        .env_remove("SYNAPSE_AGENT_SECRET")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_home_made_by_an_autostarting_client_and_a_wrapper_is_private() {
    let base = Home::new();
    let home = base.dir.path().join("fresh");
    let uds = base.dir.path().join("uds2");
    let run = |args: &[&str]| {
        let output = with_umask_022(&home, &uds, args);
        assert!(output.status.success(), "{args:?}: {}", describe(&output));
        stdout(&output)
    };
    run(&["list"]);
    let bob: Value = serde_json::from_str(&run(&["start", "dummy", "--name", "bob", "--json"])).unwrap();
    let bob_id = bob["agent_id"].as_str().unwrap().to_string();
    // A long message goes through a file in messages/.
    run(&["send", "bob", &"x".repeat(400), "--no-response"]);
    let messages = home.join("messages").join(&bob_id);
    let started = Instant::now();
    while std::fs::read_dir(&messages).map(|entries| entries.count()).unwrap_or(0) == 0 {
        assert!(started.elapsed() < DEADLINE, "the long message file never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut found = Vec::new();
    modes(&home, &mut found);
    run(&["stop", "bob"]);
    run(&["broker", "stop"]);
    assert!(found.iter().any(|(path, _, _)| path.ends_with("synapse.redb")), "{found:?}");
    assert!(found.iter().any(|(path, _, _)| path.contains("/logs/")), "{found:?}");
    for (path, is_dir, mode) in found {
        assert_eq!(mode, if is_dir { 0o700 } else { 0o600 }, "{path} is {mode:o}");
    }
    // Written as the broker stops, after the walk above.
    assert_eq!(mode(&home.join(synapse::trust::STOPPED_MARKER)), 0o600, "broker.stopped");

    // `synapse init` may be the first to create the home (it writes the trust settings there).
    let init_home = base.dir.path().join("made-by-init");
    let project = base.dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let output = Command::new("sh")
        .arg("-c")
        .arg("umask 022 && exec \"$0\" \"$@\"")
        .arg(BIN)
        .arg("init")
        .current_dir(&project)
        .env("SYNAPSE_HOME", &init_home)
        .env("SYNAPSE_UDS_DIR", &uds)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "init: {}", describe(&output));
    let mut found = Vec::new();
    modes(&init_home, &mut found);
    assert_eq!(mode(&init_home), 0o700, "the home made by init");
    for (path, is_dir, mode) in found {
        assert_eq!(mode, if is_dir { 0o700 } else { 0o600 }, "{path} is {mode:o}");
    }
}

#[test]
fn the_broker_tightens_a_home_that_is_too_open() {
    let home = Home::new();
    std::fs::set_permissions(home.home(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(home.home().join("notes.json"), "{}").unwrap();
    std::fs::set_permissions(home.home().join("notes.json"), std::fs::Permissions::from_mode(0o644)).unwrap();
    home.ok(&["list"]);
    assert_eq!(mode(&home.home()), 0o700);
    assert_eq!(mode(&home.home().join("notes.json")), 0o600);
}

#[test]
fn logs_takes_an_agent_never_a_path() {
    let home = Home::new();
    // A file outside the home that `logs/<target>.log` would reach with `..`.
    std::fs::write(home.dir.path().join("secret.log"), "TOP-SECRET contents\n").unwrap();
    std::fs::create_dir_all(home.home().join("logs")).unwrap();
    for target in ["../../secret", "../../../../etc/passwd", "/etc/passwd", "..", "a/b"] {
        let output = home.run(&["logs", target]);
        assert_eq!(output.status.code(), Some(1), "{target}: {}", describe(&output));
        assert!(stderr(&output).contains("No agent or log found matching"), "{target}: {}", describe(&output));
        assert!(!stdout(&output).contains("TOP-SECRET") && !stdout(&output).contains("root:"), "{target}");
    }
    // A name that is no file name (`start --name` takes it) finds its agent's log through the
    // broker: it was refused as "not an agent id or name".
    let agent = home.register(Some("a/b"));
    std::fs::write(home.home().join("logs").join(format!("{}.log", agent.id)), "its terminal\n").unwrap();
    let output = home.run(&["logs", "a/b"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(stdout(&output), "its terminal\n");
    // The log before it (`<id>.log.1`) comes first; a FIFO planted there is passed over, not
    // waited on for a writer that never comes.
    let older = home.home().join("logs").join(format!("{}.log.1", agent.id));
    std::fs::write(&older, "before that\n").unwrap();
    let output = home.run(&["logs", "a/b"]);
    assert_eq!(stdout(&output), "before that\nits terminal\n", "{}", describe(&output));
    std::fs::remove_file(&older).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&older).status().unwrap().success());
    let piped = || std::process::Stdio::piped();
    let logs = home.cmd(&["logs", "a/b"]).stdout(piped()).stderr(piped()).spawn().unwrap();
    let output = output_within(logs, Duration::from_secs(30), "logs");
    assert_eq!(stdout(&output), "its terminal\n", "{}", describe(&output));
}

#[test]
fn others_escape_sequences_are_shown_visibly_in_list_events_history_and_logs() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    // An OSC 52 clipboard write, a C0 screen clear, a C1 one (CSI as U+009B) and a DEL.
    let attack = "\u{1b}]52;c;SGk=\u{7}pwn\u{1b}[2J\u{9b}2J\u{7f}";
    let visible = "^[]52;c;SGk=^Gpwn^[[2J<U+009B>2J^?";
    let raw = ['\u{1b}', '\u{7}', '\u{9b}', '\u{7f}'];
    let sent = home.run_as(&alice, &["send", "bob", attack, "--response"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    // bob takes the message (a reply is expected, so it is work in progress): it becomes his
    // current task (the CURRENT column of `list`).
    let ticket = home.inbox(&bob)[0]["ticket"].to_string();
    let ack = home.run_as(&bob, &["agent", "ack", &bob.id, &ticket]);
    assert!(ack.status.success(), "{}", describe(&ack));
    // A terminal log holding the same bytes.
    std::fs::create_dir_all(home.home().join("logs")).unwrap();
    std::fs::write(home.home().join("logs").join(format!("{}.log", bob.id)), format!("> {attack}\r\n")).unwrap();

    let no_controls = |what: &str, text: &str| {
        assert!(!text.contains(raw), "{what} prints raw controls: {text:?}");
        assert!(text.contains(visible), "{what} does not show the sequence visibly: {text}");
    };
    no_controls("list", &home.ok(&["list"]));
    no_controls("events", &home.ok(&["events"]));
    no_controls("history list", &home.ok(&["history", "list"]));
    no_controls("history search", &home.ok(&["history", "search", "pwn"]));
    no_controls("logs", &home.ok(&["logs", "bob"]));
    // Exact where asked for: JSON (every control escaped, DEL and C1 too: serde_json escapes
    // only C0) and --raw.
    for args in [&["events", "--json"][..], &["list", "--json"], &["history", "list", "--json"]] {
        let json = home.ok(args);
        assert!(!json.contains(raw), "{args:?} prints raw controls: {json:?}");
        assert!(json.contains(r"\u001b]52;c;SGk=\u0007pwn\u001b[2J\u009b2J\u007f"), "{args:?}: {json}");
    }
    assert_eq!(home.ok(&["logs", "bob", "--raw"]), format!("> {attack}\r\n"));
    // The CSV export shows them visibly on a terminal (it printed them raw), and keeps them
    // exact when its output goes to a file or a pipe, to be read back.
    no_controls("history export --format csv", &on_a_terminal(&home, &["history", "export", "--format", "csv"]));
    assert!(home.ok(&["history", "export", "--format", "csv"]).contains(attack));
}

/// What `synapse <args>` writes when its standard output is a terminal (a PTY made by the test).
fn on_a_terminal(home: &Home, args: &[&str]) -> String {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let pty = native_pty_system().openpty(PtySize { rows: 30, cols: 200, pixel_width: 0, pixel_height: 0 }).unwrap();
    let mut command = CommandBuilder::new(BIN);
    command.args(args);
    command.env("SYNAPSE_HOME", home.home());
    command.env("SYNAPSE_UDS_DIR", home.uds());
    command.env("SYNAPSE_BROKER_PORT", "0");
    command.env_remove("SYNAPSE_AGENT_ID");
    let mut child = pty.slave.spawn_command(command).unwrap();
    drop(pty.slave);
    let mut reader = pty.master.try_clone_reader().unwrap();
    let reading = std::thread::spawn(move || {
        let mut output = Vec::new();
        let mut buffer = [0_u8; 4096];
        // Ends at the end of the output: 0, or EIO once the child's side is closed.
        while let Ok(count) = reader.read(&mut buffer) {
            if count == 0 {
                break;
            }
            output.extend_from_slice(&buffer[..count]);
        }
        output
    });
    let status = child.wait().unwrap();
    assert!(status.success(), "synapse {args:?} on a terminal: {status:?}");
    drop(pty.master);
    String::from_utf8_lossy(&reading.join().unwrap()).into_owned()
}

#[test]
fn requests_whose_headers_or_body_trickle_in_are_ended_so_they_cannot_hold_every_slot() {
    let home = Home::new();
    start_broker_with(
        &home,
        &[
            ("SYNAPSE_HTTP_MAX_CONNECTIONS", "2"),
            ("SYNAPSE_HTTP_HEADER_TIMEOUT_MS", "400"),
            ("SYNAPSE_HTTP_BODY_TIMEOUT_MS", "400"),
        ],
    );
    let port = broker_port(&home);
    // One sends half its headers; the other its headers and a tenth of its body.
    let mut half_headers = tcp(port);
    half_headers.write_all(b"GET /broker/health HTTP/1.1\r\nHost: loc").unwrap();
    let mut half_body = tcp(port);
    half_body
        .write_all(b"POST /send HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"to\":")
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (status, answer) = raw(&mut tcp(port), "GET", "/broker/health", &["Host: localhost"], "");
    assert_eq!(status, 503, "both slots are held for now: {answer}");
    // The body's deadline answers that request with a 4xx and ends it.
    let mut answer = String::new();
    read_until(&mut half_body, "SYNAPSE_HTTP_BODY_TIMEOUT_MS", &mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    drop(half_body);
    // The headers' deadline closes the other: a new client is served again.
    let mut rest = Vec::new();
    let _ = half_headers.read_to_end(&mut rest);
    let started = Instant::now();
    loop {
        let (status, _) = raw(&mut tcp(port), "GET", "/broker/health", &["Host: localhost"], "");
        if status == 200 {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "the slots of the slow requests were never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The socket directory is shared by default (`/tmp/synapse-a2a`): one made by another user is
/// refused, and a socket served by another user gets nothing from the CLI (issue 12; needs root
/// to act as another user, as CI and the dev machines are).
#[test]
fn a_socket_directory_or_socket_of_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    if my_uid() != 0 {
        eprintln!("SKIPPED: needs root to create files of another user");
        return;
    }
    const NOBODY: u32 = 65534;
    // A directory of another user where the broker's sockets would go.
    let home = Home::new();
    std::fs::create_dir_all(home.uds()).unwrap();
    std::os::unix::fs::chown(home.uds(), Some(NOBODY), Some(NOBODY)).unwrap();
    let refused = home.run(&["list"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("belongs to uid 65534"), "{}", describe(&refused));

    // A socket served by another user in a directory of ours: the CLI sends it nothing.
    let home = Home::new();
    std::fs::create_dir_all(home.uds()).unwrap();
    std::fs::set_permissions(home.uds(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = format!(
        "import os, socket, sys\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind({path:?})\n\
         os.chmod({path:?}, 0o777)\n\
         os.setgid({NOBODY}); os.setuid({NOBODY})\n\
         s.listen(8)\n\
         print('ready', flush=True)\n",
        path = home.socket().display().to_string()
    );
    let (fake, ready) = FakeListener::start(&script);
    assert_eq!(ready.trim(), "ready");
    let output = home
        .cmd(&["send", "bob", "secret plans", "--no-response"])
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "5000")
        .output()
        .unwrap();
    assert_ne!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(
        stderr(&output).contains("served by uid 65534") || stderr(&output).contains("already listening"),
        "{}",
        describe(&output)
    );
    fake.assert_got_nothing("the fake broker");
}

/// A home of another user is refused: its owner could replace `broker-settings.json` (let other
/// users in, allow a foreign origin) or a profile (the command an agent runs). A broker started
/// on one had loaded another user's security settings (needs root to act as another user).
#[test]
fn a_home_of_another_user_is_refused() {
    if my_uid() != 0 {
        eprintln!("SKIPPED: needs root to create files of another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let home = Home::new();
    std::fs::create_dir_all(home.home()).unwrap();
    std::fs::write(home.home().join("broker-settings.json"), r#"{"version":1,"allow_other_users":true}"#).unwrap();
    // A profile whose command leaves a mark when it runs (`doctor` asks each CLI its version).
    let mark = home.dir.path().join("ran");
    let script = home.dir.path().join("evil.sh");
    std::fs::write(&script, format!("#!/bin/sh\necho ran > {}\n", mark.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(home.home().join("profiles")).unwrap();
    std::fs::write(home.home().join("profiles/claude.json"), format!(r#"{{"command": "{}"}}"#, script.display()))
        .unwrap();
    std::os::unix::fs::chown(home.home(), Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::write(home.home().join("settings.json"), "{}").unwrap();
    let before: Vec<_> = std::fs::read_dir(home.home()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    for args in [
        vec!["broker", "start"],
        vec!["list"],
        vec!["start", "dummy"],
        vec!["init", "--scope", "user", "--force"],
        vec!["reset", "--scope", "user", "--force"],
    ] {
        let refused = home.run(&args);
        assert_eq!(refused.status.code(), Some(1), "{args:?}: {}", describe(&refused));
        assert!(stderr(&refused).contains("belongs to uid 65534"), "{args:?}: {}", describe(&refused));
    }
    assert!(!home.socket().exists(), "no broker serves");
    let after: Vec<_> = std::fs::read_dir(home.home()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(after, before, "nothing written into the other user's home");
    let doctor = home.run(&["doctor"]);
    assert!(stdout(&doctor).contains("not read: the home belongs to another user"), "{}", describe(&doctor));
    assert!(!mark.exists(), "doctor ran the other user's profile command");
}

/// A profile or the broker's security settings planted in the user's own home (left open to
/// others) are not used: a file anyone can write, or one of another user (needs root for that
/// part). A planted profile's command was run by `synapse start`.
#[test]
fn a_profile_or_security_settings_file_planted_in_the_home_is_not_used() {
    let home = Home::new();
    let mark = home.dir.path().join("ran");
    let script = home.dir.path().join("evil.sh");
    std::fs::write(&script, format!("#!/bin/sh\necho ran > {}\n", mark.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(home.home().join("profiles")).unwrap();
    let profile = home.home().join("profiles/dummy.json");
    std::fs::write(&profile, format!(r#"{{"command": "{}"}}"#, script.display())).unwrap();
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o666)).unwrap();
    let refused = home.run(&["start", "dummy"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("can be written by anyone"), "{}", describe(&refused));
    assert!(!mark.exists(), "the planted profile's command ran");
    if my_uid() != 0 {
        eprintln!("SKIPPED (the rest): needs root to create files of another user");
        return;
    }
    const NOBODY: u32 = 65534;
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&profile, Some(NOBODY), Some(NOBODY)).unwrap();
    let refused = home.run(&["start", "dummy"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("belongs to uid 65534"), "{}", describe(&refused));
    assert!(!mark.exists(), "the planted profile's command ran");
    std::fs::remove_file(&profile).unwrap();
    // The user's settings: their `env` reaches every agent's CLI (LD_PRELOAD, PATH).
    let user_settings = home.home().join("settings.json");
    std::fs::write(&user_settings, r#"{"env": {"LD_PRELOAD": "/tmp/evil.so"}}"#).unwrap();
    std::os::unix::fs::chown(&user_settings, Some(NOBODY), Some(NOBODY)).unwrap();
    let refused = home.run(&["start", "dummy"]);
    assert_ne!(refused.status.code(), Some(0), "{}", describe(&refused));
    assert!(stderr(&refused).contains("belongs to uid 65534"), "{}", describe(&refused));
    std::fs::remove_file(&user_settings).unwrap();
    home.ok(&["broker", "stop"]);
    let settings = home.home().join("broker-settings.json");
    std::fs::write(&settings, r#"{"version":1,"allow_other_users":true}"#).unwrap();
    std::os::unix::fs::chown(&settings, Some(NOBODY), Some(NOBODY)).unwrap();
    let refused = home.run(&["broker", "start"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("belongs to uid 65534"), "{}", describe(&refused));
}

/// `synapse hook` sends the agent's secret only to a hook socket of this user: one another user
/// serves at its path (in a socket directory others can write) gets nothing (needs root).
#[test]
fn a_hook_socket_of_another_user_gets_nothing() {
    if my_uid() != 0 {
        eprintln!("SKIPPED: needs root to run a process as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let home = Home::new();
    std::fs::create_dir_all(home.uds()).unwrap();
    std::fs::set_permissions(home.uds(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = home.uds().join("synapse-dummy-8190.hook");
    let script = format!(
        "import os, socket\n\
         os.setgid({NOBODY}); os.setuid({NOBODY})\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind({path:?})\n\
         s.listen(8)\n\
         print('ready', flush=True)\n",
        path = path.display().to_string()
    );
    let (fake, ready) = FakeListener::start(&script);
    assert_eq!(ready.trim(), "ready");
    let output = home
        .cmd(&["hook", "PostToolUse"])
        .env("SYNAPSE_AGENT_ID", "synapse-dummy-8190")
        .env("SYNAPSE_AGENT_SECRET", "the-agents-secret")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success() && output.stdout.is_empty(), "{}", describe(&output));
    fake.assert_got_nothing("the other user's hook socket");
}

/// The CLI falls back to the broker's TCP port (from `broker.json`) when its socket cannot be
/// reached. A port another user took after the broker died gets nothing: whoever listens there
/// would get a wrapper's secret and choose what is typed into its terminal (needs root to act
/// as another user).
#[test]
fn a_broker_port_served_by_another_user_gets_nothing() {
    if my_uid() != 0 {
        eprintln!("SKIPPED: needs root to run a process as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let home = Home::new();
    // The listening socket is made after setuid: its owner, and its connections', is nobody.
    let script = format!(
        "import os, socket\n\
         os.setgid({NOBODY}); os.setuid({NOBODY})\n\
         s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8)\n\
         print('ready', os.getpid(), s.getsockname()[1], flush=True)\n"
    );
    let (fake, ready) = FakeListener::start(&script);
    let words: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"ready"), "{ready}");
    let (pid, port): (u32, u16) = (words[1].parse().unwrap(), words[2].parse().unwrap());
    // What a broker killed with SIGKILL leaves, with its pid and port taken by the other user.
    std::fs::create_dir_all(home.home()).unwrap();
    let info = serde_json::json!({
        "pid": pid, "version": synapse::api::VERSION, "schema": 1, "home": home.home().display().to_string(),
        "socket": home.socket().display().to_string(), "port": port, "head": 0,
    });
    std::fs::write(home.home().join("broker.json"), info.to_string()).unwrap();
    let output = home
        .cmd(&["send", "bob", "secret plans", "--no-response"])
        .env("SYNAPSE_CLIENT_TIMEOUT_MS", "5000")
        .output()
        .unwrap();
    // Refused, and said; the CLI then starts a broker of its own, which knows no bob.
    assert!(stderr(&output).contains(&format!("served by uid {NOBODY}")), "{}", describe(&output));
    assert!(stderr(&output).contains("No agent found matching 'bob'"), "{}", describe(&output));
    fake.assert_got_nothing("the other user's listener");
}

/// A listener of another user (python3, `setup` binds `s` and prints its ready line): it counts
/// the bytes each connection sends it.
struct FakeListener {
    child: std::process::Child,
    lines: std::io::BufReader<std::process::ChildStdout>,
}

impl FakeListener {
    /// Starts it; its ready line.
    fn start(setup: &str) -> (FakeListener, String) {
        let script = format!(
            "{setup}total = 0\n\
             s.settimeout(15)\n\
             try:\n\
             \x20   while True:\n\
             \x20       c, _ = s.accept(); c.settimeout(2)\n\
             \x20       try:\n\
             \x20           total += len(c.recv(65536))\n\
             \x20       except Exception:\n\
             \x20           pass\n\
             \x20       print('received', total, flush=True)\n\
             except Exception:\n\
             \x20   pass\n"
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        std::io::BufRead::read_line(&mut lines, &mut ready).unwrap();
        (FakeListener { child, lines }, ready)
    }

    /// Stops it and checks that no connection sent it a byte.
    fn assert_got_nothing(mut self, what: &str) {
        let _ = self.child.kill();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.lines, &mut rest);
        let _ = self.child.wait();
        assert!(
            !rest.lines().any(|line| line.starts_with("received") && line != "received 0"),
            "{what} got bytes: {rest}"
        );
    }
}

/// Starts the broker (a first command autostarts it) with these variables in its environment.
fn start_broker_with(home: &Home, env: &[(&str, &str)]) {
    let started = home.cmd(&["list"]).envs(env.iter().copied()).output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
}

fn my_uid() -> u32 {
    synapse::private_files::my_uid()
}

/// Another user's process on this machine reaches the broker's loopback port but not its data:
/// with auth off it is refused (403), agent cards stay open (issue 12; needs root to act as
/// another user).
#[test]
fn another_users_process_is_refused_over_loopback_tcp() {
    if my_uid() != 0 {
        eprintln!("SKIPPED: needs root to run a process as another user");
        return;
    }
    let home = Home::new();
    home.ok(&["list"]);
    let port = broker_port(&home);
    let script = format!(
        "import os, socket, encodings.idna\n\
         os.setgid(65534); os.setuid(65534)\n\
         for method, path in [('GET', '/events'), ('GET', '/.well-known/agent-card.json'), ('POST', '/external-replies/tasks/send'), ('GET', '/broker/health')]:\n\
         \x20   s = socket.create_connection(('127.0.0.1', {port}))\n\
         \x20   s.sendall((method + ' ' + path + ' HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Type: application/json\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\n{{}}').encode())\n\
         \x20   answer = b''\n\
         \x20   while True:\n\
         \x20       chunk = s.recv(65536)\n\
         \x20       if not chunk: break\n\
         \x20       answer += chunk\n\
         \x20   print(path, answer.split(b'\\r\\n')[0].decode(), flush=True)\n\
         \x20   print(answer.decode(errors='replace').split('\\r\\n\\r\\n', 1)[-1][:300], flush=True)\n"
    );
    let output = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{shown} {}", String::from_utf8_lossy(&output.stderr));
    assert!(shown.contains("/events HTTP/1.1 403"), "{shown}");
    assert!(shown.contains("another user"), "{shown}");
    assert!(!shown.contains("/.well-known/agent-card.json HTTP/1.1 403"), "cards stay open: {shown}");
    // An open route that takes a body is not for other users (refused before the body is read).
    assert!(shown.contains("/external-replies/tasks/send HTTP/1.1 403"), "{shown}");
    // The broker's health says it is up, not where the user's home is nor its pid.
    let home_path = home.home().display().to_string();
    assert!(shown.contains("/broker/health HTTP/1.1 200"), "{shown}");
    let health = shown.split("/broker/health HTTP/1.1 200").nth(1).unwrap().lines().nth(1).unwrap();
    let health: Value = serde_json::from_str(health).unwrap_or_else(|_| panic!("{shown}"));
    assert_eq!(health["healthy"], true, "{health}");
    assert!(health["version"].is_string() && health.get("pid").is_none() && health.get("home").is_none(), "{health}");
    assert!(!shown.contains(&home_path), "{shown}");
    // The user's own TCP calls are served as before.
    let (status, _) = http_tcp(port, "GET", "/agents", None, &[]);
    assert_eq!(status, 200);
    let (status, health) = http_tcp(port, "GET", "/broker/health", None, &[]);
    assert_eq!((status, health["home"].as_str()), (200, Some(home_path.as_str())), "{health}");
}

/// Sends `count` pipelined `GET path` requests and reads the first answer's status line only:
/// the server then goes on answering into buffers nobody reads, and soon can write no more.
fn ask_and_never_read(stream: &mut (impl Read + Write), path: &str, count: usize) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.repeat(count).as_bytes()).unwrap();
    let mut status = [0u8; 12];
    stream.read_exact(&mut status).unwrap();
    assert_eq!(&status, b"HTTP/1.1 200", "{path}");
}

/// A client that asks for answers and never reads them cannot keep the broker from stopping:
/// once it stops, a connection gets `SYNAPSE_HTTP_CLOSING_GRACE_MS` (5 s) to finish its answer
/// and is then dropped (here: the 34 KB dashboard script asked for 300 times, on the broker's
/// socket; every server of the broker, its TCP port and the agents' ports too, closes its
/// connections the same way).
#[test]
fn a_client_that_never_reads_its_answers_cannot_keep_the_broker_from_stopping() {
    let home = Home::new();
    home.register(Some("bob"));
    let pid = home.broker_pid().expect("a broker is running");
    let mut socket = unix(&home);
    ask_and_never_read(&mut socket, "/dashboard/app.js", 300);
    let stopped = home.run(&["broker", "stop"]);
    assert!(stopped.status.success(), "{}", describe(&stopped));
    wait_until_dead(pid);
    drop(socket);
}

/// A broker whose connections get ten minutes to close once it stops, with one message queued
/// for `bob` and a client on its socket that asked for answers and never reads them: the agent,
/// the broker's pid and that client's connection.
fn held_by_a_client_that_never_reads(home: &Home) -> (Agent, u32, std::os::unix::net::UnixStream) {
    start_broker_with(home, &[("SYNAPSE_HTTP_CLOSING_GRACE_MS", "600000")]);
    let agent = home.register(Some("bob"));
    home.ok(&["send", &agent.id, "before the stop", "--no-response"]);
    let pid = home.broker_pid().expect("a broker is running");
    let mut socket = unix(home);
    ask_and_never_read(&mut socket, "/dashboard/app.js", 300);
    (agent, pid, socket)
}

/// A second SIGTERM while the broker stops ends it at once, without the grace the first one
/// gives connections (here ten minutes, and a client that never reads its answers); what was
/// acknowledged before is in the log the next broker opens.
#[test]
fn a_second_signal_while_the_broker_stops_ends_it_at_once() {
    let home = Home::new();
    let (agent, pid, socket) = held_by_a_client_that_never_reads(&home);
    kill(pid, libc::SIGTERM);
    // It removes broker.json as soon as it begins to stop, then waits for the connection.
    wait_until("the broker to begin stopping", || !home.home().join("broker.json").exists());
    assert!(is_alive(pid), "the first signal let the broker stop before its connection closed");
    kill(pid, libc::SIGTERM);
    wait_until_dead(pid);
    drop(socket);
    assert_eq!(home.inbox(&agent).len(), 1, "the message sent before the stop is still queued");
}

/// `synapse broker stop` ends a broker that accepted the stop and then did not end (here a
/// client that never reads its answers, with the closing grace set to ten minutes): after its
/// wait it signals the broker, which ends at once. It used to say "did not stop within 20 s" and
/// leave the broker running, its home unusable, until a `kill` by hand.
#[test]
fn broker_stop_signals_a_broker_that_accepted_the_stop_but_did_not_end() {
    let home = Home::new();
    let (agent, pid, socket) = held_by_a_client_that_never_reads(&home);
    let stopped = home.run(&["broker", "stop"]);
    assert!(stopped.status.success(), "{}", describe(&stopped));
    assert!(stderr(&stopped).contains("SIGTERM"), "{}", describe(&stopped));
    wait_until_dead(pid);
    drop(socket);
    assert_eq!(home.inbox(&agent).len(), 1, "the message sent before the stop is still queued");
}

/// A file lock waited for while the broker stops ends with a clear error, and the broker stops:
/// the wait tried the lock again at once, over and over (a core busy), until its deadline (here
/// 15 minutes), and the broker could not exit meanwhile.
#[test]
fn a_lock_waited_for_while_the_broker_stops_ends_and_lets_it_stop() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let lock = |agent: &str, extra: &[&str]| {
        let mut command = home.cmd(&[&["file-safety", "lock", "/shared/stop.lock", agent][..], extra].concat());
        command.env("SYNAPSE_FILE_SAFETY_ENABLED", "true");
        command
    };
    let held = lock(&alice.id, &["--duration", "600"]).output().unwrap();
    assert!(held.status.success(), "{}", describe(&held));
    let pid = home.broker_pid().expect("a broker is running");
    let waiter = lock(&bob.id, &["--wait", "--wait-timeout", "900"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its request is on its way once it holds a connection (a socket among its descriptors).
    let waiter_pid = waiter.id();
    wait_until("the waiter to connect", || {
        std::fs::read_dir(format!("/proc/{waiter_pid}/fd")).is_ok_and(|fds| {
            fds.filter_map(Result::ok)
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|to| to.to_string_lossy().starts_with("socket:")))
        })
    });
    let stopped = home.run(&["broker", "stop"]);
    assert!(stopped.status.success(), "{}", describe(&stopped));
    wait_until_dead(pid);
    let waited = output_within(waiter, DEADLINE, "the waiting lock");
    assert!(!waited.status.success(), "{}", describe(&waited));
    assert!(stderr(&waited).contains("stop"), "{}", describe(&waited));
}

/// Reads as long as the history freed what they built on pool threads, and glibc kept it in
/// those threads' arenas: the broker's RSS stayed at its peak for good (a soak: 76 → 161 MB
/// after two minutes of history reads, no lower once idle; `malloc_trim` brought a copy of its
/// home from 80 to 38 MB). The broker's sweep now hands it back within seconds of such a read
/// (that it lowers the RSS is measured, tools/README.md; here, that the sweep runs after one).
#[test]
fn the_broker_hands_back_what_long_reads_freed() {
    let home = Home::new();
    // The first command starts the broker, with its log at debug level.
    start_broker_with(&home, &[("SYNAPSE_LOG", "warn,synapse=debug")]);
    let log = home.home().join("broker.log");
    let handed_back = || {
        std::fs::read_to_string(&log).unwrap_or_default().matches("free memory handed back after long reads").count()
    };
    // A history read is one that runs on a blocking thread (`long_read`).
    home.ok(&["history", "list"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while handed_back() == 0 {
        assert!(
            Instant::now() < deadline,
            "no sweep after a long read:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each message longer than the threshold leaves a file under `messages/<agent>/` for the CLI to
/// read; they stayed for good (a soak: 2,400 files an hour). The broker removes those last
/// changed more than `SYNAPSE_MESSAGE_FILE_DAYS` (7) days ago, and follows no link doing it.
#[test]
fn long_message_files_go_after_a_week_and_nothing_else_does() {
    let home = Home::new();
    let agent = home.home().join("messages/synapse-dummy-8123");
    std::fs::create_dir_all(&agent).unwrap();
    let aged = |path: &Path, days: u64| {
        std::fs::write(path, "a long message").unwrap();
        let then = std::time::SystemTime::now() - Duration::from_secs(days * 86_400);
        std::fs::File::options().write(true).open(path).unwrap().set_modified(then).unwrap();
    };
    let old = agent.join("12-abcdef01.txt");
    let recent = agent.join("13-abcdef02.txt");
    aged(&old, 8);
    aged(&recent, 6);
    // A link in messages/ to a directory elsewhere: what it names is never looked at.
    let elsewhere = home.dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let kept = elsewhere.join("old.txt");
    aged(&kept, 30);
    std::os::unix::fs::symlink(&elsewhere, home.home().join("messages/link")).unwrap();

    home.ok(&["list"]); // starts the broker, which looks at start
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.exists() {
        assert!(Instant::now() < deadline, "a file of 8 days is still there");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(recent.exists(), "a file of 6 days went");
    assert!(kept.exists(), "a file behind a link went");
}
