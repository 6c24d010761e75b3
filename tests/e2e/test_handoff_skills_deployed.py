"""Handoff and skills as users run them: one config file (a `triage` agent that hands off to
`billing`, which loads the `refunds` skill and reads one of its files), under `agentlog serve` and
under `agentlog gateway` + `agentlog worker`, reached over HTTP, AG-UI and the AI SDK stream, and
verified with `agentlog replay RUN --verify`."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.cli.demo import follow_run
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.support import forkserver
from tests.support.topology import PYTHONPATH, REPO, TOPOLOGIES, Deployment, deploy

LIMIT = 60

CONFIG = """\
version: 1
models:
  triage-model:
    type: scripted
    script:
      - {tool_calls: [{name: transfer_to_billing, arguments: {reason: refund asked}}]}
  billing-model:
    type: scripted
    script:
      - "(triage's turn)"
      - {tool_calls: [{name: load_skill, arguments: {name: refunds}}]}
      - {tool_calls: [{name: read_skill_file, arguments: {name: refunds, path: policy.md}}]}
      - refund done
      - billing again
skills: [skills]
agents:
  - id: triage
    description: Front desk
    model: triage-model
    system_prompt: You route requests.
    handoffs: [billing]
  - id: billing
    description: Refunds and invoices
    model: billing-model
    system_prompt: You handle refunds.
    skills: ["*"]
