"""A run's client input besides messages (`agentlog.runtime.inputs.run_input`): overrides within the
agent's policy, the client's context in the prompt, its state merged into the thread's, its
forwarded props recorded; all in the run-start commit, so resume and verified replay use them.

Pure units first (the policy, the state merge, the AG-UI parsing), then a runtime on a real
nats-server: what the run records, what the model is sent, and that `verify_run` passes.
The deployed paths (AG-UI with the official client, POST /v1/runs, NATS, serve and split) are
in tests/gateway/test_agui_run_input.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.events import ContextEntry, RunOverrides, RunStarted, StatePatched
from agentlog.gateway.adapters.agui.translator import agui_run_input, parse_run_input
from agentlog.gateway.adapters.common import AdapterInputError
from agentlog.runtime import AgentSpec, DeterministicEntropy, PermissionPlugin, RunRequest, Runtime, tool
from agentlog.runtime.inputs.run_input import (
    CONTEXT_HEADING,
    OverrideNotAllowed,
    OverridePolicy,
    OverrideScope,
    RunInput,
    as_run_input,
    check_overrides,
    client_state_of,
    client_state_ops,
    context_text,
)
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import plan_replay, verify_run

from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture)

POLICY = OverridePolicy(models=["small"], system_prompt=True, options=["temperature", "max_tokens"])


# -- the policy ----------------------------------------------------------------------------------


def test_override_policy_allows_what_it_names() -> None:
    check_overrides(RunOverrides(model="small", system_prompt="be brief", options={"temperature": 0.1}),
                    POLICY, "big")
    check_overrides(RunOverrides(model="big"), OverridePolicy(), "big")  # the agent's own model: always
    check_overrides(None, OverridePolicy(), "big")


@pytest.mark.parametrize(("overrides", "field"), [
    (RunOverrides(model="huge"), "model"),
    (RunOverrides(options={"top_p": 0.5}), "options"),
    (RunOverrides(options={"temperature": 0, "seed": 1}), "options"),
])
def test_override_refused_outside_policy(overrides: RunOverrides, field: str) -> None:
    with pytest.raises(OverrideNotAllowed) as err:
        check_overrides(overrides, POLICY, "big")
    assert err.value.code == "override_not_allowed" and err.value.field == field


def test_override_system_prompt_refused_by_default() -> None:
    with pytest.raises(OverrideNotAllowed, match="system prompt"):
        check_overrides(RunOverrides(system_prompt="x"), OverridePolicy(models=["small"]), "big")


def test_run_input_override_shapes() -> None:
    assert as_run_input(None) is None
    assert as_run_input({"overrides": {}}) is None  # nothing asked: nothing recorded
    got = as_run_input({"overrides": {"model": "small"}, "context": [{"description": "d", "value": "v"}]})
    assert got == RunInput(overrides=RunOverrides(model="small"), context=[ContextEntry(description="d", value="v")])
    with pytest.raises(ValueError, match="run input"):
        as_run_input({"overrides": {"model": 3}})
    with pytest.raises(ValueError, match="run input"):
        as_run_input({"surprise": 1})


# -- the state merge and the context text ---------------------------------------------------------


def test_state_merge_sets_changed_keys_only() -> None:
    thread = {"a": 1, "b": {"x": 1}, "keep": True}
    ops = client_state_ops(thread, {"a": 1, "b": {"x": 2}, "n/ew": [1]})
    assert ops == [{"op": "add", "path": "/b", "value": {"x": 2}},
                   {"op": "add", "path": "/n~1ew", "value": [1]}]
    assert client_state_ops(thread, {}) == [] and client_state_ops(thread, None) == []
    # verified replay gets the client's state back from the recorded ops
    assert client_state_ops(thread, client_state_of(ops)) == ops


def test_context_text_is_deterministic() -> None:
    assert context_text([]) == ""
    assert context_text([ContextEntry(description="page", value="/billing"),
                         ContextEntry(description="user", value="ada")]) == (
        f"{CONTEXT_HEADING}\n- page: /billing\n- user: ada")


# -- AG-UI: RunAgentInput -> run input ------------------------------------------------------------


def _body(**extra: Any) -> dict[str, Any]:
    return {"threadId": "t1", "runId": "r1", "state": {}, "messages": [{"id": "m1", "role": "user", "content": "hi"}],
            "tools": [], "context": [], "forwardedProps": {}, **extra}


def test_agui_run_input_from_forwarded_props_and_context() -> None:
    req = parse_run_input(_body(
        state={"todo": ["a"]}, context=[{"description": "page", "value": "/home"}],
        forwardedProps={"model": "small", "systemPrompt": "be brief", "config": {"temperature": 0.2}, "tab": 3}))
    assert req.run_input == {
        "overrides": {"model": "small", "system_prompt": "be brief", "options": {"temperature": 0.2}},
        "context": [{"description": "page", "value": "/home"}],
        "forwarded_props": {"model": "small", "systemPrompt": "be brief", "config": {"temperature": 0.2}, "tab": 3},
        "state": {"todo": ["a"]},
    }
    assert parse_run_input(_body()).run_input is None  # the official client's defaults add nothing


@pytest.mark.parametrize(("props", "field"), [
    ({"model": 3}, "forwardedProps.model"),
    ({"model": ""}, "forwardedProps.model"),
    ({"systemPrompt": ["x"]}, "forwardedProps.systemPrompt"),
    ({"config": "hot"}, "forwardedProps.config"),
])
def test_agui_override_bad_shape_is_input_error(props: dict[str, Any], field: str) -> None:
    with pytest.raises(AdapterInputError) as err:
        parse_run_input(_body(forwardedProps=props))
    assert err.value.field == field


def test_agui_state_must_be_an_object() -> None:
    with pytest.raises(AdapterInputError) as err:
        agui_run_input([], [1, 2], {})
    assert err.value.field == "state"
    assert agui_run_input([], None, None) is None


# -- a runtime on a real store: recorded, sent, verified ------------------------------------------


def _runtime(store: Any, big: ScriptedModel, small: ScriptedModel) -> tuple[Runtime, AgentSpec]:
    agent = AgentSpec(id="helper", model="big", system_prompt="You help.", model_options={"temperature": 1.0},
                      overrides=POLICY)
    rt = Runtime(store, agents=[agent], models={"big": big, "small": small}, entropy=DeterministicEntropy())
    return rt, agent


async def test_run_input_recorded_sent_and_replayed(store: Any) -> None:
    big, small = ScriptedModel([Turn.text("from big")]), ScriptedModel([Turn.text("from small")])
    rt, agent = _runtime(store, big, small)
    first = await rt.run("helper", "hi", run_input={"state": {"mode": "draft"}})
    result = await rt.run("helper", "again", thread_id=first.thread_id, parent_run_id=first.run_id, run_input={
        "overrides": {"model": "small", "system_prompt": "Be brief.", "options": {"max_tokens": 50}},
        "context": [{"description": "page", "value": "/billing"}],
        "forwarded_props": {"tab": 3}, "state": {"mode": "final", "extra": [1]},
    })
    assert result.status == "done" and len(big.requests) == 1 and len(small.requests) == 1
    request = small.requests[0]
    assert request.model == "small"
    assert request.options == {"temperature": 1.0, "max_tokens": 50}
    assert request.messages[0].content == f"Be brief.\n\n{CONTEXT_HEADING}\n- page: /billing"

    commits = await logged(rt, result)
    started = [e for e in events_of(commits, "RunStarted") if e.run_id == result.run_id][0]
    assert isinstance(started, RunStarted)
    assert started.overrides == RunOverrides(model="small", system_prompt="Be brief.", options={"max_tokens": 50})
    assert started.context == [ContextEntry(description="page", value="/billing")]
    assert started.forwarded_props == {"tab": 3}
    patches = [e for e in events_of(commits, "StatePatched") if isinstance(e, StatePatched) and e.source == "client"]
    assert [p.ops for p in patches] == [[{"op": "add", "path": "/mode", "value": "draft"}],
                                        [{"op": "add", "path": "/mode", "value": "final"},
                                         {"op": "add", "path": "/extra", "value": [1]}]]
    # the state patch is in the run-start commit, with RunStarted
    start_commit = next(sc for sc in commits if any(e is started for e in sc.commit.events))
    assert any(isinstance(e, StatePatched) for e in start_commit.commit.events)

    plan = plan_replay(commits, result.run_id)
    assert plan.run_input is not None and plan.run_input.state == {"mode": "final", "extra": [1]}
    for run in (first, result):
        report = await verify_run(commits, run.run_id, rt)
        assert report.ok, report


async def test_override_not_allowed_writes_nothing(store: Any) -> None:
    rt, _ = _runtime(store, ScriptedModel([Turn.text("x")]), ScriptedModel([Turn.text("y")]))
    with pytest.raises(OverrideNotAllowed):
        await rt.start("helper", "hi", thread_id="override-refused", run_input={"overrides": {"model": "huge"}})
    assert [sc async for sc in store.read_thread("override-refused")] == []


async def test_override_recorded_decides_replay(store: Any) -> None:
    """The recorded override decides the request, not the agent's current default: a replay
    with another default system prompt still sends the recorded one and verifies."""
    rt, agent = _runtime(store, ScriptedModel([Turn.text("x")]), ScriptedModel([Turn.text("y")]))
    result = await rt.run("helper", "hi", run_input={"overrides": {"system_prompt": "Recorded."}})
    commits = await logged(rt, result)
    changed = AgentSpec(**{**agent.model_dump(), "system_prompt": "Another default."})
    report = await verify_run(commits, result.run_id, Runtime(store, agents=[changed], models={
        "big": ScriptedModel([Turn.text("x")]), "small": ScriptedModel([Turn.text("y")])}))
    assert report.ok, report


async def test_override_kept_when_another_runtime_resumes(store: Any) -> None:
    """A run waiting for an approval is resumed by another runtime (another worker: nothing in
    memory): its next inference still gets the recorded model, options, prompt and context."""

    @tool
    def deploy(env: str) -> str:
        """Deploy (needs an approval)."""
        return f"deployed {env}"

    def agent() -> AgentSpec:
        return AgentSpec(id="helper", model="big", system_prompt="You help.", tools=["deploy"],
                         plugins=[PermissionPlugin(ask=["deploy"])], overrides=POLICY)

    script = [Turn.tool("deploy", {"env": "prod"}, id="c1"), "deployed"]
    first_small = ScriptedModel(script, position="conversation")
    one = Runtime(store, agents=[agent()], tools=[deploy],
                  models={"big": ScriptedModel(["no"]), "small": first_small})
    waiting = await one.run("helper", "deploy it", run_input={
        "overrides": {"model": "small", "system_prompt": "Be careful.", "options": {"temperature": 0}},
        "context": [{"description": "ticket", "value": "OPS-1"}]})
    assert waiting.status == "waiting"

    other_small = ScriptedModel(script, position="conversation")
    two = Runtime(store, agents=[agent()], tools=[deploy], models={"big": ScriptedModel(["no"]), "small": other_small})
    decided = await two.decide(waiting.run_id, [{"target_id": "c1", "decision_id": "d1", "action": "resume",
                                                            "result": {"approved": True}}])
    assert decided.handle is not None
    async with asyncio.timeout(30):
        done = await decided.handle.result()
    assert done.status == "done"
    (request,) = other_small.requests
    assert request.model == "small" and request.options == {"temperature": 0}
    assert request.messages[0].content == f"Be careful.\n\n{CONTEXT_HEADING}\n- ticket: OPS-1"


async def test_override_refused_by_the_worker_when_the_gateway_knows_no_policy(nats_server: Any) -> None:
    """A gateway without the app cannot check a request's overrides: the worker refuses the
    command with the same code (dead-lettered, answered at once), and writes nothing."""
    from agentlog.eventlog.jetstream.store import JetStreamEventStore
    from agentlog.gateway.operations.dispatch import CommandFailed, QueueDispatcher
    from agentlog.runtime.workers.worker import Worker

    from tests.apps.app_forms import factory_runtime

    store = await JetStreamEventStore.connect(nats_server.url, request_timeout=2.0)
    worker = Worker(store, runtime=factory_runtime(store), ack_wait=5.0, fetch_timeout=0.2)
    await worker.start()
    try:
        gateway = QueueDispatcher(store.nc, store, agents=None, timeout=20.0)
        with pytest.raises(CommandFailed) as err:
            await gateway.start_run(RunRequest(agent_id="echo", messages="hi", thread_id="t-override-worker",
                                               run_input={"overrides": {"options": {"temperature": 2}}}))
        assert err.value.code == "override_not_allowed"
        assert [sc async for sc in store.read_thread("t-override-worker")] == []
        # the same gateway knowing the policy refuses it itself, before anything is queued
        knowing = QueueDispatcher(store.nc, store, timeout=20.0,
                                  override_policies={"echo": OverrideScope("echo-model", OverridePolicy(), ["echo"])})
        with pytest.raises(OverrideNotAllowed):
            await knowing.start_run(RunRequest(agent_id="echo", messages="hi", thread_id="t-override-worker",
                                               run_input={"overrides": {"model": "other"}}))
    finally:
        await worker.stop(timeout=2.0)
        await store.close()
