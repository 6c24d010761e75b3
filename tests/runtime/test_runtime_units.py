"""Pure parts of the runtime: entropy, the stop evaluator, permission decisions, gate resolution,
phase validation of plugin actions, and the run-context fold (the live loop's context must equal
the fold of what it wrote: the property resume and replay stand on)."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest

from agentlog.eventlog import MemoryEventStore
from agentlog.eventlog.events import SuspendTicket, ToolCall
from agentlog.eventlog.ids import is_valid_id
from agentlog.runtime import (
    AgentSpec,
    Block,
    DeterministicEntropy,
    Gate,
    Plugin,
    Runtime,
    SetResult,
    Suspend,
    SystemEntropy,
    ToolContext,
    ToolResult,
    tool,
)
from agentlog.runtime.agents.spec import MaxRounds
from agentlog.runtime.loop.decisions import resolve_gate
from agentlog.runtime.loop.run_context import RunContext, fold_context
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.permission import PermissionPlugin, PermissionRule, decide
from agentlog.runtime.stop import (
    ConsecutiveErrors,
    ContentMatch,
    LoopDetection,
    StopInput,
    StopOnTool,
    Timeout,
    TokenBudget,
    evaluate_stop,
)


def test_deterministic_entropy_counts_and_holds_the_clock() -> None:
    e = DeterministicEntropy(start_ms=5, prefix="t")
    assert [e.new_id(), e.new_id()] == ["t00000001", "t00000002"]
    assert e.now_ms() == 5
    e.advance(10)
    assert e.now_ms() == 15
    with pytest.raises(ValueError):
        e.advance(-1)


def test_system_entropy_ids_are_valid_and_time_ordered() -> None:
    e = SystemEntropy()
    ids = [e.new_id() for _ in range(50)]
    assert all(is_valid_id(i) for i in ids) and len(set(ids)) == 50
    assert [i[:12] for i in ids] == sorted(i[:12] for i in ids)


def _inp(**kw: Any) -> StopInput:
    base: dict[str, Any] = dict(rounds=1, elapsed_ms=0, total_tokens=0, consecutive_errors=0, round_tools=[("a",)], text="")
    base.update(kw)
    return StopInput(**base)


@pytest.mark.parametrize(
    ("cond", "fires", "quiet"),
    [
        (MaxRounds(rounds=3), _inp(rounds=3), _inp(rounds=2)),
        (Timeout(seconds=1.5), _inp(elapsed_ms=1500), _inp(elapsed_ms=1499)),
        (TokenBudget(max_tokens=10), _inp(total_tokens=10), _inp(total_tokens=9)),
        (ConsecutiveErrors(max_errors=2), _inp(consecutive_errors=2), _inp(consecutive_errors=1)),
        (StopOnTool(tool_name="done"), _inp(round_tools=[("a", "done")]), _inp(round_tools=[("done",), ("a",)])),
        (ContentMatch(pattern="[x]"), _inp(text="got [x]"), _inp(text="got x")),
        (LoopDetection(window=2), _inp(round_tools=[("b",), ("a",), ("a",)]), _inp(round_tools=[("a",), ("b",)])),
    ],
)
def test_each_stop_condition(cond: Any, fires: StopInput, quiet: StopInput) -> None:
    term = evaluate_stop([cond], fires)
    assert term is not None and term.type == "stopped" and term.code == cond.type and term.detail
    assert evaluate_stop([cond], quiet) is None


def test_stop_conditions_parse_from_json_and_reject_nonsense() -> None:
    spec = AgentSpec(id="a", model="m", stop_conditions=[{"type": "timeout", "seconds": 30},
                                                         {"type": "loop_detection", "window": 4}])
    assert [type(c).__name__ for c in spec.stop_conditions] == ["Timeout", "LoopDetection"]
    with pytest.raises(pydantic.ValidationError):
        AgentSpec(id="a", model="m", stop_conditions=[{"type": "max_rounds", "rounds": 0}])
    with pytest.raises(pydantic.ValidationError):
        AgentSpec(id="a", model="m", stop_conditions=[{"type": "bogus"}])
    with pytest.raises(pydantic.ValidationError):
        AgentSpec(id="not ok", model="m")
    assert AgentSpec(id="a", model="m", max_rounds=4).effective_stop_conditions() == [MaxRounds(rounds=4)]


def test_permission_deny_beats_allow_and_args_globs() -> None:
    allow = (PermissionRule(tool="fs_*"),)
    deny = (PermissionRule(tool="fs_*", args={"path": "/etc/*"}), PermissionRule(tool="*", args={"n": "1*"}))
    call = lambda name, **a: ToolCall(id="c", name=name, arguments=a)  # noqa: E731
    assert decide(call("fs_read", path="/tmp/x"), allow, deny, "deny") == ("allow", "allow:fs_*")
    assert decide(call("fs_read", path="/etc/x"), allow, deny, "allow")[0] == "deny"
    assert decide(call("net", n=12), allow, deny, "allow") == ("deny", "deny:*(n=1*)")  # non-str args match as JSON
    assert decide(call("net"), allow, deny, "deny") == ("deny", "default:deny")
    assert decide(call("fs_read"), allow, deny, "deny") == ("allow", "allow:fs_*")  # missing arg: no match
    with pytest.raises(ValueError):
        PermissionPlugin(default="ask")  # type: ignore[arg-type]


def test_resolve_gate_precedence() -> None:
    t = SuspendTicket(id="t")
    assert resolve_gate("c", []).kind == "run"
    assert resolve_gate("c", [SetResult(ToolResult.success(1))]).kind == "result"
    assert resolve_gate("c", [SetResult(ToolResult.success(1)), Suspend(t)]).kind == "suspend"
    d = resolve_gate("c", [Suspend(t), Gate("allow", "r1"), Block("no")])
    assert d.kind == "fail" and d.reason == "no" and [e.verdict for e in d.events] == ["allow"]
    ask = resolve_gate("c", [Gate("ask", "r2", reason="sure?")])
    assert ask.kind == "suspend" and ask.ticket == SuspendTicket(id="c", message="sure?")


async def test_action_in_the_wrong_phase_ends_the_run_with_plugin_error() -> None:
    class Wrong(Plugin):
        id = "wrong"

        def after_inference(self, ctx: Any, response: Any) -> list[Any]:
            return [SetResult(ToolResult.success("no call to answer here"))]

    rt = Runtime(MemoryEventStore(), agents=[AgentSpec(id="a", model=ScriptedModel(["hi"]), plugins=[Wrong()])],
                 entropy=DeterministicEntropy())
    async with asyncio.timeout(5):
        result = await rt.run("a", "hello")
    assert result.termination.type == "error" and result.termination.code == "plugin_error"
    assert "SetResult from after_inference" in result.termination.detail


async def test_live_context_equals_the_fold_of_the_log() -> None:
    @tool
    def count(ctx: ToolContext) -> int:
        """Counts calls in the state."""
        n = ctx.state.get("n", 0) + 1
        ctx.set("/n", n)
        return n

    @tool
    def oops() -> str:
        """Fails."""
        raise RuntimeError("x")

    store = MemoryEventStore()
    model = ScriptedModel([Turn.tools(("count", {}), ("oops", {})), Turn.tool("oops"), Turn.tool("count"), "end"])
    rt = Runtime(store, agents=[AgentSpec(id="a", model=model, tools=["count", "oops"])], tools=[count, oops],
                 entropy=DeterministicEntropy())
    async with asyncio.timeout(5):
        handle = await rt.start("a", "go")
        live_ctx = await handle._task  # the loop's own context at the end
    commits = [sc async for sc in store.read_thread(handle.thread_id)]
    folded = fold_context(RunContext(thread_id=handle.thread_id, run_id=handle.run_id), commits)
    assert folded == live_ctx
    assert folded.state == {"n": 2} and folded.step == 4 and folded.round_tools == [("count", "oops"), ("oops",), ("count",)]


def test_the_run_loop_is_composed_not_inherited() -> None:
    """`RunLoop` holds its parts (no mixin bases), and the loop's modules neither reach up
    through `TYPE_CHECKING` stubs nor import each other's private names."""
    import ast
    from pathlib import Path

    from agentlog.runtime.loop import driver

    assert driver.RunLoop.__bases__ == (object,)
    for path in Path(driver.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If):
                assert "TYPE_CHECKING" not in ast.unparse(node.test), path.name
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentlog."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
