"""`agentlog.runtime.inputs.admission.check_request` (pure): its size check is sound against the store it guards:
whatever it lets through, the run-start commit `Runtime.start` then appends fits (the store never
has to refuse it), for any message text, ASCII or not, near the limit. What it refuses is
refused by `Runtime.start` with the same `CommitTooLarge` (the gateway's 413 = serve's 413)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.errors import CommitTooLarge
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, RunRequest, Runtime
from agentlog.runtime.inputs.admission import check_request
from agentlog.runtime.models.scripted import ScriptedModel, Turn

LIMIT = 4096


def _outcome(fn) -> str:  # type: ignore[no-untyped-def]
    try:
        fn()
    except CommitTooLarge:
        return "too_large"
    return "ok"


async def _start(text: str, resource_id: str | None) -> str:
    store = MemoryEventStore(max_payload=LIMIT)
    rt = Runtime(store, agents=[AgentSpec(id="a", model=ScriptedModel([Turn.text("ok")]))])
    try:
        handle = await rt.start("a", text, resource_id=resource_id)
    except CommitTooLarge:
        return "too_large"
    await handle.result()
    return "ok"


@settings(max_examples=60)
@given(st.text(min_size=LIMIT // 2 - 200, max_size=LIMIT - 300), st.none() | st.text(max_size=40))
def test_size_check_is_sound_and_serve_agrees(text: str, resource_id: str | None) -> None:
    text = text.encode("utf-8", "replace").decode("utf-8")  # hypothesis may draw lone surrogates
    checked = _outcome(lambda: check_request(RunRequest(agent_id="a", messages=text, resource_id=resource_id),
                                              max_payload=LIMIT))
    assert asyncio.run(_start(text, resource_id)) == checked
