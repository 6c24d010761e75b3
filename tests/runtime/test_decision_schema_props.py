"""A decision answers its ticket (`agentlog.runtime.loop.hitl.check_result`), as properties of the
`Runtime` every door reaches (the gateway and the workers check decisions with the same function):

- a `resume` whose result does not validate against the suspended call's `response_schema` is
  refused with `InvalidDecision` (`invalid_decision`, naming the field) and changes nothing: the
  log holds the same commits, the run still waits on the same call, the tool never ran;
- one that validates is recorded; a permission `ask` then runs its tool only on `approved: true`.

Both for the permission plugin's approvals and for tickets an app's tool defines. Pure: the
in-memory store, a fresh runtime per example.
"""

from __future__ import annotations

import asyncio
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, InvalidDecision, PermissionPlugin, Runtime, ToolResult, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.permission import APPROVAL_SCHEMA

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
#: Answers to an approval: mostly near misses (an object with or without `approved`, of any type).
APPROVALS = (
    st.fixed_dictionaries({"approved": JSON}, optional={"reason": JSON, "always": st.booleans()})
    | st.fixed_dictionaries({}, optional={"ok": JSON, "approve": JSON, "reason": st.text(max_size=6)})
    | JSON
)
TYPES = ("string", "integer", "boolean", "object", "array", "number", "null")
#: The response schemas an app's ticket may declare: an object with typed properties, some required.
SCHEMAS = st.dictionaries(st.sampled_from(["name", "color", "count", "ok"]), st.sampled_from(TYPES),
                          min_size=1, max_size=3).flatmap(
    lambda props: st.fixed_dictionaries({
        "type": st.just("object"),
        "properties": st.just({k: {"type": t} for k, t in props.items()}),
        "required": st.lists(st.sampled_from(sorted(props)), unique=True),
    }))
ANSWERS = (st.dictionaries(st.sampled_from(["name", "color", "count", "ok", "x"]), JSON, max_size=3) | JSON)

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def valid(result: Any, schema: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(result)


async def _log(store: MemoryEventStore, thread_id: str) -> list[Any]:
    return [sc async for sc in store.read_thread(thread_id)]


async def _decide_once(rt: Runtime, store: MemoryEventStore, result: Any, schema: dict[str, Any]
                       ) -> tuple[bool, Any]:
    """Start the run (it waits on one call), decide `result` once. Returns (accepted, the final
    RunResult or None) after checking that a refusal changed nothing."""
    waiting = await rt.run("a", "go")
    assert waiting.status == "waiting"
    (call_id,) = waiting.run.calls
    before = await _log(store, waiting.thread_id)
    try:
        decided = await rt.decide(waiting.run_id, [{"target_id": call_id, "decision_id": "d1", "action": "resume",
                                                    "result": result}])
    except InvalidDecision as exc:
        assert not valid(result, schema), (result, exc)
        assert exc.code == "invalid_decision" and exc.detail and exc.detail[0]["field"].startswith("result"), exc
        assert await _log(store, waiting.thread_id) == before  # not one commit more
        again = await rt.run_view(waiting.run_id)
        assert again.status == "waiting" and again.calls[call_id].status == "suspended"
        return False, None
    assert valid(result, schema), result
    assert decided.handle is not None
    return True, await decided.handle.result()


@SETTINGS
@given(APPROVALS)
def test_an_approval_runs_its_tool_only_on_approved_true(result: Any) -> None:
    ran: list[str] = []

    @tool
    def deploy() -> str:
        """Deploy."""
        ran.append("deploy")
        return "deployed"

    async def go() -> None:
        store = MemoryEventStore()
        spec = AgentSpec(id="a", model=ScriptedModel([Turn.tool("deploy", {}), "done"]), tools=["deploy"],
                         plugins=[PermissionPlugin(ask=["deploy"])])
        rt = Runtime(store, agents=[spec], tools=[deploy])
        accepted, final = await _decide_once(rt, store, result, APPROVAL_SCHEMA)
        approved = isinstance(result, dict) and result.get("approved") is True
        assert ran == (["deploy"] if accepted and approved else []), (result, ran)
        if accepted:
            assert final.status == "done"

    asyncio.run(go())


@SETTINGS
@given(SCHEMAS, ANSWERS)
def test_an_apps_ticket_takes_only_answers_its_schema_accepts(schema: dict[str, Any], result: Any) -> None:
    @tool
    def ask() -> ToolResult:
        """Ask the human, with the ticket's schema."""
        return ToolResult.pending("t1", action="input", response_schema=schema,
                                  resume_mode="use_decision_as_tool_result")

    async def go() -> None:
        store = MemoryEventStore()
        spec = AgentSpec(id="a", model=ScriptedModel([Turn.tool("ask", {}), "done"]), tools=["ask"])
        rt = Runtime(store, agents=[spec], tools=[ask])
        accepted, final = await _decide_once(rt, store, result, schema)
        if accepted:
            (call,) = final.run.calls.values()
            assert call.status == "succeeded" and call.result == result

    asyncio.run(go())


@pytest.mark.parametrize(("result", "field"), [
    (None, "result"), ({"ok": "yes"}, "result.approved"), ({"approved": "yes"}, "result.approved"),
    (True, "result"), ({"approved": True, "reason": 3}, "result.reason")])
def test_the_refusal_names_the_failing_field(result: Any, field: str) -> None:
    @tool
    def deploy() -> str:
        """Deploy."""
        return "deployed"

    async def go() -> None:
        spec = AgentSpec(id="a", model=ScriptedModel([Turn.tool("deploy", {}), "done"]), tools=["deploy"],
                         plugins=[PermissionPlugin(ask=["deploy"])])
        rt = Runtime(MemoryEventStore(), agents=[spec], tools=[deploy])
        waiting = await rt.run("a", "go")
        (call_id,) = waiting.run.calls
        with pytest.raises(InvalidDecision) as refused:
            await rt.decide(waiting.run_id, [{"target_id": call_id, "decision_id": "d1", "action": "resume",
                                              "result": result}])
        assert refused.value.detail is not None and refused.value.detail[0]["field"] == field
        assert f"{field}:" in str(refused.value) and call_id in str(refused.value)
        # a cancel takes no result: the call is cancelled, the tool never runs
        decided = await rt.decide(waiting.run_id, [{"target_id": call_id, "decision_id": "d2", "action": "cancel"}])
        assert decided.handle is not None
        final = await decided.handle.result()
        assert final.run.calls[call_id].status == "cancelled"

    asyncio.run(go())
