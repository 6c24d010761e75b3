"""The official clients against agentlog (issue #14 "done means"): `@ag-ui/client` 1.0.0
(`HttpAgent`, its reducer and `verifyEvents`) and `ai` 6.0.325 (`AbstractChat` +
`DefaultChatTransport`, `validateUIMessages`), pinned with a package-lock in tests/js.

One node process (tests/js/clients.mjs) drives every scenario against a real stack (real
nats-server, JetStream store, runtime, aiohttp on 127.0.0.1) and prints each client's final
messages/state as JSON; here they are compared with GET /v1/threads/{id}/state and the
protocol's GET messages route after the normalisation documented in
`protocol_verify.reducers` (`normalise_agui` / `normalise_aisdk`).

Skipped when `node`/`npm` are absent, or when `npm ci` (run once into tests/js/node_modules when it
is missing) fails for want of a network; any other install failure fails the test.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
from typing import Any

import pytest

from agentlog.adapters.frontend import frontend_tool
from agentlog.runtime import AgentSpec, PermissionPlugin
from agentlog.runtime.models import ScriptedModel, Turn

from protocol_verify.reducers import normalise_agui, normalise_aisdk
from test_adapters_routes_support import TOOLS, open_stack
from test_protocol_fidelity import append_log, init_log

JS = pathlib.Path(__file__).resolve().parent / "js"
PICK = "pick_color"

#: scenario keyword (the first user message) -> the model's turns, by assistant turns so far
SCRIPTS: dict[str, list[Any]] = {
    "text": ["Hello from agentlog, streamed live."],
    "state": [Turn.tool("add", {"a": 1, "b": 2}, text="Adding them up."), "The sum is 3."],
    "approval": [Turn.tool("echo", {"text": "deploy"}, text="Deploying now."), "All done."],
    "two": [Turn.tools(("echo", {"text": "a"}), ("echo", {"text": "b"}), text="Two things."), "Both handled."],
    "frontend": [Turn.tool(PICK, {"palette": ["red", "blue"]}), "Thanks for picking."],
    "log": [Turn.tool("init_log", {}), Turn.tool("append_log", {"text": "x"}), "Logged."],
}


def route(request: Any) -> Any:
    """The scripted answer for the turn in progress: its user message names the script (e.g.
    "approval: deploy it"), the assistant turns since then say how far it got."""
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    script = SCRIPTS[request.messages[last].content.split(":")[0]]
    done = sum(m.role == "assistant" for m in request.messages[last:])
    return script[min(done, len(script) - 1)]


def agents() -> list[AgentSpec]:
    names = [t.name for t in TOOLS] + [init_log.name, append_log.name, PICK]
    ask = [PermissionPlugin(ask=["echo", "append_log"])]
    return [AgentSpec(id=mode, model=ScriptedModel([route] * 500, chunk_words=2), tools=names, plugins=ask,
                      tool_execution_mode=mode) for mode in ("sequential", "parallel_batch_approval")]


def _node_ready() -> str | None:
    """Why the Node check cannot run (None: it can), installing the pinned packages if needed."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node/npm not installed"
    return None


async def _npm_ci() -> None:
    if (JS / "node_modules" / "@ag-ui" / "client").is_dir() and (JS / "node_modules" / "ai").is_dir():
        return
    proc = await asyncio.create_subprocess_exec("npm", "ci", "--no-audit", "--no-fund", cwd=JS,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = out.decode(errors="replace")
    if proc.returncode != 0 and any(code in text for code in _NETWORK_ERRORS):
        pytest.skip(f"the npm registry is unreachable, the pinned clients cannot be installed: {text[-300:]}")
    assert proc.returncode == 0, text[-2000:]


#: npm's codes for "no network" (only these skip: a lockfile or package error still fails)
_NETWORK_ERRORS = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH")


async def test_official_clients_end_in_the_servers_state(nats_server: Any) -> None:
    why = _node_ready()
    if why is not None:
        pytest.skip(why)
    await _npm_ci()
    tools = [*TOOLS, init_log, append_log, frontend_tool(PICK, "Let the user pick a color")]
    async with open_stack(nats_server, [], tools=tools, agents=agents()) as stack:
        base = str(stack.client.make_url("")).rstrip("/")
        assert base.startswith("http://127.0.0.1:")
        proc = await asyncio.create_subprocess_exec(
            "node", str(JS / "clients.mjs"), base, cwd=JS, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, "NODE_ENV": "production"})
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()[-4000:]
        report = json.loads(out.decode().strip().splitlines()[-1])
        assert report["errors"] == [], report["errors"]
        expected = {"agui-text", "agui-state", "agui-approve", "agui-deny", "agui-retried-resume",
                    "agui-two-interrupts", "agui-frontend-tool", "ai-text", "ai-state", "ai-approve", "ai-deny",
                    "ai-partial", "ai-client-tool", "ai-resumed-stream"}
        assert set(report["scenarios"]) == expected
        for name, got in report["scenarios"].items():
            thread = got["threadId"]
            if got["protocol"] == "ag-ui":
                resp = await stack.client.get(f"/v1/ag-ui/threads/{thread}/messages")
                messages = (await resp.json())["messages"]
                assert normalise_agui(got["messages"]) == normalise_agui(messages), name
                resp = await stack.client.get(f"/v1/threads/{thread}/state")
                assert got["state"] == (await resp.json())["state"], name
            else:
                resp = await stack.client.get(f"/v1/ai-sdk/threads/{thread}/messages")
                messages = (await resp.json())["messages"]
                assert normalise_aisdk(got["messages"]) == normalise_aisdk(messages), name
                assert got["valid"] is True, (name, got.get("invalid"))
