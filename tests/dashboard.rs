//! The web dashboard (issue 17): served by the broker at `/`, live from the event log, acting
//! through the same API and rules as the CLI. One test drives a real headless Chromium through
//! chromedriver ([`webdriver`]); the others check the HTTP rules without a browser.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "support/webdriver.rs"]
mod webdriver;

use common::*;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use webdriver::Browser;

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port()
}

/// A home whose broker always listens on the same TCP port, so that the page (whose origin
/// names the port) can reconnect after the broker restarts.
struct FixedPortHome {
    home: Home,
    port: u16,
}

impl FixedPortHome {
    fn new() -> FixedPortHome {
        FixedPortHome { home: Home::new(), port: free_port() }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut command = self.home.cmd(args);
        command.env("SYNAPSE_BROKER_PORT", self.port.to_string());
        command
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.cmd(args).output().unwrap();
        assert!(output.status.success(), "synapse {args:?}: {}", describe(&output));
        String::from_utf8(output.stdout).unwrap()
    }

    /// Starts a background dummy agent; what `synapse start --json` announced.
    fn start_dummy(&self, name: &str, env: &[(&str, &str)]) -> Value {
        let mut command = self.cmd(&["start", "dummy", "--name", name, "--json"]);
        for (key, value) in env {
            command.env(key, value);
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        serde_json::from_slice(&output.stdout).unwrap()
    }
}

/// Stops the agents' wrappers when the test ends, whatever happens.
struct Wrappers<'a>(&'a FixedPortHome, Vec<String>);

impl Drop for Wrappers<'_> {
    fn drop(&mut self) {
        for agent in &self.1 {
            let _ = self.0.cmd(&["stop", agent]).output();
        }
    }
}

fn id(agent: &Value) -> String {
    agent["agent_id"].as_str().unwrap().to_string()
}

