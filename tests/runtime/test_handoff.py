"""Agent handoff (`agentlog.runtime.agents.handoff`): the `transfer_to_<agent>` tools, the `HandOff`
plugin action, the `AgentHandedOff` event and the folds that make the active agent thread
state; each run recorded on a real JetStream store and verified by replay. Through real
processes (HTTP, AG-UI, AI SDK, `replay --verify`): tests/e2e/test_handoff_skills_deployed.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from agentlog.eventlog.events import (
    AgentHandedOff,
    Commit,
    RunFinished,
    RunStarted,
    StoredCommit,
    ThreadCreated,
)
from agentlog.gateway.adapters.agui.translator import AguiTranslator
from agentlog.gateway.adapters.aisdk.translator import AiSdkTranslator
from agentlog.projections import fold_commits
from agentlog.runtime import (
    AgentSpec,
    DeterministicEntropy,
    HandOff,
    PhaseContext,
    Plugin,
    RunRequest,
    Runtime,
    tool,
)
from agentlog.runtime.agents.handoff import HandoffPlugin, HandoffTool
from agentlog.runtime.agents.spec import UnknownAgent
from agentlog.runtime.loop.run_context import RunContext, fold_context
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run
from agentlog.testing import RecordingModel

from tests.support.inprocess import InProcessDispatcher
from tests.support.runtime import logged, store  # noqa: F401  (fixture)


@tool
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: paid"


def app(triage_script: list[Any], billing_script: list[Any], **triage: Any
        ) -> tuple[Runtime, RecordingModel, RecordingModel]:
    t_model = RecordingModel(ScriptedModel(triage_script, name="triage-model", position="conversation"))
    b_model = RecordingModel(ScriptedModel(billing_script, name="billing-model", position="conversation"))
    agents = [
        AgentSpec(id="triage", model=t_model, tools=["lookup"], system_prompt="You route requests.",
                  handoffs=["billing"], description="Front desk", **triage),
        AgentSpec(id="billing", model=b_model, tools=["refund"], system_prompt="You handle refunds.",
                  description="Refunds and invoices"),
    ]
    return Runtime(None, agents=agents, tools=[refund, lookup], entropy=DeterministicEntropy(prefix=f"h{uuid.uuid4().hex[:8]}")), t_model, b_model  # type: ignore[arg-type]


async def finished(store: Any, run_id: str) -> None:
    """Wait (on the log, not a clock) for the run's `RunFinished`."""
    follower = store.follow(None, 0)
    try:
        async for sc in follower:
            if sc.commit.run_id == run_id and any(isinstance(e, RunFinished) for e in sc.commit.events):
                return
    finally:
        await follower.aclose()


def bind(rt: Runtime, s: Any) -> Runtime:
    rt.store = s
    return rt


# -- pure ---------------------------------------------------------------------------------------


def _commit(seq: int, run_id: str | None, *events: Any) -> StoredCommit:
    return StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id="t1", run_id=run_id, ts=seq, events=list(events)))


def test_handoff_folds_into_thread_run_and_loop_context() -> None:
    """`AgentHandedOff` moves the active agent of the run view, the thread view and the loop's
    context; a later run's `RunStarted` sets it again (explicit agent wins)."""
    commits = [
        _commit(1, "r1", ThreadCreated(), RunStarted(run_id="r1", agent_id="triage")),
        _commit(2, "r1", AgentHandedOff(from_agent="triage", to_agent="billing", reason="refund", call_id="c1")),
    ]
    views = fold_commits(commits)
    assert views.threads["t1"].active_agent == "billing"
    run = views.runs["r1"]
    assert run.agent_id == "triage" and run.active_agent == "billing"
    assert run.handoffs == [{"from_agent": "triage", "to_agent": "billing", "reason": "refund", "call_id": "c1",
                             "seq": 2}]
    ctx = fold_context(RunContext(thread_id="t1", run_id="r1"), commits)
    assert ctx.agent_id == "billing"
    # another run's handoff is not this run's; a new run names its agent
    other = fold_context(RunContext(thread_id="t1", run_id="r2"), commits)
    assert other.agent_id is None
    commits.append(_commit(3, "r2", RunStarted(run_id="r2", agent_id="triage")))
    assert fold_commits(commits).threads["t1"].active_agent == "triage"


