"""Test app for worker subprocesses: `agentlog worker --nats URL --app tests.apps.worker_app:app`.

Agents:
- `crashy` (parallel_streaming, `deploy` needs approval): 5 steps with two parallel `work` calls,
  a single `work`, `work` + `deploy` (suspends), a single `work`, then a final text.
- `long` (same tools and plugins): the 20-step (20 inferences) run of the crash test, see
  `LONG_SCRIPT`: 19 tool steps (28 calls; parallel pairs/triples throughout) with `work` + `deploy`
  (suspends for approval, call `call_9_1`) at step 9, then a final text at step 19.
- `quick`: `work` then a text answer, forever (the turn comes from the conversation, so any run
  on a thread continues the script; call ids stay unique per thread).
- `boss`: one `agent_run` of `helper` (a sub-agent child run, call `boss_call`), then a text;
  `helper`: one `work` (call `child_work`), then "helper done".
- `boss2`: one `agent_run` of `ops` (call `boss2_call`); `ops`: a `deploy` that needs approval
  (call `ops_deploy`), then "ops shipped".
- `held`: one `hold` call that blocks until the test answers a request on
  `worker_app.release.<call_id>`, then a text answer.

Deterministic hooks (env):
- `WORKER_APP_EXEC_LOG`: every tool execution appends `<pid> <call_id>` (one O_APPEND write).
- `WORKER_APP_COMMIT_LOG`: every append appends `<pid> <seq>`.
- `WORKER_APP_CRASH`: SIGKILL this process at one point: `model:<turn>` (in the inference of that
  turn, before its commit), `tool:<call_id>` (inside that call, after it was recorded as
  started), `after:<EventType>[:<call_id or n-th>]` (right after the commit holding it is acked).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from agentlog.runtime import AgentSpec, PermissionPlugin, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.toolkits.subagents import SubAgents
from agentlog.runtime.workers.commands import CommandClient

_CRASH = os.environ.get("WORKER_APP_CRASH", "")
_EXEC_LOG = os.environ.get("WORKER_APP_EXEC_LOG")
_COMMIT_LOG = os.environ.get("WORKER_APP_COMMIT_LOG")
_seen: dict[str, int] = {}
_NC: Any = None  # the worker's connection (set by app)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _record(path: str | None, line: str) -> None:
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def _executed(ctx: ToolContext) -> None:
    _record(_EXEC_LOG, f"{os.getpid()} {ctx.call_id}")
    if _CRASH == f"tool:{ctx.call_id}":
        _die()


@tool
async def work(k: int, ctx: ToolContext) -> str:
    """Do unit of work k (records its execution, bumps state.done)."""
    _executed(ctx)
    ctx.set("/w" + str(k), k * k)
    return f"worked {k}"


@tool
async def deploy(env: str, ctx: ToolContext) -> str:
    """Deploy to an environment (needs approval)."""
    _executed(ctx)
    return f"deployed {env}"


@tool
async def hold(ctx: ToolContext) -> str:
    """Block until the test releases this call."""
    _executed(ctx)
    released = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        await msg.respond(b"ok")
        released.set()

    sub = await _NC.subscribe(f"worker_app.release.{ctx.call_id}", cb=on_msg)
    try:
        await released.wait()
    finally:
        await sub.unsubscribe()
    return "released"


def _turn(index: int, turn: Turn) -> Any:
    def play(_request: Any) -> Turn:
        if _CRASH == f"model:{index}":
            _die()
        return turn

    return play


CRASHY_SCRIPT = [
    _turn(0, Turn.tools(("work", {"k": 1}), ("work", {"k": 2}), text="two at once")),
    _turn(1, Turn.tool("work", {"k": 3})),
    _turn(2, Turn.tools(("work", {"k": 4}), ("deploy", {"env": "prod"}), text="work and deploy")),
    _turn(3, Turn.tool("work", {"k": 5})),
    _turn(4, Turn.text("all done")),
]


def _long_steps() -> list[list[tuple[str, dict[str, Any]]]]:
    """Per step (= inference) of `long`, its tool calls; `work` units are numbered 1.. in order."""
    steps: list[list[tuple[str, dict[str, Any]]]] = []
    k = 0
    for shape in [2, 1, 3, 1, 1, 2, 1, 1, 2, "approval", 1, 2, 1, 1, 2, 1, 1, 2, 1]:
        if shape == "approval":
            k += 1
            steps.append([("work", {"k": k}), ("deploy", {"env": "prod"})])
        else:
            assert isinstance(shape, int)
            steps.append([("work", {"k": k + i + 1}) for i in range(shape)])
            k += shape
    return steps


#: Steps 0-18 call tools (step 19, the 20th inference, answers with text).
LONG_STEPS = _long_steps()
#: The step whose `deploy` needs the approval, and the call ids of the whole run (call_<step>_<i>).
LONG_APPROVAL_STEP = 9
LONG_CALLS = [f"call_{step}_{i}" for step, calls in enumerate(LONG_STEPS) for i in range(len(calls))]
LONG_SCRIPT = [
    _turn(step, Turn.tools(*calls, text=f"step {step}") if len(calls) > 1 else Turn.tool(*calls[0]))
    for step, calls in enumerate(LONG_STEPS)
] + [_turn(len(LONG_STEPS), Turn.text("all done"))]


class _CrashingStore:
    """Delegates to the real store; records appends and dies after the configured commit."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, commit: Any, expected_version: Any) -> Any:
        res = await self._store.append(commit, expected_version)
        _record(_COMMIT_LOG, f"{os.getpid()} {res.seq}")
        if _CRASH.startswith("after:"):
            _, kind, *rest = _CRASH.split(":")
            for ev in commit.events:
                if type(ev).__name__ != kind:
                    continue
                if rest and not rest[0].isdigit():
                    if getattr(ev, "call_id", None) == rest[0]:
                        _die()
                    continue
                _seen[kind] = _seen.get(kind, 0) + 1
                if _seen[kind] == int(rest[0] if rest else 1):
                    _die()
        return res


