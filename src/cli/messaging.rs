//! `synapse send`, `synapse reply`, `synapse list` (SPEC §1-2).

use super::{ReplyArgs, SendArgs, parse_priority, read_message};
use crate::api::{self, Task};
use crate::client::Client;
use crate::config::Paths;
use crate::escape::visible_line;
use crate::event::short_id;

/// The sender's identity: `--from`, else `SYNAPSE_AGENT_ID`.
/// Who sends: `--from`, else SYNAPSE_AGENT_ID (an empty variable: nobody). An empty `--from`
/// is refused: it had sent anonymously without a word.
fn identity(from: Option<String>) -> anyhow::Result<Option<String>> {
    if from.as_ref().is_some_and(|from| from.trim().is_empty()) {
        anyhow::bail!("--from is empty: give an agent id or name, or leave it out");
    }
    Ok(from.or_else(|| std::env::var("SYNAPSE_AGENT_ID").ok()).filter(|id| !id.trim().is_empty()))
}

pub async fn send(paths: &Paths, args: SendArgs) -> anyhow::Result<i32> {
    let text = read_message(args.message, args.message_file.as_ref(), args.stdin)?;
    if text.trim().is_empty() {
        anyhow::bail!("the message is empty");
    }
    // --wait N counts from here: a send that was slow leaves less to wait.
    let started = std::time::Instant::now();
    let priority = parse_priority(&args.priority)?;
    // Flags that name things of this broker (a task, a send to repeat): refused if the target
    // turns out to be an external agent. (`--from` needs an agent's secret, and external agents
    // are the user's alone: the broker refuses that before.)
    let local_only: Vec<&str> =
        [(args.reply_to.is_some(), "--reply-to"), (args.idempotency_key.is_some(), "--idempotency-key")]
            .into_iter()
            .filter_map(|(given, flag)| given.then_some(flag))
            .collect();
    let from = identity(args.from)?;
    // Without --response / --no-response / --wait, a2a.flow decides (SPEC §2, §6).
    let settings = crate::settings::Settings::load_current(&paths.home)?;
    for warning in &settings.warnings {
        eprintln!("Warning: {warning}");
    }
    let flow = settings.flow()?;
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
    let secret = if from.is_some() { client.secret().map(str::to_string) } else { None };
    let request = api::SendRequest {
        from,
        secret,
        priority,
        response_expected,
        reply_to: args.reply_to,
        idempotency_key: args.idempotency_key,
        ..api::SendRequest::new(args.target, text)
    };
    let answer = match client.send_retrying(paths, &request, crate::client::inside_an_agent()).await {
        Ok(answer) => answer,
        Err(error) if error.is::<crate::client::SendUncertain>() => {
            let key = error.downcast_ref::<crate::client::SendUncertain>().map(|uncertain| uncertain.key.clone());
            anyhow::bail!(
                "{error:#}: to send it at most once, run the same command again with --idempotency-key {}",
                key.unwrap_or_default()
            );
        }
        Err(error) if names_no_agent(&error) && is_external(&mut client, &request.to).await? => {
            if let Some(flag) = local_only.first() {
                anyhow::bail!(
                    "'{}' is an external agent (synapse external list): {flag} cannot apply to it",
                    request.to
                );
            }
            // 0 waits without a limit here; the broker follows a remote task a day at most.
            let wait_seconds = wait.map(|seconds| if seconds == 0 { u64::MAX } else { seconds });
            let external = api::ExternalSend {
                text: request.text,
                wait_seconds,
                priority: Some(priority),
                response_expected: Some(response_expected),
            };
            return super::external::send(&mut client, &request.to, &external, args.json).await;
        }
        Err(error) => return Err(error),
    };
    if let Some(warning) = &answer.warning {
        eprintln!("{warning}");
    }
    // With --json and --wait, one document: the send's answer, printed once the reply is in.
    if args.json {
        if wait.is_none() {
            println!("{}", api::json_line(&answer)?);
        }
    } else if answer.is_reply {
        let sender_task = answer.sender_task.as_ref();
        let sender_task_id = sender_task.map_or("", |task| task.id.as_str());
        println!(
            "Replied to {}: task {sender_task_id} ({}) {}",
            sender_task
                .and_then(|task| task.metadata.owner.as_deref())
                .filter(|owner| !owner.trim().is_empty())
                .unwrap_or("an anonymous sender"),
            short_id(sender_task_id),
            status_of(sender_task),
        );
    } else {
        let task = &answer.task;
        println!(
            "Sent to {}: task {} ({}) {}",
            task.metadata.owner.as_deref().unwrap_or_default(),
            task.id,
            short_id(&task.id),
            task.status
        );
        if let Some(sender_task) = &answer.sender_task {
            println!(
                "Reply expected: your task {} ({}) is {}",
                sender_task.id,
                short_id(&sender_task.id),
                sender_task.status
            );
        }
    }
    let Some(seconds) = wait else { return Ok(0) };
    // A reply's sender task is the one it completed: there is no answer to wait for.
    let Some(sender_task) = answer.sender_task.as_ref().filter(|_| !answer.is_reply).map(|task| task.id.clone()) else {
        if args.json {
            println!("{}", api::json_line(&answer)?);
        }
        return Ok(0);
    };
    let reply = client.wait_for_reply(paths, crate::client::inside_an_agent(), &sender_task, seconds, started).await;
    if args.json {
        // The answer of the send with the reply added (null when none came); the error, if
        // any, still goes to stderr with a non-zero exit.
        let mut document = serde_json::to_value(&answer)?;
        if let Some(object) = document.as_object_mut() {
            object.insert(
                "reply".into(),
                reply.as_ref().ok().map_or(serde_json::Value::Null, |text| text.clone().into()),
            );
        }
        println!("{}", api::json_line(&document)?);
    } else if let Ok(text) = &reply {
        // Exact for a script; on a terminal, the replier's controls are made visible.
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            println!("{}", crate::escape::visible(text));
        } else {
            println!("{text}");
        }
    }
    Ok(reply.map(|_| 0)?)
}

