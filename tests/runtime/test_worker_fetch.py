"""How a worker takes commands from the queue, pure (a stand-in subscription and queue answers):
one fetch asks for at most `FETCH_BATCH` commands whatever its free slots, so a backlog is shared
by the workers instead of taken whole by the first one that asks; a command behind an earlier one
of its thread is kept while it asks the queue again (`Worker._its_turn`), and given up after
`order_hold` or when the worker stops."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from agentlog.runtime.workers.worker import DEFAULT_CONCURRENCY, FETCH_BATCH, Worker

pytestmark = pytest.mark.asyncio


class _Store:
    nc = cast(Any, type("NC", (), {"jetstream": lambda self, **_: None})())


class _Subscription:
    """Answers every fetch with nothing, and stops the worker after `calls` of them."""

    def __init__(self, worker: Worker, calls: int) -> None:
        self.worker = worker
        self.calls = calls
        self.asked: list[int] = []

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.asked.append(batch)
        if len(self.asked) == self.calls:
            self.worker._stopping.set()
        return []


@pytest.mark.parametrize(("concurrency", "most"), [(DEFAULT_CONCURRENCY, FETCH_BATCH), (3, 3), (1, 1)])
async def test_a_fetch_asks_for_at_most_a_batch_of_the_free_slots(concurrency: int, most: int) -> None:
    assert DEFAULT_CONCURRENCY > FETCH_BATCH
    worker = Worker(cast(Any, _Store()), runtime=cast(Any, object()), concurrency=concurrency)
    sub = _Subscription(worker, calls=3)
    worker._sub = sub
    async with asyncio.timeout(10):
        await worker._fetch_loop()
    assert sub.asked == [most] * 3
    assert worker._slots._value == concurrency  # every slot a fetch took and did not fill is back


#: A command held behind an earlier one, as the worker received it (no `PREDECESSOR`).
_held = cast(Any, type("Msg", (), {"headers": None})())


def _answering(worker: Worker, answers: list[bool]) -> list[int]:
    """Make the worker's queue question answer `answers` in turn (then "none earlier")."""
    asked: list[int] = []

    async def earlier_pending(thread_id: str, seq: int) -> bool:
        asked.append(seq)
        return answers.pop(0) if answers else False

    worker._earlier_pending = earlier_pending  # type: ignore[method-assign]
    return asked


async def test_a_command_behind_an_earlier_one_is_kept_until_its_turn() -> None:
    worker = Worker(cast(Any, _Store()), runtime=cast(Any, object()), order_hold=30.0)
    asked = _answering(worker, [True, True, True])
    async with asyncio.timeout(10):
        assert await worker._its_turn(_held, "t", 7)
    assert asked == [7, 7, 7, 7]  # asked again until no earlier command was left


@pytest.mark.parametrize("stopping", [False, True])
async def test_a_held_command_is_given_up_after_the_hold_or_when_the_worker_stops(stopping: bool) -> None:
    worker = Worker(cast(Any, _Store()), runtime=cast(Any, object()), order_hold=0.0 if not stopping else 30.0)
    if stopping:
        worker._stopping.set()
    asked = _answering(worker, [True] * 100)
    async with asyncio.timeout(10):
        assert not await worker._its_turn(_held, "t", 7)
    assert asked == [7]  # nak'ed (by the caller) at once: no second question
