"""Merge strategies in the loop: the calls of a parallel round and the hooks of a phase writing
one key, as recorded in the log, and verified replay of each outcome (from the log, and with
the tools run again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest

from agentlog import StateKey
from agentlog.eventlog.events import ToolCall
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, DeterministicEntropy, Plugin, Runtime, ToolContext, ToolResult, tool
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.state import GCounter, GSet, MaxRegister, ops

from tests.support.runtime import events_of

pytestmark = pytest.mark.asyncio


class Doc(pydantic.BaseModel):
    title: str = ""
    body: str = ""


class Stats(pydantic.BaseModel):
    calls: GCounter = GCounter()
    best: MaxRegister = MaxRegister()
    seen: GSet[str] = GSet()


doc = StateKey("doc", Doc)
hits = StateKey("hits", int, merge="commutative")
stats = StateKey("stats", Stats, merge="lattice")
notes = StateKey("notes", list[str])  # exclusive: appends of two calls conflict
KEYS = [doc, hits, stats, notes]


class _Gate(Plugin):
    """Holds every call but the first until that one's result is in: a fixed completion order
    (first, then the others in call order) without sleeps. The first call's id is its `first`."""

    id = "gate"

    def __init__(self) -> None:
        self.released = asyncio.Event()

    def after_tool_execute(self, ctx: Any, call: ToolCall, result: ToolResult) -> None:
        self.released.set()


GATE = _Gate()


@tool(state_keys=KEYS)
async def write(field: str, value: str, first: bool, ctx: ToolContext) -> str:
    """Writes one field of the doc, counts, records a score and a tag, notes the value."""
    if not first:
        await GATE.released.wait()
    ctx.update(doc, ops.set(f"/{field}", value))
    ctx.update(hits, ops.increment())
    ctx.update(stats, ops.count("/calls"), ops.max("/best", len(value)), ops.add_to_set("/seen", field))
    return value


@tool(state_keys=KEYS)
async def note(text: str, first: bool, ctx: ToolContext) -> str:
    """Appends to the notes (an exclusive key)."""
    if not first:
        await GATE.released.wait()
    ctx.update(notes, ops.append("", text))
    ctx.update(hits, ops.increment(by=10))
    return text


def runtime(model: ScriptedModel, mode: str = "parallel_streaming", plugins: list[Plugin] | None = None,
            store: Any = None) -> Runtime:
    GATE.released = asyncio.Event()
    agent = AgentSpec(id="agent", model=model, tools=["write", "note"], tool_execution_mode=mode,
                      plugins=[GATE, *(plugins or [])])
    return Runtime(store or MemoryEventStore(), agents=[agent], tools=[write, note], entropy=DeterministicEntropy())


async def run_and_verify(rt: Runtime, prompt: str = "go") -> tuple[Any, list[Any]]:
    async with asyncio.timeout(10):
        result = await rt.run("agent", prompt)
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    assert (await verify_run(log, result.run_id, rt)).ok
    GATE.released = asyncio.Event()
    GATE.released.set()  # re-executed tools: the recorded completion order is replay's to keep
    assert (await verify_run(log, result.run_id, rt, tools_from_log=False)).ok
    return result, log


async def test_merge_strategy_exclusive_overlap_fails_the_later_call_and_is_recorded() -> None:
    model = ScriptedModel([Turn.tools(("note", {"text": "a", "first": True}), ("note", {"text": "b", "first": False})),
                           "done"])
    rt = runtime(model)
    result, log = await run_and_verify(rt)
    conflict = events_of(log, "StateConflicted")
    assert [(c.key, c.path, c.writer, c.with_writer, c.resolution) for c in conflict] == [
        ("notes", "/notes", "tool:call_0_1", "tool:call_0_0", "failed")]
    assert [w.key for w in conflict[0].writes] == ["notes", "hits"], "the dropped writes are kept on the record"
    completed = {c.call_id: c for c in events_of(log, "ToolCallCompleted")}
    assert completed["call_0_0"].outcome == "succeeded" and completed["call_0_1"].outcome == "failed"
    assert "state conflict" in completed["call_0_1"].result["error"]
    assert (await rt.thread_view(result.thread_id)).state == {"notes": ["a"], "hits": 10}
    # the model was told why
    assert any("state conflict" in m.content for m in model.requests[1].messages if m.role == "tool")


async def test_merge_strategy_exclusive_disjoint_paths_do_not_conflict() -> None:
    model = ScriptedModel([Turn.tools(("write", {"field": "title", "value": "T", "first": True}),
                                      ("write", {"field": "body", "value": "bbb", "first": False})), "done"])
    rt = runtime(model)
    result, log = await run_and_verify(rt)
    assert events_of(log, "StateConflicted") == []
    state = (await rt.thread_view(result.thread_id)).state
    assert state["doc"] == {"title": "T", "body": "bbb"}


