//! `synapse demo`: a broker and two dummy agents in a temporary home, a plain send, a
//! `--response` round trip answered by the auto-replying dummy, messages queued while it is
//! busy, and a priority-5 interrupt; then what each terminal showed and the event log.

use super::system::event_line;
use crate::api::Announce;
use crate::client::Client;
use crate::config::Paths;
use crate::event::Envelope;
use anyhow::{Context, bail};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

struct Demo {
    dir: PathBuf,
    paths: Paths,
    exe: PathBuf,
    wrappers: Vec<u32>,
}

impl Demo {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.exe);
        command
            .args(args)
            .env("SYNAPSE_HOME", &self.paths.home)
            .env("SYNAPSE_UDS_DIR", &self.paths.uds_dir)
            .env("SYNAPSE_BROKER_PORT", "0")
            .env_remove("SYNAPSE_AGENT_ID")
            .env_remove("SYNAPSE_AGENT_SECRET")
            .stdin(std::process::Stdio::null());
        command
    }

    /// Runs `synapse ...` (as `agent` when given), shows the command and its output.
    fn run(&self, agent: Option<&Announce>, args: &[&str]) -> anyhow::Result<Output> {
        let mut command = self.command(args);
        let who = match agent {
            Some(agent) => {
                command.env("SYNAPSE_AGENT_ID", &agent.agent_id).env("SYNAPSE_AGENT_SECRET", &agent.secret);
                format!("[as {}] ", agent.agent_id)
            }
            None => String::new(),
        };
        let shown: Vec<String> =
            args.iter().map(|arg| if arg.contains(' ') { format!("\"{arg}\"") } else { arg.to_string() }).collect();
        println!("  {who}$ synapse {}", shown.join(" "));
        let output = output_within(command, STEP_DEADLINE)?;
        for line in
            String::from_utf8_lossy(&output.stdout).lines().chain(String::from_utf8_lossy(&output.stderr).lines())
        {
            println!("      {line}");
        }
        if !output.status.success() {
            bail!("'synapse {}' failed", args.join(" "));
        }
        Ok(output)
    }

    fn start(&mut self, name: &str, auto_reply: bool) -> anyhow::Result<Announce> {
        // Port 0: the system chooses. The dummy profile's range (8190-8199) may be taken by
        // anything on this machine, and the demo must run however busy it is.
        let mut command = self.command(&["start", "dummy", "--name", name, "--port", "0", "--json"]);
        if auto_reply {
            command.env("SYNAPSE_DUMMY_AUTO_REPLY", "1").env("SYNAPSE_DUMMY_REPLY_DELAY_MS", "700");
        }
        let output = output_within(command, STEP_DEADLINE)?;
        if !output.status.success() {
            bail!("cannot start {name}: {}", String::from_utf8_lossy(&output.stderr));
        }
        let agent: Announce = serde_json::from_slice(&output.stdout).context("unexpected answer from synapse start")?;
        self.wrappers.push(agent.pid);
        println!(
            "  started {name}: {} (pid {}, port {}){}",
            agent.agent_id,
            agent.pid,
            agent.port,
            if auto_reply { ", answers :R messages by itself after 0.7 s" } else { "" }
        );
        Ok(agent)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        for pid in &self.wrappers {
            if let Ok(pid) = i32::try_from(*pid) {
                crate::process::signal(pid, libc::SIGTERM);
            }
        }
        // A wrapper that has not ended after the grace period is killed with its CLI (each
        // leads its own process group): the demo never hangs on its way out.
        let deadline = std::time::Instant::now() + WRAPPER_GRACE;
        for pid in &self.wrappers {
            while crate::process::is_pid_alive(*pid) {
                if std::time::Instant::now() >= deadline {
                    if let Ok(group) = i32::try_from(*pid) {
                        crate::process::signal(-group, libc::SIGKILL);
                    }
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        let _ = output_within(self.command(&["broker", "stop"]), STEP_DEADLINE);
    }
}

/// Longest the demo waits for one of its steps.
const STEP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
/// How long the wrappers have to end after SIGTERM before they are killed.
const WRAPPER_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `command` to its end and collects its output, killing it if it takes longer than
/// `deadline` (a command that never returns must not hang the demo).
fn output_within(mut command: Command, deadline: std::time::Duration) -> anyhow::Result<Output> {
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let child = command.spawn().context("cannot run synapse")?;
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(deadline) {
        Ok(output) => Ok(output?),
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                crate::process::signal(pid, libc::SIGKILL);
            }
            bail!("a synapse command did not finish within {} s", deadline.as_secs())
        }
    }
}

