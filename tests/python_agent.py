"""A Python Synapse agent (synapse-a2a 0.35.0) wrapping a tiny dummy CLI, for mixed-team tests:
a Synapse (Rust) `synapse send` talks to it and gets its `synapse reply` back.

    <a2a-venv>/bin/python tests/python_agent.py [<empty temporary directory>]

Runs the package's headless server (`python -m synapse.server --profile dummy`), which wraps the
profile's command `python3 -u dummy_agent.py` (run from the current directory) in a PTY. The wheel
lacks dummy_agent.py, so this script writes one into a temporary directory and starts the server
there. Every path the package uses (HOME, so ~/.a2a and ~/.synapse; TMPDIR, so
/tmp/synapse-a2a/messages; the UDS directory; the registry; the reply targets; the databases) is
moved into that directory. The script picks a free port itself: when the server cannot bind it
(another process took it between the pick and the bind, which happens on a busy machine), the
server is stopped at once and another port is tried, up to three. Prints "PYTHON AGENT READY
<port>" once the agent card answers and the registry entry says READY (the dummy showed its
prompt; it gets no initial instructions, as no instruction file exists for the dummy profile),
then runs until SIGTERM/SIGINT, which stops the server and removes the directory (unless the
caller gave it).

The dummy CLI prints the prompt "> " (the dummy profile's idle pattern). For each line the server
types into it that is a message from an agent ("A2A: [From: ...] ..."), it runs
`synapse reply "Python auto-reply: <text>"`: the package's reply takes the target from the
agent's own reply stack (GET /reply-stack/list, /reply-stack/get), which the server filled from
the incoming metadata (sender.sender_id + sender.sender_endpoint, sender_task_id) when
response_mode was "wait" or "notify". It then POSTs to <sender_endpoint>/tasks/send-priority
?priority=3 with metadata.in_reply_to = sender_task_id. A message without a reply target makes
`synapse reply` fail with "No reply target", which the dummy ignores.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

OUTPUT = threading.Lock()


def say(line: str) -> None:
    """Writes one whole line to our output. The server's output is passed on from another
    thread: `print` writes a text and its newline separately, and a line of the server once
    landed between the two, inside the readiness line the test reads. Once the test stops
    reading, what follows is dropped (the server's output is still drained, so it never blocks)."""
    with OUTPUT:
        try:
            sys.stdout.write(line if line.endswith("\n") else line + "\n")
            sys.stdout.flush()
        except OSError:
            pass


DUMMY_AGENT = r'''
import os, subprocess, sys

SYNAPSE = os.path.join(os.path.dirname(sys.executable), "synapse")

def prompt():
    sys.stdout.write("> ")
    sys.stdout.flush()

prompt()
for line in sys.stdin:
    line = line.strip()
    print(f"got: {line}", flush=True)
    if line.startswith("A2A: [From: "):
        # Text after the "[From: ...] " prefix and an optional "[REPLY EXPECTED] " marker.
        text = line.split("] ", 1)[1] if "] " in line else line
        text = text.removeprefix("[REPLY EXPECTED] ")
        result = subprocess.run(
            [SYNAPSE, "reply", f"Python auto-reply: {text}"], capture_output=True, text=True
        )
        # Only the outcome: the server scans this output, and a line with "Error:" would fail
        # the task ("CLI_ERROR") when it finalizes it.
        print("replied" if result.returncode == 0 else "no reply target", flush=True)
    prompt()
'''


def die_with_parent() -> None:
    """In the server's process: be killed when this script dies, even by SIGKILL (Linux). The
    dummy then reads EOF/EIO from its PTY and exits too."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def agent_env(root: Path, venv_bin: Path) -> dict:
    """The environment of the server, and of a `synapse` command run as the agent (with
    SYNAPSE_AGENT_ID added): every path of the package under `root`."""
    env = dict(os.environ)
    env.update(
        HOME=str(root / "home"),  # ~/.a2a/{registry,reply,external}, ~/.synapse/{logs,...}
        TMPDIR=str(root / "tmp"),  # tempfile.gettempdir()/synapse-a2a/{messages,attachments,...}
        # `python3` of the profile's command is the venv's (the pyenv shim needs the real HOME).
        PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
        SYNAPSE_UDS_DIR=str(root / "uds"),  # default /tmp/synapse-a2a/<agent_id>.sock
        SYNAPSE_REGISTRY_DIR=str(root / "home/.a2a/registry"),
        SYNAPSE_REPLY_TARGET_DIR=str(root / "home/.a2a/reply"),
        SYNAPSE_EXTERNAL_REGISTRY_DIR=str(root / "home/.a2a/external"),
        SYNAPSE_HISTORY_DB_PATH=str(root / "home/.synapse/history/history.db"),
        SYNAPSE_LONG_MESSAGE_DIR=str(root / "tmp/messages"),
        SYNAPSE_SHARED_MEMORY_DB_PATH=str(root / "home/.synapse/memory.db"),
        SYNAPSE_CANVAS_DB_PATH=str(root / "home/.synapse/canvas.db"),
    )
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The server's line when its port is taken (uvicorn); it then takes about 30 s to exit.
PORT_TAKEN = "address already in use"
ATTEMPTS = 3


def start_server(work: Path, env: dict, port: int) -> tuple:
    """The server on `port`, its output passed on to ours, and an event set when it says that
    the port is taken."""
    server = subprocess.Popen(
        [sys.executable, "-m", "synapse.server", "--profile", "dummy", "--port", str(port),
         "--host", "127.0.0.1"],
        cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True, preexec_fn=die_with_parent,
    )
    taken = threading.Event()

    def pass_on() -> None:
        for line in server.stdout:
            if PORT_TAKEN in line:
                taken.set()
            say(line)

    threading.Thread(target=pass_on, daemon=True).start()
    return server, taken


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        # uvicorn shuts down: controller.stop() (SIGTERM to the dummy, but then it waits up to
        # 30 s for the dummy's process group to vanish, which a zombie never does), then
        # registry.unregister(). No need to wait that long: the whole directory goes anyway.
        server.terminate()
        try:
            server.wait(3)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main() -> None:
    venv_bin = Path(sys.executable).parent  # must be the a2a venv's python
    # An optional argument names an (empty) directory to use, which the caller removes: useful
    # when the caller may SIGKILL this script (Rust's Child::kill), which skips cleanup.
    own_root = len(sys.argv) <= 1
    root = Path(tempfile.mkdtemp(prefix="python-agent-")) if own_root else Path(sys.argv[1])
    work = root / "work"  # cwd: dummy_agent.py and the project-local .synapse/ live here
    for sub in ("work", "home", "tmp", "uds"):
        (root / sub).mkdir()
    (work / "dummy_agent.py").write_text(DUMMY_AGENT)

    env = agent_env(root, venv_bin)
    env.pop("SYNAPSE_AGENT_ID", None)  # inherited identity would confuse `synapse reply`

    def on_signal(*_: object) -> None:
        raise SystemExit(0)  # leaves server.wait()/the poll loop; `finally` cleans up

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    server = None
    try:
        for attempt in range(1, ATTEMPTS + 1):
            port = free_port()
            server, taken = start_server(work, env, port)
            # Ready = the agent card answers and the registry entry (written by the server) says
            # READY, i.e. the dummy showed its prompt "> " (the dummy has no initial instructions).
            agent_file = root / f"home/.a2a/registry/synapse-dummy-{port}.json"
            deadline = time.time() + 60
            ready = False
            while not taken.is_set():
                if server.poll() is not None or time.time() > deadline:
                    why = "its server exited" if server.poll() is not None else "not ready after 60 s"
                    say(f"PYTHON AGENT FAILED ({why})")
                    sys.exit(1)
                try:
                    url = f"http://127.0.0.1:{port}/.well-known/agent.json"
                    with urllib.request.urlopen(url, timeout=2):
                        pass
                    if json.loads(agent_file.read_text()).get("status") == "READY":
                        ready = True
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.2)
            if ready:
                break
            stop_server(server)
            if attempt == ATTEMPTS:
                say(f"PYTHON AGENT FAILED (the ports tried were taken, the last {port})")
                sys.exit(1)
            say(f"port {port} was taken; trying another")
        say(f"PYTHON AGENT READY {port}")
        server.wait()
    finally:
        if server is not None:
            stop_server(server)
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
