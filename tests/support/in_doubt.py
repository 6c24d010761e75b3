"""An app with a tool that is not idempotent, and the interruption that puts its call in doubt
(no tests here): shared by the in-doubt tests of the runtime, the adapters and the CLI."""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime, ToolContext, ToolResult, tool
from agentlog.runtime.models.scripted import ScriptedCall, ScriptedModel, Turn


class Payments:
    """One process's app: `pay` (not idempotent) and `lookup` (idempotent, the default), each
    counting its executions outside the log; `hang` makes the next execution block (the process
    dies in it)."""

    def __init__(self, *, mode: str = "sequential", ask: bool = False) -> None:
        self.executions: list[tuple[str, str]] = []
        self.decisions: list[Any] = []
        self.entered = asyncio.Event()
        self.hang = False

        async def body(name: str, ctx: ToolContext) -> None:
            self.executions.append((name, ctx.call_id))
            self.decisions.append(None if ctx.decision is None else ctx.decision.result)
            if self.hang:
                self.entered.set()
                await asyncio.Event().wait()  # the process dies here

        @tool(idempotent=False)
        async def pay(amount: int, ctx: ToolContext) -> Any:
            """Pay `amount` (asks for approval first when the app says so)."""
            if ask and ctx.decision is None:
                return ToolResult.pending(f"ok-{ctx.call_id}", resume_mode="pass_decision_to_tool")
            await body("pay", ctx)
            return {"paid": amount}

        @tool
        async def lookup(ctx: ToolContext) -> str:
            """Look something up."""
            await body("lookup", ctx)
            return "found"

        def script(req: Any) -> Turn:
            if req.messages[-1].role == "user":
                calls = [ScriptedCall("pay", {"amount": 5}, id="c-pay")]
                if mode != "sequential":
                    calls.append(ScriptedCall("lookup", {}, id="c-look"))
                return Turn.tools(*calls)
            return Turn.text("told: " + req.messages[-1].content)

        self.tools = [pay, lookup]
        self.spec = AgentSpec(id="payer", model=ScriptedModel([script], loop=True), tools=["pay", "lookup"],
                              tool_execution_mode=mode)  # type: ignore[arg-type]

    def runtime(self, store: Any, process: str = "p") -> Runtime:
        """A `Runtime` of this app: each process draws ids of its own (`process`)."""
        return Runtime(store, agents=[self.spec], tools=self.tools, entropy=DeterministicEntropy(prefix=process))


async def interrupted(store: MemoryEventStore, *, thread: str, run: str, mode: str = "sequential",
                      ask: bool = False) -> Payments:
    """Start a run whose `pay` call hangs, stop its process mid-call (after the start commit)."""
    first = Payments(mode=mode, ask=ask)
    first.hang = not ask
    rt = first.runtime(store)
    handle = await rt.start("payer", "pay 5", thread_id=thread, run_id=run)
    if ask:
        waiting = await handle.result()
        assert waiting.status == "waiting"
        first.hang = True
        res = await rt.decide(run, [{"target_id": "c-pay", "decision_id": "ok", "action": "resume",
                                     "result": {"approved": True}}])
        assert res.handle is not None
    async with asyncio.timeout(10):
        await first.entered.wait()
    await asyncio.gather(*rt.abandon_runs(), return_exceptions=True)
    return first


async def resumed(store: MemoryEventStore, run: str, **kw: Any) -> tuple[Payments, Runtime, Any]:
    """A new process (its own app, its own ids) resumes `run` from the log."""
    second = Payments(**kw)
    rt = second.runtime(store, process=f"p{await store.last_seq()}-")
    handle = await rt.resume(run)
    assert handle is not None
    return second, rt, await handle.result()
