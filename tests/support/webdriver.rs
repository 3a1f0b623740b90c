//! A small WebDriver client for the dashboard's browser tests: headless Chromium driven by the
//! system's chromedriver over the W3C WebDriver protocol (JSON over HTTP/1.1 on loopback), with
//! blocking std sockets — no crate for it: a handful of commands is all the tests need.
//!
//! Which browser: `SYNAPSE_CHROMIUM` / `SYNAPSE_CHROMEDRIVER`, else `/usr/bin/chromium` and
//! `/usr/bin/chromedriver` (Debian's `chromium` and `chromium-driver` packages), else the first
//! on PATH. Missing: [`Browser::start`] prints one `SKIPPED:` line and answers None, except
//! under `CI=true`, where it fails the test.
//!
//! Shared with `tools/synapse-bench` (the `dashboard` scenario), so it needs nothing beyond the
//! crate's own dependencies.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest the driver may take to come up, and any DOM condition to become true.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    /// The browser's fresh profile (`--user-data-dir`), removed on drop.
    profile: PathBuf,
}

fn find(variable: &str, system: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(variable) {
        return Some(PathBuf::from(path));
    }
    if Path::new(system).exists() {
        return Some(PathBuf::from(system));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|dir| names.iter().map(move |name| dir.join(name))).find(|p| p.exists())
}

#[allow(unsafe_code)]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port()
}

/// One HTTP/1.1 request to the driver; the status and the JSON body.
fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<(u16, Value)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let body = body.map(|body| body.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status: u16 = status_line.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let mut chunked = false;
    let mut length = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if line.starts_with("transfer-encoding:") && line.contains("chunked") {
            chunked = true;
        }
        if let Some(value) = line.strip_prefix("content-length:") {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let mut raw = Vec::new();
    match length {
        Some(length) => {
            raw.resize(length, 0);
            reader.read_exact(&mut raw)?;
        }
        None => {
            reader.read_to_end(&mut raw)?;
        }
    }
    let body = if chunked { dechunk(&raw) } else { raw };
    Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap_or("0").trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = end + 2;
        body.extend_from_slice(&raw[start..(start + size).min(raw.len())]);
        raw = &raw[(start + size + 2).min(raw.len())..];
    }
    body
}

/// Standard base64 (screenshots come as base64 PNG).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        })
    };
    let digits: Vec<u32> = text.bytes().filter_map(value).collect();
    let mut bytes = Vec::with_capacity(digits.len() * 3 / 4);
    for group in digits.chunks(4) {
        let mut n = 0u32;
        for (index, digit) in group.iter().enumerate() {
            n |= digit << (18 - 6 * index);
        }
        let count = group.len().saturating_sub(1);
        for index in 0..count {
            bytes.push(((n >> (16 - 8 * index)) & 0xff) as u8);
        }
    }
    bytes
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, or None (skipped) when the machine
    /// has no Chromium — a failure under `CI=true`.
    pub fn start(test: &str) -> Option<Browser> {
        let chromium =
            find("SYNAPSE_CHROMIUM", "/usr/bin/chromium", &["chromium", "chromium-browser", "google-chrome"]);
        let driver = find("SYNAPSE_CHROMEDRIVER", "/usr/bin/chromedriver", &["chromedriver"]);
        let (Some(chromium), Some(driver)) = (chromium, driver) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: headless Chromium is required under CI=true (apt-get install chromium chromium-driver)"
            );
            println!("SKIPPED: {test}: no chromium and chromedriver (apt-get install chromium chromium-driver)");
            return None;
        };
        let port = free_port();
        let driver = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
        let profile = std::env::temp_dir().join(format!("synapse-chromium-{}-{port}-{nanos}", std::process::id()));
        let mut browser = Browser { driver, port, session: String::new(), profile };
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Ok((200, status)) = request(port, "GET", "/status", None)
                && status["value"]["ready"] == true
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not come up on port {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args = vec![
            "--headless".to_string(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--hide-scrollbars".into(),
            format!("--user-data-dir={}", browser.profile.display()),
        ];
        if is_root() {
            // Chromium refuses to run its sandbox as root.
            args.push("--no-sandbox".into());
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {"binary": chromium.display().to_string(), "args": args},
        }}});
        let (status, answer) = request(port, "POST", "/session", Some(&capabilities)).unwrap();
        assert_eq!(status, 200, "cannot start a Chromium session: {answer}");
        browser.session = answer["value"]["sessionId"].as_str().unwrap().to_string();
        Some(browser)
    }

    /// A command of this session; its `value`, or the driver's error.
    pub fn try_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Value> {
        let path = format!("/session/{}{path}", self.session);
        match request(self.port, method, &path, body.as_ref()) {
            Ok((200, answer)) => Ok(answer["value"].clone()),
            Ok((_, answer)) => Err(answer["value"].clone()),
            Err(error) => Err(json!({"error": error.to_string()})),
        }
    }

    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_call(method, path, body.clone()).unwrap_or_else(|error| panic!("{method} {path} {body:?}: {error}"))
    }

    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    pub fn set_size(&self, width: u32, height: u32) {
        self.call("POST", "/window/rect", Some(json!({"width": width, "height": height})));
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) in the page.
    pub fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.call("POST", "/execute/sync", Some(json!({"script": script, "args": args})))
    }

    /// Polls `script` until it returns something other than null or false; returns that. Fails
    /// the test with `what` and the last value after [`DEADLINE`].
    pub fn wait_for(&self, what: &str, script: &str, args: Vec<Value>) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let value = self.execute(script, args.clone());
            if !value.is_null() && value != false {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `script` until `accept` takes its value; returns that value. Fails the test with
    /// `what` and the last value after [`DEADLINE`].
    pub fn wait_value(&self, what: &str, script: &str, args: Vec<Value>, accept: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let value = self.execute(script, args.clone());
            if accept(&value) {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; last: {value}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The text of an open alert, if one is open.
    pub fn alert_text(&self) -> Option<String> {
        self.try_call("GET", "/alert/text", None).ok().map(|value| value.as_str().unwrap_or_default().to_string())
    }

    /// Light or dark, as the page's `prefers-color-scheme` sees it (Chrome DevTools emulation).
    pub fn color_scheme(&self, scheme: &str) {
        self.call(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": [{"name": "prefers-color-scheme", "value": scheme}]}})),
        );
    }

    /// Saves a PNG of the viewport.
    pub fn screenshot(&self, path: &Path) {
        let data = self.call("GET", "/screenshot", None);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, base64_decode(data.as_str().unwrap())).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = request(self.port, "DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

#[cfg(test)]
#[test]
fn base64_decodes_padding_and_groups() {
    assert_eq!(base64_decode("TWFu"), b"Man");
    assert_eq!(base64_decode("TWE="), b"Ma");
    assert_eq!(base64_decode("TQ=="), b"M");
}
