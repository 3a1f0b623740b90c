//! The script: what the model answers, decided from the request's last turn alone (pure, no I/O).
//!
//! Rules, first match wins, on the text of the last user turn:
//! 1. the last turn is a tool result → the final text `Done.` (ends the turn);
//! 2. a Synapse reply-expected header (`:R]`) and `what is A+B` → the Synapse MCP `reply` tool
//!    with `<A+B>` when the request offers it (`mcp__synapse__reply`, `synapse_reply`, ...), else
//!    shell `synapse reply "<A+B>"`;
//! 3. `please run: <cmd>` → shell `<cmd>` (the rest of that line);
//! 4. `hesitate`, without `urgent` → `OK.` after [`LATE_WAIT`] of silence (a model slow to its
//!    first words; a turn that also carries the priority-5 message sent to cut it is answered);
//! 5. `slow` → a slow text stream (one chunk every [`SLOW_CHUNK_INTERVAL`] for [`SLOW_CHUNKS`]);
//! 6. `what is A+B` → the sum as text;
//! 7. anything else → `OK.`.
//!
//! A request without tools is a CLI-internal one (titles, routing, next-speaker checks): it gets
//! [`Action::Internal`], never a tool call. The shell tool is picked from the request's own tool
//! list, and its arguments are filled from that tool's JSON schema.

use serde_json::{Map, Value, json};
use std::time::Duration;

/// Shell tool names, in the order of preference.
pub const SHELL_TOOL_NAMES: [&str; 5] = ["Bash", "exec_command", "shell", "run_shell_command", "bash"];

/// Pause between two chunks of a slow answer.
pub const SLOW_CHUNK_INTERVAL: Duration = Duration::from_millis(200);

/// Chunks in a slow answer (about 60 s at [`SLOW_CHUNK_INTERVAL`]).
pub const SLOW_CHUNKS: usize = 300;

/// Silence before a late answer's only words (about as long as a slow answer).
pub const LATE_WAIT: Duration = Duration::from_secs(60);

/// The final text after a tool result.
pub const DONE_TEXT: &str = "Done.";

/// The answer to anything the script has no rule for.
pub const DEFAULT_TEXT: &str = "OK.";

/// The conversation's last turn, as far as the script cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Turn {
    /// Text of the most recent user message (CLI-injected context blocks left out).
    pub last_user_text: Option<String>,
    /// The last turn is a tool result (tool_result, function_call_output, role tool, functionResponse).
    pub is_after_tool_result: bool,
}

/// A tool offered by the request: its name and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub schema: Value,
}

impl Turn {
    /// The user text this request brings to the model: none when the last turn is a tool result
    /// (then the text was already brought by an earlier request). What the record keeps, so that
    /// "reached the model exactly once" is a count of records.
    pub fn new_user_text(&self) -> Option<String> {
        if self.is_after_tool_result { None } else { self.last_user_text.clone() }
    }
}

/// What the model answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A text answer, sent at once.
    Text(String),
    /// A text answer streamed slowly, until done or the client goes away.
    Slow,
    /// `OK.` after [`LATE_WAIT`] without a word, unless the client goes away first.
    Late,
    /// A call of the shell tool `tool` with these arguments (a JSON object).
    ToolCall { tool: String, arguments: Value },
    /// A request without tools: a short text (or JSON fitting the requested schema).
    Internal,
}

impl Action {
    /// Short name for the request record.
    pub fn label(&self) -> &'static str {
        match self {
            Action::Text(_) => "text",
            Action::Slow => "slow",
            Action::Late => "late",
            Action::ToolCall { .. } => "tool_call",
            Action::Internal => "internal",
        }
    }
}

