//! Test harness: each test gets its own SYNAPSE_HOME and SYNAPSE_UDS_DIR in a temporary
//! directory, runs the real `synapse` binary, and stops its broker when dropped.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_synapse");

pub struct Home {
    pub dir: tempfile::TempDir,
    /// The SYNAPSE_HOME's own directory when it is not `dir/home` ([`Home::new_in`]).
    home_dir: Option<tempfile::TempDir>,
}

pub struct Agent {
    pub id: String,
    pub secret: String,
    pub port: u16,
    pub socket: PathBuf,
}

impl Home {
    pub fn new() -> Home {
        // A short base keeps socket paths under the 108-byte limit of sun_path.
        let dir = tempfile::Builder::new().prefix("syn").tempdir_in("/tmp").unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        // Tests' receivers and peers listen on 127.0.0.1: allow private outgoing targets in this
        // home, as `SYNAPSE_OUTBOUND_ALLOW_PRIVATE=true synapse broker start` would.
        std::fs::write(dir.path().join("home/broker-settings.json"), r#"{"outbound_allow_private": true}"#).unwrap();
        Home { dir, home_dir: None }
    }

    /// A home whose SYNAPSE_HOME lies under `base` (the sockets stay under /tmp): for what
    /// depends on the directories above the home (Gemini reads a settings file there only when
    /// root owns every one of them, which /tmp is not).
    pub fn new_in(base: &Path) -> Home {
        let mut home = Home::new();
        std::fs::create_dir_all(base).unwrap();
        let home_dir = tempfile::Builder::new().prefix("home").tempdir_in(base).unwrap();
        std::fs::create_dir_all(home_dir.path().join("home")).unwrap();
        std::fs::copy(
            home.dir.path().join("home/broker-settings.json"),
            home_dir.path().join("home/broker-settings.json"),
        )
        .unwrap();
        home.home_dir = Some(home_dir);
        home
    }

    pub fn home(&self) -> PathBuf {
        self.home_dir.as_ref().unwrap_or(&self.dir).path().join("home")
    }

    pub fn uds(&self) -> PathBuf {
        self.dir.path().join("uds")
    }

    pub fn socket(&self) -> PathBuf {
        self.uds().join("broker.sock")
    }

    /// A `synapse` command in this home, with no agent identity inherited.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("SYNAPSE_HOME", self.home())
            .env("SYNAPSE_UDS_DIR", self.uds())
            .env("SYNAPSE_BROKER_PORT", "0")
            .env_remove("SYNAPSE_AGENT_ID")
            .env_remove("SYNAPSE_AGENT_SECRET")
            .stdin(Stdio::null());
        command
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs as `agent` (its id and secret in the environment, as inside a wrapped CLI).
    pub fn run_as(&self, agent: &Agent, args: &[&str]) -> Output {
        self.cmd(args).env("SYNAPSE_AGENT_ID", &agent.id).env("SYNAPSE_AGENT_SECRET", &agent.secret).output().unwrap()
    }

    /// Runs and expects success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(output.status.success(), "synapse {args:?} failed: {}", describe(&output));
        String::from_utf8(output.stdout).unwrap()
    }

    /// Registers an agent through the contract (pid: this test process, any free port). The
    /// test process is the registering CLI's parent, an ancestor: the broker accepts it.
    pub fn register(&self, name: Option<&str>) -> Agent {
        self.register_on(0, name)
    }

    /// Like [`Home::register`], on `port` (0: any free one).
    pub fn register_on(&self, port: u16, name: Option<&str>) -> Agent {
        let output = self.register_command(port, name).output().unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        agent_of(&serde_json::from_slice(&output.stdout).unwrap())
    }

