"""Interoperability of Synapse agents with the official A2A Python client (a2a-sdk 1.3.0).

Run by tests/a2a_interop.rs against a running broker:

    python tests/a2a_interop.py <dummy agent base URL> <scenario agent base URL>

The dummy agent auto-replies (SYNAPSE_DUMMY_AUTO_REPLY=1); the scenario agent answers by rule
(fail, input, stream, wait, else complete), a follow-up on a task that asked for input by
the same rules. Prints "A2A INTEROP OK" when every check passed;
any failed check raises, so the exit status is non-zero.
"""

import asyncio
import json
import sys
import uuid

import httpx
from google.protobuf import json_format

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)


def message(text: str, context_id: str = "") -> pb.Message:
    return pb.Message(
        message_id=str(uuid.uuid4()),
        role=pb.ROLE_USER,
        parts=[pb.Part(text=text)],
        context_id=context_id,
    )


def texts(task: pb.Task) -> list[str]:
    return [part.text for artifact in task.artifacts for part in artifact.parts]


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


async def collect(stream) -> list[pb.StreamResponse]:
    return [event async for event in stream]


async def push_receiver(path: str) -> tuple[asyncio.AbstractServer, str, asyncio.Queue]:
    """A local receiver of push notifications: each POST's headers and JSON body go into the
    queue; answers 200."""
    received: asyncio.Queue = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        headers = {
            line.split(":", 1)[0].strip().lower(): line.split(":", 1)[1].strip()
            for line in head.split("\r\n")[1:]
            if ":" in line
        }
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()
        await received.put((headers, json.loads(body)))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{path}", received


async def resolve(http: httpx.AsyncClient, base_url: str) -> pb.AgentCard:
    card = await A2ACardResolver(http, base_url).get_agent_card()
    interface = card.supported_interfaces[0]
    check(interface.protocol_binding == "JSONRPC", f"{card.name}: the card offers JSON-RPC")
    check(interface.protocol_version == "1.0", f"{card.name}: the card speaks A2A 1.0")
    check(card.capabilities.streaming, f"{card.name}: the card announces streaming")
    check(len(card.skills) > 0, f"{card.name}: the card lists skills")
    return card


async def dummy_agent(http: httpx.AsyncClient, base_url: str) -> None:
    card = await resolve(http, base_url)
    blocking = ClientFactory(ClientConfig(streaming=False)).create(card)
    streaming = ClientFactory(ClientConfig(streaming=True)).create(card)

    # SendMessage (blocking): the dummy's `synapse reply` completes the task.
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("what is 6 x 7?"))))
    task = events[-1].task
    check(task.status.state == pb.TASK_STATE_COMPLETED, "dummy: SendMessage waits for the reply")
    check(any("Auto-reply" in text and "what is 6 x 7?" in text for text in texts(task)), "dummy: the reply is the artifact")

    # GetTask shows the same.
    got = await blocking.get_task(pb.GetTaskRequest(id=task.id))
    check(got.id == task.id and got.status.state == pb.TASK_STATE_COMPLETED, "dummy: GetTask finds the completed task")
    check(texts(got) == texts(task), "dummy: GetTask shows the reply artifact")

    # SendStreamingMessage: a task snapshot, then updates up to the completed status.
    events = await collect(streaming.send_message(pb.SendMessageRequest(message=message("stream me the answer"))))
    check(events[0].HasField("task"), "dummy: the stream opens with the task")
    streamed_id = events[0].task.id
    check(events[-1].HasField("status_update"), "dummy: the stream ends with a status update")
    check(events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED, "dummy: the stream ends completed")
    artifacts = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    check(any("Auto-reply" in p.text for a in artifacts for p in a.parts), "dummy: the reply is streamed as an artifact")

    # ListTasks: both tasks, newest first.
    listed = await blocking.list_tasks(pb.ListTasksRequest())
    ids = [t.id for t in listed.tasks]
    check(ids[:2] == [streamed_id, task.id], "dummy: ListTasks lists the tasks, newest first")
    check(listed.total_size == 2, "dummy: ListTasks counts them")


