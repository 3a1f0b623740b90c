//! `synapse send`, `synapse reply`, `synapse list` (SPEC §1-2).

use super::system::percent_encode;
use super::{ReplyArgs, SendArgs, read_message};
use crate::client::Client;
use crate::config::Paths;
use crate::escape::visible_line;
use crate::event::short_id;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How many times `synapse send` tries when the connection breaks under a request.
const SEND_ATTEMPTS: u32 = 3;

/// The sender's identity: `--from`, else `SYNAPSE_AGENT_ID`.
fn identity(from: Option<String>) -> Option<String> {
    from.or_else(|| std::env::var("SYNAPSE_AGENT_ID").ok()).filter(|id| !id.trim().is_empty())
}

pub fn parse_priority(text: &str) -> anyhow::Result<u8> {
    match text.trim().parse::<i64>() {
        Ok(priority) if (1..=5).contains(&priority) => Ok(u8::try_from(priority)?),
        _ => anyhow::bail!("Error: priority must be between 1 and 5 (got '{text}')"),
    }
}

fn str_of<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

pub async fn send(paths: &Paths, args: SendArgs) -> anyhow::Result<i32> {
    let text = read_message(args.message, args.message_file.as_ref(), args.stdin)?;
    if text.trim().is_empty() {
        anyhow::bail!("Error: the message is empty");
    }
    let priority = parse_priority(&args.priority)?;
    let from = identity(args.from);
    // Without --response / --no-response / --wait, a2a.flow decides (SPEC §2, §6).
    let flow = crate::settings::Settings::load_current(&paths.home)?.flow()?;
    let wait = match (args.wait, args.response || args.no_response, flow) {
        (Some(seconds), _, _) => Some(seconds),
        (None, false, crate::settings::Flow::Roundtrip) => Some(0),
        (None, _, _) => None,
    };
    let response_expected = if args.response || wait.is_some() {
        true
    } else if args.no_response {
        false
    } else {
        flow != crate::settings::Flow::Oneway
    };
    let mut client = Client::connect(paths, true).await?;
    // Every send carries a key, so that retrying one whose answer was lost cannot send twice.
    let idempotency_key = args.idempotency_key.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let body = json!({
        "to": args.target,
        "from": from,
        "secret": if from.is_some() { client.secret() } else { None },
        "text": text,
        "priority": priority,
        "response_expected": response_expected,
        "reply_to": args.reply_to,
        "idempotency_key": idempotency_key,
    });
    let mut attempt = 1;
    let answer = loop {
        match client.post("/send", &body).await {
            Ok(answer) => break answer,
            // The request may have been decided before the connection broke: the same key
            // makes the retry answer that send instead of making a second one.
            Err(error)
                if attempt < SEND_ATTEMPTS
                    && error.downcast_ref::<crate::client::ApiFailure>().is_none()
                    && format!("{error:#}").contains("closed the connection") =>
            {
                attempt += 1;
                tracing::debug!("send: {error:#}; retrying with idempotency key {idempotency_key}");
                client = Client::connect(paths, true).await?;
            }
            Err(error) => return Err(error),
        }
    };
    if let Some(warning) = answer.get("warning").and_then(Value::as_str) {
        eprintln!("{warning}");
    }
    if args.json {
        println!("{}", serde_json::to_string(&answer)?);
    } else if answer["is_reply"].as_bool() == Some(true) {
        let sender_task = str_of(&answer, "/sender_task/id");
        println!(
            "Replied to {}: task {sender_task} ({}) {}",
            match str_of(&answer, "/sender_task/metadata/owner") {
                "" => "an anonymous sender",
                owner => owner,
            },
            short_id(sender_task),
            str_of(&answer, "/sender_task/status"),
        );
    } else {
        let task = str_of(&answer, "/task/id");
        println!(
            "Sent to {}: task {task} ({}) {}",
            str_of(&answer, "/task/metadata/owner"),
            short_id(task),
            str_of(&answer, "/task/status")
        );
        if let Some(sender_task) = answer.pointer("/sender_task/id").and_then(Value::as_str) {
            println!(
                "Reply expected: your task {sender_task} ({}) is {}",
                short_id(sender_task),
                str_of(&answer, "/sender_task/status")
            );
        }
    }
    let Some(seconds) = wait else { return Ok(0) };
    let Some(sender_task) = answer.pointer("/sender_task/id").and_then(Value::as_str).map(str::to_string) else {
        return Ok(0);
    };
    wait_for_reply(&mut client, &sender_task, seconds).await
}