/// Waits until the agent's terminal log contains `text`.
fn wait_for_terminal(agent: &Value, text: &str) {
    let log = PathBuf::from(agent["log"].as_str().unwrap());
    let deadline = Instant::now() + webdriver::DEADLINE;
    loop {
        let screen = std::fs::read_to_string(&log).unwrap_or_default();
        if screen.contains(text) {
            return;
        }
        assert!(Instant::now() < deadline, "{} never showed {text:?}:\n{screen}", id(agent));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The state badge of the message row whose text is `arguments[0]` (null while there is none).
const MESSAGE_STATE: &str = "const row = Array.from(document.querySelectorAll('#messages .msg'))
    .find((r) => r.querySelector('.text').textContent === arguments[0]);
  return row ? row.querySelector('.state').textContent : null;";

/// The status shown on the card of agent `arguments[0]`.
const CARD_STATUS: &str = "const card = document.querySelector(`.card[data-agent=\"${arguments[0]}\"]`);
  return card ? card.querySelector('.status').textContent : null;";

fn wait_card(browser: &Browser, what: &str, agent: &str, status: &str) {
    browser.wait_value(what, CARD_STATUS, vec![json!(agent)], |value| value == status);
}

/// Waits for the row of the message `text`, in one of `states` (any state when empty).
fn wait_message(browser: &Browser, what: &str, text: &str, states: &[&str]) {
    browser.wait_value(what, MESSAGE_STATE, vec![json!(text)], |value| {
        !value.is_null() && (states.is_empty() || states.iter().any(|state| value == state))
    });
}

fn screenshots_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots")
}

#[test]
fn the_dashboard_follows_agents_and_messages_live_shows_hostile_text_as_text_acts_as_the_user_and_resumes_after_a_restart()
 {
    let Some(browser) = Browser::start("dashboard in Chromium") else { return };
    eprintln!("step: browser up");
    let home = FixedPortHome::new();
    // bob answers each :R message after 4 s, busy (PROCESSING) meanwhile.
    let bob = home.start_dummy("bob", &[("SYNAPSE_DUMMY_AUTO_REPLY", "1"), ("SYNAPSE_DUMMY_REPLY_DELAY_MS", "4000")]);
    let alice = home.start_dummy("alice", &[]);
    let _wrappers = Wrappers(&home, vec![id(&alice), id(&bob)]);
    let url = home.ok(&["dashboard"]).trim().to_string();
    page_key_in(&url, home.port);

    browser.set_size(1280, 1000);
    eprintln!("step: open the printed address");
    browser.goto(&url);
    for agent in [&alice, &bob] {
        wait_card(&browser, &format!("{} READY on its card", id(agent)), &id(agent), "READY");
    }
    assert_eq!(browser.execute("return document.querySelectorAll('#agents .card').length", vec![]), 2);

    // A send from the CLI appears without a reload, and the target's status changes.
    home.ok(&["send", "bob", "question one", "--response"]);
    wait_message(&browser, "the CLI's message on the page", "question one", &[]);
    wait_card(&browser, "bob PROCESSING", &id(&bob), "PROCESSING");
    wait_message(&browser, "bob's reply", "question one", &["replied"]);
    wait_card(&browser, "bob READY again", &id(&bob), "READY");

    // Hostile text is shown as text: no element made of it, no script run.
    let hostile = "<img src=x onerror=alert(1)>";
    home.ok(&["send", "alice", hostile]);
    wait_message(&browser, "the hostile message as text", hostile, &[]);
    browser.execute(
        "Array.from(document.querySelectorAll('#messages .msg')).find((r) => r.querySelector('.text').textContent === arguments[0]).click()",
        vec![json!(hostile)],
    );
    browser.wait_for(
        "the hostile message's thread",
        "return document.getElementById('thread').textContent.includes(arguments[0])",
        vec![json!(hostile)],
    );
    assert_eq!(browser.alert_text(), None, "no alert may open");
    assert_eq!(browser.execute("return document.querySelectorAll('img').length", vec![]), 0, "no img element");

    // A message sent from the page reaches the agent's terminal.
    browser.execute(
        "document.getElementById('send-to').value = arguments[0];
         document.getElementById('send-text').value = arguments[1];
         document.querySelector('#send-form button').click();",
        vec![json!(id(&alice)), json!("hello from the page")],
    );
    wait_for_terminal(&alice, "hello from the page");
    // Written, then completed (it asks for no reply).
    wait_message(&browser, "the page's message in the list", "hello from the page", &["written", "completed"]);

    // The page acts as the user: it cancels a message the user sent from the CLI (which an
    // anonymous caller may not), queued behind bob's next question.
    home.ok(&["send", "bob", "question two", "--response"]);
    wait_card(&browser, "bob busy again", &id(&bob), "PROCESSING");
    home.ok(&["send", "bob", "cancel me"]);
    wait_message(&browser, "the queued message", "cancel me", &["queued"]);
    browser.execute(
        "Array.from(document.querySelectorAll('#messages .msg')).find((r) => r.querySelector('.text').textContent === arguments[0]).click();
         document.getElementById('thread-cancel').click();",
        vec![json!("cancel me")],
    );
    wait_message(&browser, "the canceled message", "cancel me", &["canceled"]);
    assert!(browser.execute("return document.getElementById('error').hidden", vec![]) == true, "no error shown");

    // File locks and who holds them, live.
    let file = home.home.dir.path().join("shared.rs");
    let file = file.to_str().unwrap();
    let locked = home
        .cmd(&["file-safety", "lock", file, &id(&alice)])
        .env("SYNAPSE_FILE_SAFETY_ENABLED", "true")
        .output()
        .unwrap();
    assert!(locked.status.success(), "{}", describe(&locked));
    browser.wait_value("the lock on the page", "return document.getElementById('locks').textContent", vec![], |v| {
        v.as_str().is_some_and(|text| text.contains(file) && text.contains("alice"))
    });

    // Screenshots: wide and narrow, light and dark (look at them: target/dashboard-screenshots).
    for (width, label) in [(1280, "wide"), (400, "narrow")] {
        browser.set_size(width, 1000);
        for scheme in ["light", "dark"] {
            browser.color_scheme(scheme);
            browser.execute(
                "return new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))",
                vec![],
            );
            browser.screenshot(&screenshots_dir().join(format!("{label}-{scheme}.png")));
        }
    }
    browser.color_scheme("light");
    browser.set_size(1280, 1000);

    let unlocked = home
        .cmd(&["file-safety", "unlock", file, &id(&alice)])
        .env("SYNAPSE_FILE_SAFETY_ENABLED", "true")
        .output()
        .unwrap();
    assert!(unlocked.status.success(), "{}", describe(&unlocked));
    browser.wait_value("the lock gone", "return document.getElementById('locks').textContent", vec![], |v| {
        v == "no file is locked"
    });
    // A lock that expires leaves the list at its expiry (no event says so). The page has
    // applied its event once it shows the log's head at the time (the lock may have expired by
    // then, on a loaded machine: what counts is that it goes).
    let brief = home
        .cmd(&["file-safety", "lock", file, &id(&alice), "--duration", "2"])
        .env("SYNAPSE_FILE_SAFETY_ENABLED", "true")
        .output()
        .unwrap();
    assert!(brief.status.success(), "{}", describe(&brief));
    let head = home.home.head();
    browser.wait_value(
        "the page at the lock's event",
        "return Number(document.getElementById('head').textContent.replace('event ', ''))",
        vec![],
        |v| v.as_u64().is_some_and(|seq| seq >= head),
    );
    // The list is drawn at the next frame: only what is drawn after the event counts.
    browser.execute("return new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))", vec![]);
    browser.wait_value("the brief lock expired", "return document.getElementById('locks').textContent", vec![], |v| {
        v == "no file is locked"
    });

    // The filter by agent keeps the messages from or to that agent.
    let message_texts =
        "return Array.from(document.querySelectorAll('#messages .msg .text')).map((t) => t.textContent)";
    let set_filter = "const f = document.getElementById('message-filter'); f.value = arguments[0]; \
                      f.dispatchEvent(new Event('change'));";
    browser.execute(set_filter, vec![json!(id(&alice))]);
    browser.wait_value("only alice's messages", message_texts, vec![], |texts| {
        let texts: Vec<&str> = texts.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        texts.contains(&"hello from the page") && !texts.iter().any(|text| text.starts_with("question"))
    });
    browser.execute(set_filter, vec![json!("")]);
    browser.wait_value("every message again", message_texts, vec![], |texts| {
        let texts: Vec<&str> = texts.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        texts.contains(&"hello from the page") && texts.contains(&"question one")
    });

    // History search finds the messages by their words.
    browser.execute(
        "document.getElementById('search-input').value = 'question'; document.getElementById('search-form').requestSubmit();",
        vec![],
    );
    browser.wait_value(
        "the history search's records",
        "return document.getElementById('search-results').textContent",
        vec![],
        |v| {
            v.as_str().is_some_and(|text| {
                text.contains("question one") && text.contains("question two") && !text.contains("hello from the page")
            })
        },
    );

    // The broker restarts: the page resumes from the last event it applied, without duplicates.
    home.ok(&["broker", "stop"]);
    browser.wait_for(
        "the page to notice",
        "return document.getElementById('connection').dataset.state !== 'live'",
        vec![],
    );
    let shown = browser.execute(
        "return document.getElementById('error').hidden ? '' : document.getElementById('error').textContent",
        vec![],
    );
    // The stream's loss, or a refresh that found nobody listening, whichever the page saw last.
    assert!(
        shown
            .as_str()
            .is_some_and(|text| text.contains("Lost the connection to the broker") || text.contains("does not answer")),
        "the page says the broker is gone: {shown}"
    );
    home.ok(&["broker", "start"]);
    browser.wait_for(
        "the stream again",
        "return document.getElementById('connection').dataset.state === 'live'",
        vec![],
    );
    assert_eq!(
        browser.execute("return document.getElementById('error').hidden", vec![]),
        true,
        "no error once live again"
    );
    home.ok(&["send", "alice", "after the restart"]);
    wait_message(&browser, "a message after the restart", "after the restart", &[]);
    let sent = home.home.events().iter().filter(|event| event["event"]["kind"] == "message_sent").count();
    let rows = browser.execute(
        "return Array.from(document.querySelectorAll('#messages .msg .text')).map((t) => t.textContent)",
        vec![],
    );
    let rows: Vec<&str> = rows.as_array().unwrap().iter().map(|text| text.as_str().unwrap()).collect();
    assert_eq!(rows.len(), sent, "one row per message sent: {rows:?}");
    let mut unique = rows.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), rows.len(), "no message twice: {rows:?}");
    // The page key is the start's: after the restart the page reads on, and says it cannot act.
    browser.wait_for(
        "the read-only notice after the restart",
        "return !document.getElementById('read-only').hidden && document.getElementById('read-only').textContent.includes('restarted')",
        vec![],
    );
    assert_eq!(browser.execute("return document.querySelector('#send-form button').disabled", vec![]), true);
    let new_url = home.ok(&["dashboard"]).trim().to_string();
    assert_ne!(page_key_in(&new_url, home.port), page_key_in(&url, home.port), "a new key at every start");
    let seqs = browser.execute(
        "return Array.from(document.querySelectorAll('#events li')).map((li) => Number(li.textContent.split(' ')[0]))",
        vec![],
    );
    let seqs: Vec<u64> = seqs.as_array().unwrap().iter().map(|seq| seq.as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] > pair[1]), "the event log, newest first, each once: {seqs:?}");

    // The event log pages back from the newest events and comes back to them (a page is 100
    // events: these sends make the log longer than one).
    for number in 0..20 {
        home.ok(&["send", "alice", &format!("filler {number}"), "--no-response"]);
    }
    wait_message(&browser, "the last filler", "filler 19", &[]);
    let range = "return document.getElementById('events-range').textContent";
    let live =
        browser.wait_value("the newest page", range, vec![], |v| v.as_str().is_some_and(|t| t.ends_with("(live)")));
    let first_of = |range: &Value| -> u64 {
        range.as_str().and_then(|t| t.split('–').next()).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    };
    browser.execute("document.getElementById('events-older').click()", vec![]);
    let older =
        browser.wait_value("an older page", range, vec![], |v| v.as_str().is_some_and(|t| !t.ends_with("(live)")));
    assert!(first_of(&older) < first_of(&live), "older events: {older} after {live}");
    browser.execute("document.getElementById('events-newest').click()", vec![]);
    browser.wait_value("the newest page again", range, vec![], |v| v.as_str().is_some_and(|t| t.ends_with("(live)")));

    // Opened at the new address, the page acts as the user again.
    browser.goto(&new_url);
    browser.wait_for(
        "the page at the new address",
        "return document.body.dataset.ready === 'true' && document.getElementById('read-only').hidden",
        vec![],
    );
    browser.execute(
        "document.getElementById('send-to').value = arguments[0];
         document.getElementById('send-text').value = arguments[1];
         document.querySelector('#send-form button').click();",
        vec![json!(id(&alice)), json!("from the page after the restart")],
    );
    wait_for_terminal(&alice, "from the page after the restart");

    // Opened without its key (a bookmark), the page reads and says it cannot act.
    browser.goto(&format!("http://127.0.0.1:{}/", home.port));
    browser.wait_for(
        "the read-only notice",
        "return document.body.dataset.ready === 'true' && document.getElementById('read-only').textContent.includes('without its key')",
        vec![],
    );
    wait_message(&browser, "the messages, read without the key", "from the page after the restart", &[]);
    assert_eq!(browser.execute("return document.getElementById('read-only').hidden", vec![]), false);
    assert_eq!(browser.execute("return document.querySelector('#send-form button').disabled", vec![]), true);
    assert_eq!(browser.execute("return document.getElementById('thread-cancel').disabled", vec![]), true);
}

