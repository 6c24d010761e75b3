"""`RunSource.items`: the merge rule for live deltas that arrive after their commit (pure: the
queue is fed by hand, as the live subscription and the log follower would)."""

from __future__ import annotations

import pytest

from agentlog.adapters.source import _END, RunSource
from agentlog.log.events import Position, RunFinished, StepStarted, Termination, ToolCallCompleted
from agentlog.runtime import CommittedEvent


def ce(seq: int, ev: object) -> CommittedEvent:
    return CommittedEvent(Position(seq, 0), ev, 0)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_late_live_items_are_dropped_and_the_source_ends_at_the_stop() -> None:
    src = RunSource(None, None, "t1", "r1", live=False)
    early = {"type": "text_delta", "step": 1, "text": "a"}
    late = {"type": "text_delta", "step": 1, "text": "b"}
    next_step = {"type": "text_delta", "step": 2, "text": "c"}
    progress_late = {"type": "tool_progress", "call_id": "c1", "data": 1}
    progress_ok = {"type": "tool_progress", "call_id": "c2", "data": 1}
    fed = [early, ce(2, StepStarted(step=1)), late, ce(3, ToolCallCompleted(call_id="c1", outcome="succeeded")),
           progress_late, progress_ok, next_step, ce(4, RunFinished(termination=Termination(type="natural_end"))),
           _END, {"type": "text_delta", "step": 9, "text": "after the end"}]
    for item in fed:
        src._queue.put_nowait(item)
    got = [item async for item in src.items()]
    assert got == [early, fed[1], fed[3], progress_ok, next_step, fed[7]]
    await src.close()
