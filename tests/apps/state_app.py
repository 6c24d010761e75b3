"""Test app for typed state (`agentlog serve --app tests.apps.state_app:app`,
tests/gateway/test_state_deployed.py): one scenario per seed example of the state books.

Agent `stateful` answers by the first word of the thread's last user message (a scripted model
that reads the conversation, so any run on a thread goes on from where it is):

* `counter`  (Tirea 1.5, the Counter reducer): `count(2)`, then `rename("clicks")`.
* `scopes`   (Tirea 1.6 / awaken 1.2, KeyScope run vs thread): two `visit` calls in parallel.
* `lattice`  (Tirea 1.7): three parallel `allow` calls, two of them with the same tool.
* `greet`    (awaken 1.1, the counter and audit-log keys): `greet("ann")`, then `greet("bob")`.
* `exclusive` (awaken 1.3): `note("a")`, `note("b")` and `cheer()` in parallel.
* `snapshot` (awaken 1.4): `note("x")` and `peek()` in parallel, then `peek()` again.
* `draft`    (awaken 1.5, StateKeyOptions.persistent): `draft("d1")`; `peek` in the next run.
* `hooks`    (awaken 1.6 / 1.7, MutationBatch and the mutation lifecycle): a text answer; two
  plugins write the same exclusive key after the inference, a third only counts.
* `remember <topic> <fact>` / `recall <words>`: the memory tools on the thread's profile.

Parallel calls finish in a fixed order without sleeps: every call but a round's first waits
(`wait=true`) until the first one's result is in (the `gate` plugin, per run, in the process
that runs the tools).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pydantic

from agentlog.eventlog.events import ToolCall
from agentlog.runtime import AgentSpec, Plugin, Runtime, ToolContext, ToolResult, tool
from agentlog.runtime.models.base import ModelRequest
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.state import GCounter, GSet, MaxRegister, StateKey, ops
from agentlog.runtime.toolkits.memory import MemoryPlugin

# -- keys -------------------------------------------------------------------------------------------


class Counter(pydantic.BaseModel):
    value: int = 0
    label: str = ""


class Increment(pydantic.BaseModel):
    kind: Literal["increment"] = "increment"
    n: int


class Rename(pydantic.BaseModel):
    kind: Literal["rename"] = "rename"
    name: str


def reduce_counter(state: Counter, action: Increment | Rename) -> Counter:
    if isinstance(action, Increment):
        state.value += action.n
    else:
        state.label = action.name
    return state


class Policy(pydantic.BaseModel):
    allowed_tools: GSet[str] = GSet()
    grants: GCounter = GCounter()
    longest: MaxRegister = MaxRegister()


COUNTER = StateKey("counter", Counter, action=Increment | Rename, reduce=reduce_counter)
GREET_COUNT = StateKey("greet_count", int, merge="commutative", action=int,
                       reduce=lambda v, n: ops.changes(ops.increment("", n)))
AUDIT_LOG = StateKey("audit_log", list[str], action=list[str], reduce=lambda v, update: update)
RUN_VISITS = StateKey("run_visits", int, scope="run", merge="commutative")
THREAD_VISITS = StateKey("thread_visits", int, merge="commutative")
CALL_SCRATCH = StateKey("scratch", list[str], scope="tool_call")
POLICY = StateKey("permission_policy", Policy, merge="lattice")
NOTES = StateKey("notes", list[str])
DRAFT = StateKey("draft", str, persistent=False)
HOOK_TITLE = StateKey("hook_title", str)
HOOK_HITS = StateKey("hook_hits", int, merge="commutative")
KEYS = [COUNTER, GREET_COUNT, AUDIT_LOG, RUN_VISITS, THREAD_VISITS, CALL_SCRATCH, POLICY, NOTES, DRAFT,
        HOOK_TITLE, HOOK_HITS]

# -- ordering parallel calls ------------------------------------------------------------------------


class Gate(Plugin):
    """Per run: set once the round's first call has its result (AfterToolExecute)."""

    id = "gate"

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}

    def event(self, run_id: str) -> asyncio.Event:
        return self.events.setdefault(run_id, asyncio.Event())

    def after_tool_execute(self, ctx: Any, call: ToolCall, result: ToolResult) -> None:
        self.event(ctx.run_id).set()

    def step_start(self, ctx: Any) -> None:
        self.events.pop(ctx.run_id, None)  # each round waits for its own first call


