"""Mixed teams with the Python Synapse (synapse-a2a 0.35.0): its own client sends to a Synapse
(Rust) agent the way `synapse send` of the Python package does.

Run by tests/a2a_interop.rs (HOME points at a temporary directory, so the package's ~/.a2a stays
out of the user's home):

    python tests/python_synapse.py <agent base URL>

The agent is a dummy that auto-replies. Prints "PYTHON SYNAPSE OK" when every check passed; a
failed check raises, so the exit status is non-zero.
"""

import sys

import requests
from synapse.a2a_client import A2AClient


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


def main() -> None:
    endpoint = sys.argv[1]
    client = A2AClient()

    # --wait: the Python client polls GET /tasks/{id} until `status` is final.
    task = client.send_to_local(
        endpoint, "what is 6 x 7?", priority=3, wait_for_completion=True, timeout=60, response_mode="wait"
    )
    check(task is not None, "wait: the send was accepted")
    check(task.status == "completed", f"wait: the task completed (got {task.status!r})")
    texts = [part.get("text", "") for artifact in task.artifacts for part in artifact.get("parts", [])]
    check(any("Auto-reply" in text for text in texts), f"wait: the reply is the task's artifact ({texts!r})")

    # notify: a reply is expected, the client does not wait.
    task = client.send_to_local(endpoint, "tell me later", priority=3, response_mode="notify")
    check(task is not None, "notify: the send was accepted")
    got = requests.get(f"{endpoint}/tasks/{task.id}", timeout=30).json()
    check(got["metadata"]["response_expected"] is True, "notify: the task expects a reply")

    # silent, priority 5: no reply expected.
    task = client.send_to_local(endpoint, "fyi, urgent", priority=5, response_mode="silent")
    check(task is not None, "silent: the priority-5 send was accepted")
    got = requests.get(f"{endpoint}/tasks/{task.id}", timeout=30).json()
    check(got["metadata"]["response_expected"] is False, "silent: the task expects no reply")
    check(got["metadata"]["priority"] == 5, "silent: priority 5 reached the agent")

    # A Python agent's send names its sender (not registered here): delivered as unverified.
    sender = {"sender_id": "synapse-py-agent", "sender_type": "claude", "sender_endpoint": "http://127.0.0.1:9"}
    task = client.send_to_local(endpoint, "hello from a python agent", priority=3, sender_info=sender,
                                response_mode="silent")
    check(task is not None, "unverified sender: a Python agent's message is accepted")

    print("PYTHON SYNAPSE OK", flush=True)


if __name__ == "__main__":
    main()
