"""Drives a Keel agent served by `keel serve` with the official Python SDK's client
(a2a-sdk 1.x), authenticated with a Keel API key, for keel-server's tests.

    KEEL_A2A_KEY=keel_... .peers/a2a/venv/bin/python \
        crates/keel-a2a/tests/peers/keel_serve_client.py \
        --url http://127.0.0.1:8080/a2a/bot --version 1.0 --first "First." --second "Second."

It resolves the agent's public card at <url>/.well-known/agent-card.json, keeps only the
interfaces of --version (so the SDK speaks that version: its 0.3 compatibility transport
for 0.3), and checks, printing `OK <step>` per step (exit 0) or the failure (exit 1):

    card     the card declares bearer auth and requires it (securityRequirements)
    auth     a client without the key is refused (HTTP 401)
    send     a blocking send, with the key added by the SDK's AuthInterceptor from the
             card's security scheme, completes with the agent's first answer (--first)
    stream   a streamed message in the same context (the same Keel thread) completes with
             the second answer (--second), the answer arriving as an artifact update
    get      getting the first task answers it completed, with its answer
"""

import argparse
import asyncio
import os
import sys
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.auth.credentials import CredentialService
from a2a.client.auth.interceptor import AuthInterceptor
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState


class KeyService(CredentialService):
    """Answers the Keel API key for the card's `bearer` scheme."""

    def __init__(self, key: str) -> None:
        self.key = key

    async def get_credentials(self, security_scheme_name, context):
        return self.key if security_scheme_name == "bearer" else None


def request(text: str, context_id: str | None = None) -> SendMessageRequest:
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


def artifact_text(task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--version", required=True, choices=["1.0", "0.3"])
    parser.add_argument("--first", required=True)
    parser.add_argument("--second", required=True)
    args = parser.parse_args()
    key = os.environ["KEEL_A2A_KEY"]

    async with httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, args.url).get_agent_card()
    keep = [i for i in card.supported_interfaces if i.protocol_version == args.version]
    check(bool(keep), f"the card offers no {args.version} interface: {card}")
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(keep)
    check("bearer" in card.security_schemes, f"no bearer scheme: {card}")
    check(
        any("bearer" in r.schemes for r in card.security_requirements),
        f"bearer is not required: {card}",
    )
    print(f"OK card {card.name} {args.version}", flush=True)

    async with httpx.AsyncClient(timeout=60) as http:
        anonymous = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        try:
            async for _ in anonymous.send_message(request("hello")):
                pass
            raise AssertionError("a request without the key was answered")
        except AssertionError:
            raise
        except Exception as error:  # noqa: BLE001 - the SDK's HTTP error
            check("401" in str(error), f"refused, but not with 401: {error!r}")
    print("OK auth", flush=True)

    auth = [AuthInterceptor(KeyService(key))]
    blocking = ClientFactory(ClientConfig(streaming=False)).create(card, auth)
    streaming = ClientFactory(ClientConfig(streaming=True)).create(card, auth)

    first = None
    async for event in blocking.send_message(request("hello")):
        if event.HasField("task"):
            first = event.task
    check(first is not None, "no task answered the send")
    check(first.status.state == TaskState.TASK_STATE_COMPLETED, f"send: {first}")
    check(artifact_text(first) == args.first, f"send text: {first}")
    print(f"OK send {first.id}", flush=True)

    task, updates, text = None, [], ""
    async for event in streaming.send_message(request("again", context_id=first.context_id)):
        if event.HasField("task"):
            task = event.task
            updates.append("task")
        elif event.HasField("status_update"):
            updates.append(TaskState.Name(event.status_update.status.state))
            if task is not None:
                task.status.CopyFrom(event.status_update.status)
        elif event.HasField("artifact_update"):
            updates.append("artifact")
            text += "".join(p.text for p in event.artifact_update.artifact.parts)
    check(task is not None, f"the stream named no task: {updates}")
    check(task.context_id == first.context_id, f"another context: {task}")
    check(task.id != first.id, "the second message reused the first task")
    check(task.status.state == TaskState.TASK_STATE_COMPLETED, f"stream: {updates}")
    check("artifact" in updates, f"no artifact update streamed: {updates}")
    check(text == args.second, f"stream text: {text!r}")
    print(f"OK stream {' '.join(updates)}", flush=True)

    got = await blocking.get_task(GetTaskRequest(id=first.id))
    check(got.id == first.id, f"get: {got}")
    check(got.status.state == TaskState.TASK_STATE_COMPLETED, f"get: {got}")
    check(artifact_text(got) == args.first, f"get text: {got}")
    print("OK get", flush=True)

    await blocking.close()
    await streaming.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - reported to the Rust test
        print(f"FAILED {type(error).__name__}: {error}", flush=True)
        sys.exit(1)
