//! The MCP server: one tool per thing the CLI does, each going through the typed client to the
//! broker (started on demand, as the CLI does) and answering the model in words.
//!
//! Invariants:
//! - Every tool call ends in a result, never a protocol error: a refusal (bad arguments, no
//!   identity, the broker's own error) is a result with `isError` and a message the model can
//!   read. Only a call the router cannot route at all (an unknown tool) stays a protocol error.
//! - The server acts as the agent it runs in (`SYNAPSE_AGENT_ID` and `SYNAPSE_AGENT_SECRET`),
//!   or anonymously outside one; a model cannot name another sender.
//! - Text that others wrote (replies, previews, records) reaches the model with its control
//!   characters made visible (JSON escapes them; plain text goes through
//!   [`crate::escape::visible`]), as on a terminal: a CLI may print a tool's result.
//! - A new connection per call: the server lives as long as the CLI session, the broker may be
//!   restarted meanwhile.

use super::arguments::{
    FileArguments, HistorySearchArguments, LockArguments, ReplyArguments, SendArguments, TaskArguments,
};
use crate::api::{self, SendAnswer};
use crate::client::{Client, ReplyWaitError};
use crate::config::Paths;
use crate::event::short_id;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use std::path::PathBuf;

/// The tools that exist only while file safety is on.
pub const FILE_TOOLS: [&str; 3] = ["lock_file", "unlock_file", "check_file"];

/// Who the tools act as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Inside an agent: its id (its secret travels with every request, from the environment).
    Agent(String),
    /// Outside any agent: sends anonymously; cannot reply or lock.
    Anonymous,
}

impl Identity {
    /// `SYNAPSE_AGENT_ID` with its `SYNAPSE_AGENT_SECRET` (both set by the wrapper in the
    /// agent's environment), else anonymous.
    pub fn from_env() -> Identity {
        Identity::from_values(std::env::var("SYNAPSE_AGENT_ID").ok(), std::env::var("SYNAPSE_AGENT_SECRET").ok())
    }

    /// An id without its secret is no identity: every send and reply as that agent would be
    /// refused (the broker checks the secret), and the model cannot leave the sender out. A CLI
    /// that passes its MCP servers a filtered environment (one without `*SECRET*` variables,
    /// say) gets a server that sends anonymously instead.
    fn from_values(id: Option<String>, secret: Option<String>) -> Identity {
        match (id, secret) {
            (Some(id), Some(secret)) if !id.trim().is_empty() && !secret.trim().is_empty() => {
                Identity::Agent(id.trim().to_string())
            }
            _ => Identity::Anonymous,
        }
    }

    fn agent_id(&self) -> Option<&str> {
        match self {
            Identity::Agent(id) => Some(id),
            Identity::Anonymous => None,
        }
    }
}

/// What became of a `lock_file` call, to decide whether the lock it got is released again.
struct CancelledLock {
    /// It waited for the file (one that does not wait answers at once).
    waited: bool,
    /// The client cancelled it.
    cancelled: bool,
    /// It got the lock.
    locked: bool,
    /// The agent held the lock before it (a renewal).
    held_before: bool,
    /// No later `lock_file` call for the path came (whose caller was told it holds the lock).
    latest: bool,
}

impl CancelledLock {
    fn to_release(&self) -> bool {
        self.waited && self.cancelled && self.locked && !self.held_before && self.latest
    }
}

/// What a tool answers when it needs an agent identity and the server has none.
fn needs_identity(tool: &str) -> String {
    format!(
        "{tool} acts as a Synapse agent, and this MCP server runs outside any agent (no SYNAPSE_AGENT_ID with its \
         SYNAPSE_AGENT_SECRET in its environment): it can only send anonymously. Start the CLI under Synapse (synapse <profile>) to {tool}."
    )
}