    /// The `synapse agent register` command of [`Home::register_on`], for a test to add to
    /// (an API key, say) and run itself.
    pub fn register_command(&self, port: u16, name: Option<&str>) -> Command {
        let pid = std::process::id().to_string();
        let port = port.to_string();
        let mut args = vec!["agent", "register", "--type", "dummy", "--pid", &pid, "--port", &port];
        if let Some(name) = name {
            args.extend(["--name", name]);
        }
        self.cmd(&args)
    }

    pub fn broker_pid(&self) -> Option<u32> {
        let info: Value = serde_json::from_slice(&std::fs::read(self.home().join("broker.json")).ok()?).ok()?;
        info["pid"].as_u64().map(|pid| u32::try_from(pid).unwrap())
    }

    /// Every event in the log, as JSON.
    pub fn events(&self) -> Vec<Value> {
        self.ok(&["events", "--json"]).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    }

    pub fn head(&self) -> u64 {
        self.events().last().map_or(0, |event| event["seq"].as_u64().unwrap())
    }

    pub fn inbox(&self, agent: &Agent) -> Vec<Value> {
        let value: Value = serde_json::from_str(&self.ok(&["agent", "inbox", &agent.id])).unwrap();
        value["tickets"].as_array().unwrap().clone()
    }

    pub fn kill_broker(&self) {
        let pid = self.broker_pid().expect("a broker is running");
        kill(pid, libc::SIGKILL);
        wait_until_dead(pid);
    }

