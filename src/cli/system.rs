//! `synapse broker`, `synapse events`, `synapse admin`, and the hidden `synapse agent` contract.

use super::{AdminCommand, AgentCommand, BrokerCommand, EventsArgs};
use crate::client::{self, Client};
use crate::config::Paths;
use crate::event::Envelope;
use serde_json::{Value, json};
use std::io::Write;

/// `synapse broker` in the foreground. Typed by the user, its environment's security settings
/// update `broker-settings.json`; autostarted by a client, it uses the file as it is.
pub fn run_broker(paths: Paths, autostarted: bool) -> anyhow::Result<i32> {
    if !autostarted {
        crate::trust::TrustSettings::update_from_env(&paths.home)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(crate::daemon::run(paths))?;
    Ok(0)
}

pub async fn broker_control(paths: &Paths, command: Option<BrokerCommand>) -> anyhow::Result<i32> {
    match command {
        None => unreachable_foreground(),
        Some(BrokerCommand::Stop) => match client::stop_broker(paths).await? {
            Some(pid) => {
                println!("broker stopped (pid {pid})");
                Ok(0)
            }
            None => {
                println!("no broker is running for SYNAPSE_HOME={}", paths.home.display());
                Ok(0)
            }
        },
        Some(BrokerCommand::Status) => match Client::try_connect(paths).await {
            Some(mut client) => {
                let info = client.broker_info().await?;
                println!("{}", serde_json::to_string_pretty(&info)?);
                if info.get("healthy").and_then(Value::as_bool) == Some(false) {
                    eprintln!(
                        "the broker cannot store: {} (reads still work; it recovers by itself once a write succeeds)",
                        info.pointer("/write_failure/reason").and_then(Value::as_str).unwrap_or("unknown reason")
                    );
                    return Ok(1);
                }
                Ok(0)
            }
            None => {
                println!("no broker is running for SYNAPSE_HOME={}", paths.home.display());
                Ok(1)
            }
        },
        Some(BrokerCommand::Start) => {
            let (_, changed) = crate::trust::TrustSettings::update_from_env(&paths.home)?;
            if changed && Client::try_connect(paths).await.is_some() {
                eprintln!(
                    "note: the security settings in {} changed; the running broker keeps its own until 'synapse broker stop' and start",
                    crate::trust::TrustSettings::path(&paths.home).display()
                );
            }
            let mut client = Client::connect(paths, true).await?;
            let info = client.broker_info().await?;
            println!("broker running (pid {}, socket {})", info["pid"], info["socket"].as_str().unwrap_or_default());
            Ok(0)
        }
    }
}

fn unreachable_foreground() -> anyhow::Result<i32> {
    anyhow::bail!("internal: the foreground broker is started before the runtime")
}

/// One line of `synapse events`: sequence, time, kind, summary. The summary quotes others' text
/// (names, messages): its controls are made visible.
pub fn event_line(envelope: &Envelope) -> String {
    format!(
        "{:>8}  {}  {:<24} {}",
        envelope.seq,
        crate::time::rfc3339(envelope.time_ms),
        envelope.event.kind(),
        crate::escape::visible_line(&envelope.event.summary())
    )
}

pub async fn events(paths: &Paths, args: EventsArgs) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    let mut query = format!("/events?after={}&follow={}", args.after, args.follow);
    if let Some(agent) = &args.agent {
        query.push_str(&format!("&agent={}", percent_encode(agent)));
    }
    if let Some(kind) = &args.kind {
        query.push_str(&format!("&kind={}", percent_encode(kind)));
    }
    let stdout = std::io::stdout();
    let mut failure = None;
    client
        .sse(&query, |data| {
            let line = match serde_json::from_str::<Envelope>(data) {
                Ok(_) if args.json => data.to_string(),
                Ok(envelope) => event_line(&envelope),
                Err(error) => {
                    failure = Some(format!("cannot read event: {error}: {data}"));
                    return false;
                }
            };
            let mut out = stdout.lock();
            // A closed pipe (`synapse events | head`) ends the command quietly.
            writeln!(out, "{line}").and_then(|_| out.flush()).is_ok()
        })
        .await?;
    if let Some(failure) = failure {
        anyhow::bail!(failure);
    }
    Ok(0)
}

/// Percent-encodes a query value.
pub fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b',' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

pub async fn admin(paths: &Paths, command: AdminCommand) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    match command {
        AdminCommand::Rebuild => {
            let report = client.post("/admin/rebuild", &Value::Null).await?;
            println!(
                "rebuilt the projections from {} events in {:.1} ms",
                report["events"],
                report["elapsed_ms"].as_f64().unwrap_or_default()
            );
            Ok(0)
        }
        AdminCommand::Verify => {
            let report = client.post("/admin/verify", &Value::Null).await?;
            let differences = report["differences"].as_array().cloned().unwrap_or_default();
            if differences.is_empty() {
                println!("ok: replaying {} events gives exactly the live projections", report["events"]);
                Ok(0)
            } else {
                println!("MISMATCH: replaying {} events differs from the live projections:", report["events"]);
                for difference in differences {
                    println!("  {}", difference.as_str().unwrap_or_default());
                }
                Ok(1)
            }
        }
        AdminCommand::Index => {
            let progress = client.post("/admin/index", &Value::Null).await?;
            println!(
                "history index: up to event {} of {} ({} segments)",
                progress["indexed_through"], progress["head"], progress["segments"]
            );
            Ok(0)
        }
    }
}

pub async fn agent(paths: &Paths, command: AgentCommand) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    let answer = match command {
        AgentCommand::Register { agent_type, pid, name, role, port } => {
            let working_dir = std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
            let mut body =
                json!({"agent_type": agent_type, "pid": pid, "name": name, "role": role, "working_dir": working_dir});
            if let Some(port) = port {
                body["port"] = json!(port);
            }
            client.post("/agents", &body).await?
        }
        AgentCommand::Status { agent_id, status } => {
            client.post(&format!("/agents/{}/status", percent_encode(&agent_id)), &json!({"status": status})).await?
        }
        AgentCommand::Inbox { agent_id, wait_ms } => {
            client.get(&format!("/agents/{}/inbox?wait_ms={wait_ms}", percent_encode(&agent_id))).await?
        }
        AgentCommand::Ack { agent_id, ticket } => {
            client.post(&format!("/agents/{}/inbox/{ticket}/ack", percent_encode(&agent_id)), &Value::Null).await?
        }
        AgentCommand::Deregister { agent_id } => {
            client.delete(&format!("/agents/{}", percent_encode(&agent_id))).await?
        }
    };
    println!("{}", serde_json::to_string(&answer)?);
    Ok(0)
}
