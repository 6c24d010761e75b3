"""The official clients against agentlog: `@ag-ui/client` 1.0.0 (`HttpAgent`, its reducer and
`verifyEvents`) and `ai` 6.0.325 (`AbstractChat` + `DefaultChatTransport`, `validateUIMessages`),
pinned with a package-lock in tests/support/js.

One node process (tests/support/js/clients.mjs) drives every scenario against a real deployment, in
each topology users run (`agentlog serve`, and `agentlog gateway` + `agentlog worker`, on a real
nats-server: tests/support/topology.py) with the scripted app tests/apps/protocol_app.py, and prints each
client's final messages/state as JSON; here they are compared with GET /v1/threads/{id}/state
and the protocol's GET messages route after the normalisation documented in
`protocol_verify.reducers` (`normalise_agui` / `normalise_aisdk`). The deployment's worker
streams live deltas on core NATS while its gateway follows the log: the order in which they
meet is the one users get.

Skipped when `node`/`npm` are absent, or when `npm ci` (run once into tests/support/js/node_modules when it
is missing) fails for want of a network; any other install failure fails the test.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import aiohttp

from tests.support.js_clients import JS, ensure_js_clients
from tests.support.protocol_verify.reducers import normalise_agui, normalise_aisdk
from tests.support.topology import Deployment


async def _clients(base: str, only: str = "") -> dict[str, Any]:
    """Run tests/support/js/clients.mjs (the scenarios whose name contains `only`) and return its report."""
    await ensure_js_clients()
    assert base.startswith("http://127.0.0.1:")
    proc = await asyncio.create_subprocess_exec(
        "node", str(JS / "clients.mjs"), base, only, cwd=JS, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "NODE_ENV": "production"})
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()[-4000:]
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    assert report["errors"] == [], report["errors"]
    return report


async def test_official_clients_end_in_the_servers_state(protocol_deployment: Deployment) -> None:
    base = protocol_deployment.http_url
    report = await _clients(base)
    expected = {"agui-text", "agui-state", "agui-approve", "agui-deny", "agui-retried-resume",
                "agui-resume-sent-twice", "agui-two-interrupts", "agui-frontend-tool", "agui-reasoning",
                "agui-image", "ai-text", "ai-state", "ai-approve", "ai-deny", "ai-partial", "ai-client-tool",
                "ai-reasoning", "ai-image",
                "ai-resumed-stream", "ai-resumed-stream-after-a-step", "ai-resumed-stream-partial"}
    assert set(report["scenarios"]) == expected
    await _compare(base, report)


async def test_official_clients_show_the_models_reasoning(protocol_deployment: Deployment) -> None:
    """`@ag-ui/client` builds `reasoning` messages from REASONING_* events and `ai` builds
    `reasoning` parts, each thought once, before the answer it led to, as the history routes
    have them."""
    base = protocol_deployment.http_url
    report = await _clients(base, "reasoning")
    assert set(report["scenarios"]) == {"agui-reasoning", "ai-reasoning"}
    thoughts = ["The user wants a sum, so I call add.", "add returned 3."]
    agui_messages = report["scenarios"]["agui-reasoning"]["messages"]
    assert [m["content"] for m in agui_messages if m["role"] == "reasoning"] == thoughts * 2  # two turns
    roles = [m["role"] for m in agui_messages]
    assert roles == ["user", "reasoning", "assistant", "tool", "reasoning", "assistant"] * 2, roles
    parts = report["scenarios"]["ai-reasoning"]["messages"][-1]["parts"]
    assert [p["text"] for p in parts if p["type"] == "reasoning"] == thoughts
    assert all(p["state"] == "done" for p in parts if p["type"] == "reasoning")
    await _compare(base, report)


async def test_official_clients_send_an_image(protocol_deployment: Deployment) -> None:
    """`@ag-ui/client` with image input content and `ai`'s `sendMessage({files})`: the run's
    user message has the image as a part, and each client's messages equal the history's."""
    base = protocol_deployment.http_url
    report = await _clients(base, "image")
    assert set(report["scenarios"]) == {"agui-image", "ai-image"}
    async with aiohttp.ClientSession(base) as http:
        for got in report["scenarios"].values():
            async with http.get(f"/v1/threads/{got['threadId']}/messages") as resp:
                [user, *_] = [m["message"] for m in (await resp.json())["messages"]]
            assert user["content"] == "what is in this picture?", got["protocol"]
            assert [p["type"] for p in user["parts"]] == ["text", "image"] or \
                [p["type"] for p in user["parts"]] == ["image", "text"], user
            assert {p.get("media_type") for p in user["parts"] if p["type"] == "image"} == {"image/png"}
    await _compare(base, report)


async def _compare(base: str, report: dict[str, Any]) -> None:
    async with aiohttp.ClientSession(base) as http:
        for name, got in report["scenarios"].items():
            thread = got["threadId"]
            if got["protocol"] == "ag-ui":
                async with http.get(f"/v1/ag-ui/threads/{thread}/messages") as resp:
                    messages = (await resp.json())["messages"]
                assert normalise_agui(got["messages"]) == normalise_agui(messages), name
                async with http.get(f"/v1/threads/{thread}/state") as resp:
                    assert got["state"] == (await resp.json())["state"], name
            else:
                async with http.get(f"/v1/ai-sdk/threads/{thread}/messages") as resp:
                    messages = (await resp.json())["messages"]
                assert normalise_aisdk(got["messages"]) == normalise_aisdk(messages), name
                assert got["valid"] is True, (name, got.get("invalid"))