const SEND_DESCRIPTION: &str = "Send a message to another Synapse agent (another AI coding CLI working beside you; list_agents shows who is there). \
The target reads it in its input as `[A2A:<id8>:<your id>:R] <message>` when you expect a reply (R), or `[A2A:<id8>:<your id>] <message>` when not. \
A busy target gets it as soon as it is ready; nothing is lost. \
Without wait_seconds this returns at once, and the answer arrives later in your input as `[A2A:<id8>:<replier>:REPLY] <text>` \
(`[A2A:<id8>:<target>:REPLY] Failed: <why>` or `Canceled: <why>` when your message could not be answered). \
With wait_seconds it waits up to that long and returns the reply's text. Priority 5 interrupts the target: only for what cannot wait.";

const REPLY_DESCRIPTION: &str = "Answer a message that asked for your reply: one that reached you as `[A2A:<id8>:<sender>:R] <text>` (R = the sender waits for your answer). \
Use this tool instead of running `synapse reply` in a shell. It answers the sender waiting for you; when several wait, pass `to`: the sender's agent id, or the <id8> of the message you answer (always right, and the only way for a sender shown as `anonymous`; reply_targets lists them). \
Each request is answered once; the reply completes the sender's task. \
Messages without R (`[A2A:<id8>:<sender>] <text>`) need no answer, and `[A2A:<id8>:<replier>:REPLY]` lines are answers to your own messages: do not reply to those.";

const LIST_AGENTS_DESCRIPTION: &str = "List the Synapse agents running now: agent id, type, name, role, status (READY = idle, PROCESSING = busy, WAITING = a dialog is open), messages queued for it, its current task, working directory. \
Use it to find the target for send (by name, agent id, or type).";

const REPLY_TARGETS_DESCRIPTION: &str = "List the senders waiting for your answer (R messages you have not answered yet): sender agent id, the task id, when it arrived, a preview. \
Use it before reply when several senders may be waiting, and pass the one you answer as reply's `to`.";

const HISTORY_SEARCH_DESCRIPTION: &str = "Search the messages and replies exchanged between agents (both sides are kept) by keywords, newest first: task id, side (sent/received), agent, peer, status, the message (input) and the reply (output). \
A text longer than 4000 characters is cut there (the task tool gives it whole). Use it to recall what was asked or decided earlier.";

/// How much of each text a `history_search` record shows: a search of many long messages would
/// otherwise fill the model's context (200 records of 9 MB made one 113 MB result).
const SEARCH_PREVIEW_CHARS: usize = 4000;

/// `text` cut to [`SEARCH_PREVIEW_CHARS`] characters, saying how much was left out.
fn preview(text: &mut String) {
    if let Some((end, _)) = text.char_indices().nth(SEARCH_PREVIEW_CHARS) {
        let left_out = text[end..].chars().count();
        text.truncate(end);
        text.push_str(&format!("\n[cut: {left_out} more characters; the task tool gives the whole text]"));
    }
}

const TASK_DESCRIPTION: &str = "The state and outputs of one task: submitted, working, completed (the reply is in artifacts), failed, canceled, input_required. \
Use it to check on a message you sent (the task id is in send's result, or the <id8> of an [A2A:<id8>:...] prefix).";

const LOCK_FILE_DESCRIPTION: &str = "Lock a file before you edit it, so that other agents do not change it meanwhile (file safety). \
Fails, naming the holder, when another agent holds it; with wait_seconds it waits for the file to be free. Locking again renews your lock. Release it with unlock_file when done.";

const UNLOCK_FILE_DESCRIPTION: &str =
    "Release your lock on a file once your edit is done, so that others may change it.";

const CHECK_FILE_DESCRIPTION: &str = "May you write this file now? Answers allowed or not and why (who holds a lock), with the file's recent modifications by other agents: read those before editing.";

/// The MCP server of one agent (or of an anonymous user).
#[derive(Clone)]
pub struct SynapseTools {
    paths: Paths,
    identity: Identity,
    file_safety: bool,
    /// Relative file paths are taken from here (the CLI starts its MCP servers in its own).
    /// None when it was removed before the server started: file tools then take absolute paths.
    working_dir: Option<PathBuf>,
    tool_router: ToolRouter<SynapseTools>,
    /// How many `lock_file` calls each path has had: a cancelled call releases the lock it got
    /// only when no later call for that path came after it (which may hold the lock now).
    lock_calls: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
}