async def test_merge_strategy_commutative_and_lattice_parallel_writes_all_land() -> None:
    model = ScriptedModel([Turn.tools(*[("write", {"field": f, "value": v, "first": i == 0})
                                        for i, (f, v) in enumerate([("title", "x"), ("body", "yyyy"), ("title", "zz")])]),
                           "done"])
    rt = runtime(model)
    result, log = await run_and_verify(rt)
    # the two title writes overlap on an exclusive key: the third call fails; counters and
    # lattices of the two others merge
    assert [c.writer for c in events_of(log, "StateConflicted")] == ["tool:call_0_2"]
    state = (await rt.thread_view(result.thread_id)).state
    assert state["hits"] == 2
    assert state["stats"] == {"calls": {"tool:call_0_0": 1, "tool:call_0_1": 1}, "best": 4, "seen": ["body", "title"]}
    written = [e for e in events_of(log, "StateWritten") if e.key == "stats"]
    assert {e.merge for e in written} == {"lattice"} and all(op["op"] == "lattice" for e in written for op in e.ops)


async def test_merge_strategy_sequential_mode_sees_each_write() -> None:
    model = ScriptedModel([Turn.tools(("note", {"text": "a", "first": True}), ("note", {"text": "b", "first": True})),
                           "done"])
    rt = runtime(model, mode="sequential")
    result, log = await run_and_verify(rt)
    assert events_of(log, "StateConflicted") == []
    assert (await rt.thread_view(result.thread_id)).state == {"notes": ["a", "b"], "hits": 20}


async def test_merge_strategy_untyped_parallel_patches_keep_the_last_writer() -> None:
    @tool
    async def put(value: int, first: bool, ctx: ToolContext) -> int:
        """Untyped write of /x."""
        if not first:
            await GATE.released.wait()
        ctx.set("/x", value)
        return value

    GATE.released = asyncio.Event()
    model = ScriptedModel([Turn.tools(("put", {"value": 1, "first": True}), ("put", {"value": 2, "first": False})), "ok"])
    agent = AgentSpec(id="agent", model=model, tools=["put"], plugins=[GATE])
    rt = Runtime(MemoryEventStore(), agents=[agent], tools=[put], entropy=DeterministicEntropy())
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    assert events_of(log, "StateConflicted") == []
    assert (await rt.thread_view(result.thread_id)).state == {"x": 2}


class _Writes(Plugin):
    """After each inference writes the doc's title (exclusive) and counts (commutative)."""

    def __init__(self, plugin_id: str, title: str) -> None:
        self.id = plugin_id
        self.title = title
        self.saw: list[str] = []

    def after_inference(self, ctx: Any, response: Any) -> Any:
        self.saw.append(ctx.read(doc).title)
        batch = ctx.mutate()
        batch.update(doc, ops.set("/title", ctx.read(doc).title + self.title))
        batch.update(hits, ops.increment())
        return [batch]


async def test_merge_strategy_hooks_conflict_falls_back_to_sequential_on_fresh_state() -> None:
    first, second = _Writes("first", "A"), _Writes("second", "B")
    model = ScriptedModel(["hello"])
    rt = runtime(model, plugins=[first, second])
    result, log = await run_and_verify(rt)
    conflict = events_of(log, "StateConflicted")
    assert [(c.writer, c.with_writer, c.resolution) for c in conflict] == [("plugin:second", "plugin:first", "sequential")]
    # second ran twice: on the phase's snapshot, then again after first's writes
    assert second.saw[:2] == ["", "A"] and first.saw[:1] == [""]
    state = (await rt.thread_view(result.thread_id)).state
    assert state == {"doc": {"title": "AB"}, "hits": 2}  # the stored JSON; reads fill the defaults


async def test_merge_strategy_hooks_without_conflict_commit_together() -> None:
    class OnlyCount(Plugin):
        id = "counting"

        def after_inference(self, ctx: Any, response: Any) -> Any:
            batch = ctx.mutate()
            batch.update(hits, ops.increment(by=5))
            return [batch]

    first = _Writes("first", "A")
    model = ScriptedModel(["hello"])
    rt = runtime(model, plugins=[first, OnlyCount()])
    result, log = await run_and_verify(rt)
    assert events_of(log, "StateConflicted") == []
    assert (await rt.thread_view(result.thread_id)).state == {"doc": {"title": "A"}, "hits": 6}
    assert [e.source for e in events_of(log, "StateWritten")] == ["plugin:first", "plugin:first", "plugin:counting"]
