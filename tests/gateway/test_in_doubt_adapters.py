"""A call in doubt surfaces in the protocol adapters as any suspension does: an AG-UI interrupt
(reason `agentlog:in_doubt`, the ticket's response schema) and an AI SDK
`data-agentlog-interrupt` part; translated from the log of a real in-doubt run. The agent
catalog shows which tools are not idempotent."""

from __future__ import annotations

from typing import Any

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.gateway.adapters.agui import translator as agui
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.runtime import agent_catalog
from agentlog.runtime.loop.in_doubt import IN_DOUBT_SCHEMA

from tests.support.in_doubt import Payments, interrupted, resumed
from tests.support.runtime import thread_log


async def _in_doubt_run() -> tuple[list[Any], Any]:
    store = MemoryEventStore()
    await interrupted(store, thread="t-ad", run="r-ad")
    _, rt, result = await resumed(store, "r-ad")
    assert result.status == "waiting"
    events = [ev for sc in await thread_log(store, "t-ad") for ev in sc.commit.events]
    return events, await rt.run_view("r-ad")


async def test_in_doubt_call_is_an_agui_interrupt_with_its_three_answers() -> None:
    events, view = await _in_doubt_run()
    [interrupt] = agui.open_interrupts(view)
    assert interrupt.id == "c-pay" and interrupt.reason == "agentlog:in_doubt"
    assert interrupt.response_schema == IN_DOUBT_SCHEMA
    assert interrupt.metadata is not None and interrupt.metadata["agentlog"]["action"] == "in_doubt"
    out = agui.translate("t-ad", "r-ad", events)
    finished = [e for e in out if type(e).__name__ == "RunFinishedEvent"]
    assert finished and "c-pay" in as_json(finished[-1])


async def test_in_doubt_call_is_an_aisdk_interrupt_part() -> None:
    events, _ = await _in_doubt_run()
    parts = aisdk.translate("t-ad", "r-ad", events)
    [part] = [p for p in parts if p["type"] == "data-agentlog-interrupt"]
    assert part["id"] == "c-pay"
    assert part["data"]["action"] == "in_doubt" and part["data"]["responseSchema"] == IN_DOUBT_SCHEMA
    assert part["data"]["reason"] == "agentlog:in_doubt"
    assert not any(p["type"] == "tool-approval-request" for p in parts)  # not a yes/no


def as_json(event: Any) -> str:
    return event.model_dump_json(by_alias=True)


def test_in_doubt_tool_declaration_defaults_to_idempotent_and_shows_in_the_catalog() -> None:
    app = Payments()
    pay, lookup = app.tools
    assert (pay.idempotent, lookup.idempotent) == (False, True)
    catalog = agent_catalog(app.runtime(MemoryEventStore()))
    entries = {t["name"]: t for t in catalog[0]["tools"]}
    assert entries["pay"]["idempotent"] is False
    assert "idempotent" not in entries["lookup"]
