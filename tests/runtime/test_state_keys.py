"""Typed state keys and their scopes: declarations, validated writes, typed reads, reducers, and
the scopes' lifetimes as the loop records them (`StateWritten`, `StateCleared`).

Pure key/batch checks run without a store; the loop's scenarios run a `Runtime` on the in-memory
store (the same loop as on JetStream; the deployed scenarios are in tests/gateway/test_state_deployed.py)."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pydantic
import pytest

from agentlog import StateKey
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.projections.fold import fold_commits
from agentlog.runtime import AgentSpec, DeterministicEntropy, Plugin, Runtime, ToolContext, tool
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.state import (
    MutationBatch,
    StateKeyConflict,
    StateValidationError,
    StateWriteRefused,
    ops,
)

from tests.support.runtime import events_of

pytestmark = pytest.mark.asyncio


class Counter(pydantic.BaseModel):
    value: int = 0
    label: str = ""


class Increment(pydantic.BaseModel):
    kind: Literal["increment"] = "increment"
    n: int


class Rename(pydantic.BaseModel):
    kind: Literal["rename"] = "rename"
    name: str


CounterAction = Increment | Rename


def reduce_counter(state: Counter, action: CounterAction) -> Counter:
    if isinstance(action, Increment):
        state.value += action.n
    else:
        state.label = action.name
    return state


def batch(**docs: dict[str, Any]) -> MutationBatch:
    return MutationBatch({"thread": {}, "run": {}, **docs}, writer="tool:t1", owners={"tool_call": "t1"})


# -- declarations and values (pure) ------------------------------------------------------------------


async def test_state_key_reads_are_typed_and_default_until_written() -> None:
    counter = StateKey("counter", Counter)
    b = batch()
    assert b.read(counter) == Counter()
    b.write(counter, Counter(value=3, label="a"))
    value = b.read(counter)
    assert isinstance(value, Counter) and value == Counter(value=3, label="a")
    assert b.document("thread") == {"counter": {"value": 3, "label": "a"}}


async def test_state_key_write_that_does_not_validate_stages_nothing() -> None:
    counter = StateKey("counter", Counter)
    b = batch()
    with pytest.raises(StateValidationError) as err:
        b.write(counter, {"value": "many"})
    assert err.value.code == "state_invalid" and err.value.key == "counter"
    assert "value" in str(err.value)
    # an update whose result is not a Counter either: refused, nothing staged
    with pytest.raises(StateValidationError):
        b.update(counter, ops.set("/value", "x"))
    assert b.writes == [] and b.document("thread") == {}


async def test_state_key_reducer_records_action_and_the_ops_it_gave() -> None:
    counter = StateKey("counter", Counter, action=CounterAction, reduce=reduce_counter)
    b = batch()
    b.reduce(counter, Increment(n=2))
    b.reduce(counter, {"kind": "rename", "name": "clicks"})
    assert b.read(counter) == Counter(value=2, label="clicks")
    events = [w.event(source="test", call_id=None) for w in b.writes]
    assert [(e.action, e.ops) for e in events] == [
        ({"kind": "increment", "n": 2}, [{"op": "set", "path": "/counter", "value": {"value": 2, "label": ""}}]),
        ({"kind": "rename", "name": "clicks"}, [{"op": "set", "path": "/counter/label", "value": "clicks"}]),
    ]
    with pytest.raises(StateValidationError) as err:
        b.reduce(counter, {"kind": "explode"})
    assert "action" in str(err.value)


async def test_state_key_commutative_reducer_returns_ops() -> None:
    greet = StateKey("greet_count", int, merge="commutative", action=int,
                     reduce=lambda v, n: ops.changes(ops.increment("", n)))
    b = batch()
    b.reduce(greet, 2)
    b.reduce(greet, 3)
    assert b.read(greet) == 5
    assert [w.ops for w in b.writes] == [({"op": "increment", "path": "/greet_count", "value": 2},),
                                         ({"op": "increment", "path": "/greet_count", "value": 3},)]


async def test_state_key_declared_twice_differently_is_refused() -> None:
    a = StateKey("shared", int)
    b = StateKey("shared", str)
    with pytest.raises(StateKeyConflict):
        AgentSpec(id="x", model="m", state_keys=[a, b])

    class P(Plugin):
        id = "p"
        state_keys = (StateKey("shared", int, scope="run"),)

    with pytest.raises(StateKeyConflict):
        AgentSpec(id="x", model="m", state_keys=[a], plugins=[P()])
    # the same declaration twice is one key
    AgentSpec(id="x", model="m", state_keys=[a, StateKey("shared", int)])


async def test_state_key_names_and_options_are_checked() -> None:
    for bad in ("", "a/b", "~x", ".hidden", "x" * 129):
        with pytest.raises(ValueError):
            StateKey(bad, int)
    with pytest.raises(ValueError):
        StateKey("k", int, scope="galaxy")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StateKey("k", int, action=int)  # a reducer needs both
    with pytest.raises(ValueError):
        StateKey("k", int, merge="lattice")  # not a lattice type
    with pytest.raises(ValueError):
        StateKey("k", int, scope="profile", persistent=False)


async def test_state_scope_tool_call_and_profile_need_their_context() -> None:
    per_call = StateKey("scratch", int, scope="tool_call")
    profile = StateKey("prefs", dict, scope="profile")
    b = MutationBatch({"thread": {}, "run": {}}, writer="plugin:p")
    with pytest.raises(StateWriteRefused, match="tool_call scope"):
        b.write(per_call, 1)
    with pytest.raises(StateWriteRefused, match="profile"):
        b.read(profile)


# -- the loop: scopes and their lifetimes ------------------------------------------------------------

counter = StateKey("counter", Counter, action=CounterAction, reduce=reduce_counter)
visits = StateKey("visits", int, scope="run")
scratch = StateKey("scratch", list[str], scope="tool_call")
draft = StateKey("draft", str, persistent=False)


@tool(state_keys=[counter, visits, scratch, draft])
def note(text: str, ctx: ToolContext) -> dict[str, Any]:
    """Count, remember per run and per call, draft."""
    ctx.reduce(counter, Increment(n=1))
    ctx.update(visits, ops.increment())
    ctx.update(scratch, ops.append("", text))
    ctx.write(draft, text)
    return {"visits": ctx.read(visits), "scratch": ctx.read(scratch), "counter": ctx.read(counter).value}


def runtime(model: ScriptedModel, mode: str = "sequential", **spec: Any) -> Runtime:
    agent = AgentSpec(id="agent", model=model, tools=["note"], tool_execution_mode=mode, **spec)
    return Runtime(MemoryEventStore(), agents=[agent], tools=[note], entropy=DeterministicEntropy())


async def test_state_scope_lifetimes_are_recorded_as_events() -> None:
    model = ScriptedModel([Turn.tool("note", {"text": "a"}), Turn.tool("note", {"text": "b"}), "done"])
    rt = runtime(model)
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    completed = events_of(log, "ToolCallCompleted")
    # run scope: the second call saw the first's write; tool_call scope: each call its own
    assert [c.result for c in completed] == [{"visits": 1, "scratch": ["a"], "counter": 1},
                                             {"visits": 2, "scratch": ["b"], "counter": 2}]
    cleared = [(e.scope, e.keys, e.call_id) for e in events_of(log, "StateCleared")]
    assert cleared == [("tool_call", ["scratch"], "call_0_0"), ("tool_call", ["scratch"], "call_1_0"),
                       ("run", ["visits"], None), ("thread", ["draft"], None)]
    thread = await rt.thread_view(result.thread_id)
    assert thread.state == {"counter": {"value": 2, "label": ""}}  # the draft was not persistent
    assert result.run.state == {} and all(c.state == {} for c in result.run.calls.values())
    # the views are a fold of the log: the same from the commits alone
    views = fold_commits(log)
    assert views.threads[result.thread_id].state == thread.state


async def test_state_scope_thread_persists_and_run_starts_empty_in_the_next_run() -> None:
    model = ScriptedModel([Turn.tool("note", {"text": "a"}), "one", Turn.tool("note", {"text": "b"}), "two"])
    rt = runtime(model)
    async with asyncio.timeout(10):
        first = await rt.run("agent", "go")
        second = await rt.run("agent", "again", thread_id=first.thread_id)
    log = [sc async for sc in rt.store.read_run(second.run_id)]
    result = events_of(log, "ToolCallCompleted")[0].result
    assert result == {"visits": 1, "scratch": ["b"], "counter": 2}  # run scope fresh, thread kept


async def test_state_scope_time_travel_shows_run_state_before_its_cleanup() -> None:
    from agentlog.projections.timetravel import run_at

    model = ScriptedModel([Turn.tool("note", {"text": "a"}), "done"])
    rt = runtime(model)
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    positions = [(sc.seq, i, e) for sc in log for i, e in enumerate(sc.commit.events)]
    from agentlog.eventlog.events import Position

    cleared_at = next(Position(s, i) for s, i, e in positions if type(e).__name__ == "StateCleared" and e.scope == "run")
    before = run_at(log, result.run_id, Position(cleared_at.seq, cleared_at.index - 1))
    after = run_at(log, result.run_id, cleared_at)
    assert before is not None and before.state == {"visits": 1}
    assert after is not None and after.state == {}


async def test_state_key_invalid_write_fails_the_call_with_a_clear_error() -> None:
    @tool(state_keys=[counter])
    def bad(ctx: ToolContext) -> str:
        """Writes a counter that is not one."""
        ctx.write(counter, {"value": "lots"})
        return "unreachable"

    model = ScriptedModel([Turn.tool("bad", {}), "ok"])
    agent = AgentSpec(id="agent", model=model, tools=["bad"])
    rt = Runtime(MemoryEventStore(), agents=[agent], tools=[bad], entropy=DeterministicEntropy())
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    assert events_of(log, "StateWritten") == []
    completed = events_of(log, "ToolCallCompleted")[0]
    assert completed.outcome == "failed"
    assert "StateValidationError" in completed.result["error"] and "'counter'" in completed.result["error"]
    tool_message = next(m for m in model.requests[1].messages if m.role == "tool")
    assert "invalid value" in tool_message.content


async def test_state_key_replay_reduces_actions_again_and_catches_a_changed_reducer() -> None:
    from agentlog.runtime.replay.plan import NonDeterminismError
    from agentlog.runtime.replay.verify import verify_run

    model = ScriptedModel([Turn.tool("note", {"text": "a"}), Turn.tool("note", {"text": "b"}), "done"])
    rt = runtime(model)
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    written = [e for e in events_of(log, "StateWritten") if e.key == "counter"]
    assert [e.action for e in written] == [{"kind": "increment", "n": 1}] * 2
    assert (await verify_run(log, result.run_id, rt)).ok

    def doubled(state: Counter, action: CounterAction) -> Counter:
        state.value += 2 * action.n if isinstance(action, Increment) else 0
        return state

    changed = StateKey("counter", Counter, action=CounterAction, reduce=doubled)

    @tool(name="note", state_keys=[changed, visits, scratch, draft])
    def note_v2(text: str, ctx: ToolContext) -> dict[str, Any]:
        """Count, remember per run and per call, draft."""
        raise AssertionError("answered from the log")  # the same tool, its key's reducer changed

    agent = AgentSpec(id="agent", model=model, tools=["note"], tool_execution_mode="sequential")
    app = Runtime(MemoryEventStore(), agents=[agent], tools=[note_v2])
    with pytest.raises(NonDeterminismError) as err:
        await verify_run(log, result.run_id, app)
    assert "StateWritten" in str(err.value) and "counter" in str(err.value)


async def test_state_scope_snapshot_carries_run_and_call_state_to_a_resumed_run() -> None:
    """A call writes its tool_call and the run scope, then waits for a human. Another process
    (a fresh Runtime) resumes the run from its snapshot: the call, run again with the decision,
    reads both as they were, and they end with the call and the run."""
    from agentlog.runtime import ToolResult
    from agentlog.runtime.snapshots.format import decode_snapshot
    from agentlog.runtime.snapshots.store import MemorySnapshotStore

    @tool(state_keys=[visits, scratch])
    def ask(ctx: ToolContext) -> Any:
        """Note what it asked, wait for a human, then answer with what it noted."""
        if ctx.decision is None:
            ctx.update(scratch, ops.append("", "asked"))
            ctx.update(visits, ops.increment(by=7))
            return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
        return {"scratch": ctx.read(scratch), "visits": ctx.read(visits)}

    # one model script and one id source across both Runtimes: a log's ids never repeat
    model = ScriptedModel([Turn.tool("ask", {}), "done"])
    entropy = DeterministicEntropy()

    def app(store: Any, snapshots: Any) -> Runtime:
        agent = AgentSpec(id="agent", model=model, tools=["ask"], tool_execution_mode="sequential")
        return Runtime(store, agents=[agent], tools=[ask], entropy=entropy, snapshots=snapshots)

    store, snaps = MemoryEventStore(), MemorySnapshotStore()
    first = app(store, snaps)
    async with asyncio.timeout(10):
        waiting = await first.run("agent", "go")
        await first.flush_snapshots()
    assert waiting.status == "waiting"
    snapshot = decode_snapshot(await snaps.get(waiting.run_id))
    assert snapshot is not None
    assert snapshot.ctx.run_state == {"visits": 7} and snapshot.ctx.call_states == {"call_0_0": {"scratch": ["asked"]}}
    second = app(store, snaps)
    async with asyncio.timeout(10):
        res = await second.decide(waiting.run_id, [{"target_id": "call_0_0", "decision_id": "d1", "action": "resume",
                                                    "result": True, "updated_at": 1}])
        assert res.handle is not None
        done = await res.handle.result()
    log = [sc async for sc in store.read_thread(done.thread_id)]
    assert events_of(log, "ToolCallCompleted")[0].result == {"scratch": ["asked"], "visits": 7}
    assert done.run.state == {} and done.run.calls["call_0_0"].state == {}