fn success(text: impl Into<String>) -> Result<CallToolResult, ErrorData> {
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

/// A refusal the model reads (the CLI's `Error: ...` line).
/// What it says may quote the model's own arguments (a name, an id): control characters are
/// shown, not passed on to the terminal that prints the result.
fn refusal(message: impl std::fmt::Display) -> Result<CallToolResult, ErrorData> {
    let message = crate::escape::visible(&message.to_string());
    Ok(CallToolResult::error(vec![ContentBlock::text(format!("Error: {message}"))]))
}

/// A broker answer as indented JSON for the model (strings with controls come out escaped).
fn json(value: &impl serde::Serialize) -> Result<CallToolResult, ErrorData> {
    match api::json_pretty(value) {
        Ok(text) => success(text),
        Err(error) => refusal(format!("cannot encode the broker's answer: {error}")),
    }
}

/// Refuses with the message unless `$result` is Ok.
macro_rules! or_refuse {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(error) => return refusal(format!("{error:#}")),
        }
    };
}

#[tool_router]
impl SynapseTools {
    pub fn new(paths: Paths, identity: Identity, file_safety: bool, working_dir: Option<PathBuf>) -> SynapseTools {
        let mut tool_router = Self::tool_router();
        if !file_safety {
            for name in FILE_TOOLS {
                tool_router.disable_route(name);
            }
        }
        SynapseTools { paths, identity, file_safety, working_dir, tool_router, lock_calls: Default::default() }
    }

    /// Starts a broker when none runs, but never one the user stopped on purpose: a model's
    /// tool call is not the user deciding to start it again (outside an agent too).
    async fn client(&self) -> anyhow::Result<Client> {
        Client::connect_unless_stopped(&self.paths).await
    }

    fn agent(&self, tool: &str) -> Result<&str, String> {
        self.identity.agent_id().ok_or_else(|| needs_identity(tool))
    }

    #[tool(description = SEND_DESCRIPTION)]
    async fn send(&self, arguments: Parameters<SendArguments>) -> Result<CallToolResult, ErrorData> {
        // wait_seconds bound the whole call: the CLIs give a tool TOOL_TIMEOUT_SECS.
        let started = std::time::Instant::now();
        let flow = or_refuse!(crate::settings::Settings::load_current(&self.paths.home).and_then(|s| s.flow()));
        let plan = or_refuse!(arguments.0.validate(flow));
        let mut client = or_refuse!(self.client().await);
        let from = self.identity.agent_id().map(str::to_string);
        let secret = if from.is_some() { client.secret().map(str::to_string) } else { None };
        let request = api::SendRequest { from, secret, ..plan.request };
        let answer = match client.send_retrying(&self.paths, &request, true).await {
            Ok(answer) => answer,
            Err(error) if error.is::<crate::client::SendUncertain>() => {
                let key = error.downcast_ref::<crate::client::SendUncertain>().map(|uncertain| uncertain.key.clone());
                return refusal(format!(
                    "{error:#}. To send it at most once, call send again with the same arguments and idempotency_key \"{}\".",
                    key.unwrap_or_default()
                ));
            }
            Err(error) => return refusal(format!("{error:#}")),
        };
        let in_agent = self.identity.agent_id().is_some();
        let summary = sent_summary(&answer, in_agent);
        // A reply's sender task is the one it completed: there is no answer to wait for.
        let awaited = answer.sender_task.as_ref().filter(|_| !answer.is_reply);
        let (Some(seconds), Some(sender_task)) = (plan.wait_seconds, awaited) else {
            return success(summary);
        };
        match client.wait_for_reply(&self.paths, true, &sender_task.id, seconds, started).await {
            Ok(reply) => success(crate::escape::visible(&reply)),
            Err(ReplyWaitError::TimedOut { task_id, seconds }) if in_agent => refusal(format!(
                "the message was delivered, but no reply came within {seconds} s. Do not send it again: task {task_id} ({}) stays open, \
                 and the reply will reach your input as [A2A:{}:<replier>:REPLY] <text> (or look with the task tool).",
                short_id(&task_id),
                short_id(&task_id)
            )),
            Err(ReplyWaitError::TimedOut { task_id, seconds }) => refusal(format!(
                "the message was delivered, but no reply came within {seconds} s. Do not send it again: task {task_id} ({}) stays open; \
                 look for the reply with the task tool.",
                short_id(&task_id)
            )),
            Err(error) => refusal(format!("{summary}\n{error}")),
        }
    }