async def scenario_agent(http: httpx.AsyncClient, base_url: str) -> None:
    card = await resolve(http, base_url)
    blocking = ClientFactory(ClientConfig(streaming=False)).create(card)
    streaming = ClientFactory(ClientConfig(streaming=True)).create(card)
    context = str(uuid.uuid4())

    # complete
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("hello", context))))
    done = events[-1].task
    check(done.status.state == pb.TASK_STATE_COMPLETED, "scenario: a plain message completes")
    check(done.context_id == context, "scenario: the task keeps the client's context id")
    check(texts(done) == ["scenario agent: done: hello"], "scenario: with a text artifact")

    # fail
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("please fail", context))))
    failed = events[-1].task
    check(failed.status.state == pb.TASK_STATE_FAILED, "scenario: 'fail' fails the task")
    check("failing as asked" in failed.status.message.parts[0].text, "scenario: the status message says why")

    # An agent that answers at once: a Message, no task.
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("a message, please"))))
    check(events[0].HasField("message"), "scenario: an answer given at once is a Message")
    check(events[0].message.role == pb.ROLE_AGENT, "scenario: the Message comes from the agent")
    check(events[0].message.parts[0].text.startswith("scenario agent: a message for you"), "scenario: its text")

    # File and data parts in the artifacts.
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("the file, please"))))
    parts = events[-1].task.artifacts[0].parts
    check(parts[1].filename == "report.txt" and parts[1].media_type == "text/plain", "scenario: a file part")
    check(parts[1].url.startswith("data:text/plain;base64,"), "scenario: the file part's url")
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("some data, please"))))
    data = json_format.MessageToDict(events[-1].task.artifacts[0].parts[1].data)
    check(data.get("answer") == 42 and data.get("items") == ["a", "b"], f"scenario: a data part ({data})")

    # input required
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("need your input"))))
    asking = events[-1].task
    check(asking.status.state == pb.TASK_STATE_INPUT_REQUIRED, "scenario: 'input' asks for input")
    check(asking.status.message.role == pb.ROLE_AGENT, "scenario: the question comes from the agent")

    # stream
    events = await collect(streaming.send_message(pb.SendMessageRequest(message=message("stream please"))))
    chunks = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    check(len(chunks) == 4, "scenario: 'stream' sends three chunks and the final answer")
    check(len({a.artifact_id for a in chunks}) == 4, "scenario: each artifact has its own id")
    check(events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED, "scenario: the stream ends completed")

    # wait, subscribe, cancel
    request = pb.SendMessageRequest(
        message=message("wait for me"), configuration=pb.SendMessageConfiguration(return_immediately=True)
    )
    events = await collect(blocking.send_message(request))
    waiting = events[-1].task
    check(waiting.status.state == pb.TASK_STATE_WORKING, "scenario: returnImmediately answers while working")
    subscribed = asyncio.get_running_loop().create_future()

    async def follow() -> list[pb.StreamResponse]:
        seen = []
        async for event in streaming.subscribe(pb.SubscribeToTaskRequest(id=waiting.id)):
            seen.append(event)
            if not subscribed.done():
                subscribed.set_result(True)
        return seen

    follower = asyncio.create_task(follow())
    await asyncio.wait_for(subscribed, 30)
    canceled = await blocking.cancel_task(pb.CancelTaskRequest(id=waiting.id))
    check(canceled.status.state == pb.TASK_STATE_CANCELED, "scenario: CancelTask cancels a working task")
    seen = await asyncio.wait_for(follower, 30)
    check(seen[0].HasField("task") and seen[0].task.id == waiting.id, "scenario: SubscribeToTask opens with the task")
    check(seen[-1].status_update.status.state == pb.TASK_STATE_CANCELED, "scenario: the subscription ends canceled")

    # errors
    try:
        await blocking.cancel_task(pb.CancelTaskRequest(id=waiting.id))
        check(False, "scenario: canceling twice fails")
    except TaskNotCancelableError:
        check(True, "scenario: a canceled task is not cancelable (-32002)")
    try:
        await blocking.get_task(pb.GetTaskRequest(id=str(uuid.uuid4())))
        check(False, "scenario: an unknown task is not found")
    except TaskNotFoundError:
        check(True, "scenario: an unknown task is not found (-32001)")
    try:
        await collect(streaming.subscribe(pb.SubscribeToTaskRequest(id=done.id)))
        check(False, "scenario: subscribing to a finished task fails")
    except UnsupportedOperationError:
        check(True, "scenario: subscribing to a finished task is unsupported (-32004)")

    # ListTasks filters
    in_context = await blocking.list_tasks(pb.ListTasksRequest(context_id=context))
    check({t.id for t in in_context.tasks} == {done.id, failed.id}, "scenario: ListTasks filters by context")
    asking_now = await blocking.list_tasks(pb.ListTasksRequest(status=pb.TASK_STATE_INPUT_REQUIRED))
    check([t.id for t in asking_now.tasks] == [asking.id], "scenario: ListTasks filters by state")
    page = await blocking.list_tasks(pb.ListTasksRequest(page_size=2))
    check(len(page.tasks) == 2 and page.next_page_token != "", "scenario: ListTasks pages")

    # multi-turn: the agent asks for input; the follow-up names the task (its context is
    # inferred) and the agent's answer to it completes the task.
    first = message("I need more input")
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=first)))
    asked = events[-1].task
    check(asked.status.state == pb.TASK_STATE_INPUT_REQUIRED, "multi-turn: the agent asks for input")
    follow_up = pb.Message(
        message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=[pb.Part(text="use the blue one")], task_id=asked.id
    )
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=follow_up)))
    answered = events[-1].task
    check(answered.id == asked.id, "multi-turn: the follow-up continues the same task")
    check(answered.context_id == asked.context_id, "multi-turn: the context is inferred from the task")
    check(answered.status.state == pb.TASK_STATE_COMPLETED, "multi-turn: the answer to the follow-up completes it")
    check(texts(answered)[-1] == "scenario agent: done: use the blue one", "multi-turn: the agent answered the follow-up")
    check(
        [(m.role, m.message_id) for m in answered.history]
        == [
            (pb.ROLE_USER, first.message_id),
            (pb.ROLE_AGENT, asked.status.message.message_id),
            (pb.ROLE_USER, follow_up.message_id),
        ],
        "multi-turn: the history holds both messages with the client's ids and the question between them",
    )
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=follow_up)))
    check(events[-1].task.id == asked.id, "multi-turn: the same follow-up again (same messageId) is the same task")
    try:
        late = pb.Message(message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=[pb.Part(text="and red?")], task_id=asked.id)
        await collect(blocking.send_message(pb.SendMessageRequest(message=late)))
        check(False, "multi-turn: a completed task takes no further message")
    except UnsupportedOperationError:
        check(True, "multi-turn: a completed task takes no further message (-32004)")
    try:
        lost = pb.Message(
            message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=[pb.Part(text="hello?")], task_id=str(uuid.uuid4())
        )
        await collect(blocking.send_message(pb.SendMessageRequest(message=lost)))
        check(False, "multi-turn: continuing an unknown task fails")
    except TaskNotFoundError:
        check(True, "multi-turn: continuing an unknown task is not found (-32001)")

    # multi-turn over a stream: the follow-up's stream shows the task working, then completed.
    events = await collect(streaming.send_message(pb.SendMessageRequest(message=message("input, please"))))
    asked = next(e.task for e in events if e.HasField("task"))
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    check(states[-1:] == [pb.TASK_STATE_INPUT_REQUIRED], "multi-turn: the stream ends when the agent asks")
    follow_up = pb.Message(
        message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=[pb.Part(text="green")], task_id=asked.id,
        context_id=asked.context_id,
    )
    events = await collect(streaming.send_message(pb.SendMessageRequest(message=follow_up)))
    check(events[0].HasField("task") and events[0].task.id == asked.id, "multi-turn: the follow-up's stream is the task's")
    check(events[0].task.status.state == pb.TASK_STATE_WORKING, "multi-turn: the follow-up takes the task back to work")
    check(events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED, "multi-turn: the follow-up's stream ends completed")

    # Push notifications: a config set with the SDK, and the task's change posted to a local
    # receiver with the config's token.
    check(card.capabilities.push_notifications, "push: the card announces push notifications")
    server, receiver_url, received = await push_receiver("/a2a-notify")
    events = await collect(
        blocking.send_message(
            pb.SendMessageRequest(
                message=message("wait for me"), configuration=pb.SendMessageConfiguration(return_immediately=True)
            )
        )
    )
    waiting = events[-1].task
    created = await blocking.create_task_push_notification_config(
        pb.TaskPushNotificationConfig(task_id=waiting.id, id="sdk-1", url=receiver_url, token="sdk-token")
    )
    check(created.id == "sdk-1" and created.url == receiver_url, "push: CreateTaskPushNotificationConfig")
    got = await blocking.get_task_push_notification_config(
        pb.GetTaskPushNotificationConfigRequest(task_id=waiting.id, id="sdk-1")
    )
    check(got.url == receiver_url, "push: GetTaskPushNotificationConfig")
    listed = await blocking.list_task_push_notification_configs(
        pb.ListTaskPushNotificationConfigsRequest(task_id=waiting.id)
    )
    check([config.id for config in listed.configs] == ["sdk-1"], "push: ListTaskPushNotificationConfigs")
    await blocking.cancel_task(pb.CancelTaskRequest(id=waiting.id))
    while True:
        headers, body = await asyncio.wait_for(received.get(), 60)
        if body.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_CANCELED":
            break
    check(body["statusUpdate"]["taskId"] == waiting.id, "push: the receiver got the task's cancellation")
    check(headers.get("x-a2a-notification-token") == "sdk-token", "push: with the config's token")
    await blocking.delete_task_push_notification_config(
        pb.DeleteTaskPushNotificationConfigRequest(task_id=waiting.id, id="sdk-1")
    )
    listed = await blocking.list_task_push_notification_configs(
        pb.ListTaskPushNotificationConfigsRequest(task_id=waiting.id)
    )
    check(len(listed.configs) == 0, "push: DeleteTaskPushNotificationConfig")
    server.close()

    # The same agent through the A2A 0.3 client of the SDK (A2A-Version: 0.3, 0.3 shapes).
    legacy_card = pb.AgentCard()
    legacy_card.CopyFrom(card)
    legacy_card.supported_interfaces[0].protocol_version = "0.3"
    legacy = ClientFactory(ClientConfig(streaming=False)).create(legacy_card)
    events = await collect(legacy.send_message(pb.SendMessageRequest(message=message("hello from 0.3"))))
    check(events[-1].task.status.state == pb.TASK_STATE_COMPLETED, "scenario: the 0.3 client's message/send completes")
    got = await legacy.get_task(pb.GetTaskRequest(id=events[-1].task.id))
    check(texts(got) == ["scenario agent: done: hello from 0.3"], "scenario: the 0.3 client's tasks/get shows the artifact")
    legacy_streaming = ClientFactory(ClientConfig(streaming=True)).create(legacy_card)
    events = await collect(legacy_streaming.send_message(pb.SendMessageRequest(message=message("stream in 0.3"))))
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    check(states[-1:] == [pb.TASK_STATE_COMPLETED], "scenario: the 0.3 client's message/stream ends completed")