    /// An HTTP request to the broker's socket.
    pub fn http(&self, method: &str, path: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) -> (u16, Value) {
        http_unix(&self.socket(), method, path, body, headers)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if let Some(pid) = self.broker_pid() {
            let _ = self.cmd(&["broker", "stop"]).output();
            if is_alive(pid) {
                kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// The agent a registration's answer names (`agent register`, `POST /agents`).
pub fn agent_of(registration: &Value) -> Agent {
    Agent {
        id: registration["agent"]["agent_id"].as_str().unwrap().to_string(),
        secret: registration["secret"].as_str().unwrap().to_string(),
        port: u16::try_from(registration["agent"]["port"].as_u64().unwrap()).unwrap(),
        socket: PathBuf::from(registration["socket"].as_str().unwrap()),
    }
}

pub fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn kill(pid: u32, signal: i32) {
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// Sends SIGSTOP and waits until every thread of `pid` is stopped: a signal to another process
/// is delivered asynchronously, and on a loaded machine a thread already running may still
/// answer a request sent right after `kill` returns.
pub fn freeze(pid: u32) {
    kill(pid, libc::SIGSTOP);
    let started = Instant::now();
    let stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
        tasks.flatten().all(|task| {
            std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("T")
            })
        })
    };
    while !stopped() {
        assert!(started.elapsed() < Duration::from_secs(20), "process {pid} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn is_alive(pid: u32) -> bool {
    #[allow(unsafe_code)]
    let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    alive
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')).unwrap_or(false))
            .unwrap_or(true)
}

/// Waits for a process to end; the broker is not our child, so this watches /proc.
/// Waits until `done` holds, or fails naming `what`.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_until_dead(pid: u32) {
    let started = Instant::now();
    while is_alive(pid) {
        assert!(started.elapsed() < Duration::from_secs(20), "process {pid} did not end");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `path` accepts connections (a broker started in the foreground by a test).
pub fn wait_for_socket(path: &Path, child: &mut std::process::Child) {
    let started = Instant::now();
    while UnixStream::connect(path).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(stderr) = child.stderr.as_mut() {
                let _ = stderr.read_to_string(&mut err);
            }
            panic!("broker exited early ({status}): {err}");
        }
        assert!(started.elapsed() < Duration::from_secs(20), "broker socket never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_response(stream: impl Read) -> (u16, Value) {
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status: u16 = status_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut length = None;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = Some(value.trim().parse::<usize>().unwrap());
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if let Some(length) = length {
        body.resize(length, 0);
        reader.read_exact(&mut body).unwrap();
    } else if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        reader.read_to_end(&mut body).unwrap();
    }
    (status, serde_json::from_slice(&body).unwrap_or(Value::String(String::from_utf8_lossy(&body).into_owned())))
}

fn write_request(stream: &mut impl Write, method: &str, path: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or(b"");
    head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (e.g. 413) before reading a large body; a broken pipe then is fine.
    let _ = stream.write_all(body);
}

pub fn http_unix(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut stream = UnixStream::connect(socket).unwrap();
    write_request(&mut stream, method, path, body, headers);
    read_response(stream)
}

pub fn http_tcp(port: u16, method: &str, path: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write_request(&mut stream, method, path, body, headers);
    read_response(stream)
}
pub mod clis;

/// Waits for `child`'s output, killing it (SIGKILL) and failing the test when it runs past
/// `deadline`: a hung client script must not hang the suite.
pub fn output_within(child: std::process::Child, deadline: std::time::Duration, what: &str) -> Output {
    let pid = child.id();
    let (sender, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match finished.recv_timeout(deadline) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            kill(pid, libc::SIGKILL);
            panic!("{what} did not finish within {deadline:?}");
        }
    }
}

// ---- a local HTTP receiver (webhooks, A2A push notifications) ----

/// One request the receiver got.
pub struct Received {
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub answered: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// A local HTTP server answering every request with the current `status`.
pub fn receiver(status: std::sync::Arc<std::sync::atomic::AtomicU16>) -> (u16, std::sync::mpsc::Receiver<Received>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
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
            let answered = status.load(std::sync::atomic::Ordering::SeqCst);
            let _ = write!(stream, "HTTP/1.1 {answered} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let body = String::from_utf8(body).unwrap();
            if sender.send(Received { headers, body, answered }).is_err() {
                break;
            }
        }
    });
    (port, received)
}

/// The broker's TCP port, from its `broker.json`.
pub fn broker_port(home: &Home) -> u16 {
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(home.home().join("broker.json")).unwrap()).unwrap();
    u16::try_from(info["port"].as_u64().unwrap()).unwrap()
}

/// `synapse mcp` driven over raw JSON-RPC lines, past its handshake; killed when dropped.
pub struct McpSession {
    server: std::process::Child,
    input: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl McpSession {
    /// Starts `command` (a `synapse mcp`, with the environment the test wants) and initializes.
    pub fn start(command: &mut Command) -> McpSession {
        let mut server = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let input = server.stdin.take().unwrap();
        let lines = BufReader::new(server.stdout.take().unwrap()).lines();
        let mut session = McpSession { server, input, lines };
        session.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
        session.answer_to(1);
        session.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        session
    }

    pub fn send(&mut self, message: Value) {
        writeln!(self.input, "{message}").unwrap();
    }

    /// [`McpSession::answer_to`], the server killed (and the test failed) if no answer comes
    /// within `deadline`.
    pub fn answer_within(&mut self, id: u64, deadline: std::time::Duration) -> Value {
        let pid = self.server.id();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if wait.recv_timeout(deadline) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                kill(pid, libc::SIGKILL);
            }
        });
        let answer = self.answer_to(id);
        drop(done);
        watchdog.join().unwrap();
        answer
    }

    /// One line as it is (what `serde_json` would not write, say).
    pub fn send_raw(&mut self, line: &str) {
        writeln!(self.input, "{line}").unwrap();
    }

    /// The server's standard error, when the command piped it.
    pub fn take_stderr(&mut self) -> std::process::ChildStderr {
        self.server.stderr.take().expect("the command pipes standard error")
    }

    /// The answer to request `id` (what comes before it is skipped).
    pub fn answer_to(&mut self, id: u64) -> Value {
        loop {
            let line = self.lines.next().expect("the server answers").unwrap();
            let value: Value = serde_json::from_str(&line).unwrap();
            if value["id"] == id {
                return value;
            }
        }
    }
}

impl Drop for McpSession {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}
