"""How a worker takes commands from the queue, pure (a stand-in subscription and queue answers):
one fetch asks for at most `FETCH_BATCH` commands whatever its free slots, so a backlog is shared
by the workers instead of taken whole by the first one that asks; a command behind an earlier one
of its thread is kept while it asks the queue again (`agentlog.runtime.workers.order`), and given
up after `order_hold` or when the worker stops; a stop leaves a command whose ack was sent alone;
the worker's metrics."""

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
        assert await worker.order.wait(_held, "t", 7)
    assert asked == [7, 7, 7, 7]  # asked again until no earlier command was left


async def test_of_two_commands_of_a_thread_waiting_in_one_worker_only_the_earlier_asks_the_queue() -> None:
    worker = Worker(cast(Any, _Store()), runtime=cast(Any, object()), order_hold=30.0)
    asked = _answering(worker, [True, True])  # the earlier one is told twice that one before it is queued
    async with asyncio.timeout(10):
        assert all(await asyncio.gather(worker.order.wait(_held, "t", 7), worker.order.wait(_held, "t", 8)))
    assert asked == [7, 7, 7, 8]  # 8 waited for 7 without asking, then asked once


@pytest.mark.parametrize("stopping", [False, True])
async def test_a_held_command_is_given_up_after_the_hold_or_when_the_worker_stops(stopping: bool) -> None:
    worker = Worker(cast(Any, _Store()), runtime=cast(Any, object()), order_hold=0.0 if not stopping else 30.0)
    if stopping:
        worker._stopping.set()
    asked = _answering(worker, [True] * 100)
    async with asyncio.timeout(10):
        assert not await worker.order.wait(_held, "t", 7)
    assert asked == [7]  # nak'ed (by the caller) at once: no second question


class _AckingMsg:
    """A start whose ack the server never answers (the worker is stopped while it waits)."""

    def __init__(self) -> None:
        from agentlog.runtime.inputs.commands import StartRun, encode_command
        from agentlog.runtime.workers.commands import ALONE

        self.data = encode_command(StartRun(thread_id="t", run_id="r", agent_id="a", messages=["hi"]))
        self.headers = dict([ALONE])
        self.subject, self.reply = "agentlog.cmd.t", "$JS.ACK.reply"
        self.metadata = type("Meta", (), {"num_delivered": 1, "sequence": type("Seq", (), {"stream": 5})()})()
        self.acking = asyncio.Event()

    async def ack_sync(self, timeout: float) -> None:
        self.acking.set()
        await asyncio.Event().wait()  # no answer: the stop cancels this

    async def in_progress(self) -> None:
        pass


class _Finishing:
    """Stands in for a `Runtime`: carries every command out at once."""

    async def execute(self, *_: Any, **__: Any) -> str:
        return "done"

    def fence_runs(self) -> None:
        pass

    def abandon_runs(self) -> list[asyncio.Task[Any]]:
        return []


async def test_a_stop_does_not_hand_back_a_command_whose_ack_was_sent() -> None:
    """Its run is done: handing it back would ask the server about an acked message (and wait
    for an answer that may not come), and the stop would log that it handed a finished run back."""
    asked: list[bytes] = []

    class Connection:
        def jetstream(self, **_: Any) -> None:
            return None

        async def request(self, subject: str, payload: bytes, timeout: float) -> None:
            asked.append(payload)

    store = cast(Any, type("Store", (), {"nc": Connection()})())
    worker = Worker(store, runtime=cast(Any, _Finishing()))
    msg = _AckingMsg()
    task = asyncio.get_running_loop().create_task(worker._handle(msg))
    worker._tasks[task] = msg
    task.add_done_callback(worker._done)
    async with asyncio.timeout(10):
        await msg.acking.wait()
        await worker.stop(timeout=0)
    assert task.cancelled() or task.done()
    assert asked == []  # no hand-back


async def test_the_worker_metrics_count_commands_and_their_waits_for_their_turn() -> None:
    from prometheus_client import CollectorRegistry

    from agentlog.runtime.workers.metrics import WorkerCollector

    worker = Worker(cast(Any, _Store()), runtime=cast(Any, object()), concurrency=16, order_hold=30.0)
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))
    waiting: list[float | None] = []

    async def earlier_pending(thread_id: str, seq: int) -> bool:
        waiting.append(registry.get_sample_value("agentlog_worker_commands_waiting_for_turn"))
        return len(waiting) < 3  # an earlier one twice, then none

    worker._earlier_pending = earlier_pending  # type: ignore[method-assign]
    worker.stats["acked"] += 2
    async with asyncio.timeout(10):
        assert await worker.order.wait(_held, "t", 7)
        assert await worker.order.wait(_held, "t", 8)  # no earlier one: no wait
    assert waiting == [0.0, 1.0, 1.0, 0.0]  # waiting from the first "earlier" on, until its turn
    assert registry.get_sample_value("agentlog_worker_commands_waiting_for_turn") == 0.0
    assert registry.get_sample_value("agentlog_worker_order_waits_total") == 1.0
    assert (registry.get_sample_value("agentlog_worker_order_wait_seconds_total") or 0.0) > 0.0
    assert registry.get_sample_value("agentlog_worker_commands_total", {"outcome": "acked"}) == 2.0
    assert registry.get_sample_value("agentlog_worker_concurrency") == 16.0
    assert registry.get_sample_value("agentlog_worker_commands_in_flight") == 0.0
