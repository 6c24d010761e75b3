"""`agentlog.eventlog.cancel.cancel_wins`: a cancel of the caller is never lost in a call that waits
with `asyncio.wait_for`, as nats-py's `request`, `next_msg` / `fetch` and KV / Object Store reads
do. On Python 3.11 such a call returns its result when the result arrives in the same loop step as
the cancel (the cancel is gone); here that step is made to happen every time."""

from __future__ import annotations

import asyncio
import sys

import pytest

from agentlog.eventlog.cancel import cancel_wins


async def _like_next_msg(queue: asyncio.Queue[str]) -> str:
    """What nats-py's `Subscription.next_msg` does: a task around `wait_for(queue.get())`."""
    return await asyncio.create_task(asyncio.wait_for(queue.get(), 30))


async def _cancel_as_the_message_arrives(reader: asyncio.Task[str], queue: asyncio.Queue[str]) -> None:
    for _ in range(3):  # the reader is now blocked in the get (no time passes)
        await asyncio.sleep(0)
    queue.put_nowait("the next message")  # wakes the get...
    await asyncio.sleep(0)  # ...which completes; the reader has not seen it yet
    reader.cancel()  # and the cancel lands now


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps the cancel from Python 3.12 on")
async def test_a_plain_await_loses_the_cancel() -> None:
    """The hazard itself (so that the test below is known to meet it)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    reader = asyncio.create_task(_like_next_msg(queue))
    await _cancel_as_the_message_arrives(reader, queue)
    assert await reader == "the next message"  # cancelled, yet it returned


async def test_cancel_wins_keeps_the_cancel() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    reader = asyncio.create_task(cancel_wins(_like_next_msg(queue)))
    await _cancel_as_the_message_arrives(reader, queue)
    with pytest.raises(asyncio.CancelledError):
        await reader


async def test_cancel_wins_returns_the_result_or_raises_the_error() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    queue.put_nowait("m")
    assert await cancel_wins(_like_next_msg(queue)) == "m"
    with pytest.raises(TimeoutError):
        await cancel_wins(asyncio.wait_for(queue.get(), 0.01))
