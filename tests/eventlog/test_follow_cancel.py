"""A follow is stopped by cancelling the task that reads it (the SSE hub's feed when its last
follower leaves, a dispatcher done waiting). The cancel must win even when the follow's next
message arrives in the same loop step: otherwise the follow runs on, and whoever awaits its end
(the hub's last leaver, so that follower's HTTP stream) waits forever. That race hung about one
`GET /v1/runs/{id}/events?follow=true` in a few hundred decide-then-follow cycles
(tests/e2e/test_e2e_approval.py, scripts/bench_e2e.py); here it is made to happen every time."""

from __future__ import annotations

import asyncio

import pytest

from agentlog.eventlog.jetstream.follow import get_within


async def test_a_cancel_that_meets_the_next_message_still_cancels() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    reader = asyncio.create_task(get_within(queue, 30.0))
    await asyncio.sleep(0)  # one loop step: the reader is now blocked in the get (no time passes)
    queue.put_nowait("the next message")  # wakes the reader...
    reader.cancel()  # ...and the cancel lands in the same step
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert queue.get_nowait() == "the next message"  # nothing is lost for a later reader


async def test_get_within_returns_the_item_or_times_out() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    queue.put_nowait(1)
    assert await get_within(queue, 30.0) == 1
    with pytest.raises(TimeoutError):
        await get_within(queue, 0.01)
