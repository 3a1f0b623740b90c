//! `synapse broker`, `synapse events`, `synapse admin`, and the hidden `synapse agent` contract.

use super::{AdminCommand, AgentCommand, BrokerCommand, EventsArgs};
use crate::api;
use crate::client::{self, Client};
use crate::config::Paths;
use crate::event::Envelope;
use std::io::Write;

/// `synapse broker` in the foreground. Typed by the user, its environment's security settings
/// update `broker-settings.json`; autostarted by a client, it uses the file as it is.
pub fn run_broker(paths: Paths, autostarted: bool) -> anyhow::Result<i32> {
    if !autostarted {
        crate::trust::TrustSettings::update_from_env(&paths.home)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    match runtime.block_on(crate::daemon::run(paths)) {
        Ok(()) => Ok(0),
        // Said apart (its own exit status): a client that started this broker waits for the
        // one that has the database (starting, or stopping) instead of reporting a failure.
        Err(error) if error.downcast_ref::<crate::daemon::AlreadyRunning>().is_some() => {
            eprintln!("{}", super::user_message(&format!("{error:#}")));
            Ok(client::ALREADY_RUNNING_EXIT)
        }
        Err(error) => Err(error),
    }
}

pub async fn broker_control(paths: &Paths, command: Option<BrokerCommand>, json: bool) -> anyhow::Result<i32> {
    let home = paths.home.display().to_string();
    match command {
        None => unreachable_foreground(),
        Some(BrokerCommand::Stop) => {
            let stopped = client::stop_broker(paths).await?;
            if json {
                println!("{}", serde_json::json!({"stopped": stopped.is_some(), "pid": stopped, "home": home}));
            } else {
                match stopped {
                    Some(pid) => println!("broker stopped (pid {pid})"),
                    None => println!("no broker is running for SYNAPSE_HOME={home}"),
                }
            }
            Ok(0)
        }
        Some(BrokerCommand::Status) => match Client::try_connect(paths).await {
            Some(mut client) => {
                let info = client.health().await?;
                client::ensure_home(paths, &info)?;
                if json {
                    println!("{}", api::json_pretty(&info)?);
                } else {
                    println!(
                        "broker running: pid {}, version {}, head {}\n  home   {}\n  socket {}\n  port   127.0.0.1:{}\n  health {}",
                        info.pid,
                        info.version,
                        info.head,
                        info.home,
                        info.socket,
                        info.port,
                        if info.healthy { "ok" } else { "cannot store" }
                    );
                }
                if !info.healthy {
                    eprintln!(
                        "the broker cannot store: {} (reads still work; it recovers by itself once a write succeeds)",
                        info.write_failure.as_ref().map_or("unknown reason", |failure| failure.reason.as_str())
                    );
                    return Ok(1);
                }
                Ok(0)
            }
            None => {
                if json {
                    println!("{}", serde_json::json!({"running": false, "home": home}));
                } else {
                    println!("no broker is running for SYNAPSE_HOME={home}");
                }
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
            // Typed on purpose: starts a broker stopped on purpose, also inside an agent.
            let mut client = Client::connect_starting(paths).await?;
            let info = client.health().await?;
            if json {
                println!("{}", api::json_pretty(&info)?);
            } else {
                println!("broker running (pid {}, socket {})", info.pid, info.socket);
            }
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

/// The last event `events --follow` printed: after a broker restart the stream goes on from
/// it, and it must still be the same event (else the log was replaced meanwhile).
struct Seen {
    seq: u64,
    event: serde_json::Value,
}

/// `synapse events [--follow]`. Following, it outlives the broker: when the stream ends (the
/// broker stopped or crashed) it waits for the next broker (never starting one stopped on
/// purpose) and goes on after the last event it printed, so nothing is printed twice or
/// skipped. A log that no longer holds that event ends it with exit 1 and the reason.
pub async fn events(paths: &Paths, args: EventsArgs) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    let stdout = std::io::stdout();
    let mut last: Option<Seen> = None;
    // Set after a restart: the stream starts again at the last printed event, to check it.
    let mut resuming = false;
    loop {
        let mut failure = None;
        let mut printing_failed: Option<std::io::Error> = None;
        let after = match &last {
            Some(seen) if resuming => seen.seq.saturating_sub(1),
            Some(seen) => seen.seq,
            None => args.after,
        };
        let streamed = client
            .events(after, args.follow, args.agent.as_deref(), args.kind.as_deref(), |data| {
                let envelope = match serde_json::from_str::<Envelope>(data) {
                    Ok(envelope) => envelope,
                    Err(error) => {
                        failure = Some(format!("cannot read event: {error}: {data}"));
                        return false;
                    }
                };
                if args.follow {
                    let event = serde_json::from_str::<serde_json::Value>(data).unwrap_or_default();
                    if std::mem::take(&mut resuming) {
                        if let Some(seen) = &last
                            && (envelope.seq != seen.seq || event != seen.event)
                        {
                            failure = Some(replaced_log(paths, seen.seq));
                            return false;
                        }
                        // Printed before the restart.
                        return true;
                    }
                    last = Some(Seen { seq: envelope.seq, event });
                }
                let line =
                    if args.json { crate::escape::json_controls(data.to_string()) } else { event_line(&envelope) };
                let mut out = stdout.lock();
                // A closed pipe (`synapse events | head`) ends the command quietly.
                match writeln!(out, "{line}").and_then(|_| out.flush()) {
                    Ok(()) => true,
                    Err(error) => {
                        printing_failed = Some(error);
                        false
                    }
                }
            })
            .await;
        if let Some(failure) = failure {
            anyhow::bail!(failure);
        }
        if let Some(error) = &printing_failed {
            return super::output_failed(error);
        }

        match streamed {
            // The broker went away under the stream: a followed stream waits for the next one.
            Ok(()) if args.follow => {}
            Err(error) if args.follow && going_away(&error) => {}
            Ok(()) => return Ok(0),
            Err(error) => return Err(error.into()),
        }
        let at = last.as_ref().map_or(after, |seen| seen.seq);
        eprintln!("synapse events: the broker went away after event {at}; following on when a broker is back");
        // A broker of another version or home ends it (no event of that one is this stream's).
        // A broker shutting down may still take a connection and close it under the request:
        // that is the same going away, not an error.
        let head = loop {
            client = Client::connect_when_available_unless_other(paths).await?;
            match client.health().await {
                Ok(health) => break health.head,
                Err(error) if going_away(&error) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                Err(error) => return Err(error.into()),
            }
        };
        if let Some(seen) = &last {
            // A log shorter than what was printed is not the one followed (deleted or moved
            // aside while no broker ran); one as long is checked on its first event.
            if head < seen.seq {
                anyhow::bail!(replaced_log(paths, seen.seq));
            }
            resuming = true;
        }
        eprintln!("synapse events: following again after event {at}");
    }
}

/// An error that means the broker is going (or gone): the connection broke or was refused, no
/// answer came, or it answered that it cannot serve now (a 5xx while it shuts down).
fn going_away(error: &client::ClientError) -> bool {
    match error {
        client::ClientError::Unreachable { .. } | client::ClientError::Timeout(_) => true,
        client::ClientError::Http { status, .. } => status.is_server_error(),
        _ => false,
    }
}

fn replaced_log(paths: &Paths, seq: u64) -> String {
    format!(
        "the event log of SYNAPSE_HOME={} changed while no broker ran: event {seq}, printed before, is no longer in it. Run 'synapse events' again to read the log as it is now",
        paths.home.display()
    )
}

pub async fn admin(paths: &Paths, command: AdminCommand, json: bool) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    match command {
        AdminCommand::Rebuild => {
            let report = client.rebuild().await?;
            if json {
                println!("{}", api::json_line(&report)?);
            } else {
                println!("rebuilt the projections from {} events in {:.1} ms", report.events, report.elapsed_ms);
            }
            Ok(0)
        }
        AdminCommand::Verify => {
            let report = client.verify().await?;
            if json {
                println!("{}", api::json_line(&report)?);
            } else if report.differences.is_empty() {
                println!("ok: replaying {} events gives exactly the live projections", report.events);
            } else {
                println!("MISMATCH: replaying {} events differs from the live projections:", report.events);
                for difference in &report.differences {
                    println!("  {difference}");
                }
            }
            Ok(if report.differences.is_empty() { 0 } else { 1 })
        }
        AdminCommand::Index => {
            let progress = client.index_history().await?;
            if json {
                println!("{}", api::json_line(&progress)?);
            } else {
                println!(
                    "history index: up to event {} of {} ({} segments)",
                    progress.indexed_through, progress.head, progress.segments
                );
            }
            Ok(0)
        }
    }
}

pub async fn agent(paths: &Paths, command: AgentCommand) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    // Each answer is printed as the broker gave it (one JSON line).
    let line = match command {
        AgentCommand::Register { agent_type, pid, name, role, port } => {
            let working_dir = std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
            let request = api::RegisterRequest { agent_type, name, role, pid, working_dir, port, port_range: None };
            api::json_line(&client.register(&request).await?)?
        }
        AgentCommand::Status { agent_id, status } => {
            let status = status.parse().map_err(|reason: String| anyhow::anyhow!(reason))?;
            api::json_line(&client.set_status(&agent_id, &api::StatusUpdate { status, note: None }).await?)?
        }
        AgentCommand::Inbox { agent_id, wait_ms } => api::json_line(&client.inbox(&agent_id, wait_ms, None).await?)?,
        AgentCommand::Ack { agent_id, ticket } => api::json_line(&client.ack(&agent_id, ticket, None).await?)?,
        AgentCommand::Deregister { agent_id } => api::json_line(&client.deregister(&agent_id).await?)?,
    };
    println!("{line}");
    Ok(0)
}
