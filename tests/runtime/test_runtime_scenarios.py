"""Runtime scenarios on a real nats-server + JetStreamEventStore: each asserts the exact commits
and events written, key fields, and the final thread/run views folded from the log."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import nats
import pytest

from agentlog.eventlog.events import Message, ToolCall
from agentlog.runtime import (
    AgentSpec,
    DeterministicEntropy,
    NatsLiveSink,
    PermissionPlugin,
    Plugin,
    Runtime,
    ToolContext,
    ToolError,
    ToolResult,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn

from tests.support.runtime import (  # noqa: F401  (fixture)
    DONE_CALL,
    FINAL_TEXT,
    INFER_TOOL,
    START,
    events_of,
    logged,
    shape,
    store,
)

pytestmark = pytest.mark.asyncio


@tool
def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers and remember the last sum in the thread state."""
    ctx.set("/last_sum", a + b)
    return a + b


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool
def broken() -> str:
    """Always fails."""
    raise ToolError("the disk is on fire")


def runtime(store: Any, model: ScriptedModel, *, tools: list[Any] | None = None, **spec: Any) -> Runtime:
    tools = tools if tools is not None else [add, echo, broken]
    agent = AgentSpec(id="agent", model=model, tools=[t.name for t in tools], **spec)
    return Runtime(store, agents=[agent], tools=tools, entropy=DeterministicEntropy())


async def test_plain_text_run(store: Any) -> None:
    model = ScriptedModel(["Hello there!"])
    rt = runtime(store, model, system_prompt="Be brief.")
    async with asyncio.timeout(10):
        handle = await rt.start("agent", "hi")
        seen = [ce.event for ce in [ce async for ce in handle.events()]]
        result = await handle.result()
    log = await logged(rt, result)
    assert shape(log) == [START, FINAL_TEXT]
    assert [type(e).__name__ for e in seen] == [n for c in shape(log) for n in c]
    assert result.status == "done" and result.termination.type == "natural_end"
    (assistant,) = [m.message for m in events_of(log, "MessageAppended") if m.message.role == "assistant"]
    assert assistant.content == "Hello there!"
    request = model.requests[0]
    assert [m.role for m in request.messages] == ["system", "user"]
    assert request.messages[0].content == "Be brief."
    thread = await rt.thread_view(result.thread_id)
    assert thread.message_count == 2 and thread.run_ids == [result.run_id] and thread.active_run_id is None
    run = await rt.run_view(result.run_id)
    assert run == result.run
    assert run.status == "done" and run.steps == 1 and run.agent_id == "agent"
    assert run.usage == events_of(log, "RunFinished")[0].usage
    assert run.usage.total_tokens > 0


async def test_multi_step_tool_run_with_state(store: Any) -> None:
    model = ScriptedModel([
        Turn.tool("add", {"a": 1, "b": 2}),
        Turn.tool("add", {"a": 3, "b": 4}),
        "The sums are 3 and 7.",
    ])
    rt = runtime(store, model, tool_execution_mode="sequential")
    async with asyncio.timeout(10):
        result = await rt.run("agent", "add things")
    log = await logged(rt, result)
    tool_done = ["StatePatched", *DONE_CALL, "StepFinished"]
    assert shape(log) == [START, INFER_TOOL, tool_done, INFER_TOOL, tool_done, FINAL_TEXT]
    completed = events_of(log, "ToolCallCompleted")
    assert [(c.call_id, c.outcome, c.result) for c in completed] == [
        ("call_0_0", "succeeded", 3), ("call_1_0", "succeeded", 7),
    ]
    tool_msgs = [e.message for e in events_of(log, "MessageAppended") if e.message.role == "tool"]
    assert [(m.tool_call_id, m.content, m.id) for m in tool_msgs] == [
        ("call_0_0", "3", completed[0].message_id), ("call_1_0", "7", completed[1].message_id),
    ]
    assert [e.ops for e in events_of(log, "StatePatched")] == [
        [{"op": "add", "path": "/last_sum", "value": 3}], [{"op": "add", "path": "/last_sum", "value": 7}],
    ]
    # the model saw each tool result
    assert [m.role for m in model.requests[2].messages] == ["user", "assistant", "tool", "assistant", "tool"]
    thread = await rt.thread_view(result.thread_id)
    assert thread.state == {"last_sum": 7} and thread.message_count == 6
    run = result.run
    assert run.steps == 3 and result.termination.type == "natural_end"
    assert {k: (c.status, c.name, c.arguments) for k, c in run.calls.items()} == {
        "call_0_0": ("succeeded", "add", {"a": 1, "b": 2}),
        "call_1_0": ("succeeded", "add", {"a": 3, "b": 4}),
    }