GATE = Gate()


async def _after_first(ctx: ToolContext, wait: bool) -> None:
    if wait:
        await GATE.event(ctx.run_id).wait()


# -- tools --------------------------------------------------------------------------------------------


@tool(state_keys=[COUNTER])
def count(n: int, ctx: ToolContext) -> int:
    """Increment the counter (reducer action Increment)."""
    ctx.reduce(COUNTER, Increment(n=n))
    return ctx.read(COUNTER).value


@tool(state_keys=[COUNTER])
def rename(name: str, ctx: ToolContext) -> str:
    """Rename the counter (reducer action Rename)."""
    ctx.reduce(COUNTER, Rename(name=name))
    return ctx.read(COUNTER).label


@tool(state_keys=[GREET_COUNT, AUDIT_LOG])
def greet(name: str, ctx: ToolContext) -> dict[str, Any]:
    """Greet: count it (commutative) and replace the audit log with one more line (exclusive)."""
    ctx.reduce(GREET_COUNT, 1)
    ctx.reduce(AUDIT_LOG, [*ctx.read(AUDIT_LOG), f"greeted {name}"])
    return {"greet_count": ctx.read(GREET_COUNT), "audit_log": ctx.read(AUDIT_LOG)}


@tool(state_keys=[RUN_VISITS, THREAD_VISITS, CALL_SCRATCH])
async def visit(ctx: ToolContext, wait: bool = False) -> dict[str, Any]:
    """Count a visit in the run and in the thread; keep a per-call scratch."""
    seen = {"run_visits": ctx.read(RUN_VISITS), "thread_visits": ctx.read(THREAD_VISITS)}
    await _after_first(ctx, wait)
    ctx.update(RUN_VISITS, ops.increment())
    ctx.update(THREAD_VISITS, ops.increment())
    ctx.update(CALL_SCRATCH, ops.append("", ctx.call_id))
    return {**seen, "scratch": ctx.read(CALL_SCRATCH)}


@tool(state_keys=[POLICY])
async def allow(tool_name: str, ctx: ToolContext, wait: bool = False) -> list[str]:
    """Allow a tool in the permission policy (lattice fields: a set, a counter, a max)."""
    await _after_first(ctx, wait)
    ctx.update(POLICY, ops.add_to_set("/allowed_tools", tool_name), ops.count("/grants"),
               ops.max("/longest", len(tool_name)))
    return ctx.read(POLICY).allowed_tools.members


@tool(state_keys=[NOTES, GREET_COUNT])
async def note(text: str, ctx: ToolContext, wait: bool = False) -> list[str]:
    """Append to the notes (exclusive) and count (commutative)."""
    await _after_first(ctx, wait)
    ctx.update(NOTES, ops.append("", text))
    ctx.reduce(GREET_COUNT, 1)
    return ctx.read(NOTES)


@tool(state_keys=[GREET_COUNT])
async def cheer(ctx: ToolContext, wait: bool = False) -> int:
    """Count only (commutative)."""
    await _after_first(ctx, wait)
    ctx.reduce(GREET_COUNT, 1)
    return ctx.read(GREET_COUNT)


@tool(state_keys=[NOTES, DRAFT, COUNTER])
async def peek(ctx: ToolContext, wait: bool = False) -> dict[str, Any]:
    """Read the notes, the draft and the counter as this call's snapshot has them."""
    seen = {"notes": ctx.read(NOTES), "draft": ctx.read(DRAFT), "counter": ctx.read(COUNTER).value}
    await _after_first(ctx, wait)
    return seen


