"""Test app for the protocol suites run against real deployments (`agentlog serve --app
tests.apps.protocol_app:app`, and `agentlog gateway` + `agentlog worker`): the official-client scenarios of
tests/support/js/clients.mjs and the fidelity checks of tests/gateway/test_protocol_fidelity.py.

Every agent answers from one scripted router: the first user message of the turn names the
script (e.g. "approval: deploy it"), the assistant turns since then say how far it got. So one
deployment serves every scenario of a module, each on its own thread, with no per-test model.

Agents: `sequential` and `parallel_batch_approval` (the tool execution modes), both asking a
human before `echo` and `append_log`; `open`, the same tools with no approval gate; `priced`, the
same as `open` on a model with prices (its runs record a cost); `tunable`, which answers with what
it was sent (model, system prompt, options, state) and allows some per-request overrides.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from agentlog.runtime import AgentSpec, App, PermissionPlugin, ToolContext, ToolError, ToolResult, tool
from agentlog.runtime.inputs.run_input import OverridePolicy
from agentlog.runtime.models import ModelRequestRejected, ScriptedModel, Turn
from agentlog.runtime.models.pricing import ModelPrices

from tests.support.frontend_stubs import frontend_tool

PICK = "pick_color"


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
def ask_name() -> ToolResult:
    """Needs a human to type something."""
    return ToolResult.pending("ticket2", action="input", message="your name?",
                              response_schema={"type": "object", "properties": {"name": {"type": "string"}}})


@tool
def broken() -> str:
    """Always fails."""
    raise ToolError("the disk is on fire")


@tool
def approve_me(what: str) -> ToolResult:
    """Needs a human to approve (a pending result, whatever the agent's permissions)."""
    return ToolResult.pending("ticket1", message=f"approve {what}?")


@tool
def init_log(ctx: ToolContext) -> str:
    """Start an empty log list in the thread state."""
    ctx.set("/log", [])
    return "ok"


@tool
def append_log(text: str, ctx: ToolContext) -> str:
    """Append to the log list (an array append: applying it twice shows)."""
    ctx.patch([{"op": "add", "path": "/log/-", "value": text}])
    return text


@tool
def report(ctx: ToolContext) -> str:
    """Tell the client what happened: a custom event, a raw one, an activity and its change."""
    ctx.emit("report.started", {"step": 1})
    ctx.emit_raw({"vendor": "acme", "seq": 1}, source="acme")
    ctx.activity("plan", {"steps": ["fetch", "sum"], "done": 0})
    ctx.activity_patch("plan", [{"op": "replace", "path": "/done", "value": 1}])
    ctx.emit("report.finished", {"step": 2})
    return "reported"


#: Where a test releases a `hold` call: a file named after the thread.
HOLD_DIR = Path(tempfile.gettempdir()) / "agentlog-protocol-hold"


@tool
async def hold(ctx: ToolContext) -> str:
    """Keep the run going until the test releases the thread (a file in HOLD_DIR): a run that
    is live for as long as a test needs it to be."""
    while not (HOLD_DIR / ctx.thread_id).exists():
        await asyncio.sleep(0.05)
    return "released"


TOOLS = [add, echo, report, hold, ask_name, broken, approve_me, init_log, append_log,
         frontend_tool(PICK, "Let the user pick a color")]

#: What the `longfail` scenario's model answers: an error message far longer than a line, with a
#: marker at its end (shown whole wherever a failed run is: never cut).
LONG_ERROR = ("the provider refused the request: " + "context window exceeded by the attached documents; " * 6
              + "request id req-7f3a9c. END-OF-ERROR")

#: scenario keyword (the first user message of the turn) -> the model's turns, by assistant turns so far
SCRIPTS: dict[str, list[Any]] = {
    "text": ["Hello from agentlog, streamed live."],
    "state": [Turn.tool("add", {"a": 1, "b": 2}, text="Adding them up."), "The sum is 3."],
    "add": [Turn.tool("add", {"a": 1, "b": 2}, text="Let me add those numbers"), "The sum is three."],
    "approval": [Turn.tool("echo", {"text": "deploy"}, text="Deploying now."), "All done."],
    "two": [Turn.tools(("echo", {"text": "a"}), ("echo", {"text": "b"}), text="Two things."), "Both handled."],
    "frontend": [Turn.tool(PICK, {"palette": ["red", "blue"]}), "Thanks for picking."],
    "log": [Turn.tool("init_log", {}), Turn.tool("append_log", {"text": "x"}), "Logged."],
    "name": [Turn.tool("ask_name", {}), "Nice to meet you."],
    # a reasoning model: it thinks before the call and before the answer
    "think": [Turn.tool("add", {"a": 1, "b": 2}, text="Adding.", reasoning="The user wants a sum, so I call add."),
              Turn.text("The sum is 3.", reasoning="add returned 3.")],
    "emit": [Turn.tool("report", {}, text="Reporting."), "Reported."],
    "hold": [Turn.tool("hold", {}, text="Holding on."), "Released."],
    # three calls at once, one of which fails
    "trio": [Turn.tools(("add", {"a": 1, "b": 2}), ("echo", {"text": "b"}), ("broken", {})), "The sum is 3."],
    "fail": [Turn.fail(ModelRequestRejected("bad api key"))],
    "longfail": [Turn.fail(ModelRequestRejected(LONG_ERROR))],
    # two calls that each wait for a human
    "pair": [Turn.tools(("approve_me", {"what": "x"}), ("approve_me", {"what": "y"}))],
    # held at its first call until released, then three calls at once and one more: many events
    "fan": [Turn.tool("hold", {}), Turn.tools(("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2}),
                                             ("add", {"a": 3, "b": 3}), text="three at once"),
            Turn.tool("add", {"a": 4, "b": 4}), "all done"],
    # a frontend tool the request declares (AG-UI `tools`), not the app
    "confirm": [Turn.tool("confirm_action", {"text": "really?"}), "Confirmed, thanks."],
}


def route(request: Any) -> Any:
    """The scripted answer for the turn in progress (see the module docstring); a message that
    names no script gets a plain answer."""
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    script = SCRIPTS.get(request.messages[last].content.split(":")[0], ["Hello."])
    done = sum(m.role == "assistant" for m in request.messages[last:])
    return script[min(done, len(script) - 1)]


def agents() -> list[AgentSpec]:
    names = [t.name for t in TOOLS]
    ask = [PermissionPlugin(ask=["echo", "append_log"])]
    specs = [AgentSpec(id=mode, model=ScriptedModel([route] * 100_000, chunk_words=2), tools=names, plugins=ask,
                       tool_execution_mode=mode) for mode in ("sequential", "parallel_batch_approval")]
    specs.append(AgentSpec(id="open", model=ScriptedModel([route] * 100_000, chunk_words=2), tools=names))
    # $2 / $4 per 1M input / output tokens (a scripted model counts words as tokens)
    specs.append(AgentSpec(id="priced", model=ScriptedModel([route] * 100_000, chunk_words=2, name="priced",
                                                            prices=ModelPrices(input=2.0, output=4.0)),
                           tools=names))
    return specs



# -- `tunable`: a run's client input (tests/gateway/test_agui_run_input.py) --------------------------------


@tool
def read_state(key: str, ctx: ToolContext) -> Any:
    """The thread state's value at `key` as the tool sees it (the client's state reaches tools)."""
    return ctx.state.get(key)


@tool
def read_state_approved(key: str, ctx: ToolContext) -> Any:
    """`read_state` once a human approved it (the run waits for the approval)."""
    return ctx.state.get(key)


def tell(request: Any) -> Any:
    """Reads the thread state's `draft` (`read_state_approved` when the message starts with
    "approve", so the run waits for a human first), then answers with what it was sent, as
    JSON: the model name, the system prompt (the client's context included), the options, and
    the state read."""
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    results = [m.content for m in request.messages[last:] if m.role == "tool"]
    if not results:
        asked = request.messages[last].content.startswith("approve")
        return Turn.tool("read_state_approved" if asked else "read_state", {"key": "draft"})
    system = request.messages[0].content if request.messages[0].role == "system" else ""
    return json.dumps({"model": request.model, "system": system, "options": request.options,
                       "state_seen": results[-1]}, sort_keys=True)


#: The `tunable` agent's models: its own, one a request may choose, one it may not.
TUNABLE_MODELS = {name: ScriptedModel([tell] * 100_000) for name in ("tunable-default", "tunable-small", "tunable-huge")}

#: An `App`, not a `Runtime`: the server then builds the runtime with its own live sink, views
#: and snapshots (a factory's `Runtime` would be used as is, streaming nothing live).
app = App(
    agents=[*agents(), AgentSpec(
        id="tunable", model="tunable-default", tools=["read_state", "read_state_approved"],
        system_prompt="You are tunable.", model_options={"max_tokens": 100},
        plugins=[PermissionPlugin(ask=["read_state_approved"])],
        overrides=OverridePolicy(models=["tunable-small"], system_prompt=True, options=["temperature"]))],
    tools=[*TOOLS, read_state, read_state_approved], models=TUNABLE_MODELS,
)
