"""`agentlog.runtime.loading.RunLoader`: the one way every caller loads a run (snapshot + tail)."""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.eventlog.events import ToolCallDecided, ToolCallDecision
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, Runtime, ToolContext, ToolResult, tool
from agentlog.runtime.loading import LoadedRun, RunLoader
from agentlog.runtime.loop.hitl import CallNotSuspended
from agentlog.runtime.loop.run_context import RunContext
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.runs.intake import CheckedDecisions, Handoff, check_loaded
from agentlog.runtime.snapshots.format import CHUNKS, decode_snapshot
from agentlog.runtime.snapshots.store import MemorySnapshotStore


@tool
def approve(ctx: ToolContext) -> Any:
    """Pending until a human decides; then done."""
    if ctx.decision is None:
        return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
    return "approved"


def cycler(store: Any, snapshots: Any) -> Runtime:
    model = ScriptedModel([lambda req: Turn.tool("approve", id=f"ask{sum(m.role == 'assistant' for m in req.messages)}",
                                                 text="again?")], loop=True)
    agent = AgentSpec(id="cycler", model=model, tools=["approve"], max_rounds=1000)
    return Runtime(store, agents=[agent], tools=[approve], snapshots=snapshots)


async def cycle(rt: Runtime, run_id: str, n: int) -> None:
    view = await rt.run_view(run_id)
    [call] = [c for c, v in view.calls.items() if v.status == "suspended"]
    res = await rt.decide(run_id, [{"target_id": call, "decision_id": f"d{n}", "action": "resume", "updated_at": 1}])
    assert res.handle is not None and (await res.handle.result()).status == "waiting"
    await rt.flush_snapshots()


async def test_a_snapshot_replaced_while_it_is_read_is_read_again_not_folded() -> None:
    """A snapshot written meanwhile purges the chunks its predecessor named: a loader that read
    the old entry misses them, reads the entry again and loads from the new one (not from seq 1)."""
    store, snaps = MemoryEventStore(), MemorySnapshotStore()
    rt = cycler(store, snaps)
    result = await rt.run("cycler", "go", thread_id="t-r", run_id="t-r-run")
    assert result.status == "waiting"
    await rt.flush_snapshots()
    gone: set[str] = set()
    for n in range(200):  # until a new snapshot purges a chunk its predecessor named (a span merge)
        old = snaps.entries["t-r-run"]
        await cycle(rt, "t-r-run", n)
        old_entry, new_entry = decode_snapshot(old), decode_snapshot(snaps.entries["t-r-run"])
        assert old_entry is not None and new_entry is not None
        gone = {*old_entry.message_chunks, *old_entry.call_chunks} - {*new_entry.message_chunks, *new_entry.call_chunks}
        if gone:
            break
    assert gone, "no snapshot replaced a chunk"

    reads = {"entry": 0}
    real_get = snaps.get

    async def get(key: str) -> bytes | None:  # the first read of the entry: the one just replaced
        if key == "t-r-run":
            reads["entry"] += 1
            if reads["entry"] == 1:
                return old
        return await real_get(key)

    snaps.get = get  # type: ignore[method-assign]
    CHUNKS.clear()  # a process that holds none of the chunks (a gateway, another worker)
    loaded = await RunLoader(store, snapshots=snaps).load("t-r-run")
    assert reads["entry"] == 2
    assert loaded.snapshot is not None and loaded.snapshot.seq == new_entry.seq
    folded = await RunLoader(store).load("t-r-run")
    assert loaded.ctx.messages == folded.ctx.messages and loaded.version == folded.version


async def test_a_run_handed_on_that_the_thread_left_behind_is_loaded_afresh() -> None:
    """`Handoff`: decisions a gateway checked, with the run it loaded, are taken by `decide`
    instead of a second load and check; if the thread moved meanwhile (another decision for the
    same call landed), the append conflicts and `decide` checks them again on the run loaded
    afresh: nothing recorded twice."""
    store, snaps = MemoryEventStore(), MemorySnapshotStore()
    rt = cycler(store, snaps)
    assert (await rt.run("cycler", "go", thread_id="t-h", run_id="t-h-run")).status == "waiting"
    await rt.flush_snapshots()
    [call] = [c for c, v in (await rt.run_view("t-h-run")).calls.items() if v.status == "suspended"]

    late = {"target_id": call, "decision_id": "d-late", "action": "resume"}
    rt.handoff.give(check_loaded(await rt.loader().load("t-h-run"), [late], 1))  # the gateway's load and check
    other = cycler(store, snaps)  # another process decides the same call first
    res = await other.decide("t-h-run", [{"target_id": call, "decision_id": "d-first", "action": "resume"}])
    assert res.handle is not None and (await res.handle.result()).status == "waiting"

    with pytest.raises(CallNotSuspended):
        await rt.decide("t-h-run", [late])
    assert len(rt.handoff) == 0  # taken once
    recorded = [e.decision.decision_id async for sc in store.read_run("t-h-run") for e in sc.commit.events
                if type(e) is ToolCallDecided]
    assert recorded == ["d-first"]


def _checked(run_id: str, *decision_ids: str) -> CheckedDecisions:
    run = LoadedRun("t", "a", RunContext(thread_id="t", run_id=run_id), 1, [])
    return CheckedDecisions(run, [ToolCallDecision(target_id="c", decision_id=d, action="resume")
                                  for d in decision_ids], [])


def test_a_run_handed_on_is_taken_only_for_the_decisions_it_was_checked_for() -> None:
    handoff = Handoff(limit=2)
    checked = _checked("r", "d1", "d2")
    handoff.give(checked)
    assert handoff.take("r", ["d1"]) is None and "r" not in handoff  # another decision: dropped
    handoff.give(checked)
    assert handoff.take("r", ["d2", "d1"]) is checked and handoff.take("r", ["d1", "d2"]) is None
    for n in range(3):
        handoff.give(_checked(f"r{n}", "d"))
    assert len(handoff) == 2 and "r0" not in handoff  # the oldest pushed out
