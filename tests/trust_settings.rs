//! Trust boundaries that must hold whoever starts the broker and whatever the targets answer
//! (issue 12): security settings that survive a crash, a deliberate stop that stays stopped,
//! outgoing requests that cannot be turned against the broker, secrets kept out of the log,
//! idempotent sends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

fn broker_port(home: &Home) -> u16 {
    let info: Value = serde_json::from_slice(&std::fs::read(home.home().join("broker.json")).unwrap()).unwrap();
    u16::try_from(info["port"].as_u64().unwrap()).unwrap()
}

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
    let first = home.broker_pid().unwrap();

    home.ok(&["broker", "stop"]);
    assert!(!is_alive(first));
    // The old wrapper restarted a broker within half a second; watch well past its retry delay.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert!(
            std::os::unix::net::UnixStream::connect(home.socket()).is_err(),
            "a broker was started after 'synapse broker stop'"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    home.ok(&["broker", "start"]);
    // The round trip needs bob's wrapper connected to the new broker (its watcher injects).
    let answer = home.ok(&["send", "bob", "are you back?", "--wait", "30"]);
    assert!(answer.contains("Auto-reply"), "{answer}");
}