/// Follows the log until `done` says the state it folds is complete (at most [`STEP_DEADLINE`]).
async fn follow_until(paths: &Paths, mut done: impl FnMut(&Envelope) -> bool) -> anyhow::Result<()> {
    let mut client = Client::connect(paths, true).await?;
    let mut finished = false;
    let followed = client.events(0, true, None, None, |data| {
        if let Ok(envelope) = serde_json::from_str::<Envelope>(data)
            && done(&envelope)
        {
            finished = true;
            return false;
        }
        true
    });
    // A step that never comes must not hang the demo: say so, and where to look.
    match tokio::time::timeout(STEP_DEADLINE, followed).await {
        Ok(result) => result?,
        Err(_) => bail!(
            "a demo step did not happen within {} s; 'synapse events' shows how far it got",
            STEP_DEADLINE.as_secs()
        ),
    }
    if !finished {
        bail!("the broker stopped before the demo finished");
    }
    Ok(())
}

/// Every ticket written and every agent back at its prompt afterwards, at the event `head` or
/// a later one (the log is replayed from its start, and earlier moments were settled too). The
/// state at `head` itself counts: everything may have settled before the demo read the head,
/// and then no later event comes.
fn settled(head: u64) -> impl FnMut(&Envelope) -> bool {
    use crate::event::{AgentStatus, Event};
    let mut issued = 0usize;
    let mut injected = 0usize;
    let mut ready: HashMap<String, bool> = HashMap::new();
    move |envelope| {
        match &envelope.event {
            Event::TicketIssued { .. } | Event::ReverseTicketIssued { .. } => issued += 1,
            Event::TicketInjected { agent_id, .. } => {
                injected += 1;
                ready.insert(agent_id.clone(), false);
            }
            Event::AgentStatusChanged { agent_id, status, .. } => {
                ready.insert(agent_id.clone(), *status == AgentStatus::Ready);
            }
            _ => {}
        }
        envelope.seq >= head
            && issued > 0
            && issued == injected
            && ready.len() >= 2
            && ready.values().all(|ready| *ready)
    }
}

