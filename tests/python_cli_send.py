"""Mixed teams with the Python Synapse (synapse-a2a 0.35.0): the package's own CLI
(`<a2a-venv>/bin/synapse`, run as from a plain shell, so anonymously) sends to a Synapse (Rust)
agent and waits for the reply.

    <a2a-venv>/bin/python tests/python_cli_send.py <agent base URL>

The agent is a dummy that auto-replies "[DUMMY] Auto-reply to <id8>: <text>". The Python
`synapse send <target>` only resolves targets from its own file registry (~/.a2a/registry), so
the CLI offers two ways to reach an agent it did not start:

1. `synapse external add <url> --alias A` (reads the agent card; keeps the card's `url`), then
   `synapse external send A <text> --wait`: POSTs <url>/tasks/send with {"message": ...} and no
   metadata at all (so no response_mode, which the Python server takes as "notify"), polls
   GET /tasks/{id} and prints each artifact as its Python dict ("  - {...}").
2. A registry entry for the agent in the package's registry directory (what the package writes
   for its own agents), then `synapse send <name> <text> --wait`: POSTs
   /tasks/send-priority?priority=3 with metadata.response_mode "wait" (no sender: the caller is
   no agent), polls GET /tasks/{id} and prints "[<type>] <text>" per artifact, the text taken
   from the artifact's `data` (or `data.content`, or `text`): the package's artifact format is
   {"type": "text", "data": {"content": ...}}.

Every path of the package (HOME, so ~/.a2a and ~/.synapse; TMPDIR; the registries; the history
database) is moved into a temporary directory. Prints "PYTHON CLI OK" when every check passed;
otherwise raises, listing every failed check with the CLI's output.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

SYNAPSE = str(Path(sys.executable).parent / "synapse")  # the Python CLI, not the Rust binary
failures: list[str] = []


def check(condition: bool, what: str, output: str = "") -> None:
    if condition:
        print(f"ok: {what}", flush=True)
    else:
        print(f"FAILED: {what}", flush=True)
        failures.append(f"{what}\n--- output ---\n{output}")


def run(env: dict, cwd: Path, *args: str) -> tuple[int, str]:
    result = subprocess.run(
        [SYNAPSE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    return result.returncode, result.stdout + result.stderr


def reply_line(text: str) -> re.Pattern:
    return re.compile(r"\[DUMMY\] Auto-reply to [0-9a-f]{8}: " + re.escape(text))


def main() -> None:
    url = sys.argv[1].rstrip("/")
    with urllib.request.urlopen(f"{url}/.well-known/agent.json", timeout=10) as response:
        card = json.load(response)
    name = card["name"]
    agent_id = card.get("extensions", {}).get("synapse", {}).get("agent_id") or f"synapse-{name}"

    root = Path(tempfile.mkdtemp(prefix="python-cli-"))
    try:
        for sub in ("work", "home", "tmp", "uds"):
            (root / sub).mkdir()
        env = dict(os.environ)
        env.update(
            HOME=str(root / "home"),
            TMPDIR=str(root / "tmp"),
            SYNAPSE_UDS_DIR=str(root / "uds"),
            SYNAPSE_REGISTRY_DIR=str(root / "home/.a2a/registry"),
            SYNAPSE_REPLY_TARGET_DIR=str(root / "home/.a2a/reply"),
            SYNAPSE_EXTERNAL_REGISTRY_DIR=str(root / "home/.a2a/external"),
            SYNAPSE_HISTORY_DB_PATH=str(root / "home/.synapse/history/history.db"),
            SYNAPSE_LONG_MESSAGE_DIR=str(root / "tmp/messages"),
            SYNAPSE_SEND_READY_DELAY="0",  # `send` otherwise waits 2 s before a READY target
        )
        for var in ("SYNAPSE_AGENT_ID", "SYNAPSE_AGENT_NAME"):  # anonymous: no agent identity
            env.pop(var, None)
        work = root / "work"

        # 1. external add + external send --wait.
        code, out = run(env, work, "external", "add", url, "--alias", "rustbob")
        check(code == 0 and f"Added external agent: {name}" in out, "external add read the card", out)
        text = "hello from python external send"
        code, out = run(env, work, "external", "send", "rustbob", text, "--wait")
        check(code == 0 and "Status: completed" in out, "external send --wait: completed", out)
        check(bool(reply_line(text).search(out)), "external send --wait: the reply is printed", out)

        # 2. A registry entry (the fields `synapse send` reads; no pid, so no liveness check by
        # pid, but it checks the port) + send --wait.
        port = urlparse(url).port
        entry = {
            "agent_id": agent_id, "agent_type": agent_id.split("-")[1], "name": name,
            "port": port, "status": "READY", "endpoint": url, "working_dir": str(work),
        }
        registry = root / "home/.a2a/registry"
        registry.mkdir(parents=True, exist_ok=True)
        (registry / f"{agent_id}.json").write_text(json.dumps(entry))
        text = "hello from python send"
        code, out = run(env, work, "send", name, text, "--wait")
        check(code == 0 and "Status: completed" in out, "send --wait: completed", out)
        check(bool(reply_line(text).search(out)), "send --wait: the reply is printed", out)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    if failures:
        raise AssertionError(f"{len(failures)} check(s) failed:\n\n" + "\n\n".join(failures))
    print("PYTHON CLI OK", flush=True)


if __name__ == "__main__":
    main()