async def http_json_binding(http: httpx.AsyncClient, base_url: str) -> None:
    """The same scenario agent through the SDK's HTTP+JSON transport (the card's /v1 interface)."""
    card = await resolve(http, base_url)
    bindings = [interface.protocol_binding for interface in card.supported_interfaces]
    check("HTTP+JSON" in bindings, f"rest: the card names an HTTP+JSON interface ({bindings})")
    blocking = ClientFactory(ClientConfig(streaming=False, supported_protocol_bindings=["HTTP+JSON"])).create(card)
    streaming = ClientFactory(ClientConfig(streaming=True, supported_protocol_bindings=["HTTP+JSON"])).create(card)
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("hello over rest"))))
    done = events[-1].task
    check(texts(done) == ["scenario agent: done: hello over rest"], "rest: SendMessage completes with the artifact")
    got = await blocking.get_task(pb.GetTaskRequest(id=done.id))
    check(got.status.state == pb.TASK_STATE_COMPLETED, "rest: GetTask")
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("a message over rest"))))
    check(events[0].HasField("message"), "rest: an answer given at once is a Message")
    events = await collect(streaming.send_message(pb.SendMessageRequest(message=message("stream over rest"))))
    check(events[0].HasField("task"), "rest: the stream opens with the task")
    check(events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED, "rest: the stream ends completed")
    # multi-turn over HTTP+JSON
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=message("input over rest"))))
    asked = events[-1].task
    check(asked.status.state == pb.TASK_STATE_INPUT_REQUIRED, "rest: the agent asks for input")
    follow_up = message("use the red one")
    follow_up.task_id = asked.id
    events = await collect(blocking.send_message(pb.SendMessageRequest(message=follow_up)))
    check(events[-1].task.status.state == pb.TASK_STATE_COMPLETED, "rest: the follow-up completes the task")
    try:
        await blocking.get_task(pb.GetTaskRequest(id="no-such-task"))
        check(False, "rest: an unknown task is not found")
    except TaskNotFoundError:
        check(True, "rest: an unknown task is not found")

    # Push notifications over HTTP+JSON: a config set through the SDK's REST transport, and the
    # task's cancellation posted to a local receiver with the config's token.
    server, receiver_url, received = await push_receiver("/rest-notify")
    events = await collect(
        blocking.send_message(
            pb.SendMessageRequest(
                message=message("wait over rest"), configuration=pb.SendMessageConfiguration(return_immediately=True)
            )
        )
    )
    waiting = events[-1].task
    created = await blocking.create_task_push_notification_config(
        pb.TaskPushNotificationConfig(task_id=waiting.id, id="rest-1", url=receiver_url, token="rest-token")
    )
    check(created.id == "rest-1" and created.url == receiver_url, "rest: CreateTaskPushNotificationConfig")
    listed = await blocking.list_task_push_notification_configs(
        pb.ListTaskPushNotificationConfigsRequest(task_id=waiting.id)
    )
    check([config.id for config in listed.configs] == ["rest-1"], "rest: ListTaskPushNotificationConfigs")
    await blocking.cancel_task(pb.CancelTaskRequest(id=waiting.id))
    while True:
        headers, body = await asyncio.wait_for(received.get(), 60)
        if body.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_CANCELED":
            break
    check(body["statusUpdate"]["taskId"] == waiting.id, "rest: the receiver got the task's cancellation")
    check(headers.get("x-a2a-notification-token") == "rest-token", "rest: with the config's token")
    server.close()


async def main() -> None:
    dummy_url, scenario_url = sys.argv[1], sys.argv[2]
    async with httpx.AsyncClient(timeout=60) as http:
        await dummy_agent(http, dummy_url)
        await scenario_agent(http, scenario_url)
        await http_json_binding(http, scenario_url)
    print("A2A INTEROP OK", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
