"""Commands stored alone for their thread (`agentlog.runtime.workers.commands.ALONE`), against a
real nats-server: a start/continue/decide is published with the header while it may be the only
command of its thread in the queue, and stored with it only if it is; a worker runs such a
command without asking the queue for an earlier one."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.inputs.commands import Cancel, Command, StartRun
from agentlog.runtime.workers.commands import ALONE, COMMANDS_STREAM, CommandClient
from agentlog.runtime.workers.worker import Worker

pytestmark = pytest.mark.asyncio


def start(thread: str, run: str) -> StartRun:
    return StartRun(thread_id=thread, run_id=run, agent_id="a", messages=["hi"], command_id=f"start-{run}")


async def stored_alone(client: CommandClient, seq: int) -> bool:
    headers = (await client.js.get_msg(COMMANDS_STREAM, seq)).headers or {}
    return headers.get(ALONE[0]) == ALONE[1]


def recording(client: CommandClient) -> list[bool]:
    """Whether each publish of `client` asked for `ALONE` (a refused one included)."""
    asked: list[bool] = []
    publish = client.js.publish

    async def record(subject: str, payload: bytes, **kwargs: Any) -> Any:
        asked.append(ALONE[0] in (kwargs.get("headers") or {}))
        return await publish(subject, payload, **kwargs)

    client.js.publish = record  # type: ignore[method-assign]
    return asked


async def test_a_command_is_stored_alone_only_when_no_other_of_its_thread_is_queued(
        nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            first, other = CommandClient(store.nc), CommandClient(store.nc)
            asked = recording(first)
            queued = await first.submit(start("t1", "r1"))
            assert await stored_alone(first, queued.seq)
            # while r1 is queued: refused with the header, stored without it
            behind = await first.submit(start("t1", "r2"))
            assert not await stored_alone(first, behind.seq) and asked == [True, True, False]
            # the same client, right after that refusal: published without the header at once
            third = await first.submit(start("t1", "r3"))
            assert not await stored_alone(first, third.seq) and asked == [True, True, False, False]
            # another client has seen no refusal: it asks, and is refused too
            asked_other = recording(other)
            fourth = await other.submit(start("t1", "r5"))
            assert not await stored_alone(other, fourth.seq) and asked_other == [True, False]
            # the same command again: the server's duplicate detection still answers
            again = await other.submit(start("t1", "r1"))
            assert again.duplicate and again.seq == queued.seq
            # a cancel is for a run being driven: never published with the header
            cancel = await other.submit(Cancel(thread_id="t2", run_id="r9"))
            assert not await stored_alone(other, cancel.seq)
            # another thread's queue is its own
            assert await stored_alone(other, (await other.submit(start("t3", "r4"))).seq)
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


async def test_a_worker_asks_the_queue_for_an_earlier_command_only_when_the_command_was_not_alone(
        nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    runtime = _Runtime()
    worker = Worker(store, runtime=cast(Any, runtime))
    checked: set[int] = set()  # queue seqs of the commands the worker asked about
    check = worker._earlier_pending

    async def recorded(thread_id: str, seq: int) -> bool:
        checked.add(seq)
        return await check(thread_id, seq)

    worker._earlier_pending = recorded  # type: ignore[method-assign]
    try:
        async with asyncio.timeout(30):
            client = CommandClient(store.nc)
            alone = await client.submit(start("t1", "r1"))
            behind = await client.submit(start("t1", "r2"))  # r1 is queued: stored without the header
            await worker.start()
            assert [await runtime.ran.get(), await runtime.ran.get()] == ["r1", "r2"]
            assert checked == {behind.seq} and alone.seq not in checked
    finally:
        await worker.stop(timeout=10)
        await store.close()
