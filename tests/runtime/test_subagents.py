"""Sub-agents as child runs (`agentlog.runtime.toolkits.subagents`) on a real JetStream store: lineage in the log,
foreground and background children, progress forwarded to the parent's call, allowed / excluded
agents, cancellation cascading to descendants, a child that waits for a human suspending its
parent (resumed from the log when the child finishes), and verified replay of the whole tree."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.events import RunFinished, RunStarted, ThreadCreated
from agentlog.runtime import AgentSpec, PermissionPlugin, Runtime, ToolContext, tool
from agentlog.runtime.live import MemoryLiveSink
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.toolkits.subagents import SubAgents, child_ids, verify_tree

from tests.support.runtime import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio
TIMEOUT = 30


@tool
async def lookup(key: str, ctx: ToolContext) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
async def deploy(env: str, ctx: ToolContext) -> str:
    """Deploy (needs approval)."""
    return f"deployed {env}"


class Blocker:
    """A tool that blocks until cancelled; `started[name]` is set once it runs."""

    def __init__(self) -> None:
        self.started: dict[str, asyncio.Event] = {}

        @tool
        async def block(ctx: ToolContext) -> str:
            """Block until cancelled."""
            self.started.setdefault(ctx.run_id, asyncio.Event()).set()
            await ctx.wait_cancelled()
            return "unblocked"

        self.tool = block


def app(store: Any, agents: list[AgentSpec], models: dict[str, Any], tools: list[Any] = (),
        live: Any = None) -> tuple[Runtime, SubAgents]:
    rt = Runtime(store, agents=agents, tools=[lookup, deploy, *tools], models=models, live=live)
    return rt, SubAgents().install(rt)


def run_call(agent_id: str, prompt: str, call_id: str, **extra: Any) -> Turn:
    return Turn.tool("agent_run", {"agent_id": agent_id, "prompt": prompt, **extra}, id=call_id)


async def finished(store: Any, thread_id: str, run_id: str) -> RunFinished:
    """Follow a thread until `run_id` finishes (bounded by the test's timeout)."""
    async for sc in store.follow(thread_id):
        for ev in sc.commit.events:
            if type(ev) is RunFinished and sc.commit.run_id == run_id:
                return ev
    raise AssertionError("follow ended")


async def test_foreground_child_is_a_real_run_with_lineage_progress_and_verified_replay(store: Any) -> None:
    live = MemoryLiveSink()
    agents = [
        AgentSpec(id="boss", model="boss", tools=["agent_run"]),
        AgentSpec(id="helper", model="helper", tools=["lookup"]),
    ]
    models = {
        "boss": ScriptedModel([run_call("helper", "find x", "c-run"), Turn.text("boss: done")], name="boss"),
        "helper": ScriptedModel([Turn.tool("lookup", {"key": "x"}), Turn.text("x is 42")], name="helper"),
    }
    rt, _sub = app(store, agents, models, live=live)
    async with asyncio.timeout(TIMEOUT):
        result = await rt.run("boss", "delegate", thread_id="pt", run_id="pr")
    assert result.termination.type == "natural_end"
    child_thread, child_run = child_ids("pr", "c-run")
    call = result.run.calls["c-run"]
    assert call.status == "succeeded"
    assert call.result["output"] == "x is 42" and call.result["run_id"] == child_run
    assert call.result["termination"] == "natural_end"
    # the child is a real run on its own thread, lineage recorded in the log
    child_log = [sc async for sc in store.read_thread(child_thread)]
    created = next(e for e in child_log[0].commit.events if type(e) is ThreadCreated)
    started = next(e for e in child_log[0].commit.events if type(e) is RunStarted)
    assert created.parent_thread_id == "pt" and created.metadata["parent_call_id"] == "c-run"
    assert (started.run_id, started.agent_id, started.parent_run_id, started.parent_thread_id, started.origin) == (
        child_run, "helper", "pr", "pt", "subagent")
    view = await rt.run_view(child_run)
    assert view.parent_run_id == "pr" and view.parent_thread_id == "pt" and view.status == "done"
    # the child's commits went to the parent's call as live progress
    progress = [p for p in live.of_type("tool_progress") if p["call_id"] == "c-run"]
    assert progress and all(p["data"]["subagent_run_id"] == child_run for p in progress)
    assert any(p["data"].get("text") == "x is 42" for p in progress)
    assert "RunFinished" in progress[-1]["data"]["events"]
    # verified replay across parent and child: agent_run answers from the log, no new run
    fresh, _ = app(store, agents, {"boss": ScriptedModel(["unused"]), "helper": ScriptedModel(["unused"])})
    reports = await verify_tree(store, "pr", fresh)  # the default: every tool answers from the log
    assert [(r.run_id, r.ok) for r in reports] == [("pr", True), (child_run, True)]
    assert [(r.tools_from_log, r.tools_executed) for r in reports] == [(1, 0), (1, 0)]
    # opting in to re-execution runs the child's tool again; agent_run still answers from the log
    reports = await verify_tree(store, "pr", fresh, tools_from_log=False)
    assert [(r.run_id, r.ok) for r in reports] == [("pr", True), (child_run, True)]
    assert reports[0].tools_from_log == 1 and reports[1].tools_executed == 1


async def test_background_child_output_and_stop(store: Any) -> None:
    blocker = Blocker()
    _t, bg = child_ids("pr2", "c-bg")
    # the boss asks for the output only once the child's tool is running
    gate = blocker.started.setdefault(bg, asyncio.Event())
    agents = [
        AgentSpec(id="boss", model="boss", tools=["agent_run", "agent_output", "agent_stop"]),
        AgentSpec(id="slow", model="slow", tools=["block"]),
    ]
    models = {
        "boss": ScriptedModel([
            run_call("slow", "wait", "c-bg", background=True),
            Turn.tool("agent_output", {"run_id": bg}, id="c-out", gate=gate),
            Turn.tool("agent_stop", {"run_id": bg}, id="c-stop"),
            Turn.tool("agent_output", {"run_id": bg, "wait": True}, id="c-out2"),
            Turn.tool("agent_stop", {"run_id": "pr2"}, id="c-bad"),
            Turn.text("stopped it"),
        ], name="boss"),
        "slow": ScriptedModel([Turn.tool("block"), Turn.text("never")], name="slow"),
    }
    rt, _sub = app(store, agents, models, tools=[blocker.tool])
    async with asyncio.timeout(TIMEOUT):
        result = await rt.run("boss", "go", thread_id="pt2", run_id="pr2")
    calls = result.run.calls
    assert calls["c-bg"].result == {"run_id": bg, "thread_id": child_ids("pr2", "c-bg")[0], "agent_id": "slow",
                                    "status": "running"}
    assert calls["c-out"].result["status"] == "running"
    assert calls["c-stop"].result == {"run_id": bg, "stopped": True}
    assert calls["c-out2"].result["termination"] == "cancelled"
    assert calls["c-bad"].status == "failed" and "not a sub-agent run" in calls["c-bad"].result["error"]
    assert result.termination.type == "natural_end"


async def test_allowed_and_excluded_agents(store: Any) -> None:
    agents = [
        AgentSpec(id="boss", model="boss", tools=["agent_run"], allowed_agents=["helper", "other"],
                  excluded_agents=["other"]),
        AgentSpec(id="helper", model="helper"),
        AgentSpec(id="other", model="helper"),
    ]
    models = {
        "boss": ScriptedModel([Turn.tools(("agent_run", {"agent_id": "other", "prompt": "x"}, "c1"),
                                          ("agent_run", {"agent_id": "ghost", "prompt": "x"}, "c2")),
                               Turn.text("ok")], name="boss"),
        "helper": ScriptedModel([Turn.text("hi")], loop=True),
    }
    rt, _sub = app(store, agents, models)
    async with asyncio.timeout(TIMEOUT):
        result = await rt.run("boss", "go", thread_id="pt3", run_id="pr3")
    for call_id, why in (("c1", "may not start it: 'other'"), ("c2", "unknown agent: 'ghost'")):
        call = result.run.calls[call_id]
        assert call.status == "failed" and why in call.result["error"], call.result
        assert "allowed agents: helper" in call.result["error"]
        assert [sc async for sc in store.read_run(child_ids("pr3", call_id)[1])] == []


async def test_cancelling_a_parent_cancels_its_descendants(store: Any) -> None:
    blocker = Blocker()
    agents = [
        AgentSpec(id="boss", model="boss", tools=["agent_run"]),
        AgentSpec(id="mid", model="mid", tools=["agent_run"]),
        AgentSpec(id="slow", model="slow", tools=["block"]),
    ]
    models = {
        "boss": ScriptedModel([run_call("mid", "go", "c-mid")], name="boss"),
        "mid": ScriptedModel([run_call("slow", "go", "c-slow")], name="mid"),
        "slow": ScriptedModel([Turn.tool("block")], name="slow"),
    }
    rt, sub = app(store, agents, models, tools=[blocker.tool])
    mid_thread, mid_run = child_ids("pr4", "c-mid")
    slow_thread, slow_run = child_ids(mid_run, "c-slow")
    async with asyncio.timeout(TIMEOUT):
        handle = await rt.start("boss", "go", thread_id="pt4", run_id="pr4")
        await blocker.started.setdefault(slow_run, asyncio.Event()).wait()
        assert await rt.cancel("pr4", reason="user")
        assert (await handle.result()).termination.type == "cancelled"
        assert (await finished(store, mid_thread, mid_run)).termination.type == "cancelled"
        assert (await finished(store, slow_thread, slow_run)).termination.type == "cancelled"
        await sub.drain()


async def test_child_waiting_for_a_human_suspends_the_parent_until_it_finishes(store: Any) -> None:
    agents = [
        AgentSpec(id="boss", model="boss", tools=["agent_run"]),
        AgentSpec(id="ops", model="ops", tools=["deploy"], plugins=[PermissionPlugin(ask=["deploy"])]),
    ]
    models = {
        "boss": ScriptedModel([run_call("ops", "ship it", "c-ops"), Turn.text("boss: shipped")], name="boss"),
        "ops": ScriptedModel([Turn.tool("deploy", {"env": "prod"}, id="c-deploy"), Turn.text("shipped prod")],
                             name="ops"),
    }
    rt, sub = app(store, agents, models)
    ops_thread, ops_run = child_ids("pr5", "c-ops")
    async with asyncio.timeout(TIMEOUT):
        first = await rt.run("boss", "go", thread_id="pt5", run_id="pr5")
        assert first.status == "waiting"
        ticket = first.run.calls["c-ops"].ticket
        assert ticket.id == ops_run and ticket.resume_mode == "use_decision_as_tool_result"
        assert (await rt.run_view(ops_run)).status == "waiting"
        # the human approves the child's deploy; the child finishes; its finish resumes the parent
        res = await rt.decide(ops_run, [{"target_id": "c-deploy", "decision_id": "ok-1", "action": "resume",
                                              "result": {"approved": True}}])
        assert (await res.handle.result()).termination.type == "natural_end"
        # once the child's effects are settled (what a worker waits for before its ack), the
        # parent's decision is in the log
        await rt.settled(ops_run)
        decided = [e for sc in [c async for c in store.read_run("pr5")] for e in sc.commit.events
                   if type(e).__name__ == "ToolCallDecided"]
        assert [d.decision.decision_id for d in decided] == [f"d-{ops_run}"]
        await finished(store, "pt5", "pr5")
        await sub.drain()
    parent = await rt.run_view("pr5")
    assert parent.status == "done" and parent.termination.type == "natural_end"
    assert parent.calls["c-ops"].result["output"] == "shipped prod"
    assert parent.calls["c-ops"].decision.decision_id == f"d-{ops_run}"