def app(store: Any) -> Runtime:
    global _NC
    _NC = store.nc
    agents = [
        AgentSpec(id="crashy", model="crashy", tools=["work", "deploy"], max_rounds=20,
                  tool_execution_mode="parallel_streaming", plugins=[PermissionPlugin(ask=["deploy"])]),
        AgentSpec(id="long", model="long", tools=["work", "deploy"], max_rounds=25,
                  tool_execution_mode="parallel_streaming", plugins=[PermissionPlugin(ask=["deploy"])]),
        AgentSpec(id="quick", model="quick", tools=["work"], max_rounds=5),
        AgentSpec(id="held", model="held", tools=["hold"], max_rounds=5),
        # sub-agents (agentlog.runtime.toolkits.subagents): boss delegates to helper, a child run on its own thread
        AgentSpec(id="boss", model="boss", tools=["agent_run"], max_rounds=5, allowed_agents=["helper"]),
        AgentSpec(id="helper", model="helper", tools=["work"], max_rounds=5),
        # boss2 delegates to ops, whose deploy waits for a human (the parent's call suspends too)
        AgentSpec(id="boss2", model="boss2", tools=["agent_run"], max_rounds=5),
        AgentSpec(id="ops", model="ops", tools=["deploy"], max_rounds=5, plugins=[PermissionPlugin(ask=["deploy"])]),
    ]
    models = {
        "crashy": ScriptedModel(CRASHY_SCRIPT, position="conversation"),
        "long": ScriptedModel(LONG_SCRIPT, position="conversation"),
        "quick": ScriptedModel([Turn.tool("work", {"k": 7}), Turn.text("ok")], loop=True, position="conversation"),
        "held": ScriptedModel([Turn.tool("hold"), Turn.text("after hold")], loop=True, position="conversation"),
        "boss": ScriptedModel([Turn.tool("agent_run", {"agent_id": "helper", "prompt": "help"}, id="boss_call"),
                               Turn.text("boss done")], position="conversation"),
        "helper": ScriptedModel([Turn.tool("work", {"k": 5}, id="child_work"), Turn.text("helper done")],
                                position="conversation"),
        "boss2": ScriptedModel([Turn.tool("agent_run", {"agent_id": "ops", "prompt": "ship"}, id="boss2_call"),
                                Turn.text("boss2 done")], position="conversation"),
        "ops": ScriptedModel([Turn.tool("deploy", {"env": "prod"}, id="ops_deploy"), Turn.text("ops shipped")],
                             position="conversation"),
    }
    rt = Runtime(_CrashingStore(store), agents=agents, tools=[work, deploy, hold], models=models)
    # children start through the work queue, so any worker runs (and recovers) them
    SubAgents(commands=CommandClient(store.nc)).install(rt)
    return rt
