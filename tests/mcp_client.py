"""Drives `synapse mcp` over stdio with the official MCP Python SDK (mcp 2.3.0), for
tests/mcp_interop.rs (issue 18).

Environment (set by the Rust test): SYNAPSE_BIN, SYNAPSE_HOME, SYNAPSE_UDS_DIR,
SYNAPSE_BROKER_PORT (0), CAROL_ID / CAROL_SECRET (a registered agent the server acts as),
PROJECT_DIR (the working directory of the file-safety session). Agents running: `bob` (a dummy),
`alice` (a dummy that answers by itself), `carol` (registered, answered by this script).

Prints one JSON line per fact the Rust side checks further, and `MCP CLIENT OK` at the end; any
failed check raises (exit status 1).
"""

import asyncio
import json
import os
import re
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client

# The text bob's terminal must show: shell metacharacters and quotes arrive untouched.
BOB_TEXT = "hello bob from mcp: $HOME `true` ; 'single' \"double\" & done"
# Longest a single MCP request may take (the waiting send waits far less).
REQUEST_TIMEOUT_SECONDS = 90


def server(agent=None, extra=None, cwd=None):
    """Parameters for `synapse mcp` in the test's home, as `agent` (id, secret) or anonymous."""
    env = {name: os.environ[name] for name in ("SYNAPSE_HOME", "SYNAPSE_UDS_DIR", "SYNAPSE_BROKER_PORT")}
    if agent is not None:
        env["SYNAPSE_AGENT_ID"], env["SYNAPSE_AGENT_SECRET"] = agent
    env.update(extra or {})
    return StdioServerParameters(command=os.environ["SYNAPSE_BIN"], args=["mcp"], env=env, cwd=cwd)


def text_of(result):
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


async def call(session, name, arguments):
    return await session.call_tool(name, arguments, read_timeout_seconds=REQUEST_TIMEOUT_SECONDS)


async def ok(session, name, arguments=None):
    result = await call(session, name, arguments or {})
    assert not result.is_error, f"{name} {arguments!r} failed: {text_of(result)}"
    return text_of(result)


async def refused(session, name, arguments, expected):
    """A bad call: a tool result with is_error and a message naming the problem."""
    result = await call(session, name, arguments)
    text = text_of(result)
    assert result.is_error, f"{name} {arguments!r} should be refused, got: {text}"
    assert expected in text, f"{name} {arguments!r}: expected {expected!r} in {text!r}"
    return text


def fact(**values):
    print(json.dumps(values), flush=True)


async def anonymous_session():
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "synapse", init.server_info
            assert "acts anonymously" in (init.instructions or ""), init.instructions
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert set(tools) == {"send", "reply", "list_agents", "reply_targets", "history_search", "task"}, sorted(tools)
            assert set(tools["send"].input_schema["required"]) == {"to", "message"}, tools["send"].input_schema
            assert ":R]" in tools["reply"].description, tools["reply"].description

            agents = json.loads(await ok(session, "list_agents"))
            names = {agent["name"] for agent in agents}
            assert {"bob", "alice", "carol"} <= names, agents

            # A message to bob, no reply expected: the Rust side reads it in bob's terminal.
            sent = await ok(session, "send", {"to": "bob", "message": BOB_TEXT, "expect_reply": False})
            assert sent.startswith("Sent to synapse-dummy-"), sent
            fact(sent_to_bob=BOB_TEXT)

            # Waiting for alice's automatic answer: the reply is the tool's result.
            reply = await ok(session, "send", {"to": "alice", "message": "what is 2+2?", "wait_seconds": 60})
            assert reply.startswith("[DUMMY] Auto-reply to ") and reply.endswith("what is 2+2?"), reply
            fact(alice_replied=reply)

            # A question for carol, answered below by a server that runs as carol.
            asked = await ok(session, "send", {"to": "carol", "message": "carol, what is the answer?"})
            match = re.search(r"Your task ([0-9a-f-]{36}) tracks it", asked)
            assert match, asked
            question_task = match.group(1)

            # Bad arguments and missing identity: readable tool errors, the session goes on.
            await refused(session, "send", {"to": "bob", "message": "x", "priority": 9}, "priority must be between 1 and 5 (got 9)")
            await refused(session, "send", {"to": "bob"}, "missing field `message`")
            await refused(session, "send", {"to": "bob", "message": "x", "priority": "high"}, "invalid type")
            await refused(session, "send", {"to": "bob", "text": "x", "message": "x"}, "unknown field `text`")
            await refused(session, "send", {"to": "bob", "message": "   "}, "the message is empty")
            await refused(session, "send", {"to": "bob", "message": "x", "wait_seconds": 0}, "wait_seconds must be between 1 and 600")
            await refused(session, "send", {"to": "nobody-here", "message": "x"}, "No agent found matching 'nobody-here'")
            await refused(session, "reply", {"message": "4"}, "outside any agent")
            await refused(session, "reply_targets", {}, "outside any agent")
            await refused(session, "task", {"task_id": " "}, "'task_id' is empty")
            await refused(session, "history_search", {"keywords": []}, "at least one keyword")
            await refused(session, "lock_file", {"path": "x"}, "File safety is disabled")
            assert json.loads(await ok(session, "list_agents")), "the session still answers"
            return question_task


async def carol_session(carol, question_task):
    async with stdio_client(server(agent=carol)) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert f"You are the Synapse agent {carol[0]}" in (init.instructions or ""), init.instructions
            targets = json.loads(await ok(session, "reply_targets"))
            assert len(targets) == 1 and targets[0]["preview"].startswith("carol, what is"), targets
            answered = await ok(session, "reply", {"message": "the answer is 42"})
            assert answered.startswith("Replied to ") and "completed" in answered, answered
            await refused(session, "reply", {"message": "again"}, "No reply target")
            assert "No one is waiting" in await ok(session, "reply_targets")
            await refused(session, "reply", {"message": ""}, "the reply is empty")

    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            task = json.loads(await ok(session, "task", {"task_id": question_task[:8]}))
            assert task["id"] == question_task and task["status"] == "completed", task
            assert "the answer is 42" in json.dumps(task["artifacts"]), task
            records = json.loads(await ok(session, "history_search", {"keywords": ["answer"]}))
            assert any(record["output"] == "the answer is 42" for record in records), records
            fact(carol_replied=question_task)


async def file_safety_session(carol):
    project = os.environ["PROJECT_DIR"]
    params = server(agent=carol, extra={"SYNAPSE_FILE_SAFETY_ENABLED": "true"}, cwd=project)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert "File safety is on" in (init.instructions or ""), init.instructions
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert {"lock_file", "unlock_file", "check_file"} <= names, names
            locked = json.loads(await ok(session, "lock_file", {"path": "notes.txt", "intent": "edit"}))
            assert locked["locked"] and locked["lock"]["path"] == os.path.join(project, "notes.txt"), locked
            checked = json.loads(await ok(session, "check_file", {"path": "notes.txt"}))
            assert checked["allowed"], checked
            await refused(session, "lock_file", {"path": "notes.txt", "duration_seconds": -5}, "positive number of seconds")
            assert (await ok(session, "unlock_file", {"path": "notes.txt"})).startswith("Unlocked ")
            fact(file_safety="ok")


async def main():
    carol = (os.environ["CAROL_ID"], os.environ["CAROL_SECRET"])
    question_task = await anonymous_session()
    await carol_session(carol, question_task)
    await file_safety_session(carol)
    print("MCP CLIENT OK", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