/// The page key in an address `synapse dashboard` printed, which must be the broker's page.
fn page_key_in(url: &str, port: u16) -> String {
    let key = url
        .strip_prefix(&format!("http://127.0.0.1:{port}/?key="))
        .unwrap_or_else(|| panic!("not the dashboard's address with its key: {url}"));
    assert!(key.len() == 64 && key.bytes().all(|byte| byte.is_ascii_hexdigit()), "{url}");
    key.to_string()
}

/// A raw request over TCP with its headers; the status, headers and body as text.
fn raw_tcp(port: u16, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    (status, answer)
}

#[test]
fn the_page_and_its_assets_carry_a_strict_content_security_policy_and_no_inline_script() {
    let home = Home::new();
    home.ok(&["broker", "start"]);
    let port = broker_port(&home);
    for (path, media) in
        [("/", "text/html"), ("/dashboard/app.js", "text/javascript"), ("/dashboard/app.css", "text/css")]
    {
        let (status, answer) =
            raw_tcp(port, &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"));
        assert_eq!(status, 200, "{path}: {answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains(&format!("content-type: {media}")), "{path}: {answer}");
        assert!(lower.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{path}: {answer}");
        assert!(!lower.contains("unsafe-inline"), "{path}");
    }
    let (_, page) = raw_tcp(port, &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"));
    assert!(!page.contains("<script>") && page.contains("<script src=\"/dashboard/app.js?v="), "{page}");
    // Its assets under this start's names (a cached copy of the plain name never runs here).
    let version = page.split("/dashboard/app.js?v=").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or("");
    assert_eq!(version.len(), 16, "{page}");
    let (status, _) = raw_tcp(
        port,
        &format!("GET /dashboard/app.js?v={version} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 200);
    // A page of another site cannot read it either: a foreign Host is a rebinding attempt.
    let (status, _) = raw_tcp(port, "GET / HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 421);
}

#[test]
fn a_post_from_a_foreign_origin_is_refused_and_the_dashboards_own_origin_acts_as_the_user() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let port = broker_port(&home);
    let send = |origin: &str, text: &str| {
        let body = json!({"to": "bob", "text": text}).to_string();
        raw_tcp(
            port,
            &format!(
                "POST /send HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let (status, answer) = send("http://evil.example", "from elsewhere");
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer.contains("\"error\"") && answer.contains("evil.example"),
        "a JSON error naming the origin: {answer}"
    );
    let (status, answer) = send(&format!("http://localhost:{}", port + 1), "from another port");
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = send(&format!("http://127.0.0.1:{port}"), "from the dashboard");
    assert_eq!(status, 200, "{answer}");
    assert!(!home.events().iter().any(|event| event["event"]["data"]["text"] == "from elsewhere"));

    // The user's message (sent from the CLI) may be canceled by the user only: over TCP without
    // the dashboard's Origin the caller is anonymous; with it and the page key, the user. The
    // Origin alone is what a page another user served on the broker's port (while the broker
    // was stopped) still has once the broker runs there: it is not the user.
    let sent: Value = serde_json::from_str(&home.ok(&["send", "bob", "user's message", "--json"])).unwrap();
    let task = sent["task"]["id"].as_str().unwrap().to_string();
    let own_origin = format!("http://127.0.0.1:{port}");
    let key = page_key_in(home.ok(&["dashboard"]).trim(), port);
    let cancel = |headers: &str| {
        raw_tcp(
            port,
            &format!(
                "POST /agents/{}/tasks/{task}/cancel HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\nContent-Length: 0\r\n\r\n",
                bob.id
            ),
        )
    };
    let (status, answer) = cancel("");
    assert_eq!(status, 403, "anonymous: {answer}");
    let (status, answer) = cancel(&format!("Origin: {own_origin}\r\n"));
    assert_eq!(status, 403, "the origin without the page key: {answer}");
    let (status, answer) = cancel(&format!("Origin: {own_origin}\r\nX-Synapse-Page-Key: {}\r\n", "0".repeat(64)));
    assert_eq!(status, 403, "a guessed page key: {answer}");
    let (status, answer) = cancel(&format!("X-Synapse-Page-Key: {key}\r\n"));
    assert_eq!(status, 403, "the key without the page's origin: {answer}");
    let (status, answer) = cancel(&format!("Origin: {own_origin}\r\nX-Synapse-Page-Key: {key}\r\n"));
    assert_eq!(status, 200, "the dashboard opened with its key: {answer}");

    // A script at the broker's origin cannot fetch the key: the route refuses any web page, and
    // any caller over TCP that is not the user.
    let fetch_key = |headers: &str| {
        raw_tcp(
            port,
            &format!(
                "GET /dashboard/page-key HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n"
            ),
        )
    };
    for headers in [
        String::new(),
        format!("Origin: {own_origin}\r\n"),
        format!("Origin: {own_origin}\r\nX-Synapse-Page-Key: {key}\r\n"),
    ] {
        let (status, answer) = fetch_key(&headers);
        assert_eq!(status, 403, "{headers}: {answer}");
        assert!(!answer.contains(&key), "{answer}");
    }
}

/// `synapse dashboard --open` hands the address to an opener, and says when that fails (xdg-open
/// with no display exits non-zero): the failure was taken for an opened page.
#[test]
fn dashboard_open_says_when_the_opener_fails() {
    use std::os::unix::fs::PermissionsExt;
    let home = Home::new();
    let opened = home.dir.path().join("opened.txt");
    // Both openers are written before anything runs (a script written while another process
    // forks may be busy to exec).
    let write_opener = |dir: &str, script: &str| {
        let bin = home.dir.path().join(dir);
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("xdg-open"), script).unwrap();
        std::fs::set_permissions(bin.join("xdg-open"), std::fs::Permissions::from_mode(0o755)).unwrap();
        bin
    };
    let failing = write_opener("failing-bin", "#!/bin/sh\necho 'no display' >&2\nexit 3\n");
    let working = write_opener("working-bin", &format!("#!/bin/sh\nprintf '%s' \"$1\" > '{}'\n", opened.display()));
    let failed = home.cmd(&["dashboard", "--open"]).env("PATH", &failing).output().unwrap();
    assert!(failed.status.success(), "{}", describe(&failed));
    let url = stdout(&failed).trim().to_string();
    assert!(
        stderr(&failed).contains("xdg-open failed") && stderr(&failed).contains(&format!("open {url} yourself")),
        "{}",
        describe(&failed)
    );

    let worked = home.cmd(&["dashboard", "--open"]).env("PATH", &working).output().unwrap();
    assert!(worked.status.success(), "{}", describe(&worked));
    assert_eq!(std::fs::read_to_string(&opened).unwrap(), stdout(&worked).trim());
    assert!(!stderr(&worked).contains("yourself"), "{}", describe(&worked));
}

/// Another home's broker comes up on the port the page follows: the page starts again from
/// that log. With a shorter log it took every event for a repeat and froze; with a longer one
/// it mixed the two logs' events.
#[test]
fn the_page_starts_again_when_another_log_answers_at_its_port() {
    let Some(browser) = Browser::start("dashboard after another log in Chromium") else { return };
    let port = free_port();
    let fill = |sends: usize, text: &str| {
        let home = FixedPortHome { home: Home::new(), port };
        home.ok(&["broker", "start"]);
        home.home.register(Some("bob"));
        for number in 0..sends {
            home.ok(&["send", "bob", &format!("{text} {number}"), "--no-response"]);
        }
        home
    };
    let first = fill(10, "first log");
    browser.goto(&format!("http://127.0.0.1:{port}/"));
    wait_message(&browser, "the first log's last message", "first log 9", &[]);
    // The page starts again in place, never by navigating: what answers at the port may be
    // another user's server, whose page would then run in this tab. A reload would drop this.
    browser.execute("window.stillTheSamePage = true;", vec![]);
    let first_head = first.home.head();
    first.ok(&["broker", "stop"]);

    let second = fill(1, "second log");
    assert!(second.home.head() < first_head, "the second log is the shorter one");
    wait_message(&browser, "the shorter log's message", "second log 0", &[]);
    assert!(browser.execute("return document.body.textContent.includes('first log 9')", vec![]) == false);
    let second_head = second.home.head();
    second.ok(&["broker", "stop"]);

    let third = fill(5, "third log");
    assert!(third.home.head() > second_head, "the third log is longer than the second");
    wait_message(&browser, "the longer log's last message", "third log 4", &[]);
    browser.wait_value(
        "the second log's message gone",
        "return document.body.textContent.includes('second log 0')",
        vec![],
        |v| v == false,
    );
    assert_eq!(browser.execute("return window.stillTheSamePage === true", vec![]), true, "the page navigated");
}

#[test]
fn with_auth_on_the_event_stream_opens_only_with_a_fresh_token_bought_with_the_key() {
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
    let port = broker_port(&home);
    // Without the API key, `synapse dashboard` gets no page key: it prints the bare address
    // (the page asks for the key) and says why.
    let bare = home.run(&["dashboard"]);
    assert!(bare.status.success(), "{}", describe(&bare));
    assert_eq!(stdout(&bare).trim(), format!("http://127.0.0.1:{port}/"));
    assert!(
        stderr(&bare).contains("read-only without its key") && stderr(&bare).contains("API key"),
        "{}",
        describe(&bare)
    );
    let get = |path: &str| {
        raw_tcp(port, &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"))
    };
    // The page itself needs no key (it asks for one); its data does.
    assert_eq!(get("/").0, 200);
    assert_eq!(get("/dashboard/state").0, 401);
    let (status, answer) = get("/events");
    assert_eq!(status, 401, "{answer}");
    let (status, answer) = get(&format!("/events?token={}", "0".repeat(64)));
    assert_eq!(status, 401, "a guessed token: {answer}");
    assert!(answer.contains("Invalid stream token"), "{answer}");
    let token_request = |key: &str| {
        raw_tcp(
            port,
            &format!(
                "POST /dashboard/stream-token HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-API-Key: {key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    let (status, answer) = token_request("wrong-key");
    assert_eq!(status, 401, "{answer}");

    // The page key passes authentication as a key does: the page opened from the address
    // `synapse dashboard` prints (with the API key in the shell) never needs the API key. A
    // guessed page key, or the real one over the Unix socket, passes nothing.
    let keyed = home.cmd(&["dashboard"]).env("SYNAPSE_API_KEY", "key-one").output().unwrap();
    assert!(keyed.status.success(), "{}", describe(&keyed));
    let page_key = page_key_in(stdout(&keyed).trim(), port);
    let with_page_key = |method: &str, path: &str, key: &str| {
        raw_tcp(
            port,
            &format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Synapse-Page-Key: {key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    let (status, answer) = with_page_key("GET", "/dashboard/state", &page_key);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"as_user\":true"), "{answer}");
    let (status, answer) = with_page_key("POST", "/dashboard/stream-token", &page_key);
    assert_eq!(status, 200, "{answer}");
    let one_off = format!("{}{}", &page_key[..63], if page_key.ends_with('0') { '1' } else { '0' });
    for guess in ["0".repeat(64), one_off, String::new()] {
        let (status, answer) = with_page_key("GET", "/dashboard/state", &guess);
        assert_eq!(status, 401, "a guessed page key {guess:?}: {answer}");
    }
    // It passes authentication, not the user's own routes: stopping the broker needs the CLI
    // or the admin key, from the page's own origin too.
    let (status, answer) = with_page_key("POST", "/broker/shutdown", &page_key);
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = raw_tcp(
        port,
        &format!(
            "POST /broker/shutdown HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\nX-Synapse-Page-Key: {page_key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(status, 403, "{answer}");
    // Nor on an agent's own port: the page is on the broker's.
    let registered = home.register_command(0, Some("bob")).env("SYNAPSE_API_KEY", "key-one").output().unwrap();
    assert!(registered.status.success(), "{}", describe(&registered));
    let agent_port = agent_of(&serde_json::from_slice(&registered.stdout).unwrap()).port;
    let (status, answer) = raw_tcp(
        agent_port,
        &format!(
            "GET /tasks HTTP/1.1\r\nHost: 127.0.0.1:{agent_port}\r\nX-Synapse-Page-Key: {page_key}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(status, 401, "the page key on an agent's port: {answer}");
    let (status, answer) = home.http("GET", "/dashboard/state", None, &[("x-synapse-page-key", &page_key)]);
    assert_eq!(status, 401, "the page key is for the browser's loopback connection: {answer}");

    let (status, answer) = token_request("key-one");
    assert_eq!(status, 200, "{answer}");
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let token: Value = serde_json::from_str(body).unwrap();
    let token = token["token"].as_str().unwrap().to_string();
    // The token opens one stream (not following, so it ends at the head) and only /events.
    let (status, answer) = get(&format!("/dashboard/state?token={token}"));
    assert_eq!(status, 401, "a token is for /events only: {answer}");
    let (status, answer) = get(&format!("/events?token={token}"));
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("text/event-stream"), "{answer}");
    let (status, _) = get(&format!("/events?token={token}"));
    assert_eq!(status, 401, "a spent token");
}

#[test]
fn with_auth_on_the_page_asks_for_the_key_shows_a_refused_one_and_streams_with_a_token() {
    let Some(browser) = Browser::start("dashboard with auth in Chromium") else { return };
    // A fixed port: the page reconnects after the broker restarts.
    let home = FixedPortHome::new();
    let with_key = |args: &[&str]| {
        let output = home
            .cmd(args)
            .env("SYNAPSE_AUTH_ENABLED", "true")
            .env("SYNAPSE_API_KEYS", "key-one")
            .env("SYNAPSE_ALLOW_LOCALHOST", "false")
            .env("SYNAPSE_API_KEY", "key-one")
            .output()
            .unwrap();
        assert!(output.status.success(), "synapse {args:?}: {}", describe(&output));
        String::from_utf8(output.stdout).unwrap()
    };
    with_key(&["broker", "start"]);
    let pid = std::process::id().to_string();
    let registered: Value = serde_json::from_str(&with_key(&[
        "agent", "register", "--type", "dummy", "--pid", &pid, "--port", "0", "--name", "bob",
    ]))
    .unwrap();
    let bob = registered["agent"]["agent_id"].as_str().unwrap().to_string();
    let url = with_key(&["dashboard"]).trim().to_string();
    let port = home.port;
    page_key_in(&url, port);
    let bare = format!("http://127.0.0.1:{port}/");

    // Opened without its page key, the page asks for the API key.
    browser.goto(&bare);
    browser.wait_value("the key form", "return !document.getElementById('key-form').hidden", vec![], |v| v == true);
    let enter_key = |key: &str| {
        browser.execute(
            "document.getElementById('key-input').value = arguments[0];
             document.getElementById('key-form').requestSubmit();",
            vec![json!(key)],
        );
    };
    enter_key("not-a-key");
    browser.wait_value("the refusal on the page", "return document.getElementById('error').textContent", vec![], |v| {
        v.as_str().is_some_and(|text| text.contains("Key refused"))
    });
    assert_eq!(browser.execute("return document.getElementById('key-form').hidden", vec![]), false);
    enter_key("key-one");
    // bob is registered without a wrapper: it stays STARTING.
    wait_card(&browser, "bob's card once the key is given", &bob, "STARTING");
    // The key stays in the page's memory: nothing in the browser's storage for whatever answers
    // at this origin next.
    assert_eq!(browser.execute("return sessionStorage.length + localStorage.length", vec![]), 0);
    browser.wait_value("the stream", "return document.getElementById('connection').dataset.state", vec![], |v| {
        v == "live"
    });
    // The stream (opened with a token, not the key) brings a new message without a reload.
    with_key(&["send", "bob", "seen through the token stream"]);
    wait_message(&browser, "the message", "seen through the token stream", &[]);
    // A refused send says why on the page.
    browser.execute(
        "const select = document.getElementById('send-to');
         const option = document.createElement('option');
         option.value = 'nobody';
         option.textContent = 'nobody';
         select.append(option);
         select.value = 'nobody';
         document.getElementById('send-text').value = 'hello?';
         document.querySelector('#send-form button').click();",
        vec![],
    );
    browser.wait_value("the refusal", "return document.getElementById('error').textContent", vec![], |v| {
        v.as_str().is_some_and(|text| text.starts_with("Send refused: 404") && text.contains("nobody"))
    });
    // The broker stops: the page forgets the key (another user's server may answer at this
    // origin next), and asks for it again once the broker is back.
    with_key(&["broker", "stop"]);
    browser.wait_value("the stream lost", "return document.getElementById('connection').dataset.state", vec![], |v| {
        v != "live"
    });
    with_key(&["broker", "start"]);
    browser.wait_value(
        "the key form after a restart",
        "return !document.getElementById('key-form').hidden",
        vec![],
        |v| v == true,
    );
    enter_key("key-one");
    browser.wait_value("the stream again", "return document.getElementById('connection').dataset.state", vec![], |v| {
        v == "live"
    });
    // A reload asks again.
    browser.goto(&bare);
    browser.wait_value(
        "the key form after a reload",
        "return !document.getElementById('key-form').hidden",
        vec![],
        |v| v == true,
    );

    // Opened from the address `synapse dashboard` printed (this start's), the page key is
    // enough: no key form, and the page reads, streams and sends as the user.
    let url = with_key(&["dashboard"]).trim().to_string();
    browser.goto(&url);
    wait_card(&browser, "bob's card with the page key", &bob, "STARTING");
    browser.wait_value("the stream", "return document.getElementById('connection').dataset.state", vec![], |v| {
        v == "live"
    });
    assert_eq!(browser.execute("return document.getElementById('key-form').hidden", vec![]), true);
    browser.execute(
        "document.getElementById('send-to').value = arguments[0];
         document.getElementById('send-text').value = 'sent with the page key';
         document.querySelector('#send-form button').click();",
        vec![json!(bob)],
    );
    wait_message(&browser, "the page's send", "sent with the page key", &[]);
}

#[test]
fn synapse_dashboard_prints_the_brokers_address_and_the_event_log_pages_backwards() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    for number in 0..5 {
        home.ok(&["send", "bob", &format!("message {number}"), "--no-response"]);
    }
    let port = broker_port(&home);
    let url = home.ok(&["dashboard"]).trim().to_string();
    page_key_in(&url, port);
    let printed: Value = serde_json::from_str(&home.ok(&["dashboard", "--json"])).unwrap();
    assert_eq!(printed["url"], url.as_str());

    let head = home.head();
    let (status, newest) = home.http("GET", "/dashboard/events?limit=4", None, &[]);
    assert_eq!(status, 200, "{newest}");
    let seqs = |page: &Value| -> Vec<u64> {
        page["events"].as_array().unwrap().iter().map(|event| event["seq"].as_u64().unwrap()).collect()
    };
    assert_eq!(seqs(&newest), (head - 3..=head).collect::<Vec<_>>(), "the newest page, oldest first");
    assert_eq!(newest["head"], head);
    let (_, older) = home.http("GET", &format!("/dashboard/events?before={}&limit=4", head - 3), None, &[]);
    assert_eq!(seqs(&older), (head - 7..=head - 4).collect::<Vec<_>>());
    let (_, first) = home.http("GET", "/dashboard/events?before=3&limit=100", None, &[]);
    assert_eq!(seqs(&first), vec![1, 2]);
    let (_, none) = home.http("GET", "/dashboard/events?before=1", None, &[]);
    assert_eq!(seqs(&none), Vec::<u64>::new());
    // Forwards: the page after one shown.
    let (status, newer) = home.http("GET", &format!("/dashboard/events?after={}&limit=4", head - 8), None, &[]);
    assert_eq!(status, 200, "{newer}");
    assert_eq!(seqs(&newer), (head - 7..=head - 4).collect::<Vec<_>>(), "oldest first");
    let (_, past) = home.http("GET", &format!("/dashboard/events?after={head}"), None, &[]);
    assert_eq!(seqs(&past), Vec::<u64>::new());
    for bad in ["limit=0", "limit=5001", "limit=x", "before=-1", "colour=red", "after=x", "after=1&before=5"] {
        let (status, answer) = home.http("GET", &format!("/dashboard/events?{bad}"), None, &[]);
        assert_eq!(status, 400, "{bad}: {answer}");
        assert!(answer["message"].is_string(), "{bad}: a JSON error: {answer}");
    }

    // The snapshot the page starts from: the agents as /agents shows them, since when each has
    // its status, and the head to follow the stream from.
    let (status, snapshot) = home.http("GET", "/dashboard/state", None, &[]);
    assert_eq!(status, 200, "{snapshot}");
    assert_eq!(snapshot["auth_enabled"], false);
    assert_eq!(snapshot["as_user"], true, "the user's CLI, over the Unix socket");
    let (status, answer) = raw_tcp(
        port,
        &format!(
            "GET /dashboard/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"as_user\":false"), "a page without its key reads only: {answer}");
    assert!(snapshot["head"].as_u64().unwrap() >= head);
    let agent = &snapshot["agents"][0];
    assert_eq!(agent["agent_id"], bob.id.as_str());
    assert_eq!(agent["queue_depth"], 5);
    assert!(agent["status_since_ms"].as_u64().unwrap() > 0, "{agent}");
    // Long messages: a page holds about 4 MiB of their texts, the newest ones just before
    // `before` (at least one), and the next page goes on from the oldest it holds.
    let file = home.dir.path().join("long.txt");
    for letter in ["x", "y", "z"] {
        std::fs::write(&file, letter.repeat(3 << 20)).unwrap();
        home.ok(&["send", "bob", "-F", file.to_str().unwrap(), "--no-response"]);
    }
    let (status, long) = home.http("GET", "/dashboard/events?limit=200", None, &[]);
    assert_eq!(status, 200);
    let long_seqs = seqs(&long);
    let head = home.head();
    assert_eq!(long_seqs.last(), Some(&head), "the newest page ends at the head");
    assert!(long_seqs.windows(2).all(|pair| pair[1] == pair[0] + 1), "{long_seqs:?}");
    let texts = long.to_string().len();
    assert!(texts < 9 << 20, "{texts} bytes for the page");
    assert!(long_seqs.len() < 200);
    // Walked forwards from the start, pages of bounded text go on where each ended: every
    // event once, in order.
    let mut after = 0;
    let mut pages = 0;
    while after < head {
        let (status, page) = home.http("GET", &format!("/dashboard/events?after={after}&limit=200"), None, &[]);
        assert_eq!(status, 200);
        assert!(page.to_string().len() < 9 << 20);
        let page_seqs = seqs(&page);
        assert_eq!(page_seqs.first(), Some(&(after + 1)), "{page_seqs:?}");
        assert!(page_seqs.windows(2).all(|pair| pair[1] == pair[0] + 1), "{page_seqs:?}");
        after = *page_seqs.last().unwrap();
        pages += 1;
    }
    assert!(pages >= 2, "the long texts make short pages: {pages}");
}

/// A page of the event log holds fewer events when their texts are long (about 4 MiB a page):
/// "newer" goes on right after the page shown. It used to ask for the page a full one would
/// have been followed by, and skipped the rest of that range.
#[test]
fn the_event_logs_newer_page_starts_right_after_a_short_one() {
    let Some(browser) = Browser::start("dashboard in Chromium") else { return };
    let home = Home::new();
    home.register(Some("carol"));
    let file = home.dir.path().join("long.txt");
    let send = |text: &str| home.ok(&["send", "carol", text, "--no-response"]);
    let send_long = |letter: &str| {
        std::fs::write(&file, letter.repeat(5 << 19)).unwrap();
        home.ok(&["send", "carol", "-F", file.to_str().unwrap(), "--no-response"]);
    };
    ["a", "b", "c"].into_iter().for_each(send_long);
    (0..10).for_each(|number| drop(send(&format!("early {number}"))));
    ["d", "e", "f"].into_iter().for_each(send_long);
    (0..30).for_each(|number| drop(send(&format!("late {number}"))));
    let head = home.head();
    let url = home.ok(&["dashboard"]).trim().to_string();
    browser.goto(&url);

    let range = "return document.getElementById('events-range').textContent";
    let bounds = |shown: &Value| -> (u64, u64) {
        let text = shown.as_str().unwrap_or_default().trim_end_matches(" (live)");
        let mut ends = text.split('–').map(|number| number.trim().parse::<u64>().unwrap_or(0));
        (ends.next().unwrap_or(0), ends.next().unwrap_or(0))
    };
    let live = browser.wait_value("the newest events, live", range, vec![], |shown| {
        shown.as_str().is_some_and(|text| text.ends_with("(live)")) && bounds(shown).1 == head
    });
    let mut pages = vec![live];
    for click in ["events-older", "events-older", "events-newer"] {
        let before = pages.last().unwrap().clone();
        browser.execute(&format!("document.getElementById('{click}').click()"), vec![]);
        pages.push(browser.wait_value(click, range, vec![], |shown| *shown != before && shown.as_str() != Some("")));
    }
    let [live, first, second, newer] = [0, 1, 2, 3].map(|page| bounds(&pages[page]));
    assert_eq!(first.1 + 1, live.0, "older pages go on where the one shown starts: {pages:?}");
    assert_eq!(second.1 + 1, first.0, "{pages:?}");
    assert!(second.1 - second.0 + 1 < 100, "the second page is one cut short by long texts: {pages:?}");
    assert_eq!(newer.0, first.0, "newer starts right after the page shown: {pages:?}");
    // On to the live view, every event on the way shown: the live view comes once the page
    // shown ends where it begins.
    let mut previous = newer;
    for _ in 0..10 {
        let before = pages.last().unwrap().clone();
        browser.execute("document.getElementById('events-newer').click()", vec![]);
        pages.push(browser.wait_value("newer", range, vec![], |shown| *shown != before && shown.as_str() != Some("")));
        let page = bounds(pages.last().unwrap());
        if pages.last().unwrap().as_str().is_some_and(|text| text.ends_with("(live)")) {
            assert!(page.0 <= previous.1 + 1, "no event left out before the live view: {pages:?}");
            return;
        }
        assert_eq!(page.0, previous.1 + 1, "no event left out on the way: {pages:?}");
        previous = page;
    }
    panic!("newer never came back to the live view: {pages:?}");
}
