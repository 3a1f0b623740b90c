//! Test support for the real CLIs: their set-up (from the library, `synapse::scripted_model::clis`)
//! and a handle on a running `synapse scripted-model`.

#[allow(unused_imports)]
pub use synapse::scripted_model::clis::*;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A running `synapse scripted-model`, killed when dropped.
pub struct ScriptedModel {
    child: Child,
    pub port: u16,
}

impl ScriptedModel {
    /// Starts the model on a free port (appending its requests to `log`, if given).
    pub fn start(log: Option<&Path>) -> ScriptedModel {
        let mut command = Command::new(super::BIN);
        command.args(["scripted-model", "--port", "0"]).stdin(Stdio::null()).stdout(Stdio::piped());
        if let Some(log) = log {
            command.arg("--log").arg(log);
        }
        let mut child = command.spawn().expect("cannot start synapse scripted-model");
        let stdout = child.stdout.take().expect("no stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("no port line");
        let announce: Value = serde_json::from_str(&line).expect("the port line is not JSON");
        let port = announce["port"].as_u64().and_then(|port| u16::try_from(port).ok()).expect("no port");
        ScriptedModel { child, port }
    }

    /// Every request the model has received, oldest first.
    pub fn requests(&self) -> Vec<Value> {
        let (status, body) = super::http_tcp(self.port, "GET", "/_synapse/requests", None, &[]);
        assert_eq!(status, 200);
        body.as_array().cloned().unwrap_or_default()
    }

    /// How many slow answers a client left before their end (an interrupted turn).
    pub fn slow_answers_cut(&self) -> u64 {
        let (status, body) = super::http_tcp(self.port, "GET", "/_synapse/slow_streams", None, &[]);
        assert_eq!(status, 200);
        body["cut"].as_u64().unwrap_or_default()
    }

    /// How many requests brought this text to the model as the user's new turn.
    pub fn count_user_text(&self, needle: &str) -> usize {
        self.requests()
            .iter()
            .filter(|request| request["internal"] == json!(false))
            .filter(|request| request["last_user_text"].as_str().is_some_and(|text| text.contains(needle)))
            .count()
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The requests in a `--log` file, one JSON object per line.
pub fn read_request_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}
