"""HITL scenarios shared by the in-process tests and the cold-resume subprocess (no tests here).

A scenario is an agent (tools, plugins, execution mode, scripted model), a first user message and
a list of *phases*: each phase is what a human (or client) does next while the run waits: decide,
cancel, or continue with a new run. Every phase is applied by a freshly built `Runtime` whose
`DeterministicEntropy` is seeded from the phase number only, so the same phase applied in this
process or in another one writes the same log.

Subprocess entry (what the cold-resume tests run):

    python -m tests.support.hitl <nats-url> <scenario> <phase-index>     # from the repo root

connects to the test's nats-server, builds the same agent, applies that phase, waits for the run
to finish or wait again, prints one JSON line and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import (
    AgentSpec,
    DeterministicEntropy,
    PermissionPlugin,
    Runtime,
    ToolContext,
    ToolResult,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn

THREAD = "t1"
RUN = "r1"


@tool
def deploy(env: str) -> str:
    """Deploy to an environment (guarded by a permission `ask` rule)."""
    return f"deployed {env}"


@tool
def pay(amount: int, ctx: ToolContext) -> Any:
    """Needs an approval: pending the first time, pays once run again with a decision."""
    if ctx.decision is None:
        return ToolResult.pending(f"pay-{ctx.call_id}", message=f"pay {amount}?", parameters={"amount": amount})
    return f"paid {amount}"


@tool
def ask_color() -> Any:
    """Asks the human; the answer becomes the tool result."""
    return ToolResult.pending("color", action="input", message="favourite colour?",
                              response_schema={"type": "object"}, resume_mode="use_decision_as_tool_result")


@tool
def sign(doc: str, ctx: ToolContext) -> Any:
    """Gets the decision passed in when it runs again."""
    if ctx.decision is None:
        return ToolResult.pending(f"sign-{ctx.call_id}", message=f"sign {doc}?", resume_mode="pass_decision_to_tool")
    return {"doc": doc, "signed_by": ctx.decision.result.get("by"), "decision": ctx.decision.decision_id}


TOOLS = [deploy, pay, ask_color, sign]


def d(target: str, decision_id: str, action: str = "resume", result: Any = None, **kw: Any) -> dict[str, Any]:
    return {"target_id": target, "decision_id": decision_id, "action": action, "result": result, **kw}


YES = {"approved": True}
NO = {"approved": False, "reason": "not on a friday"}


@dataclass
class Scenario:
    script: list[Any]
    phases: list[tuple[str, Any]]
    mode: str = "parallel_streaming"
    ask: list[str] = field(default_factory=list)
    message: str = "go"


TWO_DEPLOYS = [Turn.tools(("deploy", {"env": "a"}), ("deploy", {"env": "b"})), "both done"]

SCENARIOS: dict[str, Scenario] = {
    "ask_approve": Scenario([Turn.tool("deploy", {"env": "prod"}), "deployed"], [("decide", [d("call_0_0", "d1", result=YES)])], ask=["deploy"]),
    "ask_deny": Scenario([Turn.tool("deploy", {"env": "prod"}), "ok, not deployed"], [("decide", [d("call_0_0", "d1", result=NO)])], ask=["deploy"]),
    "cancel_decision": Scenario([Turn.tool("deploy", {"env": "prod"}), "cancelled"], [("decide", [d("call_0_0", "d1", "cancel", reason="changed my mind")])], ask=["deploy"]),
    "pending_replay": Scenario([Turn.tool("pay", {"amount": 5}), "paid"], [("decide", [d("call_0_0", "d1", result=YES)])]),
    "pending_use_decision": Scenario([Turn.tool("ask_color"), "blue it is"], [("decide", [d("call_0_0", "d1", result={"color": "blue"})])]),
    "pending_pass_decision": Scenario([Turn.tool("sign", {"doc": "nda"}), "signed"], [("decide", [d("call_0_0", "d1", result={"by": "ann"})])]),
    "two_sequential": Scenario(TWO_DEPLOYS, [("decide", [d("call_0_0", "d1", result=YES)]), ("decide", [d("call_0_1", "d2", result=YES)])], mode="sequential", ask=["deploy"]),
    "two_batch": Scenario(TWO_DEPLOYS, [("decide", [d("call_0_0", "d1", result=YES)]), ("decide", [d("call_0_1", "d2", result=NO)])], mode="parallel_batch_approval", ask=["deploy"]),
    "two_streaming": Scenario(TWO_DEPLOYS, [("decide", [d("call_0_0", "d1", result=YES)]), ("decide", [d("call_0_1", "d2", result=YES)])], mode="parallel_streaming", ask=["deploy"]),
    "cancel_waiting": Scenario(TWO_DEPLOYS, [("cancel", "user left")], ask=["deploy"]),
    "continuation": Scenario(
        [Turn.tools(("deploy", {"env": "a"}), ("deploy", {"env": "b"})), "a done, b cancelled", "bye"],
        [("continue", {"message": "never mind b", "decisions": [d("call_0_0", "d1", result=YES)]})],
        ask=["deploy"],
    ),
}


def build(store: Any, name: str, phase: int) -> Runtime:
    """The scenario's runtime for `phase` (0 = the run start): same agent every time, entropy
    seeded by the phase only."""
    sc = SCENARIOS[name]
    model = ScriptedModel(sc.script, position="conversation")
    plugins = [PermissionPlugin(ask=sc.ask)] if sc.ask else []
    agent = AgentSpec(id="agent", model=model, tools=[t.name for t in TOOLS], plugins=plugins,
                      tool_execution_mode=sc.mode, max_rounds=10)
    prefix = "id" if phase == 0 else f"p{phase}x"
    return Runtime(store, agents=[agent], tools=TOOLS, entropy=DeterministicEntropy(prefix=prefix))


async def start(rt: Runtime, name: str) -> Any:
    return await rt.run("agent", SCENARIOS[name].message, thread_id=THREAD, run_id=RUN)


async def apply_phase(rt: Runtime, name: str, index: int) -> dict[str, Any]:
    """Apply phase `index` (1-based) and wait for the run to finish or wait again."""
    kind, arg = SCENARIOS[name].phases[index - 1]
    if kind == "decide":
        res = await rt.decide(RUN, arg)
        status = None
        if res.handle is not None:
            status = (await res.handle.result()).status
        return {"seq": res.seq, "duplicate": res.duplicate, "resumed": res.resumed, "status": status}
    if kind == "cancel":
        return {"cancelled": await rt.cancel(RUN, reason=arg)}
    if kind == "continue":
        result = await rt.run("agent", arg["message"], parent_run_id=RUN, run_id=f"r{index + 1}",
                              decisions=arg["decisions"])
        return {"status": result.status, "run_id": result.run_id}
    raise ValueError(kind)


async def _main(url: str, name: str, index: int) -> None:
    store = await JetStreamEventStore.connect(url)
    try:
        async with asyncio.timeout(30):
            out = await apply_phase(build(store, name, index), name, index)
    finally:
        await store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