pub fn run(keep: bool) -> anyhow::Result<i32> {
    let dir = std::env::temp_dir().join(format!("synapse-demo-{}", std::process::id()));
    let paths = Paths { home: dir.join("home"), uds_dir: dir.join("uds"), broker_port: 0 };
    let exe = std::env::current_exe().context("cannot find the synapse executable")?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = {
        let mut demo = Demo { dir: dir.clone(), paths: paths.clone(), exe, wrappers: Vec::new() };
        script(&mut demo, &runtime)
    };
    if keep {
        println!("\nThe demo's home is kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn script(demo: &mut Demo, runtime: &tokio::runtime::Runtime) -> anyhow::Result<i32> {
    println!("Synapse demo: a broker and two dummy agents in {}\n", demo.dir.display());
    println!("1. Start two agents in the background (the broker starts on demand)");
    let alice = demo.start("alice", false)?;
    let bob = demo.start("bob", true)?;
    let ids = [alice.agent_id.clone(), bob.agent_id.clone()];
    runtime.block_on(follow_until(&demo.paths, {
        let mut ready: HashMap<String, bool> = HashMap::new();
        let ids = ids.clone();
        move |envelope| {
            if let crate::event::Event::AgentStatusChanged { agent_id, status, .. } = &envelope.event {
                ready.insert(agent_id.clone(), *status == crate::event::AgentStatus::Ready);
            }
            ids.iter().all(|id| ready.get(id).copied().unwrap_or(false))
        }
    }))?;
    demo.run(None, &["list"])?;

    println!("\n2. A plain message from alice to bob (no reply expected)");
    demo.run(Some(&alice), &["send", "bob", "Hello Bob, just so you know: the build is green.", "--no-response"])?;

    println!("\n3. A question that expects a reply; bob's dummy answers with 'synapse reply'");
    let asked = demo.run(Some(&alice), &["send", "bob", "Bob, what is 6 x 7?", "--response"])?;
    let sender_task = String::from_utf8_lossy(&asked.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("Reply expected: your task "))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .context("no task id in the output of synapse send")?;

    println!("\n4. While bob is busy answering, two more messages queue in his inbox");
    demo.run(None, &["send", "bob", "queued message 1", "--no-response"])?;
    demo.run(None, &["send", "bob", "queued message 2", "--no-response", "-p", "4"])?;

    println!("\n5. Alice's task completes when the reply arrives (it also lands in her terminal)");
    let waited = runtime.block_on(async {
        let mut client = Client::connect(&demo.paths, true).await?;
        anyhow::Ok(client.wait_task(&sender_task, std::time::Duration::from_secs(30)).await?)
    })?;
    println!(
        "  task {} is {}: \"{}\"",
        crate::event::short_id(&sender_task),
        waited.task.status,
        waited.reply.as_deref().unwrap_or_default()
    );

    println!("\n6. Priority 5 interrupts bob while he works on another question, then is written");
    let asked = demo.run(None, &["send", "bob", "Bob, a long question for you?", "--response"])?;
    // "Sent to <agent>: task <id> (<id8>) submitted"
    let question_task = String::from_utf8_lossy(&asked.stdout)
        .lines()
        .find_map(|line| line.split_once(": task ").map(|(_, rest)| rest.to_string()))
        .and_then(|rest| rest.split_whitespace().next().map(str::to_string))
        .context("no task id in the output of synapse send")?;
    // Once bob is busy with it (his dummy takes 700 ms to answer), the urgent message comes.
    runtime.block_on(follow_until(&demo.paths, |envelope| {
        matches!(&envelope.event, crate::event::Event::TaskStateChanged { task_id, state: crate::event::TaskState::Working, .. } if *task_id == question_task)
    }))?;
    demo.run(None, &["send", "bob", "URGENT: stop and read this", "--no-response", "-p", "5"])?;

    // Everything up to the urgent message is in the log now: wait until it has all settled.
    let head = runtime.block_on(async {
        let mut client = Client::connect(&demo.paths, true).await?;
        let mut head = 0;
        client
            .events(0, false, None, None, |data| {
                if let Ok(envelope) = serde_json::from_str::<Envelope>(data) {
                    head = envelope.seq;
                }
                true
            })
            .await?;
        anyhow::Ok(head)
    })?;
    runtime.block_on(follow_until(&demo.paths, settled(head)))?;
    for (name, agent) in [("alice", &alice), ("bob", &bob)] {
        println!("\n--- {name}'s terminal ({}) ---", agent.agent_id);
        let log = std::fs::read_to_string(agent.log.as_deref().unwrap_or_default()).unwrap_or_default();
        for line in log.replace('\r', "").lines() {
            println!("  {line}");
        }
    }
    println!("\n--- the event log ---");
    let events = runtime.block_on(async {
        let mut client = Client::connect(&demo.paths, true).await?;
        let mut lines = Vec::new();
        client
            .events(0, false, None, None, |data| {
                if let Ok(envelope) = serde_json::from_str::<Envelope>(data) {
                    lines.push(event_line(&envelope));
                }
                true
            })
            .await?;
        anyhow::Ok(lines)
    })?;
    for line in events {
        println!("{line}");
    }
    println!("\nDone. Every message above is an event in one durable log; try 'synapse --help'.");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::settled;
    use crate::event::{AgentStatus, Envelope, Event};

    fn at(seq: u64, event: Event) -> Envelope {
        Envelope { v: crate::event::SCHEMA_VERSION, seq, time_ms: 0, actor: None, event }
    }

    fn status(seq: u64, agent: &str, status: AgentStatus) -> Envelope {
        at(seq, Event::AgentStatusChanged { agent_id: agent.into(), status, note: None })
    }

    fn issued(seq: u64, agent: &str) -> Envelope {
        at(
            seq,
            Event::TicketIssued {
                agent_id: agent.into(),
                task_id: format!("t{seq}"),
                priority: 3,
                from: None,
                display_task_id: format!("t{seq}"),
                response_expected: false,
                turn: 0,
            },
        )
    }

    fn injected(seq: u64, agent: &str, ticket: u64) -> Envelope {
        at(seq, Event::TicketInjected { agent_id: agent.into(), ticket, priority: 3, how: None })
    }

    /// The log as it stood in a demo that waited for ever: everything had settled by the time
    /// the demo read the head (6), so no later event came; the state at the head counts.
    #[test]
    fn a_log_settled_at_its_head_is_settled() {
        let log = [
            status(1, "alice", AgentStatus::Ready),
            status(2, "bob", AgentStatus::Ready),
            issued(3, "bob"),
            injected(4, "bob", 3),
            status(5, "bob", AgentStatus::Processing),
            status(6, "bob", AgentStatus::Ready),
        ];
        let mut done = settled(6);
        let answers: Vec<bool> = log.iter().map(&mut done).collect();
        assert_eq!(answers, [false, false, false, false, false, true]);
    }

    /// Moments before the head that looked settled do not count, nor a state with a ticket not
    /// yet written or an agent not back at its prompt.
    #[test]
    fn earlier_settled_moments_and_unsettled_states_do_not_count() {
        let mut done = settled(5);
        assert!(!done(&status(1, "alice", AgentStatus::Ready)));
        assert!(!done(&issued(2, "bob")));
        assert!(!done(&injected(3, "bob", 2)));
        assert!(!done(&status(4, "bob", AgentStatus::Ready)), "settled, but before the head");
        assert!(!done(&issued(5, "bob")), "a ticket waits");
        assert!(!done(&injected(6, "bob", 5)), "bob has not come back to his prompt");
        assert!(done(&status(7, "bob", AgentStatus::Ready)));
    }
}
