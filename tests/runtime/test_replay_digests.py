"""Per-part request digests (`InferenceCompleted.request_digests`) and verify_run's default of
answering tools from the log.

- property: change exactly one part of a model request and `differing_parts` names exactly it;
- a log recorded before the per-part digests existed still verifies (and a changed prompt still
  diverges, just without naming the part);
- `verify_run` without `tools_from_log` executes no tool (Temporal's replayer never re-runs
  activities).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from agentlog.eventlog.events import InferenceCompleted, Message, StoredCommit
from agentlog.runtime.models.base import ModelRequest, ToolSpec
from agentlog.runtime.replay.verify import (
    REQUEST_PARTS,
    NonDeterminismError,
    differing_parts,
    request_part_digests,
    verify_run,
)

from tests.runtime.test_replay import app, record
from tests.support.runtime import store  # noqa: F401  (fixture)

BASE = ModelRequest(model="m", messages=[Message(id="system", role="system", content="Be exact."),
                                         Message(id="u1", role="user", content="hi")],
                    tools=[ToolSpec(name="add")], options={"temperature": 0})

text = st.text(min_size=1, max_size=8)
CHANGES = {
    "model": text.map(lambda t: msgspec.structs.replace(BASE, model="m" + t)),
    "system": text.map(lambda t: msgspec.structs.replace(BASE, messages=[
        Message(id="system", role="system", content="Be exact." + t), BASE.messages[1]])),
    "messages": text.map(lambda t: msgspec.structs.replace(BASE, messages=[
        BASE.messages[0], Message(id="u1", role="user", content="hi" + t)])),
    "tools": text.map(lambda t: msgspec.structs.replace(BASE, tools=[ToolSpec(name="add", description=t)])),
    "options": st.integers(1, 9).map(lambda n: msgspec.structs.replace(BASE, options={"temperature": n})),
}


@given(st.sampled_from(sorted(CHANGES)).flatmap(lambda part: st.tuples(st.just(part), CHANGES[part])))
def test_one_changed_part_is_named_alone(change: tuple[str, ModelRequest]) -> None:
    part, request = change
    assert differing_parts(request_part_digests(BASE), request_part_digests(request)) == [REQUEST_PARTS[part]]
    assert differing_parts(request_part_digests(request), request_part_digests(request)) == []


def _without_part_digests(log: list[StoredCommit]) -> list[StoredCommit]:
    def strip(event: Any) -> Any:
        return msgspec.structs.replace(event, request_digests=None) if isinstance(event, InferenceCompleted) else event

    return [msgspec.structs.replace(sc, commit=msgspec.structs.replace(
        sc.commit, events=[strip(e) for e in sc.commit.events])) for sc in log]


async def test_a_log_without_part_digests_still_verifies(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    assert all(e.request_digests for sc in log for e in sc.commit.events if isinstance(e, InferenceCompleted))
    old = _without_part_digests(log)
    async with asyncio.timeout(10):
        assert (await verify_run(old, result.run_id, app(recorder, **spec))).ok
        report = await verify_run(old, result.run_id, app(recorder, **{**spec, "system_prompt": "Be creative."}),
                                  raise_on_divergence=False)
    assert not report.ok and report.divergence is not None
    assert report.divergence.detail == "the model request differs from the recorded one"


async def test_verify_run_answers_every_tool_from_the_log_by_default(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    async with asyncio.timeout(10):
        report = await verify_run(store, result.run_id, app(recorder, **spec))
    assert report.ok and report.tools_executed == 0 and report.tools_from_log == 3
    try:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, **{**spec, "system_prompt": "Other."}))
    except NonDeterminismError as exc:
        assert str(exc).endswith("system prompt (incl. plugin context) changed)")
    else:
        raise AssertionError("a changed prompt must diverge")