"""

SKILL = """\
---
name: refunds
description: How to refund an order.
---
Follow policy.md.
"""


@pytest.fixture(scope="module", params=TOPOLOGIES)
def app_deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    where: Path = tmp_path_factory.mktemp(f"handoff-skills-{request.param}")
    (where / "skills" / "refunds").mkdir(parents=True)
    (where / "skills" / "refunds" / "SKILL.md").write_text(SKILL)
    (where / "skills" / "refunds" / "policy.md").write_text("Refund within 30 days.\n")
    config = where / "app.yaml"
    config.write_text(CONFIG)
    with deploy(request.param, where / "deployment", app=str(config)) as running:
        running.config = config  # type: ignore[attr-defined]
        yield running


async def settle(deployment: Deployment, http: aiohttp.ClientSession, thread_id: str, run_id: str) -> dict[str, Any]:
    """Wait (on the log) until the run ends, then read its view at least that far."""
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        async with asyncio.timeout(LIMIT):
            seq, _ = await follow_run(store, thread_id, run_id, 0, lambda _c: None)
    finally:
        await store.close()
    async with asyncio.timeout(LIMIT):
        while True:  # the server waits for its projection itself; on a loaded machine, ask again
            async with http.get(f"/v1/runs/{run_id}", params={"min_seq": str(seq)}) as r:
                if r.status == 503 and (await r.json()).get("code") == "projection_timeout":
                    continue
                assert r.status == 200, await r.text()
                view: dict[str, Any] = await r.json()
                return view


def sse(text: str) -> list[Any]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


async def test_handoff_and_skill_over_http_then_continue_with_active_agent(app_deployment: Deployment) -> None:
    """`GET /v1/agents` lists the transfer and skill tools; the run view and the thread view
    show the handoff; the skill's body and file are the
    recorded results of billing's calls; the inspector timeline has the handoff row and `agentlog
    run show` names both agents; messages
    sent to the finished run continue with billing (the active agent); replay verifies."""
    async with aiohttp.ClientSession(app_deployment.http_url) as http:
        async with http.get("/v1/agents") as r:  # the catalog offers the generated tools too
            catalog = {a["id"]: [t["name"] for t in a["tools"]] for a in (await r.json())["agents"]}
        assert catalog == {"triage": ["transfer_to_billing"], "billing": ["load_skill", "read_skill_file"]}
        async with http.post("/v1/runs", json={"agent_id": "triage", "messages": "refund order 42"}) as r:
            assert r.status == 202, await r.text()
            started = await r.json()
        run_id, thread_id = started["run_id"], started["thread_id"]
        view = await settle(app_deployment, http, thread_id, run_id)
        assert view["status"] == "done" and view["termination"]["type"] == "natural_end", app_deployment.outputs()
        assert view["agent_id"] == "triage" and view["active_agent"] == "billing"
        (handoff,) = view["handoffs"]
        assert handoff["from_agent"] == "triage" and handoff["to_agent"] == "billing"
        assert handoff["reason"] == "refund asked"
        results = {c["name"]: c for c in view["calls"].values()}
        assert results["transfer_to_billing"]["result"] == {"handed_off_to": "billing", "reason": "refund asked"}
        assert results["load_skill"]["status"] == "succeeded" and results["load_skill"]["result"].startswith("Follow policy.md.")
        assert results["read_skill_file"]["result"] == "Refund within 30 days.\n"
        async with http.get(f"/v1/threads/{thread_id}") as r:
            assert (await r.json())["active_agent"] == "billing"
        async with http.get(f"/v1/runs/{run_id}/timeline") as r:
            assert r.status == 200, await r.text()
            timeline = await r.json()
        rows = [e for group in timeline["steps"] for e in group["events"] if e["type"] == "AgentHandedOff"]
        assert [e["summary"] for e in rows] == ["handoff triage -> billing: refund asked"]
        shown = await asyncio.to_thread(CliRunner().invoke, cli_app, [
            "run", "show", run_id, "--url", app_deployment.http_url, "--timeout", "10"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and "triage -> billing" in shown.stdout, shown.output

        async with http.post(f"/v1/runs/{run_id}/inputs", json={"messages": "thanks"}) as r:
            assert r.status == 202, await r.text()
            nxt = await r.json()
        after = await settle(app_deployment, http, thread_id, nxt["run_id"])
        assert after["agent_id"] == "billing" and after["status"] == "done" and after["handoffs"] == []

    if app_deployment.kind == "serve":  # the recording is the same in both topologies
        for rid in (run_id, nxt["run_id"]):
            proc = await asyncio.to_thread(
                forkserver.run, ["replay", rid, "--verify", "--app", str(app_deployment.config),  # type: ignore[attr-defined]
                                 "--nats", app_deployment.nats_url],
                cwd=str(REPO), env={**os.environ, "PYTHONPATH": PYTHONPATH}, timeout=LIMIT)
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


async def test_handoff_and_skill_over_agui_and_ai_sdk(app_deployment: Deployment) -> None:
    """AG-UI: the handoff is a CUSTOM `agentlog.handoff` after the transfer call, and billing's
    skill calls follow in the same stream; the AI SDK stream carries a
    `data-agentlog-handoff` part and the skill file's text as a tool output."""
    thread = f"t{uuid.uuid4().hex[:12]}"
    body = {"threadId": thread, "runId": "r1", "messages": [{"id": "u1", "role": "user", "content": "refund 42"}],
            "tools": [], "context": [], "state": {}, "forwardedProps": {}}
    value = {"from_agent": "triage", "to_agent": "billing", "reason": "refund asked"}
    async with aiohttp.ClientSession(app_deployment.http_url) as http:
        async with http.post("/v1/ag-ui/agents/triage/runs", json=body) as r:
            assert r.status == 200, await r.text()
            events = sse(await r.text())
        types = [e["type"] for e in events]
        assert types[-1] == "RUN_FINISHED", types
        custom = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "agentlog.handoff"]
        assert len(custom) == 1 and {k: custom[0]["value"][k] for k in value} == value
        names = [e.get("toolCallName") for e in events if e["type"] == "TOOL_CALL_START"]
        assert names == ["transfer_to_billing", "load_skill", "read_skill_file"]
        # recorded with the transfer call's completion (AfterToolExecute effects precede its result)
        assert types.index("TOOL_CALL_END") < events.index(custom[0]) < types.index("RUN_FINISHED")

        chat = {"id": f"c{uuid.uuid4().hex[:12]}",
                "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "refund 7"}]}]}
        async with http.post("/v1/ai-sdk/agents/triage/runs", json=chat) as r:
            assert r.status == 200, await r.text()
            parts = sse(await r.text())
        handoffs = [p for p in parts if p["type"] == "data-agentlog-handoff"]
        assert len(handoffs) == 1 and {k: handoffs[0]["data"][k] for k in value} == value
        assert parts[-1]["type"] == "finish", parts
        outputs = [p for p in parts if p["type"] == "tool-output-available"]
        assert any(p["output"] == "Refund within 30 days.\n" for p in outputs), outputs
        async with http.get(f"/v1/ai-sdk/threads/{chat['id']}/messages") as r:  # the history keeps the part
            assert r.status == 200, await r.text()
            history = (await r.json())["messages"]
        assistant = [m for m in history if m["role"] == "assistant"]
        kept = [p for m in assistant for p in m["parts"] if p["type"] == "data-agentlog-handoff"]
        assert len(kept) == 1 and {k: kept[0]["data"][k] for k in value} == value
        types_in_order = [p["type"] for p in assistant[0]["parts"]]
        assert types_in_order.index("tool-transfer_to_billing") < types_in_order.index("data-agentlog-handoff")