/// Decides the answer to a request with this last turn and these tools.
pub fn decide(turn: &Turn, tools: &[Tool]) -> Action {
    if tools.is_empty() {
        return Action::Internal;
    }
    if turn.is_after_tool_result {
        return Action::Text(DONE_TEXT.to_string());
    }
    let text = turn.last_user_text.as_deref().unwrap_or_default();
    let sum = sum_asked(text);
    // (command, escalate): a `please run:` command is one the user must approve, so it asks for
    // unsandboxed execution where the tool has that (Codex runs sandboxed commands unasked).
    if let (Some(sum), true, Some(tool)) = (sum, text.contains(":R]"), mcp_reply_tool(tools)) {
        return Action::ToolCall { tool: tool.name.clone(), arguments: json!({"message": sum.to_string()}) };
    }
    let command = match (sum, text.contains(":R]")) {
        (Some(sum), true) => Some((format!("synapse reply \"{sum}\""), false)),
        // `sleep N` is the long tool run of the busy-delivery tests, allowed by every set-up
        // (clis.rs): run as is, never escalated to a dialog.
        _ => run_request(text).map(|command| {
            let escalate = !command.starts_with("sleep ");
            (command, escalate)
        }),
    };
    if let Some((command, escalate)) = command {
        return match shell_tool(tools) {
            Some(tool) => {
                let mut arguments = shell_arguments(&tool.schema, &command);
                if escalate && tool.schema.pointer("/properties/sandbox_permissions").is_some() {
                    arguments["sandbox_permissions"] = json!("require_escalated");
                    arguments["justification"] = json!("The user asked to run this command.");
                }
                Action::ToolCall { tool: tool.name.clone(), arguments }
            }
            None => Action::Text(format!("I would run `{command}`, but no shell tool was offered.")),
        };
    }
    let lower = text.to_lowercase();
    if lower.contains("hesitate") && !lower.contains("urgent") {
        return Action::Late;
    }
    if lower.contains("slow") {
        return Action::Slow;
    }
    match sum {
        Some(sum) => Action::Text(sum.to_string()),
        None => Action::Text(DEFAULT_TEXT.to_string()),
    }
}

/// `A+B` when the text asks `what is A+B` (integers, spaces allowed around `+`).
pub fn sum_asked(text: &str) -> Option<i64> {
    let lower = text.to_lowercase();
    lower.match_indices("what is").find_map(|(at, needle)| {
        let rest = lower[at + needle.len()..].trim_start();
        let (left, rest) = leading_integer(rest)?;
        let rest = rest.trim_start().strip_prefix('+')?.trim_start();
        let (right, _) = leading_integer(rest)?;
        left.checked_add(right)
    })
}

fn leading_integer(text: &str) -> Option<(i64, &str)> {
    let sign = usize::from(text.starts_with('-'));
    let digits = text[sign..].bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let end = sign + digits;
    Some((text[..end].parse().ok()?, &text[end..]))
}

/// The command after `please run:` (the rest of that line), if any.
pub fn run_request(text: &str) -> Option<String> {
    let marker = "please run:";
    let at = text.to_lowercase().find(marker)?;
    let rest = &text[at + marker.len()..];
    let command = rest.lines().next().unwrap_or_default().trim();
    (!command.is_empty()).then(|| command.to_string())
}

/// The Synapse MCP server's `reply` tool, under whatever name the CLI gives it: the server's
/// name and the tool's (`mcp__synapse__reply`, `synapse_reply`, `synapse-reply`), or the bare
/// tool name (Gemini, when no other tool has it).
pub fn mcp_reply_tool(tools: &[Tool]) -> Option<&Tool> {
    tools.iter().find(|tool| {
        let name = tool.name.to_lowercase();
        name == "reply" || (name.contains("synapse") && name.ends_with("reply"))
    })
}

/// The first shell tool the request offers, by [`SHELL_TOOL_NAMES`] preference.
pub fn shell_tool(tools: &[Tool]) -> Option<&Tool> {
    SHELL_TOOL_NAMES.iter().find_map(|name| tools.iter().find(|tool| tool.name == *name))
}

/// Arguments for a shell tool with this schema running `command`: the command goes into
/// `command` or `cmd` (else the first required string), `login` is false (a login shell resets
/// PATH), and every other required property gets its default, first enum value or a short value.
pub fn shell_arguments(schema: &Value, command: &str) -> Value {
    let properties = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let command_key = ["command", "cmd"]
        .into_iter()
        .find(|key| properties.contains_key(*key))
        .or_else(|| {
            required
                .iter()
                .copied()
                .find(|key| properties.get(*key).and_then(|p| p.get("type")) == Some(&json!("string")))
        })
        .unwrap_or("command");
    let mut arguments = Map::new();
    arguments.insert(command_key.to_string(), json!(command));
    if properties.contains_key("login") {
        arguments.insert("login".to_string(), json!(false));
    }
    for key in required {
        if arguments.contains_key(key) {
            continue;
        }
        let property = properties.get(key).cloned().unwrap_or(Value::Null);
        let value = if key == "description" { json!("Run a shell command") } else { example_value(&property) };
        arguments.insert(key.to_string(), value);
    }
    Value::Object(arguments)
}