    #[tool(description = REPLY_DESCRIPTION)]
    async fn reply(&self, arguments: Parameters<ReplyArguments>) -> Result<CallToolResult, ErrorData> {
        let from = or_refuse!(self.agent("reply")).to_string();
        let plan = or_refuse!(arguments.0.validate());
        let mut client = or_refuse!(self.client().await);
        let secret = client.secret().map(str::to_string);
        let request =
            api::ReplyRequest { from, secret, to: plan.to, text: plan.text, idempotency_key: plan.idempotency_key };
        let answer = match client.send_retrying(&self.paths, &request, true).await {
            Ok(answer) => answer,
            Err(error) if error.is::<crate::client::SendUncertain>() => {
                let key = error.downcast_ref::<crate::client::SendUncertain>().map(|uncertain| uncertain.key.clone());
                return refusal(format!(
                    "{error:#}. To reply at most once, call reply again with the same arguments and idempotency_key \"{}\".",
                    key.unwrap_or_default()
                ));
            }
            Err(error) => return refusal(format!("{error:#}")),
        };
        let sender_task = answer.sender_task.as_ref();
        let replied = format!(
            "Replied to {}: their task {} is {}.",
            crate::escape::visible_line(answer.task.metadata.peer.as_deref().unwrap_or("an anonymous sender")),
            short_id(sender_task.map_or("", |task| task.id.as_str())),
            sender_task.map(|task| task.status.to_string()).unwrap_or_default()
        );
        match &answer.warning {
            Some(warning) => success(format!("{}\n{replied}", crate::escape::visible_line(warning))),
            None => success(replied),
        }
    }

    #[tool(description = LIST_AGENTS_DESCRIPTION, annotations(read_only_hint = true))]
    async fn list_agents(&self) -> Result<CallToolResult, ErrorData> {
        let mut client = or_refuse!(self.client().await);
        let agents = or_refuse!(client.agents().await).agents;
        if agents.is_empty() {
            return success("No agents are running.");
        }
        let me = self.identity.agent_id();
        let rows: Vec<serde_json::Value> = agents
            .iter()
            .map(|agent| {
                serde_json::json!({
                    "agent_id": agent.agent_id,
                    "type": agent.agent_type,
                    "name": agent.name,
                    "role": agent.role,
                    "status": agent.status,
                    "status_note": agent.status_note,
                    "queued_messages": agent.queue_depth,
                    "current_task": agent.current_task.as_ref().map(|task| &task.preview),
                    "working_dir": agent.working_dir,
                    "is_you": me == Some(agent.agent_id.as_str()),
                })
            })
            .collect();
        json(&rows)
    }

    #[tool(description = REPLY_TARGETS_DESCRIPTION, annotations(read_only_hint = true))]
    async fn reply_targets(&self) -> Result<CallToolResult, ErrorData> {
        let me = or_refuse!(self.agent("reply_targets")).to_string();
        let mut client = or_refuse!(self.client().await);
        let targets = or_refuse!(client.reply_targets(&me).await).targets;
        if targets.is_empty() {
            return success("No one is waiting for your reply.");
        }
        json(&targets)
    }

