"""A small A2A agent on the official Python SDK (a2a-sdk 1.x), for keel-a2a's tests and
the curl examples of docs/a2a.md.

    .peers/a2a/venv/bin/python crates/keel-a2a/tests/peers/a2a_peer.py --port 41241

It listens on 127.0.0.1 only, serves its card at /.well-known/agent-card.json and
JSON-RPC at /a2a/jsonrpc (protocol 1.0 and, through the SDK's compatibility layer, 0.3),
and prints `READY <base url>` once it accepts connections. What a task does depends on
the first word of the message:

    ask ...     input-required ("What is your name?"); the answer completes the task
    slow ...    works until cancelled (no timer: it waits for the cancellation)
    fail ...    fails with "failure requested"
    other       completes with an artifact "echo: <message>"

Options: --versions 1.0,0.3 (interfaces advertised), --no-streaming, --bearer-env VAR
(JSON-RPC requests must carry `Authorization: Bearer $VAR`).
"""

import argparse
import asyncio
import os
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)

RPC_PATH = "/a2a/jsonrpc"


class PeerExecutor(AgentExecutor):
    """The behaviours above; `slow` tasks wait on an event their cancellation sets."""

    def __init__(self) -> None:
        self.cancelled: dict[str, asyncio.Event] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        updater = TaskUpdater(event_queue=event_queue, task_id=task_id, context_id=context_id)
        text = context.get_user_input().strip()
        current = context.current_task
        if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.start_work()
            await updater.add_artifact(
                parts=[Part(text=f"Nice to meet you, {text}.")], name="reply", last_chunk=True
            )
            await updater.complete()
            return
        if current is None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message] if context.message else [],
                )
            )
        word = text.split()[0].lower() if text.split() else ""
        if word == "ask":
            await updater.requires_input(
                message=updater.new_agent_message(parts=[Part(text="What is your name?")])
            )
        elif word == "slow":
            event = self.cancelled.setdefault(task_id, asyncio.Event())
            await updater.start_work(
                message=updater.new_agent_message(parts=[Part(text="working until cancelled")])
            )
            print(f"SLOW {task_id}", flush=True)
            await event.wait()
        elif word == "fail":
            await updater.failed(
                message=updater.new_agent_message(parts=[Part(text="failure requested")])
            )
        else:
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text=f"echo: {text}")], name="reply", last_chunk=True)
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        self.cancelled.setdefault(task_id, asyncio.Event()).set()
        updater = TaskUpdater(
            event_queue=event_queue, task_id=task_id, context_id=context.context_id or ""
        )
        await updater.cancel()


class RequireBearer:
    """ASGI middleware: JSON-RPC requests need `Authorization: Bearer <token>`."""

    def __init__(self, app, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == RPC_PATH:
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != self.expected:
                response = JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--versions", default="1.0,0.3")
    parser.add_argument("--no-streaming", action="store_true")
    parser.add_argument("--bearer-env")
    args = parser.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"

    card = AgentCard(
        name="Python peer",
        description="Echoes messages; `ask` asks a question, `slow` works until cancelled, `fail` fails.",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=not args.no_streaming, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id="echo", name="Echo", description="Echoes the message.", tags=["test"], examples=["hello"])
        ],
        supported_interfaces=[
            AgentInterface(protocol_binding="JSONRPC", protocol_version=v.strip(), url=base + RPC_PATH)
            for v in args.versions.split(",")
        ],
    )
    handler = DefaultRequestHandler(
        agent_executor=PeerExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(
        handler, RPC_PATH, enable_v0_3_compat=True
    )
    app = Starlette(routes=routes)
    if args.bearer_env:
        app = RequireBearer(app, os.environ[args.bearer_env])

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            serving.result()
            sys.exit(1)
        await asyncio.sleep(0.01)
    print(f"READY {base}", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(main())