async def test_sequential_calls_run_one_at_a_time_in_order(store: Any) -> None:
    model = ScriptedModel([Turn.tools(("echo", {"text": "a"}), ("echo", {"text": "b"})), "ok"])
    rt = runtime(store, model, tool_execution_mode="sequential")
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = await logged(rt, result)
    assert shape(log) == [
        START,
        INFER_TOOL,                                   # a starts with the inference commit
        [*DONE_CALL, "ToolCallStarted"],              # a completes, b starts: one commit
        [*DONE_CALL, "StepFinished"],
        FINAL_TEXT,
    ]
    assert [e.call_id for e in events_of(log, "ToolCallStarted")] == ["call_0_0", "call_0_1"]
    assert [c.status for c in result.run.calls.values()] == ["succeeded", "succeeded"]


class _ReleaseAfter(Plugin):
    """Sets `event` when the named tool's result is in (AfterToolExecute), so another call can
    finish strictly after it: a deterministic completion order without sleeps."""

    id = "release_after"

    def __init__(self, name: str, event: asyncio.Event) -> None:
        self.name = name
        self.event = event

    def after_tool_execute(self, ctx: Any, call: ToolCall, result: ToolResult) -> None:
        if call.name == self.name:
            self.event.set()


@pytest.mark.parametrize("mode", ["parallel_batch_approval", "parallel_streaming"])
async def test_parallel_calls_run_concurrently_and_commit_as_they_finish(store: Any, mode: str) -> None:
    first_started = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Waits until released."""
        first_started.set()
        await release.wait()
        return "slow done"

    @tool
    async def fast() -> str:
        """Needs `slow` to be running already: only possible if both run at once."""
        await first_started.wait()
        return "fast done"

    model = ScriptedModel([Turn.tools(("slow", {}), ("fast", {})), "both done"])
    agent = AgentSpec(id="agent", model=model, tools=["slow", "fast"], tool_execution_mode=mode,
                      plugins=[_ReleaseAfter("fast", release)])
    rt = Runtime(store, agents=[agent], tools=[slow, fast], entropy=DeterministicEntropy())
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = await logged(rt, result)
    assert shape(log) == [
        START,
        [*INFER_TOOL, "ToolCallStarted"],          # both start together
        DONE_CALL,                                 # fast finishes first: its own commit
        [*DONE_CALL, "StepFinished"],              # slow last, with the step end
        FINAL_TEXT,
    ]
    assert [c.call_id for c in events_of(log, "ToolCallCompleted")] == ["call_0_1", "call_0_0"]
    assert {c.name: c.status for c in result.run.calls.values()} == {"slow": "succeeded", "fast": "succeeded"}
    # tool results are in the conversation in completion order, both before the next inference
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == ["fast done", "slow done"]


async def test_tool_error_unknown_tool_and_invalid_arguments_go_back_to_the_model(store: Any) -> None:
    model = ScriptedModel([
        Turn.tools(("broken", {}), ("nope", {"x": 1}), ("add", {"a": "one"})),
        "I see the errors.",
    ])
    rt = runtime(store, model, tool_execution_mode="sequential")
    async with asyncio.timeout(10):
        result = await rt.run("agent", "try")
    log = await logged(rt, result)
    assert shape(log) == [
        START,
        INFER_TOOL,                                                 # broken starts
        [*DONE_CALL, *DONE_CALL, *DONE_CALL, "StepFinished"],      # broken fails; unknown + invalid never start
        FINAL_TEXT,
    ]
    completed = {c.call_id: c for c in events_of(log, "ToolCallCompleted")}
    assert [c.outcome for c in completed.values()] == ["failed", "failed", "failed"]
    assert completed["call_0_0"].result == {"error": "the disk is on fire"}
    assert "unknown tool 'nope'" in completed["call_0_1"].result["error"]
    assert "available tools: add, broken, echo" in completed["call_0_1"].result["error"]
    assert "invalid arguments for tool 'add'" in completed["call_0_2"].result["error"]
    assert "a:" in completed["call_0_2"].result["error"] and "b:" in completed["call_0_2"].result["error"]
    tool_msgs = [m for m in model.requests[1].messages if m.role == "tool"]
    assert [m.content.startswith("Error: ") for m in tool_msgs] == [True, True, True]
    assert result.termination.type == "natural_end"
    assert {k: c.status for k, c in result.run.calls.items()} == {
        "call_0_0": "failed", "call_0_1": "failed", "call_0_2": "failed",
    }


async def test_invalid_state_edit_fails_the_call_and_writes_no_patch(store: Any) -> None:
    @tool
    def bad_edit(ctx: ToolContext) -> str:
        """Removes a key that does not exist."""
        ctx.remove("/missing")
        return "ok"

    model = ScriptedModel([Turn.tool("bad_edit"), "hm"])
    rt = runtime(store, model, tools=[bad_edit])
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = await logged(rt, result)
    assert shape(log) == [START, INFER_TOOL, [*DONE_CALL, "StepFinished"], FINAL_TEXT]
    (done,) = events_of(log, "ToolCallCompleted")
    assert done.outcome == "failed" and "invalid state edit" in done.result["error"]
    assert (await rt.thread_view(result.thread_id)).state == {}


async def test_permission_allow_and_deny(store: Any) -> None:
    calls: list[str] = []

    @tool
    def fs_read(path: str) -> str:
        """Read a file."""
        calls.append(path)
        return f"contents of {path}"

    permission = PermissionPlugin(
        allow=["fs_*"], deny=[{"tool": "fs_*", "args": {"path": "/etc/*"}}], default="deny",
    )
    model = ScriptedModel([
        Turn.tools(("fs_read", {"path": "/tmp/a.txt"}), ("fs_read", {"path": "/etc/shadow"})),
        "done",
    ])
    agent = AgentSpec(id="agent", model=model, tools=["fs_read"], plugins=[permission],
                      tool_execution_mode="sequential")
    rt = Runtime(store, agents=[agent], tools=[fs_read], entropy=DeterministicEntropy())
    async with asyncio.timeout(10):
        result = await rt.run("agent", "read")
    log = await logged(rt, result)
    assert shape(log) == [
        START,
        ["StepStarted", "MessageAppended", "InferenceCompleted", "ToolCallGated", "ToolCallStarted"],
        [*DONE_CALL, "ToolCallGated", *DONE_CALL, "StepFinished"],   # the deny never starts
        FINAL_TEXT,
    ]
    gated = [(g.call_id, g.verdict, g.rule) for g in events_of(log, "ToolCallGated")]
    assert gated == [("call_0_0", "allow", "allow:fs_*"), ("call_0_1", "deny", "deny:fs_*(path=/etc/*)")]
    assert calls == ["/tmp/a.txt"]
    denied = {c.call_id: c for c in events_of(log, "ToolCallCompleted")}["call_0_1"]
    assert denied.outcome == "failed" and "permission denied" in denied.result["error"]
    views = result.run.calls
    assert (views["call_0_0"].status, views["call_0_0"].verdict) == ("succeeded", "allow")
    assert (views["call_0_1"].status, views["call_0_1"].verdict, views["call_0_1"].rule) == (
        "failed", "deny", "deny:fs_*(path=/etc/*)",
    )


@pytest.mark.parametrize("mode", ["sequential", "parallel_streaming"])
async def test_cancel_while_a_tool_runs(store: Any, mode: str) -> None:
    started = asyncio.Event()
    saw_cancel: list[bool] = []

    @tool
    async def wait_forever(ctx: ToolContext) -> str:
        """Runs until the run is cancelled."""
        started.set()
        await ctx.wait_cancelled()
        saw_cancel.append(ctx.is_cancelled)
        return "interrupted"

    model = ScriptedModel([Turn.tool("wait_forever"), "never"])
    rt = runtime(store, model, tools=[wait_forever], tool_execution_mode=mode)
    async with asyncio.timeout(10):
        handle = await rt.start("agent", "wait")
        await started.wait()
        assert await rt.cancel(handle.run_id, reason="user hit stop") is True
        result = await handle.result()
    log = await logged(rt, result)
    assert shape(log) == [
        START,
        INFER_TOOL,
        ["RunCancelRequested"],
        [*DONE_CALL, "StepFinished", "RunFinished"],
    ]
    assert saw_cancel == [True] or saw_cancel == []  # cooperative tool saw the signal, or was cancelled first
    assert events_of(log, "RunCancelRequested")[0].reason == "user hit stop"
    (done,) = events_of(log, "ToolCallCompleted")
    assert done.outcome == "cancelled"
    assert result.termination.type == "cancelled"
    assert result.run.status == "done" and result.run.cancel_requested
    assert result.run.calls["call_0_0"].status == "cancelled"
    assert [type(ce.event).__name__ for ce in [ce async for ce in handle.events()]] == [
        n for c in shape(log) for n in c
    ]
    assert await rt.cancel(handle.run_id) is False  # already finished: nothing appended
    assert len(await logged(rt, result)) == 4


async def test_cancel_during_inference(store: Any) -> None:
    entered = asyncio.Event()
    never = asyncio.Event()  # never set: the model hangs until cancelled

    async def hang(request: Any) -> str:
        entered.set()
        await never.wait()
        return "never"

    model = ScriptedModel([hang])
    rt = runtime(store, model)
    async with asyncio.timeout(10):
        handle = await rt.start("agent", "hi")
        await entered.wait()
        await rt.cancel(handle.run_id)
        result = await handle.result()
    log = await logged(rt, result)
    assert shape(log) == [START, ["RunCancelRequested"], ["StepStarted", "StepFinished", "RunFinished"]]
    assert result.termination.type == "cancelled"


async def test_continuation_of_a_finished_run(store: Any) -> None:
    model = ScriptedModel(["first answer", "second answer"])
    rt = runtime(store, model)
    async with asyncio.timeout(10):
        first = await rt.run("agent", "first question")
        second = await rt.run("agent", "second question", parent_run_id=first.run_id)
    assert second.thread_id == first.thread_id
    log = await logged(rt, second)
    assert shape(log) == [START, FINAL_TEXT, ["RunStarted", "MessageAppended"], FINAL_TEXT]
    started = events_of(log, "RunStarted")
    assert [(s.run_id, s.parent_run_id) for s in started] == [(first.run_id, None), (second.run_id, first.run_id)]
    assert [m.content for m in model.requests[1].messages] == [
        "first question", "first answer", "second question",
    ]
    thread = await rt.thread_view(first.thread_id)
    assert thread.run_ids == [first.run_id, second.run_id] and thread.message_count == 4
    assert second.run.parent_run_id == first.run_id and second.termination.type == "natural_end"


async def test_cannot_start_a_second_run_while_one_is_active(store: Any) -> None:
    started = asyncio.Event()

    @tool
    async def block(ctx: ToolContext) -> str:
        """Blocks until cancelled."""
        started.set()
        await ctx.wait_cancelled()
        return "x"

    rt = runtime(store, ScriptedModel([Turn.tool("block"), "x"]), tools=[block])
    async with asyncio.timeout(10):
        handle = await rt.start("agent", "go")
        await started.wait()
        from agentlog.runtime import RunConflict

        with pytest.raises(RunConflict, match="active run"):
            await rt.start("agent", "again", thread_id=handle.thread_id)
        await rt.cancel(handle.run_id)
        assert (await handle.result()).termination.type == "cancelled"


async def test_live_deltas_on_core_nats(store: Any, nats_server: Any) -> None:
    text = "one two three four five"
    model = ScriptedModel([Turn.tool("echo", {"text": "x"}), text], chunk_words=1)
    received: list[dict[str, Any]] = []
    got_all = asyncio.Event()
    nc = await nats.connect(nats_server.url)
    try:
        async def on_msg(msg: Any) -> None:
            received.append(msgspec.json.decode(msg.data))
            if "".join(r.get("text", "") for r in received if r["type"] == "text_delta") == text:
                got_all.set()

        await nc.subscribe("agentlog.live.>", cb=on_msg)
        await nc.flush()
        async with NatsLiveSink(store.nc) as live:
            agent = AgentSpec(id="agent", model=model, tools=["echo"])
            rt = Runtime(store, agents=[agent], tools=[echo], live=live, entropy=DeterministicEntropy())
            async with asyncio.timeout(10):
                result = await rt.run("agent", "talk")
                await got_all.wait()
    finally:
        await nc.close()
    kinds = {r["type"] for r in received}
    assert {"text_delta", "tool_call_delta"} <= kinds
    assert [r["text"] for r in received if r["type"] == "text_delta"] == ["one ", "two ", "three ", "four ", "five"]
    log = await logged(rt, result)
    assert not [e for e in events_of(log, "MessageAppended") if e.message.content in ("one ", "two ")]


async def test_plugin_actions_context_patch_and_user_message(store: Any) -> None:
    from agentlog.runtime import AddContext, AddUserMessage, ExcludeTools, PatchState

    class Helper(Plugin):
        id = "helper"

        def before_inference(self, ctx: Any) -> list[Any]:
            return [AddContext(f"step {ctx.step}"), ExcludeTools(("broken",)),
                    PatchState(({"op": "add", "path": "/seen_step", "value": ctx.step},))]

        def after_tool_execute(self, ctx: Any, call: ToolCall, result: ToolResult) -> list[Any]:
            return [AddUserMessage(f"noted {call.name}")]

    model = ScriptedModel([Turn.tool("echo", {"text": "hi"}), "bye"])
    rt = runtime(store, model, plugins=[Helper()], system_prompt="sys")
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = await logged(rt, result)
    assert shape(log) == [
        START,
        ["StepStarted", "StatePatched", "MessageAppended", "InferenceCompleted", "ToolCallStarted"],
        [*DONE_CALL, "MessageAppended", "StepFinished"],
        ["StepStarted", "StatePatched", "MessageAppended", "InferenceCompleted", "StepFinished", "RunFinished"],
    ]
    assert model.requests[0].messages[0].content == "sys\n\nstep 1"
    assert [t.name for t in model.requests[0].tools] == ["add", "echo"]
    assert model.requests[1].messages[-1] == Message(id=model.requests[1].messages[-1].id, role="user", content="noted echo")
    assert (await rt.thread_view(result.thread_id)).state == {"seen_step": 2}
    assert {e.source for e in events_of(log, "StatePatched")} == {"plugin"}
