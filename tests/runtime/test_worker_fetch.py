"""How a worker takes commands from the queue (`Worker._fetch_loop`, pure: a stand-in
subscription): one fetch asks for at most `FETCH_BATCH` commands whatever its free slots, so a
backlog is shared by the workers instead of taken whole by the first one that asks."""

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