def test_handoff_spec_declares_transfer_tools_and_plugin() -> None:
    """`handoffs` adds one `transfer_to_<agent>` tool per target (deduplicated) and the plugin
    that turns a successful call into `HandOff`; a failed call hands nothing off."""
    spec = AgentSpec(id="a", model="m", tools=["lookup"], handoffs=["b", "c", "b"])
    assert spec.tools == ["lookup", "transfer_to_b", "transfer_to_c"]
    plugin = next(p for p in spec.plugins if isinstance(p, HandoffPlugin))
    from agentlog.eventlog.events import ToolCall
    from agentlog.runtime.tools import ToolResult

    call = ToolCall(id="c1", name="transfer_to_c", arguments={"reason": "why"})
    ctx: Any = None
    assert plugin.after_tool_execute(ctx, call, ToolResult.success({})) == [HandOff(agent="c", reason="why", call_id="c1")]
    assert plugin.after_tool_execute(ctx, call, ToolResult.failure("no")) is None
    assert HandoffTool("b", "Refunds").spec.parameters["properties"]["reason"]
    with pytest.raises(ValueError):
        AgentSpec(id="a", model="m", handoffs=["not an id"])


# -- on a real store ----------------------------------------------------------------------------


async def test_handoff_next_turn_uses_target_instructions_tools_and_model(store: Any) -> None:
    """After `transfer_to_billing`, the next inference goes to billing's model with billing's
    system prompt and tools; the log records the handoff; replay verifies the run."""
    rt, t_model, b_model = app(
        [Turn.tool("transfer_to_billing", {"reason": "refund asked"})],
        ["(unused: triage's turn)", Turn.tool("refund", {"order": "42"}), "refund done"],
    )
    rt = bind(rt, store)
    async with asyncio.timeout(20):
        result = await rt.run("triage", "I want a refund for order 42")
    assert result.termination.type == "natural_end"
    (first,) = t_model.requests
    assert first.messages[0].content == "You route requests."
    assert [t.name for t in first.tools] == ["lookup", "transfer_to_billing"]
    assert "Refunds and invoices" in first.tools[1].description
    assert len(b_model.requests) == 2
    assert all(r.messages[0].content == "You handle refunds." for r in b_model.requests)
    assert [t.name for t in b_model.requests[0].tools] == ["refund"]
    log = await logged(rt, result)
    handoffs = [e for sc in log for e in sc.commit.events if isinstance(e, AgentHandedOff)]
    assert handoffs == [AgentHandedOff(from_agent="triage", to_agent="billing", reason="refund asked",
                                       call_id=handoffs[0].call_id)]
    assert result.run.active_agent == "billing" and result.run.agent_id == "triage"
    assert (await rt.thread_view(result.thread_id)).active_agent == "billing"
    report = await verify_run(store, result.run_id, rt)
    assert report.ok and report.inferences == 3


async def test_handoff_plugin_action_and_unknown_target(store: Any) -> None:
    """A plugin's `HandOff` at RunStart: the first inference is already the target's. A handoff
    to an agent nobody registered ends the run `error` (`agent_not_found`) with no handoff
    recorded (at RunStart it fails the start itself, before anything is written)."""

    class Router(Plugin):
        id = "router"

        def __init__(self, target: str, at: str = "run_start") -> None:
            self.target = target
            setattr(self, at, self.route)

        def route(self, ctx: PhaseContext) -> list[Any]:
            return [HandOff(agent=self.target, reason="routed")]

        def run_start(self, ctx: PhaseContext) -> list[Any]:
            return []

        def step_start(self, ctx: PhaseContext) -> list[Any]:
            return []

    rt, t_model, b_model = app(["unused"], ["billing answers"], plugins=[Router("billing")])
    rt = bind(rt, store)
    async with asyncio.timeout(20):
        result = await rt.run("triage", "hi")
    assert result.termination.type == "natural_end"
    assert t_model.requests == [] and len(b_model.requests) == 1
    assert (await verify_run(store, result.run_id, rt)).ok

    rt2, _, _ = app(["unused"], ["unused"], plugins=[Router("nobody", at="step_start")])
    rt2 = bind(rt2, store)
    async with asyncio.timeout(20):
        bad = await rt2.run("triage", "hi")
    assert bad.termination.type == "error" and bad.termination.code == "agent_not_found"
    assert not [e for sc in await logged(rt2, bad) for e in sc.commit.events if isinstance(e, AgentHandedOff)]
    rt3, _, _ = app(["unused"], ["unused"], plugins=[Router("nobody")])
    rt3 = bind(rt3, store)
    with pytest.raises(UnknownAgent):
        await rt3.start("triage", "hi", thread_id="never-written")
    assert await store.thread_version("never-written") == 0