/// A small value that fits the schema: its default, first enum value, or a minimal value of its
/// type (objects get their required properties). Used for tool arguments and for JSON answers to
/// CLI-internal requests that ask for a response schema.
pub fn example_value(schema: &Value) -> Value {
    if let Some(default) = schema.get("default") {
        return default.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|values| values.first()) {
        return first.clone();
    }
    if let Some(constant) = schema.get("const") {
        return constant.clone();
    }
    if let Some(first) = ["anyOf", "oneOf"].iter().find_map(|key| schema.get(*key)?.as_array()?.first()) {
        return example_value(first);
    }
    let kind = match schema.get("type") {
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).find(|kind| *kind != "null"),
        Some(kind) => kind.as_str(),
        None => None,
    };
    match kind.map(str::to_lowercase).as_deref() {
        Some("string") => json!("ok"),
        Some("integer") | Some("number") => schema.get("minimum").cloned().unwrap_or(json!(1)),
        Some("boolean") => json!(false),
        Some("array") => json!([]),
        Some("object") => {
            let mut object = Map::new();
            let properties = schema.get("properties").and_then(Value::as_object);
            for key in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
            {
                let property = properties.and_then(|p| p.get(key)).cloned().unwrap_or(Value::Null);
                object.insert(key.to_string(), example_value(&property));
            }
            Value::Object(object)
        }
        _ => Value::Null,
    }
}

/// A text block without the context a CLI put in front of what the user typed: leading
/// `<tag>...</tag>` blocks (Claude's `<system-reminder>`, Codex's `<environment_context>`,
/// Copilot's `<current_datetime>`, ...).
pub fn without_injected_context(text: &str) -> &str {
    let mut rest = text.trim();
    while let Some(after_open) = rest.strip_prefix('<') {
        let Some(name_end) = after_open.find(['>', ' ']) else { break };
        let name = &after_open[..name_end];
        if name.is_empty() || name.starts_with('/') {
            break;
        }
        let close = format!("</{name}>");
        let Some(close_at) = rest.find(&close) else { break };
        rest = rest[close_at + close.len()..].trim_start();
    }
    rest
}