/// Blocks until the task is final (the broker answers when the log says so). 0 = no limit.
async fn wait_for_reply(client: &mut Client, task_id: &str, seconds: u64) -> anyhow::Result<i32> {
    let started = Instant::now();
    let limit = (seconds > 0).then(|| Duration::from_secs(seconds));
    loop {
        let slice = match limit {
            Some(limit) => limit.saturating_sub(started.elapsed()),
            None => Duration::from_secs(600),
        };
        let answer = client.get(&format!("/tasks/{task_id}/wait?timeout_ms={}", slice.as_millis())).await?;
        if answer["timed_out"].as_bool() != Some(true) {
            let state = str_of(&answer, "/task/status");
            match answer.get("reply").and_then(Value::as_str) {
                Some(reply) if state == "completed" => {
                    // Exact for a script; on a terminal, the replier's controls are made visible.
                    if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                        println!("{}", crate::escape::visible(reply));
                    } else {
                        println!("{reply}");
                    }
                    return Ok(0);
                }
                _ => {
                    eprintln!("Error: task {} ended {state} without a reply", short_id(task_id));
                    return Ok(1);
                }
            }
        }
        if limit.is_some_and(|limit| started.elapsed() >= limit) {
            eprintln!("Error: no reply within {seconds} s; task {} ({}) stays open", task_id, short_id(task_id));
            return Ok(1);
        }
    }
}

pub async fn reply(paths: &Paths, args: ReplyArgs) -> anyhow::Result<i32> {
    let Some(from) = identity(args.from) else {
        anyhow::bail!(
            "Error: synapse reply needs to know who is replying: run it inside an agent (SYNAPSE_AGENT_ID) or pass --from"
        );
    };
    let text = if args.list_targets {
        None
    } else {
        Some(read_message(args.message, args.message_file.as_ref(), args.stdin)?)
    };
    let mut client = Client::connect(paths, true).await?;
    let Some(text) = text else {
        let answer = client.get(&format!("/agents/{}/reply-stack/list", percent_encode(&from))).await?;
        let targets = answer["targets"].as_array().cloned().unwrap_or_default();
        if args.json {
            println!("{}", serde_json::to_string(&answer)?);
        } else if targets.is_empty() {
            println!("No reply targets.");
        } else {
            for target in targets {
                let task = target["sender_task_id"].as_str().or(target["task_id"].as_str()).unwrap_or_default();
                println!(
                    "{}  task {}  {}  {}",
                    visible_line(str_of(&target, "/sender_id")),
                    visible_line(short_id(task)),
                    str_of(&target, "/received_at"),
                    visible_line(str_of(&target, "/preview"))
                );
            }
        }
        return Ok(0);
    };
    let secret = client.secret().map(str::to_string);
    let answer = client.post("/reply", &json!({"from": from, "secret": secret, "to": args.to, "text": text})).await?;
    if args.json {
        println!("{}", serde_json::to_string(&answer)?);
    } else {
        let sender_task = str_of(&answer, "/sender_task/id");
        println!(
            "Replied to {}: task {sender_task} ({}) {}",
            str_of(&answer, "/task/metadata/peer"),
            short_id(sender_task),
            str_of(&answer, "/sender_task/status")
        );
    }
    Ok(0)
}

pub async fn list(paths: &Paths, json_output: bool) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    let answer = client.get("/agents").await?;
    if json_output {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(0);
    }
    let agents = answer["agents"].as_array().cloned().unwrap_or_default();
    if agents.is_empty() {
        println!("No agents running. Start one with 'synapse <profile>' or 'synapse start <profile>'.");
        return Ok(0);
    }
    let header = ["TYPE", "ID", "NAME", "PORT", "STATUS", "PID", "QUEUE", "CURRENT", "DIR"];
    println!(
        "{:<10} {:<24} {:<10} {:<6} {:<11} {:>7} {:>5}  {:<28} {}",
        header[0], header[1], header[2], header[3], header[4], header[5], header[6], header[7], header[8]
    );
    // Every text field comes from a registration or a message: shown with its controls visible.
    for agent in agents {
        println!(
            "{:<10} {:<24} {:<10} {:<6} {:<11} {:>7} {:>5}  {:<28} {}",
            visible_line(str_of(&agent, "/agent_type")),
            visible_line(str_of(&agent, "/agent_id")),
            visible_line(agent["name"].as_str().unwrap_or("-")),
            agent["port"].to_string(),
            visible_line(str_of(&agent, "/status")),
            agent["pid"].to_string(),
            agent["queue_depth"].to_string(),
            visible_line(agent.pointer("/current_task/preview").and_then(Value::as_str).unwrap_or("-")),
            visible_line(str_of(&agent, "/working_dir")),
        );
        // Why it takes no message now, in its wrapper's words.
        if let Some(note) = agent["status_note"].as_str() {
            println!("{:<10} {:<24} ↳ {}", "", "", visible_line(note));
        }
    }
    Ok(0)
}
