"""What tools and plugins emit for clients (`ToolContext.emit`, `emit_raw`, `activity`,
`activity_patch`; the `Emit` plugin action): recorded in the log as `Emitted`, forwarded as AG-UI
CUSTOM, RAW, ACTIVITY_SNAPSHOT and ACTIVITY_DELTA in log order, seen by the official
`@ag-ui/client` against what users run (`protocol_deployment`: `agentlog serve`, and `agentlog
gateway` + `agentlog worker`), live and when the run is read again from the log.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

import pytest

from agentlog.eventlog.events import Emitted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.adapters.agui.translator import emitted_events
from agentlog.runtime import Emit, PhaseContext, Plugin

from tests.support import forkserver
from tests.support.js_clients import JS, ensure_js_clients
from tests.support.topology import PYTHONPATH, REPO, Deployment

TIMEOUT = 90
#: What the `report` tool emits, in order (tests/apps/protocol_app.py).
EXPECTED = [
    ("CUSTOM", "report.started", {"step": 1}),
    ("RAW", "acme", {"vendor": "acme", "seq": 1}),
    ("ACTIVITY_SNAPSHOT", "plan", {"steps": ["fetch", "sum"], "done": 0}),
    ("ACTIVITY_DELTA", "plan", [{"op": "replace", "path": "/done", "value": 1}]),
    ("CUSTOM", "report.finished", {"step": 2}),
]


def shape(ev: dict[str, Any]) -> tuple[str, Any, Any] | None:
    kind = ev["type"]
    if kind == "CUSTOM" and not str(ev.get("name", "")).startswith("agentlog."):
        return kind, ev["name"], ev["value"]
    if kind == "RAW":
        return kind, ev["source"], ev["event"]
    if kind == "ACTIVITY_SNAPSHOT" and ev["activityType"] == "plan":
        return kind, ev["activityType"], ev["content"]
    if kind == "ACTIVITY_DELTA":
        return kind, ev["activityType"], ev["patch"]
    return None


async def official_client(base: str, agent: str, thread: str) -> dict[str, Any]:
    await ensure_js_clients()
    proc = await asyncio.create_subprocess_exec("node", str(JS / "emitted.mjs"), base, agent, thread, cwd=JS,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    doc: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return doc


async def test_custom_event_raw_event_activity_reach_the_official_client_in_log_order(
        protocol_deployment: Deployment) -> None:
    """The tool's CUSTOM, RAW and ACTIVITY events arrive in the order it emitted them, after
    the tool call and before its result; the client keeps the activity as a message with the
    delta applied."""
    thread = f"t{uuid.uuid4().hex[:12]}"
    doc = await official_client(protocol_deployment.http_url, "open", thread)
    seen = [s for s in (shape(e) for e in doc["events"]) if s is not None]
    assert seen == EXPECTED, doc["events"]
    types = [e["type"] for e in doc["events"]]
    assert types.index("ACTIVITY_DELTA") < types.index("TOOL_CALL_RESULT") < types.index("RUN_FINISHED")
    activity = [m for m in doc["messages"] if m.get("role") == "activity" and m.get("activityType") == "plan"]
    assert len(activity) == 1 and activity[0]["content"] == {"steps": ["fetch", "sum"], "done": 1}, doc["messages"]


async def test_custom_event_and_activity_are_in_the_log(protocol_deployment: Deployment) -> None:
    """Recorded, not only streamed: the run's commits hold the `Emitted` events in order, with the
    call that emitted them."""
    thread = f"t{uuid.uuid4().hex[:12]}"
    await official_client(protocol_deployment.http_url, "open", thread)
    store = await JetStreamEventStore.connect(protocol_deployment.nats_url)
    try:
        emitted = [e async for sc in store.read_thread(thread) for e in sc.commit.events if isinstance(e, Emitted)]
    finally:
        await store.close()
    assert [e.kind for e in emitted] == ["custom", "raw", "activity_snapshot", "activity_delta", "custom"], emitted
    assert len({e.call_id for e in emitted}) == 1 and emitted[0].call_id


@pytest.mark.parametrize("kind", ["custom", "raw", "activity_snapshot", "activity_delta"])
def test_raw_event_custom_event_activity_translation(kind: str) -> None:
    """Each kind as its AG-UI event; an activity snapshot's non-object content is wrapped, a
    patch AG-UI cannot carry is dropped (not a failed stream)."""
    ev = Emitted(kind=kind, name="n", value=[1] if kind == "activity_snapshot" else {"a": 1},  # type: ignore[arg-type]
                 patch=[{"op": "add", "path": "/a", "value": 2}] if kind == "activity_delta" else None,
                 message_id="m1")
    (out,) = emitted_events(ev)
    wire = out.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["type"] == {"custom": "CUSTOM", "raw": "RAW", "activity_snapshot": "ACTIVITY_SNAPSHOT",
                            "activity_delta": "ACTIVITY_DELTA"}[kind]
    if kind == "activity_snapshot":
        assert wire["content"] == {"value": [1]} and wire["messageId"] == "m1"
    assert emitted_events(Emitted(kind="activity_delta", name="n", patch=[{"op": "nope"}])) == []


def test_custom_event_plugin_action_is_accepted_in_every_phase() -> None:
    """`Emit` is an action of every phase that takes state patches (a plugin emits where it acts)."""
    from agentlog.runtime.plugins import PHASE_ACTIONS, PatchState

    assert all(Emit in actions for actions in PHASE_ACTIONS.values() if PatchState in actions)
    assert Plugin and PhaseContext  # the public names a plugin author imports


@pytest.mark.parametrize("reexecute", [False, True], ids=["tools_from_log", "tools_reexecuted"])
async def test_custom_event_runs_verify_by_replay(protocol_deployment: Deployment, reexecute: bool) -> None:
    """`agentlog replay RUN --verify`: a run whose tool emitted events replays identically, the
    tool answered from the log (its emitted events with it) or run again."""
    if protocol_deployment.kind != "serve":
        pytest.skip("the recording is the same in both topologies")
    thread = f"t{uuid.uuid4().hex[:12]}"
    await official_client(protocol_deployment.http_url, "open", thread)
    store = await JetStreamEventStore.connect(protocol_deployment.nats_url)
    try:
        run_id = [sc.commit.run_id async for sc in store.read_thread(thread) if sc.commit.run_id][0]
    finally:
        await store.close()
    args = ["--reexecute-tools", "report"] if reexecute else []
    proc = await asyncio.to_thread(
        forkserver.run, ["replay", run_id, "--verify", "--app", "tests.apps.protocol_app:app", *args,
                         "--nats", protocol_deployment.nats_url],
        cwd=str(REPO), env={**os.environ, "PYTHONPATH": PYTHONPATH}, timeout=TIMEOUT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