/// The user's newest text out of a turn's text blocks: injected context left out, the last block
/// that remains. A CLI whose previous request was cancelled sends the old message and the new one
/// in one turn (Gemini): the script answers the new one, and each message counts once.
pub fn user_text<'a>(blocks: impl IntoIterator<Item = &'a str>) -> Option<String> {
    blocks.into_iter().map(without_injected_context).filter(|text| !text.is_empty()).last().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(names: &[&str]) -> Vec<Tool> {
        names
            .iter()
            .map(|name| Tool {
                name: name.to_string(),
                schema: json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
            })
            .collect()
    }

    fn turn(text: &str) -> Turn {
        Turn { last_user_text: Some(text.to_string()), is_after_tool_result: false }
    }

    #[test]
    fn a_reply_expected_sum_becomes_a_synapse_reply_call() {
        let action = decide(&turn("[A2A:12345678:alice:R] what is 2+2"), &tools(&["Read", "Bash"]));
        assert_eq!(
            action,
            Action::ToolCall { tool: "Bash".into(), arguments: json!({"command": "synapse reply \"4\""}) }
        );
    }

    #[test]
    fn a_reply_expected_sum_goes_to_the_synapse_mcp_reply_tool_when_offered() {
        for name in ["mcp__synapse__reply", "synapse_reply", "synapse-reply", "reply"] {
            let action = decide(&turn("[A2A:12345678:alice:R] what is 2+2"), &tools(&["Bash", name, "send"]));
            assert_eq!(action, Action::ToolCall { tool: name.into(), arguments: json!({"message": "4"}) });
        }
        let action = decide(&turn("[A2A:12345678:alice] what is 2+2"), &tools(&["Bash", "mcp__synapse__reply"]));
        assert_eq!(action, Action::Text("4".into()), "no reply expected: a text answer");
    }

    #[test]
    fn a_plain_sum_is_answered_in_text() {
        assert_eq!(decide(&turn("what is 40 + 2?"), &tools(&["bash"])), Action::Text("42".into()));
        assert_eq!(sum_asked("What is -3+5"), Some(2));
        assert_eq!(sum_asked("what is it"), None);
    }

    #[test]
    fn please_run_takes_the_rest_of_the_line() {
        let action = decide(&turn("hi\nplease run: touch /tmp/x && ls\nthanks"), &tools(&["bash"]));
        assert_eq!(
            action,
            Action::ToolCall { tool: "bash".into(), arguments: json!({"command": "touch /tmp/x && ls"}) }
        );
    }

    #[test]
    fn after_a_tool_result_the_turn_ends_with_done() {
        let turn = Turn { last_user_text: Some("please run: ls".into()), is_after_tool_result: true };
        assert_eq!(decide(&turn, &tools(&["bash"])), Action::Text("Done.".into()));
    }

    #[test]
    fn slow_hello_and_toolless_requests() {
        assert_eq!(decide(&turn("go slow please"), &tools(&["bash"])), Action::Slow);
        assert_eq!(decide(&turn("hesitate, then say it"), &tools(&["bash"])), Action::Late);
        assert_eq!(
            decide(&turn("hesitate-marker\n[A2A:1:x] urgent-marker"), &tools(&["bash"])),
            Action::Text(DEFAULT_TEXT.into())
        );
        assert_eq!(decide(&turn("hello"), &tools(&["bash"])), Action::Text("OK.".into()));
        assert_eq!(decide(&turn("[A2A:1:a:R] what is 2+2"), &[]), Action::Internal);
    }

    #[test]
    fn the_preferred_shell_tool_wins() {
        assert_eq!(shell_tool(&tools(&["bash", "Bash"])).map(|t| t.name.as_str()), Some("Bash"));
        assert_eq!(shell_tool(&tools(&["Read"])), None);
    }

    #[test]
    fn shell_arguments_follow_the_schema() {
        let codex = json!({"type": "object", "properties": {"cmd": {"type": "string"}, "login": {"type": "boolean"},
            "workdir": {"type": "string"}}, "required": ["cmd"]});
        assert_eq!(shell_arguments(&codex, "ls"), json!({"cmd": "ls", "login": false}));
        let copilot = json!({"type": "object", "properties": {"command": {"type": "string"},
            "description": {"type": "string"}, "mode": {"type": "string", "enum": ["sync", "async"]},
            "initial_wait": {"type": "integer", "minimum": 30}}, "required": ["command", "description", "mode", "initial_wait"]});
        assert_eq!(
            shell_arguments(&copilot, "ls"),
            json!({"command": "ls", "description": "Run a shell command", "mode": "sync", "initial_wait": 30})
        );
    }

    #[test]
    fn of_two_messages_in_one_turn_the_newest_is_the_users_text() {
        let blocks = ["[A2A:1:a] please run: touch x", "<ctx>y</ctx>", "[A2A:2:a] queued"];
        assert_eq!(user_text(blocks).as_deref(), Some("[A2A:2:a] queued"));
        assert_eq!(user_text(["<ctx>only</ctx>"]), None);
    }

    #[test]
    fn injected_context_is_not_user_text() {
        let blocks = ["<system-reminder>be slow</system-reminder>", "hello"];
        assert_eq!(user_text(blocks), Some("hello".to_string()));
        assert_eq!(user_text(["<environment_context>x</environment_context>"]), None);
        let copilot = "<current_datetime>2026-11-23T16:08</current_datetime>\n\n[A2A:1:a:R] what is 2+2";
        assert_eq!(user_text([copilot]).as_deref(), Some("[A2A:1:a:R] what is 2+2"));
        assert_eq!(user_text(["<b>bold</b> text"]).as_deref(), Some("text"));
        assert_eq!(user_text(["a <b>c</b>"]).as_deref(), Some("a <b>c</b>"));
    }

    #[test]
    fn example_values_fit_the_schema() {
        let schema = json!({"type": "OBJECT", "properties": {"next_speaker": {"type": "STRING", "enum": ["user", "model"]},
            "reasoning": {"type": "STRING"}}, "required": ["reasoning", "next_speaker"]});
        assert_eq!(example_value(&schema), json!({"reasoning": "ok", "next_speaker": "user"}));
    }
}
