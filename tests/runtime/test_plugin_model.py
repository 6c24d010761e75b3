"""The plugin model (agentlog.runtime.plugins) beyond phase hooks: plugin-provided tools, a
config section per plugin validated when the agent is defined, per-agent hook filters,
scheduled actions converging within a phase (bounded), post-commit effects, input filters,
request transforms, and keyed / persistent / throttled context messages with the reminder
plugin. Pure (the in-memory store); each run is verified by replay."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pydantic
import pytest

from agentlog.eventlog.events import (
    ActionScheduled,
    ContextMessageSet,
    EffectEmitted,
    InputFiltered,
    ScheduledActionsRan,
    StatePatched,
    ToolCall,
)
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import (
    ActionHandler,
    AddContext,
    AgentSpec,
    DeterministicEntropy,
    Effect,
    EffectSpec,
    PatchState,
    PhaseContext,
    Plugin,
    RejectInput,
    ReminderPlugin,
    RemoveContext,
    Runtime,
    Schedule,
    Tool,
    ToolContext,
    ToolResult,
    WarnInput,
    agent_catalog,
    tool,
)
from agentlog.runtime.config import ConfigError, build, parse_config
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.models.base import ModelRequest
from agentlog.runtime.plugins import MAX_PHASE_ROUNDS
from agentlog.runtime.replay.verify import verify_run


@tool
def noop() -> str:
    """Nothing."""
    return "ok"


def runtime(plugins: list[Plugin], script: list[Any], *, tools: Sequence[Tool] = (noop,), **spec: Any
            ) -> tuple[Runtime, ScriptedModel]:
    model = ScriptedModel(script)
    agent = AgentSpec(id="a", model=model, tools=[t.name for t in tools], plugins=plugins, **spec)
    return Runtime(MemoryEventStore(), agents=[agent], tools=list(tools), entropy=DeterministicEntropy()), model


async def events_of(rt: Runtime, thread_id: str) -> list[Any]:
    return [e for sc in [sc async for sc in rt.store.read_thread(thread_id)] for e in sc.commit.events]


async def verified(rt: Runtime, run_id: str) -> None:
    report = await verify_run(rt.store, run_id, rt)
    assert report.ok and report.commits_verified == report.commits_recorded


def system_of(model: ScriptedModel, k: int) -> str:
    first = model.requests[k].messages[0]
    return first.content if first.role == "system" else ""


# -- plugin-provided tools ------------------------------------------------------------------------


class Notes(Plugin):
    id = "notes"

    def __init__(self) -> None:
        @tool(category="notes")
        def take_note(text: str) -> str:
            """Remember a note."""
            return f"noted: {text}"

        self._tools = [take_note]

    def tools(self) -> Sequence[Tool]:
        return self._tools


async def test_plugin_tools_are_offered_to_the_agents_using_the_plugin_and_run() -> None:
    rt, model = runtime([Notes()], [Turn.tool("take_note", {"text": "milk"}), "done"])
    result = await rt.run("a", "go")
    assert [t.name for t in model.requests[0].tools] == ["noop", "take_note"]
    (call,) = result.run.calls.values()
    assert call.result == "noted: milk"
    (entry,) = agent_catalog(rt)
    assert [t["name"] for t in entry["tools"]] == ["noop", "take_note"]
    assert rt.tools.get("take_note").provided_by == "notes"  # type: ignore[union-attr]
    await verified(rt, result.run_id)


def test_plugin_tools_stay_with_their_agents_and_may_not_shadow_an_app_tool() -> None:
    plain = AgentSpec(id="plain", model=ScriptedModel(["x"]), tools=["noop"])
    with_notes = AgentSpec(id="noted", model=ScriptedModel(["x"]), tools=["noop"], plugins=[Notes()])
    Runtime(MemoryEventStore(), agents=[plain, with_notes], tools=[noop])
    assert plain.tools == ["noop"] and with_notes.tools == ["noop", "take_note"]

    @tool(name="take_note")
    def other(text: str) -> str:
        """An app tool of the same name."""
        return text

    with pytest.raises(ValueError, match="plugin 'notes' gives a tool named 'take_note'"):
        Runtime(MemoryEventStore(), agents=[AgentSpec(id="b", model="m", plugins=[Notes()])], tools=[other])


async def test_plugin_tools_are_hidden_by_the_agents_hook_filter() -> None:
    rt, model = runtime([Notes(), ReminderPlugin()], ["done"], hook_filter=["reminder"])
    await rt.run("a", "go")
    assert [t.name for t in model.requests[0].tools] == ["noop"]


# -- configuration sections -----------------------------------------------------------------------


class Motto(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str = "Be brief."
    times: int = pydantic.Field(default=1, ge=1)


class MottoPlugin(Plugin):
    id = "motto"
    config_model = Motto

    def before_inference(self, ctx: PhaseContext) -> list[Any]:
        return [AddContext(" ".join([ctx.config.text] * ctx.config.times))]


async def test_plugin_config_section_is_validated_and_read_by_the_hooks() -> None:
    rt, model = runtime([MottoPlugin()], ["ok"], sections={"motto": {"text": "Speak up.", "times": 2}})
    await rt.run("a", "go")
    assert system_of(model, 0) == "Speak up. Speak up."
    assert isinstance(rt.agents.get("a").sections["motto"], Motto)


async def test_plugin_config_absent_section_means_the_defaults() -> None:
    rt, model = runtime([MottoPlugin()], ["ok"])
    await rt.run("a", "go")
    assert system_of(model, 0) == "Be brief."


@pytest.mark.parametrize("sections, message", [
    ({"motto": {"times": 0}}, r"sections\.motto: times: Input should be greater than or equal to 1"),
    ({"motto": {"colour": "red"}}, r"sections\.motto: colour: Extra inputs are not permitted"),
    ({"mottoo": {}}, r"sections 'mottoo': no plugin of this agent has that config key \(plugins' keys: motto\)"),
])
def test_plugin_config_mistakes_are_refused_when_the_agent_is_defined(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        AgentSpec(id="a", model="m", plugins=[MottoPlugin()], sections=sections)


def test_plugin_config_section_in_a_config_file_is_validated_at_load() -> None:
    base = ("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, "
            "plugins: ['agentlog.runtime.rules.reminders:ReminderPlugin'], sections: {reminder: %s}}]")
    loaded = build(parse_config(base % "{rules: [{tool: 'noop*', message: hi, cooldown: 2}]}"))
    (spec,) = loaded.agents
    assert spec.sections["reminder"].rules[0].cooldown == 2
    with pytest.raises(ConfigError, match=r"agent 'a'.*sections\.reminder: rules\.0\.cooldown"):
        build(parse_config(base % "{rules: [{tool: noop, message: hi, cooldown: -1}]}"))
    with pytest.raises(ConfigError, match=r"sections\.reminder: rules\.0\.tool"):
        build(parse_config(base % "{rules: [{tool: 'noop(', message: hi}]}"))


# -- hook filters ---------------------------------------------------------------------------------


class Tagger(Plugin):
    def __init__(self, tag: str) -> None:
        self.id = tag

    def before_inference(self, ctx: PhaseContext) -> list[Any]:
        return [AddContext(f"[{self.id}]")]


async def test_hook_filter_runs_only_the_named_plugins_hooks() -> None:
    rt, model = runtime([Tagger("one"), Tagger("two")], ["ok"], hook_filter=["two"])
    await rt.run("a", "go")
    assert system_of(model, 0) == "[two]"
    with pytest.raises(pydantic.ValidationError, match="hook_filter names 'three'"):
        AgentSpec(id="a", model="m", plugins=[Tagger("one")], hook_filter=["three"])


# -- scheduled actions ----------------------------------------------------------------------------


class Counter(Plugin):
    """Schedules `count` at StepStart; the handler counts to a limit by scheduling itself again,
    and schedules `announce` for BeforeInference (a later phase: recorded)."""

    id = "counter"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def step_start(self, ctx: PhaseContext) -> list[Any]:
        return [Schedule("count", 1)] if ctx.step == 1 else []

    def action_handlers(self) -> Mapping[str, ActionHandler]:
        def count(ctx: PhaseContext, n: int) -> list[Any]:
            patch = PatchState(ops=({"op": "add", "path": "/count", "value": n},))
            assert ctx.state.get("count", 0) == n - 1  # each round sees the previous round's patch
            return [patch, Schedule("count", n + 1)] if n < self.limit else [patch, Schedule("announce", n)]

        def announce(ctx: PhaseContext, n: int) -> list[Any]:
            return [AddContext(f"counted to {n}")]

        return {"count": ActionHandler("step_start", count), "announce": ActionHandler("before_inference", announce)}


async def test_scheduled_actions_converge_within_their_phase_and_carry_to_a_later_one() -> None:
    rt, model = runtime([Counter(limit=5)], ["ok"])
    result = await rt.run("a", "go")
    events = await events_of(rt, result.thread_id)
    assert [e.ops[0]["value"] for e in events if isinstance(e, StatePatched)] == [1, 2, 3, 4, 5]
    assert [(e.key, e.phase, e.payload) for e in events if isinstance(e, ActionScheduled)] == [
        ("announce", "before_inference", 5)]
    assert [(e.phase, e.count) for e in events if isinstance(e, ScheduledActionsRan)] == [("before_inference", 1)]
    assert system_of(model, 0) == "counted to 5"
    await verified(rt, result.run_id)


async def test_scheduled_actions_that_never_converge_end_the_run_phase_loop_exceeded() -> None:
    rt, model = runtime([Counter(limit=10_000)], ["ok"])
    result = await rt.run("a", "go")
    assert (result.termination.type, result.termination.code) == ("error", "phase_loop_exceeded")
    assert f"after {MAX_PHASE_ROUNDS} rounds" in (result.termination.detail or "")
    assert model.requests == []  # nothing reached the model
    await verified(rt, result.run_id)


async def test_a_scheduled_action_nobody_handles_ends_the_run_error() -> None:
    class Stray(Plugin):
        def step_start(self, ctx: PhaseContext) -> list[Any]:
            return [Schedule("nobody")]

    rt, _ = runtime([Stray()], ["ok"])
    result = await rt.run("a", "go")
    assert result.termination.code == "plugin_error" and "'nobody'" in (result.termination.detail or "")


# -- effects --------------------------------------------------------------------------------------


class Audit(Plugin):
    id = "audit"

    def __init__(self) -> None:
        self.seen: list[tuple[Any, Any]] = []
        self.done = asyncio.Event()

    def after_tool_execute(self, ctx: PhaseContext, call: ToolCall, result: ToolResult) -> list[Any]:
        return [PatchState(ops=({"op": "add", "path": "/audited", "value": call.name},)),
                Effect("audit.record", {"tool": call.name, "status": result.status})]

    def effect_handlers(self) -> Mapping[str, Any]:
        async def record(payload: Any, state: Mapping[str, Any]) -> None:
            self.seen.append((payload, state.get("audited")))
            self.done.set()

        return {"audit.record": record}


async def test_effects_run_after_their_commit_once_and_not_on_replay() -> None:
    audit = Audit()
    rt, _ = runtime([audit], [Turn.tool("noop"), "done"])
    result = await rt.run("a", "go")
    async with asyncio.timeout(5):
        await audit.done.wait()
    assert audit.seen == [({"tool": "noop", "status": "success"}, "noop")]  # the state as committed
    events = await events_of(rt, result.thread_id)
    assert [(e.key, e.payload) for e in events if isinstance(e, EffectEmitted)] == [
        ("audit.record", {"tool": "noop", "status": "success"})]
    await verified(rt, result.run_id)
    await asyncio.sleep(0)
    assert len(audit.seen) == 1  # the replay recorded, compared, and ran nothing


async def test_an_effect_nobody_handles_ends_the_run_before_it_is_written() -> None:
    class Stray(Plugin):
        def step_start(self, ctx: PhaseContext) -> list[Any]:
            return [Effect("nobody.listens")]

    rt, _ = runtime([Stray()], ["ok"])
    result = await rt.run("a", "go")
    assert result.termination.code == "plugin_error"
    assert not [e for e in await events_of(rt, result.thread_id) if isinstance(e, EffectEmitted)]


async def test_a_failing_effect_is_logged_and_the_run_goes_on() -> None:
    class Failing(Plugin):
        def step_start(self, ctx: PhaseContext) -> list[Any]:
            return [Effect("boom")]

        def effect_handlers(self) -> Mapping[str, Any]:
            def boom(payload: Any, state: Any) -> None:
                raise RuntimeError("effect failed")

            return {"boom": boom}

    rt, _ = runtime([Failing()], ["ok"])
    result = await rt.run("a", "go")
    assert result.termination.type == "natural_end"


# -- input filters --------------------------------------------------------------------------------


class NoSecrets(Plugin):
    id = "no-secrets"

    def filter_input(self, ctx: PhaseContext, messages: Sequence[Any]) -> list[Any]:
        text = " ".join(m.content for m in messages)
        if "password" in text:
            return [RejectInput("the message contains a password")]
        if "email" in text:
            return [WarnInput("the message mentions an email address")]
        return []


async def test_an_input_filter_rejects_before_the_model_is_called() -> None:
    rt, model = runtime([NoSecrets()], ["never"])
    result = await rt.run("a", "my password is hunter2")
    assert (result.termination.type, result.termination.code) == ("blocked", "input_rejected")
    assert result.termination.detail == "the message contains a password" and model.requests == []
    (filtered,) = [e for e in await events_of(rt, result.thread_id) if isinstance(e, InputFiltered)]
    assert (filtered.verdict, filtered.plugin) == ("reject", "no-secrets") and len(filtered.message_ids) == 1
    await verified(rt, result.run_id)


async def test_an_input_filter_warning_is_recorded_and_shown_to_the_model() -> None:
    rt, model = runtime([NoSecrets()], ["ok", "ok"])
    result = await rt.run("a", "my email is a@b.c")
    assert result.termination.type == "natural_end"
    assert "Warnings about the user's input:\n- the message mentions an email address" in system_of(model, 0)
    await rt.run("a", "hello again", parent_run_id=result.run_id)  # a run's warnings are its own
    assert "Warnings" not in system_of(model, 1)
    await verified(rt, result.run_id)


# -- request transforms ---------------------------------------------------------------------------


class Cap(Plugin):
    id = "cap"

    def transform_request(self, ctx: PhaseContext, request: ModelRequest) -> ModelRequest:
        return msgspec.structs.replace(request, options={**request.options, "max_tokens": 64})


async def test_a_request_transform_changes_what_is_sent_and_replay_checks_it() -> None:
    rt, model = runtime([Cap()], ["ok"], model_options={"temperature": 0})
    result = await rt.run("a", "go")
    assert model.requests[0].options == {"temperature": 0, "max_tokens": 64}
    await verified(rt, result.run_id)
    changed = AgentSpec(id="a", model="m", tools=["noop"], model_options={"temperature": 0})
    report = await verify_run(rt.store, result.run_id, Runtime(None, agents=[changed], tools=[noop]),  # type: ignore[arg-type]
                              raise_on_divergence=False)
    assert not report.ok and "options changed" in str(report.divergence)


# -- context messages and reminders ---------------------------------------------------------------


class Context(Plugin):
    """Step 1: a persistent keyed message and one shown every other inference; step 3 removes
    the persistent one."""

    def step_start(self, ctx: PhaseContext) -> list[Any]:
        if ctx.step == 1:
            return [AddContext("always here", key="rule", persistent=True),
                    AddContext("every other", key="tick", persistent=True, cooldown=1)]
        if ctx.step == 3:
            return [RemoveContext("rule")]
        return []


async def test_persistent_and_throttled_context_messages() -> None:
    rt, model = runtime([Context()], [Turn.tool("noop")] * 4 + ["done"])
    result = await rt.run("a", "go")
    shown = [system_of(model, k) for k in range(5)]
    assert shown == ["always here\n\nevery other", "always here", "every other", "", "every other"]
    events = await events_of(rt, result.thread_id)
    assert [(e.key, e.text) for e in events if isinstance(e, ContextMessageSet)] == [
        ("rule", "always here"), ("tick", "every other"), ("rule", None)]
    await verified(rt, result.run_id)


@tool
def deploy(env: str) -> ToolResult:
    """Deploy."""
    return ToolResult.failure("cluster unreachable") if env == "prod" else ToolResult.success("deployed")


async def test_reminder_rules_add_a_message_after_matching_calls_with_a_cooldown() -> None:
    reminder = ReminderPlugin([{"name": "failed-deploy", "tool": "deploy(env = prod)", "output": {"status": "error"},
                                "message": "A deploy failed: check the cluster first.", "cooldown": 2},
                               {"tool": "deploy", "output": {"status": "success", "content": "deploy*"},
                                "message": "Tell the user it is deployed."}])
    calls = [Turn.tool("deploy", {"env": "prod"})] * 4 + [Turn.tool("deploy", {"env": "dev"}), "done"]
    rt, model = runtime([reminder], calls, tools=[deploy])
    result = await rt.run("a", "ship it")
    shown = [system_of(model, k) for k in range(6)]
    failed = "A deploy failed: check the cluster first."
    # failures after inferences 1-4: shown at 2, throttled at 3 and 4, shown again at 5
    assert shown == ["", failed, "", "", failed, "Tell the user it is deployed."]
    keys = [e.key for e in await events_of(rt, result.thread_id) if isinstance(e, ContextMessageSet)]
    assert keys == ["reminder:failed-deploy"] * 4 + ["reminder:rule-1"]
    await verified(rt, result.run_id)


async def test_reminder_rules_from_the_agents_section() -> None:
    rt, model = runtime([ReminderPlugin()], [Turn.tool("noop"), "done"],
                        sections={"reminder": {"rules": [{"tool": "no*", "message": "Noop ran."}]}})
    await rt.run("a", "go")
    assert system_of(model, 1) == "Noop ran."


# -- across a suspension and another process --------------------------------------------------------


class Later(Plugin):
    """After a call (here: one that waits for a human), schedule an action for the next
    BeforeInference and leave a one-shot context message: both must survive the wait."""

    id = "later"

    def after_tool_execute(self, ctx: PhaseContext, call: ToolCall, result: ToolResult) -> list[Any]:
        return [Schedule("note", call.name), AddContext("A human looked at this.", key="looked")]

    def action_handlers(self) -> Mapping[str, ActionHandler]:
        return {"note": ActionHandler("before_inference", lambda ctx, name: [AddContext(f"(after {name})")])}


async def test_scheduled_actions_and_context_messages_survive_a_wait_and_a_resume_elsewhere() -> None:
    @tool
    def approve_me(ctx: ToolContext) -> Any:
        """Waits for a human."""
        if ctx.decision is None:
            return ToolResult.pending(ctx.call_id, message="ok?", resume_mode="use_decision_as_tool_result")
        return "approved"

    def make(model: ScriptedModel, store: Any, prefix: str) -> Runtime:
        spec = AgentSpec(id="a", model=model, tools=["approve_me"], plugins=[Later()])
        return Runtime(store, agents=[spec], tools=[approve_me], entropy=DeterministicEntropy(prefix=prefix))

    store = MemoryEventStore()
    first = make(ScriptedModel([Turn.tool("approve_me"), "never"]), store, "one")
    waiting = await first.run("a", "go")
    assert waiting.status == "waiting"
    events = await events_of(first, waiting.thread_id)
    assert [type(e).__name__ for e in events if isinstance(e, (ActionScheduled, ContextMessageSet))] == [
        "ActionScheduled", "ContextMessageSet"]
    second_model = ScriptedModel(["done"])  # another process: its model answers the next inference
    second = make(second_model, store, "two")
    (call_id,) = waiting.run.calls
    res = await second.decide(waiting.run_id, [{"target_id": call_id, "decision_id": "d1", "action": "resume",
                                                "result": "fine"}])
    assert res.handle is not None
    done = await res.handle.result()
    assert done.termination.type == "natural_end"
    # AfterToolExecute ran twice (the call suspended, then completed with the decision): two actions
    # were pending for the inference after the wait; the keyed message is one
    assert system_of(second_model, 0) == "A human looked at this.\n\n(after approve_me)\n\n(after approve_me)"
    await verified(second, waiting.run_id)


class Charge(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    cents: int = pydantic.Field(ge=1)


class Billing(Plugin):
    """Typed payloads: a scheduled `charge` and a `receipt` effect, both `Charge`s."""

    id = "billing"

    def __init__(self, cents: Any) -> None:
        self.cents = cents
        self.receipts: list[Any] = []

    def step_start(self, ctx: PhaseContext) -> list[Any]:
        return [Schedule("charge", {"cents": self.cents})] if ctx.step == 1 else []

    def action_handlers(self) -> Mapping[str, ActionHandler]:
        def charge(ctx: PhaseContext, payload: Charge) -> list[Any]:
            assert isinstance(payload, Charge)
            return [Effect("receipt", payload.model_dump())]

        return {"charge": ActionHandler("step_start", charge, payload=Charge)}

    def effect_handlers(self) -> Mapping[str, Any]:
        return {"receipt": EffectSpec(lambda payload, state: self.receipts.append(payload), payload=Charge)}


async def test_typed_payloads_of_scheduled_actions_and_effects() -> None:
    billing = Billing(250)
    rt, _ = runtime([billing], ["ok"])
    result = await rt.run("a", "go")
    assert result.termination.type == "natural_end" and billing.receipts == [Charge(cents=250)]
    (effect,) = [e for e in await events_of(rt, result.thread_id) if isinstance(e, EffectEmitted)]
    assert effect.payload == {"cents": 250}
    await verified(rt, result.run_id)


async def test_a_payload_that_does_not_validate_ends_the_run_before_anything_runs() -> None:
    billing = Billing(-5)
    rt, model = runtime([billing], ["ok"])
    result = await rt.run("a", "go")
    assert result.termination.code == "plugin_error"
    assert "scheduled action 'charge': invalid payload: cents" in (result.termination.detail or "")
    assert billing.receipts == [] and model.requests == []


def test_plugin_config_schemas_are_in_the_agent_catalog() -> None:
    rt, _ = runtime([MottoPlugin(), Tagger("plain")], ["ok"])
    (entry,) = agent_catalog(rt)
    (plugin,) = entry["plugins"]
    assert (plugin["id"], plugin["config_key"]) == ("motto", "motto")
    assert plugin["config_schema"]["properties"]["times"] == {"default": 1, "minimum": 1, "title": "Times",
                                                             "type": "integer"}
    plain, _ = runtime([Tagger("plain")], ["ok"])
    assert "plugins" not in agent_catalog(plain)[0]


# -- hooks of one phase run concurrently ----------------------------------------------------------


class Rendezvous(Plugin):
    """Two of these meet in before_inference: each sets its own event and waits for the other's,
    so they finish only if their hooks run at the same time."""

    def __init__(self, name: str, mine: asyncio.Event, theirs: asyncio.Event, fail: bool = False) -> None:
        self.id, self.mine, self.theirs, self.fail = name, mine, theirs, fail

    async def before_inference(self, ctx: PhaseContext) -> list[Any]:
        self.mine.set()
        await self.theirs.wait()
        if self.fail:
            raise RuntimeError(f"{self.id} failed")
        return [AddContext(f"[{self.id}]"), PatchState(ops=({"op": "add", "path": f"/{self.id}", "value": True},))]


async def test_async_hooks_of_a_phase_run_concurrently_and_answer_in_registration_order() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    # registered second, it finishes first (the first waits for it): the order stays registration order
    rt, model = runtime([Rendezvous("first", a, b), Rendezvous("second", b, a)], ["ok"])
    async with asyncio.timeout(5):
        result = await rt.run("a", "go")
    assert system_of(model, 0) == "[first]\n\n[second]"
    patched = [e.ops[0]["path"] for e in await events_of(rt, result.thread_id) if isinstance(e, StatePatched)]
    assert patched == ["/first", "/second"]
    await verified(rt, result.run_id)


async def test_concurrent_hooks_that_fail_raise_the_first_registered_failure() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    rt, model = runtime([Rendezvous("first", a, b, fail=True), Rendezvous("second", b, a, fail=True)], ["ok"])
    async with asyncio.timeout(5):
        result = await rt.run("a", "go")
    assert result.termination.type == "error" and "first failed" in (result.termination.detail or "")
    assert model.requests == []