    #[tool(description = HISTORY_SEARCH_DESCRIPTION, annotations(read_only_hint = true))]
    async fn history_search(&self, arguments: Parameters<HistorySearchArguments>) -> Result<CallToolResult, ErrorData> {
        if !crate::settings::history_enabled() {
            return refusal(crate::settings::HISTORY_DISABLED);
        }
        let plan = or_refuse!(arguments.0.validate());
        let mut client = or_refuse!(self.client().await);
        let records = or_refuse!(
            client
                .search_history(&plan.keywords, plan.logic, plan.case_sensitive, plan.agent.as_deref(), plan.limit)
                .await
        )
        .records;
        if records.is_empty() {
            return success("No records match.");
        }
        let mut records = records;
        for record in &mut records {
            preview(&mut record.input);
            preview(&mut record.output);
        }
        json(&records)
    }

    #[tool(description = TASK_DESCRIPTION, annotations(read_only_hint = true))]
    async fn task(&self, arguments: Parameters<TaskArguments>) -> Result<CallToolResult, ErrorData> {
        let id = or_refuse!(arguments.0.validate());
        let mut client = or_refuse!(self.client().await);
        json(&or_refuse!(client.task(&id).await).task)
    }

    /// A waiting lock the client cancels (the user's Esc) is not given up half-way: the broker
    /// may grant it at any moment of its wait, so the call runs to its end, and a lock it got
    /// for a caller who has gone is released again: unless the agent held it before the call
    /// (that lock was only being renewed), or another `lock_file` call for the path came after
    /// this one (the model asked again: that call's lock is the same lock, and it was told it
    /// holds it).
    #[tool(description = LOCK_FILE_DESCRIPTION)]
    async fn lock_file(
        &self,
        arguments: Parameters<LockArguments>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let agent_id = or_refuse!(self.agent("lock_file")).to_string();
        let plan = or_refuse!(arguments.0.validate(self.working_dir.as_deref()));
        let mut client = or_refuse!(self.client().await);
        let call = self.lock_call(&plan.path, true);
        let held_before = if plan.wait_seconds.is_some_and(|seconds| seconds > 0) {
            let check = api::ValidateRequest { path: plan.path.clone(), agent_id: agent_id.clone() };
            or_refuse!(client.validate_write(&check).await).lock.is_some_and(|lock| lock.agent_id == agent_id)
        } else {
            false
        };
        let request = api::LockRequest {
            path: plan.path,
            agent_id,
            duration_seconds: Some(plan.duration_seconds),
            intent: plan.intent,
            task_id: plan.task_id,
            wait_seconds: plan.wait_seconds,
        };
        let answer = or_refuse!(client.lock(&request).await);
        let cancelled = CancelledLock {
            waited: request.wait_seconds.is_some_and(|seconds| seconds > 0),
            cancelled: context.ct.is_cancelled(),
            locked: answer.locked,
            held_before,
            latest: self.lock_call(&request.path, false) == call,
        };
        if cancelled.to_release() {
            let release =
                api::UnlockRequest { path: request.path.clone(), agent_id: Some(request.agent_id), force: false };
            or_refuse!(client.unlock(&release).await);
            return refusal(format!("the call was cancelled; the lock it got on {} is released", request.path));
        }
        json(&answer)
    }

    /// The number of the latest `lock_file` call for `path`, after counting one more if `new`.
    fn lock_call(&self, path: &str, new: bool) -> u64 {
        let mut calls = self.lock_calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = calls.entry(path.to_string()).or_insert(0);
        if new {
            *count += 1;
        }
        *count
    }

    #[tool(description = UNLOCK_FILE_DESCRIPTION)]
    async fn unlock_file(&self, arguments: Parameters<FileArguments>) -> Result<CallToolResult, ErrorData> {
        let agent_id = or_refuse!(self.agent("unlock_file")).to_string();
        let path = or_refuse!(arguments.0.validate(self.working_dir.as_deref()));
        let mut client = or_refuse!(self.client().await);
        let request = api::UnlockRequest { path, agent_id: Some(agent_id), force: false };
        success(format!("Unlocked {}", or_refuse!(client.unlock(&request).await).unlocked))
    }

