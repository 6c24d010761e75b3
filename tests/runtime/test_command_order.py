"""Commands that prove their turn (`agentlog.runtime.workers.commands.PREDECESSOR`), against a real
nats-server: a start/continue/decide is stored with the queue seq of the command of its thread it
comes right after (`0`: none was queued), as the server checked it, and a worker runs it without
asking the queue for an earlier one when that proves none is left."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.inputs.commands import Cancel, Command, StartRun
from agentlog.runtime.workers import commands
from agentlog.runtime.workers.commands import COMMANDS_STREAM, PREDECESSOR, CommandClient
from agentlog.runtime.workers.worker import Worker

pytestmark = pytest.mark.asyncio


def start(thread: str, run: str) -> StartRun:
    return StartRun(thread_id=thread, run_id=run, agent_id="a", messages=["hi"], command_id=f"start-{run}")


async def predecessor(client: CommandClient, seq: int) -> int | None:
    """The `PREDECESSOR` the command at queue seq `seq` was stored with (None: without)."""
    value = ((await client.js.get_msg(COMMANDS_STREAM, seq)).headers or {}).get(PREDECESSOR)
    return None if value is None else int(value)


def recording(client: CommandClient, *, before_retry: Any = None) -> list[int | None]:
    """The `PREDECESSOR` each publish of `client` asked for (a refused one included). With
    `before_retry`, that is awaited once, right after the first refused publish."""
    asked: list[int | None] = []
    publish = client.js.publish

    async def record(subject: str, payload: bytes, **kwargs: Any) -> Any:
        value = (kwargs.get("headers") or {}).get(PREDECESSOR)
        asked.append(None if value is None else int(value))
        try:
            return await publish(subject, payload, **kwargs)
        except Exception:
            nonlocal before_retry
            if before_retry is not None:
                hook, before_retry = before_retry, None
                await hook()
            raise

    client.js.publish = record  # type: ignore[method-assign,assignment]
    return asked


async def test_a_command_is_stored_after_the_command_queued_right_before_it(
        nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "RECENT", 600.0)  # a slow machine's pauses do not end the bursts below
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            first, other = CommandClient(store.nc), CommandClient(store.nc)
            asked = recording(first)
            r1 = await first.submit(start("t1", "r1"))
            assert await predecessor(first, r1.seq) == 0 and asked == [0]  # nothing of t1 queued
            # r1 is queued: `0` is refused, the seq the refusal names is taken
            r2 = await first.submit(start("t1", "r2"))
            assert await predecessor(first, r2.seq) == r1.seq and asked == [0, 0, r1.seq]
            # right after that refusal (a burst): the client expects its own last command at once
            r3 = await first.submit(start("t1", "r3"))
            assert await predecessor(first, r3.seq) == r2.seq and asked == [0, 0, r1.seq, r2.seq]
            # another client knows nothing of the burst: refused once, then right
            asked_other = recording(other)
            r4 = await other.submit(start("t1", "r4"))
            assert await predecessor(other, r4.seq) == r3.seq and asked_other == [0, r3.seq]
            # the first client's own last command is no longer the last one queued: refused, then right
            r5 = await first.submit(start("t1", "r5"))
            assert await predecessor(first, r5.seq) == r4.seq and asked[-2:] == [r3.seq, r4.seq]
            # the same command again: the server's duplicate detection still answers
            again = await other.submit(start("t1", "r1"))
            assert again.duplicate and again.seq == r1.seq
            # a cancel is for a run being driven: never published with the header
            cancel = await other.submit(Cancel(thread_id="t2", run_id="r9"))
            assert await predecessor(other, cancel.seq) is None
            # another thread's queue is its own
            assert await predecessor(other, (await other.submit(start("t3", "r6"))).seq) == 0
    finally:
        await store.close()


async def test_a_command_refused_twice_is_stored_without_a_predecessor(nats_server: EmbeddedNatsServer) -> None:
    """Another command lands between the refusal and the retry: the retry is refused too, and the
    command is queued without the header (the worker then asks the queue)."""
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            client, racing = CommandClient(store.nc), CommandClient(store.nc)
            r1 = await client.submit(start("t1", "r1"))
            landed: list[int] = []

            async def another_lands() -> None:
                landed.append((await racing.submit(start("t1", "r2"))).seq)

            asked = recording(client, before_retry=another_lands)
            r3 = await client.submit(start("t1", "r3"))
            assert asked == [0, r1.seq, None] and await predecessor(client, r3.seq) is None
            assert await predecessor(client, landed[0]) == r1.seq
    finally:
        await store.close()


class _Runtime:
    """Stands in for a `Runtime`: records the runs it is given and finishes them at once."""

    def __init__(self) -> None:
        self.ran: asyncio.Queue[str] = asyncio.Queue()

    async def execute(self, cmd: Command, **_: Any) -> str:
        self.ran.put_nowait(cmd.run_id)
        return "done"

    def abandon_runs(self) -> list[asyncio.Task[Any]]:
        return []


def asking(worker: Worker) -> set[int]:
    """The queue seqs of the commands `worker` asks the queue about (an earlier one of the thread?)."""
    checked: set[int] = set()
    check = worker._earlier_pending

    async def recorded(thread_id: str, seq: int) -> bool:
        checked.add(seq)
        return await check(thread_id, seq)

    worker._earlier_pending = recorded  # type: ignore[method-assign]
    return checked


@contextlib.asynccontextmanager
async def one_worker(nats_server: EmbeddedNatsServer, **options: Any,
                     ) -> AsyncIterator[tuple[CommandClient, Worker, _Runtime, set[int]]]:
    """A client, a worker (not started, made with `options`) with a `_Runtime`, and the seqs it
    asks the queue about."""
    store = await JetStreamEventStore.connect(nats_server.url)
    runtime = _Runtime()
    worker = Worker(store, runtime=cast(Any, runtime), **options)
    try:
        async with asyncio.timeout(30):
            yield CommandClient(store.nc), worker, runtime, asking(worker)
    finally:
        await worker.stop(timeout=10)
        await store.close()


async def test_a_worker_does_not_ask_the_queue_after_the_command_it_carried_out_right_before(
        nats_server: EmbeddedNatsServer) -> None:
    async with one_worker(nats_server) as (client, worker, runtime, checked):
        burst = [await client.submit(start("t1", f"r{i}")) for i in range(1, 5)]
        await worker.start()
        assert [await runtime.ran.get() for _ in burst] == ["r1", "r2", "r3", "r4"]
        assert checked == set()


async def test_a_worker_asks_the_queue_when_another_carried_out_the_command_before(
        nats_server: EmbeddedNatsServer) -> None:
    """r2 was stored right after r1, but this worker did not carry r1 out (it is gone from the
    queue, as after another worker's ack): r2 proves nothing here, so the worker asks."""
    async with one_worker(nats_server) as (client, worker, runtime, checked):
        r1 = await client.submit(start("t1", "r1"))
        r2 = await client.submit(start("t1", "r2"))
        assert await predecessor(client, r2.seq) == r1.seq
        await client.js.delete_msg(COMMANDS_STREAM, r1.seq)
        await worker.start()
        assert await runtime.ran.get() == "r2"
        assert checked == {r2.seq}


async def test_an_earlier_command_that_reaches_the_worker_after_a_later_one_runs_first(
        nats_server: EmbeddedNatsServer) -> None:
    """r1 is leased by another consumer client when the worker takes r2 (as when a worker that
    took r1 hands it back, or dies and its lease ends): r2 waits for r1 without holding its
    thread in the worker, so r1, redelivered to this worker, runs at once, and r2 right after it,
    proven by r1, before its `order_hold` ends and without a nak."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from agentlog.eventlog.subjects import commands_filter

    async with one_worker(nats_server, order_hold=3600.0) as (client, worker, runtime, checked):
        r1 = await client.submit(start("t1", "r1"))
        r2 = await client.submit(start("t1", "r2"))
        await client.js.add_consumer(COMMANDS_STREAM, ConsumerConfig(
            durable_name=worker.consumer, ack_policy=AckPolicy.EXPLICIT, filter_subject=commands_filter()))
        elsewhere = await client.js.pull_subscribe_bind(worker.consumer, COMMANDS_STREAM)
        [leased] = await elsewhere.fetch(1, timeout=5)
        assert leased.metadata.sequence.stream == r1.seq
        held = asyncio.Event()
        ask = worker._earlier_pending

        async def asked(thread_id: str, seq: int) -> bool:
            earlier = await ask(thread_id, seq)
            if seq == r2.seq and earlier:
                held.set()
            return earlier

        worker._earlier_pending = asked  # type: ignore[method-assign]
        await worker.start()
        await held.wait()  # the worker holds r2: r1 is still queued
        await leased.nak()
        assert [await runtime.ran.get() for _ in range(2)] == ["r1", "r2"]
        assert worker.stats["naked"] == 0
        assert r2.seq in checked


class _Recorder:
    """Stands in for the `Runtime` of several workers: records which run each one started, in
    the order they were started (yielding to the loop on the way, so that workers interleave)."""

    def __init__(self, started: list[str], progress: asyncio.Event) -> None:
        self.started = started
        self.progress = progress

    async def execute(self, cmd: Command, **_: Any) -> str:
        self.started.append(cmd.run_id)
        self.progress.set()
        for _turn in range(3):
            await asyncio.sleep(0)  # a yield to the other workers, not a wait for anything
        return "done"

    def abandon_runs(self) -> list[asyncio.Task[Any]]:
        return []


async def test_two_workers_take_a_threads_commands_in_queue_order_under_bursts_from_two_clients(
        nats_server: EmbeddedNatsServer) -> None:
    """Two clients queue bursts on the same threads at once (refusals, retries and foreign
    predecessors interleave); two workers each on their own connection carry the commands out,
    and every thread's commands start in the order of their queue seqs, each once."""
    stores = [await JetStreamEventStore.connect(nats_server.url) for _ in range(4)]
    started: list[str] = []
    progress = asyncio.Event()
    workers = [Worker(store, runtime=cast(Any, _Recorder(started, progress)), concurrency=16) for store in stores[:2]]
    clients = [CommandClient(store.nc) for store in stores[2:]]
    try:
        async with asyncio.timeout(120):
            for worker in workers:
                await worker.start()
            for round_ in range(6):
                seqs: dict[str, int] = {}

                async def burst(c: int, t: int, round_: int = round_, seqs: dict[str, int] = seqs) -> None:
                    for r in range(3):
                        run = f"x{round_}-t{t}-c{c}-r{r}"
                        seqs[run] = (await clients[c].submit(start(f"x{round_}-t{t}", run))).seq

                await asyncio.gather(*(burst(c, t) for t in range(15) for c in range(2)))
                while len([run for run in started if run.startswith(f"x{round_}-")]) < len(seqs):
                    progress.clear()
                    await progress.wait()
                for t in range(15):
                    thread = [run for run in started if run.startswith(f"x{round_}-t{t}-")]
                    assert thread == sorted(thread, key=seqs.__getitem__), (round_, t)
                    assert len(thread) == len(set(thread)) == 6
    finally:
        for worker in workers:
            await worker.stop(timeout=10)
        for store in stores:
            await store.close()


class _NoConnection:
    """What `CommandClient` asks of a connection before it publishes."""

    max_payload = 1 << 20

    def jetstream(self, **_: Any) -> Any:
        return None


class _RefusingJetStream:
    """Refuses every publish with `PREDECESSOR` (the refusal saying `description`, perhaps not
    as nats-server words it), and takes one without it."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.asked: list[str | None] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None, **_: Any) -> Any:
        from nats.js.api import PubAck
        from nats.js.errors import BadRequestError

        expected = (headers or {}).get(PREDECESSOR)
        self.asked.append(expected)
        if expected is not None:
            raise BadRequestError(code=400, err_code=10071, description=self.description)
        return PubAck(stream=COMMANDS_STREAM, seq=7)


@pytest.mark.parametrize("description", ["wrong last sequence", "wrong last sequence: 0"])
async def test_a_refusal_that_names_no_other_predecessor_queues_the_command_without_one(description: str) -> None:
    """A pure unit test of the client's retry: a refusal it cannot read, or one naming the seq it
    expected, is not tried again with a guess."""
    client = CommandClient(cast(Any, _NoConnection()))
    client._ensured = True
    js = _RefusingJetStream(description)
    client.js = cast(Any, js)
    queued = await client.submit(start("t1", "r1"))
    assert queued.seq == 7 and js.asked == ["0", None]
