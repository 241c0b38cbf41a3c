"""Drives an A2A agent with the official Python SDK's client (a2a-sdk 1.x), for keel-a2a's
tests of the Keel server router (whose test backend behaves like a2a_peer.py).

    .peers/a2a/venv/bin/python crates/keel-a2a/tests/peers/a2a_client.py \
        --url http://127.0.0.1:PORT/a2a/echo --version 1.0

It resolves the card at <url>/.well-known/agent-card.json, keeps only the interfaces of
--version (so the SDK speaks that version: its 0.3 compatibility transport for 0.3), then
checks: a streamed echo, a blocking (non-streaming) echo, the input-required round trip,
cancelling a slow task mid-stream, and getting the cancelled task. Prints `OK <step>` per
step and exits 0, or prints the failure and exits 1.
"""

import argparse
import asyncio
import sys
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)


def request(text: str, task_id: str | None = None) -> SendMessageRequest:
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    if task_id:
        message.task_id = task_id
    return SendMessageRequest(message=message)


def artifact_text(task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def last_task(client, req):
    """Sends `req` and folds the events into the final task snapshot."""
    task = None
    async for event in client.send_message(req):
        if event.HasField("task"):
            task = event.task
        elif event.HasField("status_update") and task is not None:
            task.status.CopyFrom(event.status_update.status)
        elif event.HasField("artifact_update") and task is not None:
            task.artifacts.append(event.artifact_update.artifact)
    assert task is not None, "no task in the response"
    return task


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--version", required=True, choices=["1.0", "0.3"])
    args = parser.parse_args()

    async with httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, args.url).get_agent_card()
    keep = [i for i in card.supported_interfaces if i.protocol_version == args.version]
    check(bool(keep), f"the card offers no {args.version} interface: {card}")
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(keep)
    print(f"OK card {card.name} {args.version}", flush=True)

    streaming = ClientFactory(ClientConfig(streaming=True)).create(card)
    blocking = ClientFactory(ClientConfig(streaming=False)).create(card)

    task = await last_task(streaming, request("hello"))
    check(task.status.state == TaskState.TASK_STATE_COMPLETED, f"stream: {task}")
    check(artifact_text(task) == "echo: hello", f"stream text: {task}")
    print("OK stream", flush=True)

    task = await last_task(blocking, request("hello again"))
    check(task.status.state == TaskState.TASK_STATE_COMPLETED, f"send: {task}")
    check(artifact_text(task) == "echo: hello again", f"send text: {task}")
    print("OK send", flush=True)

    task = await last_task(streaming, request("ask me"))
    check(task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, f"ask: {task}")
    check(task.status.message.parts[0].text == "What is your name?", f"question: {task}")
    answered = await last_task(streaming, request("Ada", task_id=task.id))
    check(answered.status.state == TaskState.TASK_STATE_COMPLETED, f"answer: {answered}")
    check("Nice to meet you, Ada." in artifact_text(answered), f"answer text: {answered}")
    print("OK input-required", flush=True)

    cancelled = None
    async for event in streaming.send_message(request("slow please")):
        if event.HasField("task"):
            slow_id = event.task.id
        if (
            event.HasField("status_update")
            and event.status_update.status.state == TaskState.TASK_STATE_WORKING
            and event.status_update.status.message.parts
        ):
            cancelled = await streaming.cancel_task(CancelTaskRequest(id=slow_id))
    check(cancelled is not None, "the slow task never reported working")
    check(cancelled.status.state == TaskState.TASK_STATE_CANCELED, f"cancel: {cancelled}")
    print("OK cancel", flush=True)

    fetched = await blocking.get_task(GetTaskRequest(id=slow_id))
    check(fetched.status.state == TaskState.TASK_STATE_CANCELED, f"get: {fetched}")
    print("OK get", flush=True)

    await streaming.close()
    await blocking.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - reported to the Rust test
        print(f"FAILED {type(error).__name__}: {error}", flush=True)
        sys.exit(1)