    #[tool(description = CHECK_FILE_DESCRIPTION, annotations(read_only_hint = true))]
    async fn check_file(&self, arguments: Parameters<FileArguments>) -> Result<CallToolResult, ErrorData> {
        let agent_id = or_refuse!(self.agent("check_file")).to_string();
        let path = or_refuse!(arguments.0.validate(self.working_dir.as_deref()));
        let mut client = or_refuse!(self.client().await);
        json(&or_refuse!(client.validate_write(&api::ValidateRequest { path, agent_id }).await))
    }
}

/// What a send did, in the CLI's words, with what the model needs to follow it up.
fn sent_summary(answer: &SendAnswer, in_agent: bool) -> String {
    if answer.is_reply {
        let sender_task = answer.sender_task.as_ref();
        return format!(
            "Replied to {}: their task {} is {}.",
            crate::escape::visible_line(
                sender_task.and_then(|task| task.metadata.owner.as_deref()).unwrap_or("an anonymous sender")
            ),
            short_id(sender_task.map_or("", |task| task.id.as_str())),
            sender_task.map(|task| task.status.to_string()).unwrap_or_default()
        );
    }
    let task = &answer.task;
    let mut text = format!(
        "Sent to {}: task {} ({}) {}.",
        crate::escape::visible_line(task.metadata.owner.as_deref().unwrap_or_default()),
        task.id,
        short_id(&task.id),
        task.status
    );
    if let Some(warning) = &answer.warning {
        text = format!("{warning}\n{text}");
    }
    match &answer.sender_task {
        Some(sender_task) if in_agent => text.push_str(&format!(
            "\nA reply is expected: it will reach your input as [A2A:{}:<replier>:REPLY] <text>. Your task {} tracks it (task tool).",
            short_id(&sender_task.id),
            sender_task.id
        )),
        // Outside an agent nothing types the reply anywhere: the task holds it.
        Some(sender_task) => text.push_str(&format!(
            "\nA reply is expected: look for it with the task tool. Your task {} tracks it.",
            sender_task.id
        )),
        None => {}
    }
    text
}

impl SynapseTools {
    /// The server's instructions: who the tools act as, what the prefixes mean, which tools work.
    fn instructions(&self) -> String {
        let prefixes = "Messages from other agents arrive in your input with a prefix: `[A2A:<id8>:<sender>:R] <text>` asks for your answer \
(R: answer it with the reply tool), `[A2A:<id8>:<sender>] <text>` needs no answer, `[A2A:<id8>:<replier>:REPLY] <text>` is the answer to a message you sent \
(`Failed: <why>` or `Canceled: <why>` as its text when that message could not be answered).";
        let who = match &self.identity {
            Identity::Agent(id) => format!(
                "Synapse lets AI coding agents work together. You are the Synapse agent {id}: these tools act as you. {prefixes} \
Use send to message another agent (list_agents shows who runs), reply to answer, reply_targets to see who waits for you, task to follow a message, history_search to look back."
            ),
            Identity::Anonymous => format!(
                "Synapse lets AI coding agents work together. This server runs outside any Synapse agent (no SYNAPSE_AGENT_ID), so it acts anonymously: \
send, list_agents, task and history_search work; reply, reply_targets and the file tools need an agent identity and answer an error. {prefixes}"
            ),
        };
        if self.file_safety {
            format!(
                "{who} File safety is on: call check_file and lock_file before editing a file, unlock_file when done."
            )
        } else {
            who
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SynapseTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("synapse", api::VERSION))
            .with_instructions(self.instructions())
    }