/// The broker found no live agent the target names (404 from the send).
fn names_no_agent(error: &anyhow::Error) -> bool {
    error.downcast_ref::<crate::client::ClientError>().is_some_and(|error| {
        error.status() == Some(hyper::StatusCode::NOT_FOUND) && error.to_string().starts_with("No agent found matching")
    })
}

/// Is `alias` an external agent (`synapse external add`)? Only the user may use them: an agent
/// asking is told so along with the send's own error.
async fn is_external(client: &mut Client, alias: &str) -> anyhow::Result<bool> {
    match client.external(alias).await {
        Ok(answer) => Ok(answer.external.is_some()),
        Err(error) if error.status() == Some(hyper::StatusCode::FORBIDDEN) => anyhow::bail!(
            "No agent found matching '{alias}'. Run 'synapse list' to see the running agents. External agents (synapse external) are for the user only, not for an agent"
        ),
        Err(_) => Ok(false),
    }
}

/// `synapse cancel <task>`: cancels it where it lives (under its owner; an anonymous sender's
/// task through the receiver's task it is linked to, which the broker cancels both of).
pub async fn cancel(paths: &Paths, reference: &str, json: bool) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    let task = client.task(reference).await?.task;
    let (owner, task_id) = match (&task.metadata.owner, &task.metadata.peer_task_id) {
        (Some(owner), _) => (owner.clone(), task.id.clone()),
        (None, Some(peer)) => {
            let peer_task = client.task(peer).await?.task;
            match peer_task.metadata.owner {
                Some(owner) => (owner, peer_task.id),
                None => anyhow::bail!("task {} belongs to no agent and cannot be canceled", short_id(&task.id)),
            }
        }
        (None, None) => anyhow::bail!("task {} belongs to no agent and cannot be canceled", short_id(&task.id)),
    };
    let canceled = client.cancel(&owner, &task_id).await?;
    if json {
        println!("{}", api::json_line(&canceled)?);
    } else {
        println!("Canceled task {} ({}) of {}", canceled.task.id, short_id(&canceled.task.id), visible_line(&owner));
    }
    Ok(0)
}

/// A task's state as the broker spells it (empty when there is no task).
fn status_of(task: Option<&Task>) -> String {
    task.map(|task| task.status.to_string()).unwrap_or_default()
}