@tool(state_keys=[DRAFT])
def draft(text: str, ctx: ToolContext) -> str:
    """Write the draft: a key that is not persistent (cleared when the run ends)."""
    ctx.write(DRAFT, text)
    return ctx.read(DRAFT)


# -- plugins --------------------------------------------------------------------------------------------


def _scenario(ctx: Any) -> str:
    users = [m.content for m in ctx.messages if m.role == "user"]
    return users[-1].split()[0] if users and users[-1].split() else ""


class TitleWriter(Plugin):
    """In `hooks` runs, after the inference: append its letter to the title (exclusive) and
    count (commutative)."""

    def __init__(self, plugin_id: str, letter: str) -> None:
        self.id = plugin_id
        self.letter = letter

    def after_inference(self, ctx: Any, response: Any) -> Any:
        if _scenario(ctx) != "hooks":
            return None
        batch = ctx.mutate()
        batch.update(HOOK_TITLE, ops.set("", ctx.read(HOOK_TITLE) + self.letter))
        batch.update(HOOK_HITS, ops.increment())
        return [batch]


class HitCounter(Plugin):
    id = "hit_counter"

    def after_inference(self, ctx: Any, response: Any) -> Any:
        if _scenario(ctx) != "hooks":
            return None
        batch = ctx.mutate()
        batch.update(HOOK_HITS, ops.increment(by=10))
        return [batch]


# -- the model ------------------------------------------------------------------------------------------

SCRIPTS: dict[str, list[Turn]] = {
    "counter": [Turn.tool("count", {"n": 2}), Turn.tool("rename", {"name": "clicks"}), Turn.text("counted")],
    "scopes": [Turn.tools(("visit", {}), ("visit", {"wait": True})), Turn.text("visited")],
    "lattice": [Turn.tools(("allow", {"tool_name": "search"}), ("allow", {"tool_name": "read", "wait": True}),
                           ("allow", {"tool_name": "search", "wait": True})), Turn.text("allowed")],
    "greet": [Turn.tool("greet", {"name": "ann"}), Turn.tool("greet", {"name": "bob"}), Turn.text("greeted")],
    "exclusive": [Turn.tools(("note", {"text": "a"}), ("note", {"text": "b", "wait": True}), ("cheer", {"wait": True})),
                  Turn.text("noted")],
    "snapshot": [Turn.tools(("note", {"text": "x"}), ("peek", {"wait": True})), Turn.tool("peek", {}), Turn.text("peeked")],
    "draft": [Turn.tool("draft", {"text": "d1"}), Turn.tool("peek", {}), Turn.text("drafted")],
    "peek": [Turn.tool("peek", {}), Turn.text("peeked")],
    "hooks": [Turn.text("hooked")],
}


def answer(request: ModelRequest) -> Turn:
    """The next turn of the scenario named by the last user message, counted from it."""
    messages = request.messages
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    words = messages[last_user].content.split()
    done = sum(1 for m in messages[last_user + 1:] if m.role == "assistant")
    if words and words[0] == "remember":
        script = [Turn.tool("remember", {"topic": words[1], "fact": " ".join(words[2:])}), Turn.text("remembered")]
    elif words and words[0] == "recall":
        script = [Turn.tool("recall", {"query": " ".join(words[1:])}), Turn.text("recalled")]
    else:
        script = SCRIPTS.get(words[0] if words else "", [Turn.text("?")])
    return script[min(done, len(script) - 1)]


MEMORY = MemoryPlugin()
TOOLS = [count, rename, greet, visit, allow, note, cheer, peek, draft]  # and MEMORY's plugin tools


def app(store: Any) -> Runtime:
    spec = AgentSpec(
        id="stateful", model="stateful", tools=[t.name for t in TOOLS], max_rounds=6, state_keys=KEYS,
        plugins=[GATE, TitleWriter("title_a", "A"), TitleWriter("title_b", "B"), HitCounter(), MEMORY],
    )
    model = ScriptedModel([answer], loop=True, position="conversation")
    return Runtime(store, agents=[spec], tools=TOOLS, models={"stateful": model})
