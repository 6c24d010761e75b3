"""A user application for the `agentlog replay --verify --app tests.apps.replay_app:<attr>` tests.

`app` is the application the runs are recorded with; the other attributes are the same app
changed in one way each (what `--verify` must catch), or wrong things to pass to `--app`.
Models are `ScriptedModel(position="conversation")`: the turn comes from the conversation, so a
fresh process (the CLI) answers like the one that recorded (replay answers from the log anyway).

`hitl_<scenario>` is the Runtime of a `tests.support.hitl` scenario (built on first access),
`hitl_changed_<scenario>` the same with a changed `deploy` tool.
"""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AddContext, AgentSpec, App, Plugin, Runtime, ToolContext, tool
from agentlog.runtime.models import ScriptedModel, Turn

SCRIPT = [
    Turn.tool("add", {"a": 1, "b": 2}),
    Turn.tools(("echo", {"text": "x"}), ("echo", {"text": "y"})),
    "done",
]
PROMPT = "Be exact."


@tool
def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers and remember the last sum."""
    ctx.set("/last_sum", a + b)
    return a + b


@tool(name="add")
def add_changed(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers and remember the last sum."""
    # same name, schema and description as `add`: only the value differs
    ctx.set("/last_sum", a + b + 1)
    return a + b + 1


@tool
def echo(text: str) -> str:
    """Echo."""
    return text


@tool(name="echo")
def echo_described(text: str) -> str:
    """Echo the text back."""
    # same name and value as `echo`: only the description (part of the tool list) differs
    return text


#: What the `app_side_effect` tools did: a replay answering tools from the log leaves it empty.
SIDE_EFFECTS: list[str] = []


@tool(name="add")
def add_effect(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers and remember the last sum."""
    SIDE_EFFECTS.append("add")
    ctx.set("/last_sum", a + b)
    return a + b


@tool(name="echo")
def echo_effect(text: str) -> str:
    """Echo."""
    SIDE_EFFECTS.append("echo")
    return text


class TodayContext(Plugin):
    """Adds context to every inference: changes the model request, not any committed event."""

    id = "today"

    def before_inference(self, ctx: Any) -> list[Any]:
        return [AddContext("Today is Tuesday.")]


def make(*, tools: tuple[Any, ...] = (add, echo), prompt: str = PROMPT, plugins: tuple[Any, ...] = (),
         mode: str = "parallel_streaming") -> App:
    agent = AgentSpec(id="calc", model="scripted", system_prompt=prompt, tools=["add", "echo"],
                      plugins=list(plugins), tool_execution_mode=mode, max_rounds=5)
    return App(agents=[agent], tools=list(tools),
               models={"scripted": ScriptedModel(SCRIPT, position="conversation")})


app = make()
app_tool_changed = make(tools=(add_changed, echo))
app_prompt_changed = make(prompt="Be creative.")
app_with_context = make(plugins=(TodayContext(),))
app_sequential = make(mode="sequential")
app_tool_described = make(tools=(add, echo_described))
app_side_effect = make(tools=(add_effect, echo_effect))


def factory(store: Any) -> Runtime:
    """A factory: called with the CLI's store."""
    return app.runtime(store)


def bad_factory(store: Any) -> int:
    return 42


not_an_app = 42


@tool(name="deploy")
def deploy_changed(env: str) -> str:
    """Deploy to an environment (guarded by a permission `ask` rule)."""
    return f"deployed {env} (staging)"


def __getattr__(name: str) -> Runtime:
    """`hitl_<scenario>`: that scenario's Runtime (its store is never used by replay);
    `hitl_changed_<scenario>`: the same with a `deploy` tool that returns another value."""
    from tests.support import hitl as S
    changed = name.startswith("hitl_changed_")
    scenario = name.removeprefix("hitl_changed_" if changed else "hitl_")
    if not name.startswith("hitl_") or scenario not in S.SCENARIOS:
        raise AttributeError(name)
    rt = S.build(None, scenario, 0)
    if changed:
        return Runtime(None, agents=[rt.agents.get("agent")],  # type: ignore[arg-type]
                       tools=[deploy_changed, *(t for t in S.TOOLS if t.name != "deploy")])
    return rt