pub async fn reply(paths: &Paths, args: ReplyArgs) -> anyhow::Result<i32> {
    let Some(from) = identity(args.from)? else {
        anyhow::bail!(
            "synapse reply needs to know who is replying: run it inside an agent (SYNAPSE_AGENT_ID) or pass --from"
        );
    };
    let text = if args.list_targets {
        None
    } else {
        Some(read_message(args.message, args.message_file.as_ref(), args.stdin)?)
    };
    let mut client = Client::connect(paths, true).await?;
    let Some(text) = text else {
        let answer = client.reply_targets(&from).await?;
        if args.json {
            println!("{}", api::json_line(&answer)?);
        } else if answer.targets.is_empty() {
            println!("No reply targets.");
        } else {
            for target in &answer.targets {
                let task = target.sender_task_id.as_deref().unwrap_or(&target.task_id);
                println!(
                    "{}  task {}  {}  {}",
                    visible_line(&target.sender_id),
                    visible_line(short_id(task)),
                    target.received_at,
                    visible_line(&target.preview)
                );
            }
        }
        return Ok(0);
    };
    let secret = client.secret().map(str::to_string);
    let request = api::ReplyRequest { from, secret, to: args.to, text, idempotency_key: args.idempotency_key };
    // A reply whose answer was lost (the broker restarting under it) is tried again with its
    // key: sent again without one, it was refused ("No reply target"), or answered the next
    // request in line.
    let answer = match client.send_retrying(paths, &request, crate::client::inside_an_agent()).await {
        Ok(answer) => answer,
        Err(error) if error.is::<crate::client::SendUncertain>() => {
            let key = error.downcast_ref::<crate::client::SendUncertain>().map(|uncertain| uncertain.key.clone());
            anyhow::bail!(
                "{error:#}: to reply at most once, run the same command again with --idempotency-key {}",
                key.unwrap_or_default()
            );
        }
        Err(error) => return Err(error),
    };
    if let Some(warning) = &answer.warning {
        eprintln!("{warning}");
    }
    if args.json {
        println!("{}", api::json_line(&answer)?);
    } else {
        let sender_task = answer.sender_task.as_ref();
        let sender_task_id = sender_task.map_or("", |task| task.id.as_str());
        println!(
            "Replied to {}: task {sender_task_id} ({}) {}",
            visible_line(answer.task.metadata.peer.as_deref().unwrap_or("an anonymous sender")),
            short_id(sender_task_id),
            status_of(sender_task)
        );
    }
    Ok(0)
}

pub async fn list(paths: &Paths, json_output: bool) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    let answer = client.agents().await?;
    if json_output {
        println!("{}", api::json_pretty(&answer)?);
        return Ok(0);
    }
    let agents = answer.agents;
    if agents.is_empty() {
        println!("No agents running. Start one with 'synapse <profile>' or 'synapse start <profile>'.");
        return Ok(0);
    }
    let mut rows = vec![
        ["TYPE", "ID", "NAME", "ROLE", "PORT", "STATUS", "PID", "QUEUE", "CURRENT", "DIR"].map(String::from).to_vec(),
    ];
    let mut notes = Vec::new();
    // Every text field comes from a registration or a message: shown with its controls visible.
    for agent in &agents {
        rows.push(vec![
            visible_line(&agent.agent_type),
            visible_line(&agent.agent_id),
            visible_line(agent.name.as_deref().unwrap_or("-")),
            visible_line(agent.role.as_deref().filter(|role| !role.is_empty()).unwrap_or("-")),
            agent.port.to_string(),
            visible_line(&agent.status.to_string()),
            agent.pid.to_string(),
            agent.queue_depth.to_string(),
            visible_line(agent.current_task.as_ref().map_or("-", |task| task.preview.as_str())),
            visible_line(&agent.working_dir),
        ]);
        // Why it takes no message now, in its wrapper's words.
        notes.push(agent.status_note.as_deref().map(visible_line));
    }
    let width = super::table::terminal_width();
    let lines = super::table::render(&rows, &[8, 9], width);
    let mut lines = lines.into_iter();
    if let Some(header) = lines.next() {
        println!("{header}");
    }
    for (line, note) in lines.zip(notes) {
        println!("{line}");
        if let Some(note) = note {
            let note = format!("  ↳ {note}");
            println!("{}", width.map_or(note.clone(), |width| super::table::truncate(&note, width)));
        }
    }
    Ok(0)
}