async def test_handoff_continuation_starts_with_active_agent(store: Any) -> None:
    """Messages sent to a finished run (a continuation naming no agent) go on with the run's
    active agent; `start_run` naming an agent starts that one (explicit wins)."""
    rt, _, b_model = app([Turn.tool("transfer_to_billing", {}), "-", "-", "triage again"],
                         ["-", "billing 1", "billing again"])
    rt = bind(rt, store)
    dispatcher = InProcessDispatcher(rt)
    async with asyncio.timeout(20):
        first = await rt.run("triage", "refund please")
        accepted = await dispatcher.submit_inputs(first.run_id, messages=[{"role": "user", "content": "and?"}])
        await finished(store, accepted.run_id)
        second = await rt.run_view(accepted.run_id)
    assert second.agent_id == "billing" and second.status == "done"
    assert len(b_model.requests) == 2
    assert (await rt.thread_view(first.thread_id)).active_agent == "billing"
    async with asyncio.timeout(20):
        explicit = await dispatcher.start_run(RunRequest(
            agent_id="triage", messages=[{"role": "user", "content": "back"}], parent_run_id=accepted.run_id))
        await finished(store, explicit.run_id)
    assert (await rt.run_view(explicit.run_id)).agent_id == "triage"
    assert (await rt.thread_view(first.thread_id)).active_agent == "triage"


@pytest.mark.parametrize("snapshots", [False, True], ids=["folded", "from_snapshot"])
async def test_handoff_resume_from_log_keeps_the_active_agent(store: Any, snapshots: bool) -> None:
    """A run that handed off and then waited for a human is decided on another Runtime (a fresh
    loop folded from the log, or from the run-context snapshot the first one wrote, as on
    another worker): it goes on with the target agent, and verifies by replay across it."""
    from agentlog.runtime import MemorySnapshotStore, PermissionPlugin

    def make() -> tuple[Runtime, RecordingModel]:
        rt, _, b_model = app([Turn.tool("transfer_to_billing", {})],
                             ["-", Turn.tool("refund", {"order": "7"}), "refunded"])
        rt.agents.get("billing").plugins.append(PermissionPlugin(ask=["refund"]))
        rt.snapshots = shared
        return bind(rt, store), b_model

    shared = MemorySnapshotStore() if snapshots else None
    first, _ = make()
    async with asyncio.timeout(20):
        waiting = await (await first.start("triage", "refund 7")).result()
        assert waiting.run.status == "waiting" and waiting.run.active_agent == "billing"
        await first.flush_snapshots()
        if snapshots:
            assert first.snapshot_seq(waiting.run_id) > 0
        call_id = [c.call_id for c in waiting.run.calls.values() if c.status == "suspended"][0]
        other, b_model = make()
        res = await other.decide(waiting.run_id, [{"target_id": call_id, "decision_id": "d1", "action": "resume",
                                                   "result": {"approved": True}}])
        assert res.handle is not None
        done = await res.handle.result()
    assert done.termination.type == "natural_end" and done.run.active_agent == "billing"
    assert len(b_model.requests) == 1  # the other Runtime's billing model answered the last turn
    assert b_model.requests[0].messages[0].content == "You handle refunds."
    assert (await verify_run(store, done.run_id, other)).ok


def test_handoff_protocol_mapping() -> None:
    """AG-UI: a CUSTOM `agentlog.handoff`; AI SDK: a `data-agentlog-handoff` part."""
    ev = AgentHandedOff(from_agent="triage", to_agent="billing", reason="r", call_id="c1")
    value = {"from_agent": "triage", "to_agent": "billing", "reason": "r", "call_id": "c1"}
    wire = [e.model_dump(mode="json", by_alias=True, exclude_none=True)
            for e in AguiTranslator("t1", "r1").feed(ev)]
    assert {"type": "CUSTOM", "name": "agentlog.handoff", "value": value} in wire
    assert {"type": "data-agentlog-handoff", "data": value} in AiSdkTranslator("t1", "r1").feed(ev)


def test_handoff_declared_in_the_config_file(tmp_path: Any) -> None:
    """`handoffs:` of a config agent: the transfer tools and plugin; a target that is not
    another agent of the file is a config error."""
    from agentlog.runtime.config import ConfigError, load_config

    text = """\
version: 1
models:
  m: {type: scripted, script: ["hi"]}
agents:
  - id: triage
    model: m
    handoffs: [billing]
  - id: billing
    model: m
"""
    path = tmp_path / "app.yaml"
    path.write_text(text)
    triage, billing = load_config(path).agents
    assert triage.tools == ["transfer_to_billing"] and triage.handoffs == ["billing"]
    assert any(isinstance(p, HandoffPlugin) for p in triage.plugins) and billing.tools == []
    for bad in ["[nobody]", "[triage]"]:
        path.write_text(text.replace("[billing]", bad))
        with pytest.raises(ConfigError, match="handoffs names"):
            load_config(path)