    /// As the router, except that a file tool called while file safety is off (not listed, but
    /// a client may know it) answers how to turn it on instead of "tool not found".
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.file_safety && FILE_TOOLS.contains(&request.name.as_ref()) {
            return refusal(crate::settings::FILE_SAFETY_HOW_TO_ENABLE).map(Into::into);
        }
        self.tool_router.call(ToolCallContext::new(self, request, context)).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A cancelled waiting lock is released, but not a renewal's, not a call's that did not
    /// wait, and not once the model asked again for the same path (its call holds that lock).
    #[test]
    fn a_cancelled_lock_is_released_only_when_nobody_was_told_of_it() {
        let lock = |waited, cancelled, held_before, latest| {
            CancelledLock { waited, cancelled, locked: true, held_before, latest }.to_release()
        };
        assert!(lock(true, true, false, true));
        assert!(!lock(true, false, false, true), "not cancelled");
        assert!(!lock(false, true, false, true), "no wait");
        assert!(!lock(true, true, true, true), "a renewal");
        assert!(!lock(true, true, false, false), "asked again");
        assert!(
            !CancelledLock { waited: true, cancelled: true, locked: false, held_before: false, latest: true }
                .to_release()
        );
        let tools = tools(Identity::Agent("synapse-codex-8120".into()), true);
        let first = tools.lock_call("/a", true);
        assert_eq!(tools.lock_call("/a", false), first, "the latest call");
        tools.lock_call("/b", true);
        assert_eq!(tools.lock_call("/a", false), first, "another path's call is another count");
        tools.lock_call("/a", true);
        assert_ne!(tools.lock_call("/a", false), first, "a later call for the path");
    }

    #[test]
    fn an_agent_id_without_its_secret_is_no_identity() {
        let id = || Some("synapse-codex-8120".to_string());
        assert_eq!(Identity::from_values(id(), Some("s".into())), Identity::Agent("synapse-codex-8120".into()));
        assert_eq!(Identity::from_values(id(), None), Identity::Anonymous);
        assert_eq!(Identity::from_values(id(), Some(" ".into())), Identity::Anonymous);
        assert_eq!(Identity::from_values(None, Some("s".into())), Identity::Anonymous);
        assert_eq!(Identity::from_values(Some(" ".into()), Some("s".into())), Identity::Anonymous);
    }

    fn tools(identity: Identity, file_safety: bool) -> SynapseTools {
        let paths = Paths { home: "/nonexistent/home".into(), uds_dir: "/nonexistent/uds".into(), broker_port: 0 };
        SynapseTools::new(paths, identity, file_safety, Some("/work".into()))
    }

    fn names(tools: &SynapseTools) -> Vec<String> {
        tools.tool_router.list_all().into_iter().map(|tool| tool.name.to_string()).collect()
    }

    #[test]
    fn the_file_tools_are_offered_only_while_file_safety_is_on() {
        let off = names(&tools(Identity::Anonymous, false));
        assert_eq!(off, ["history_search", "list_agents", "reply", "reply_targets", "send", "task"]);
        let on = names(&tools(Identity::Agent("synapse-claude-8100".into()), true));
        for name in FILE_TOOLS {
            assert!(on.contains(&name.to_string()), "{on:?}");
        }
    }

    #[test]
    fn every_tool_has_a_description_and_an_object_schema() {
        for tool in tools(Identity::Anonymous, true).tool_router.list_all() {
            assert!(tool.description.as_deref().is_some_and(|text| text.len() > 40), "{}", tool.name);
            assert_eq!(tool.input_schema.get("type").and_then(|kind| kind.as_str()), Some("object"), "{}", tool.name);
        }
    }

    #[test]
    fn the_instructions_say_who_the_tools_act_as() {
        let agent = tools(Identity::Agent("synapse-codex-8120".into()), false).instructions();
        assert!(agent.contains("You are the Synapse agent synapse-codex-8120"), "{agent}");
        assert!(agent.contains("[A2A:<id8>:<sender>:R]") && agent.contains("reply tool"), "{agent}");
        let anonymous = tools(Identity::Anonymous, false).instructions();
        assert!(anonymous.contains("acts anonymously"), "{anonymous}");
        assert!(tools(Identity::Anonymous, true).instructions().contains("File safety is on"));
    }

    #[tokio::test]
    async fn an_anonymous_server_refuses_to_reply_with_a_readable_tool_error() {
        let tools = tools(Identity::Anonymous, false);
        let arguments = Parameters(ReplyArguments { message: "4".into(), to: None, idempotency_key: None });
        let result = tools.reply(arguments).await.unwrap();
        assert_eq!(result.is_error, Some(true));
        let text = serde_json::to_string(&result.content).unwrap();
        assert!(text.contains("outside any agent"), "{text}");
    }
}
