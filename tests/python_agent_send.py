"""Mixed teams with the Python Synapse (synapse-a2a 0.35.0): a Python Synapse agent sends to a
Synapse (Rust) agent and gets the reply back into its own task (the "unverified sender" path).

    <a2a-venv>/bin/python tests/python_agent_send.py <agent base URL>

The Rust agent is a dummy that auto-replies "[DUMMY] Auto-reply to <id8>: <text>"; its broker
must be allowed to post to 127.0.0.1 (`{"outbound_allow_private": true}` in broker-settings.json).

Starts a Python agent with tests/python_agent.py (in a temporary directory, on a port it finds free), then runs
the package's CLI as that agent (its environment plus SYNAPSE_AGENT_ID=synapse-dummy-<port>):
`synapse send <name> <text> --wait`. The CLI resolves targets only from the package's registry,
so a registry entry for the Rust agent is written there first. The CLI then
  - creates the sender task on the Python agent (POST /tasks/create over its UDS socket),
  - POSTs <rust>/tasks/send-priority?priority=3 with metadata.sender = {sender_id,
    sender_type, sender_endpoint http://localhost:<port>, sender_uds_path}, sender_task_id and
    response_mode "wait" (no secret: the Rust side treats the sender as unverified),
  - polls GET /tasks/<sender_task_id> on the Python agent until it is final.
The Rust broker posts the dummy's reply to <sender_endpoint>/tasks/send with metadata.in_reply_to
= sender_task_id; the Python agent completes that task with the artifact
{"type": "text", "data": {"content": <reply>}} and the CLI prints "    [text] <reply>".

Prints "PYTHON AGENT SEND OK" when every check passed; a failed check raises.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).parent))
from python_agent import agent_env  # noqa: E402

VENV_BIN = Path(sys.executable).parent  # must be the a2a venv's python


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def get_json_list(url: str) -> list:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def main() -> None:
    url = sys.argv[1].rstrip("/")
    card = get_json(f"{url}/.well-known/agent.json")
    name = card["name"]
    rust_id = card.get("extensions", {}).get("synapse", {}).get("agent_id") or f"synapse-{name}"

    root = Path(tempfile.mkdtemp(prefix="python-agent-send-"))
    agent = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "python_agent.py"), str(root)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        # python_agent.py prints "PYTHON AGENT READY <port>" once its dummy shows its prompt
        # (the port it found free); the server's own lines come before it.
        before: list[str] = []
        line = ""
        for line in agent.stdout:
            if line.startswith("PYTHON AGENT"):
                break
            before = (before + [line.rstrip()])[-20:]
        words = line.split()
        check(
            line.startswith("PYTHON AGENT READY ") and len(words) == 4 and words[3].isdigit(),
            f"the Python agent started ({line.strip()!r}; its last lines: {before!r})",
        )
        port = int(words[3])

        # The Rust agent in the Python registry; working_dir = the CLI's cwd (else `send`
        # refuses a target in another directory without --force).
        work = root / "work"
        entry = {
            "agent_id": rust_id, "agent_type": rust_id.split("-")[1], "name": name,
            "port": urlparse(url).port, "status": "READY", "endpoint": url, "working_dir": str(work),
        }
        (root / f"home/.a2a/registry/{rust_id}.json").write_text(json.dumps(entry))

        env = agent_env(root, VENV_BIN)
        env.update(SYNAPSE_AGENT_ID=f"synapse-dummy-{port}", SYNAPSE_SEND_READY_DELAY="0")
        text = "hello from the python agent"
        result = subprocess.run(
            [str(VENV_BIN / "synapse"), "send", name, text, "--wait"],
            cwd=work, env=env, capture_output=True, text=True, timeout=120,
        )
        out = result.stdout + result.stderr
        print(out, flush=True)
        check(result.returncode == 0, f"send --wait exited 0 (got {result.returncode})")
        check("Status: completed" in out, "send --wait: the CLI reports its task completed")
        task_id = next(l.split(":", 1)[1].strip() for l in out.splitlines() if "Task ID:" in l)
        reply = f": {text}"

        # The Python agent's own view of its sending task (the printed Task ID is its id). Poll
        # GET /tasks (the list): GET /tasks/{id} of a "working" task while the Python dummy is
        # idle would itself finalize the task from the PTY (see the note on the race below).
        deadline = time.time() + 30
        while True:
            task = next(t for t in get_json_list(f"http://127.0.0.1:{port}/tasks") if t["id"] == task_id)
            contents = [a.get("data", {}).get("content", "") for a in task["artifacts"]]
            if contents or time.time() > deadline:
                break
            time.sleep(0.2)
        print(json.dumps(task, indent=2), flush=True)
        check(task["metadata"].get("direction") == "outgoing", f"Python task {task_id[:8]} is the agent's sending task")
        check(task["status"] == "completed", f"Python task {task_id[:8]} is completed")
        check(
            len(contents) == 1 and contents[0].startswith("[DUMMY] Auto-reply to ") and contents[0].endswith(reply),
            f"its only artifact is the Rust dummy's reply ({contents!r})",
        )
        # Race inside the package: while its controller is READY (the dummy idles: it is not
        # the one running this CLI), GET /tasks/{id} and every READY transition complete any
        # "working" task from the PTY output, the sending task included. The CLI's --wait then
        # returns before the reply came and prints no "Response:" (the reply still lands in the
        # task afterwards). The reply usually wins when the Rust dummy answers at once.
        printed = "[text] [DUMMY] Auto-reply to " in out and reply in out
        print(f"note: the CLI printed the reply: {printed}", flush=True)
    finally:
        agent.send_signal(signal.SIGTERM)  # python_agent.py stops the server
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        shutil.rmtree(root, ignore_errors=True)
    print("PYTHON AGENT SEND OK", flush=True)


if __name__ == "__main__":
    main()