async def test_handoff_from_sequential_to_parallel_agent_replays(store: Any) -> None:
    """The target's execution mode applies after the handoff (two calls in flight together), and
    replay holds their results as recorded for the agent that made them."""
    rt, _, b_model = app([Turn.tool("transfer_to_billing", {})],
                         ["-", Turn.tools(("refund", {"order": "1"}), ("refund", {"order": "2"})), "both refunded"],
                         tool_execution_mode="sequential")
    billing = rt.agents.get("billing")
    assert billing.tool_execution_mode == "parallel_streaming"
    rt = bind(rt, store)
    async with asyncio.timeout(20):
        result = await rt.run("triage", "refund 1 and 2")
    assert result.termination.type == "natural_end" and len(b_model.requests) == 2
    report = await verify_run(store, result.run_id, rt, tools_from_log=False)
    assert report.ok and report.tools_executed >= 2


async def test_handoff_agent_registered_after_the_runtime_gets_its_transfer_tool(store: Any) -> None:
    """`rt.agents.register(spec)` later: the start registers the spec's transfer tools."""
    rt, _, b_model = app(["unused"], ["-", "billing here"])
    rt = bind(rt, store)
    late = AgentSpec(id="late", model=ScriptedModel([Turn.tool("transfer_to_billing", {})], name="late-model"),
                     handoffs=["billing"])
    rt.agents.register(late)
    async with asyncio.timeout(20):
        result = await rt.run("late", "hi")
    assert result.termination.type == "natural_end" and result.run.active_agent == "billing"
    assert len(b_model.requests) == 1


class _Crash(Exception):
    """The simulated death of the process driving the run."""


class _CrashingStore:
    """Lets `after` appends through, then fails every append (the process died there)."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.after, self.appended = inner, after, 0

    async def append(self, commit: Commit, expected_version: int | None) -> Any:
        if self.appended >= self.after:
            raise _Crash(f"crashed after commit {self.after}")
        res = await self.inner.append(commit, expected_version)
        self.appended += 1
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_handoff_crash_at_every_commit_then_resume_is_exact(store: Any) -> None:
    """Kill the process after each commit of a run that hands off, resume it with a fresh
    Runtime (new models and tools, nothing in memory): the log equals the uninterrupted run's,
    commit for commit, ids and timestamps included."""
    from agentlog.eventlog.memory import MemoryEventStore

    def fresh(s: Any, prefix: str, counter: int = 0) -> Runtime:
        rt, _, _ = app([Turn.tool("transfer_to_billing", {"reason": "refund"})],
                       ["-", Turn.tool("refund", {"order": "9"}), "refunded"],
                       tool_execution_mode="sequential")
        entropy = DeterministicEntropy(prefix=prefix)
        entropy._counter = counter  # noqa: SLF001 - continue where the committed draws ended
        rt.entropy = entropy
        return bind(rt, s)

    async def log_of(s: Any, thread: str) -> list[Commit]:
        return [sc.commit async for sc in s.read_thread(thread)]  # (seqs differ: one store, many threads)

    n = None
    k = 1
    while n is None or k < n:
        prefix, thread, run = f"k{k}x", f"t-handoff-{k}", f"r-handoff-{k}"
        mem = MemoryEventStore()
        async with asyncio.timeout(20):
            control = await fresh(mem, prefix).run("triage", "refund 9", thread_id=thread, run_id=run)
        want = await log_of(mem, thread)
        assert control.run.active_agent == "billing" and any(
            isinstance(e, AgentHandedOff) for c in want for e in c.events)
        n = len(want)
        crashed = fresh(_CrashingStore(store, k), prefix)
        async with asyncio.timeout(20):
            with pytest.raises(_Crash):
                await crashed.run("triage", "refund 9", thread_id=thread, run_id=run)
        left = await log_of(store, thread)
        assert left == want[:k]
        counter = max(int(c.commit_id[len(prefix):]) for c in left)
        resumer = fresh(store, prefix, counter)
        async with asyncio.timeout(20):
            handle = await resumer.resume(run)
            assert handle is not None
            result = await handle.result()
        assert result.status == "done" and result.run.active_agent == "billing"
        assert await log_of(store, thread) == want, f"resumed after commit {k} of {n}"
        k += 1
    assert n is not None and n >= 5
