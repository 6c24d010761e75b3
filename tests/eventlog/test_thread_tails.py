"""The store's shared live tail (`agentlog.eventlog.jetstream.tails.ThreadTails`) on a real
nats-server: follows that join while their threads are written get every commit once and in
order, whether it came from the stream, from what the tail kept or from its queue; a follow
from below what the tail kept reads the stream; a follow that does not keep up is taken off the
tail and still misses nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import Commit, StepStarted, StoredCommit
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.jetstream.tails import ThreadTails

pytestmark = pytest.mark.asyncio
WAIT = 20.0


def commit(thread: str) -> Commit:
    return Commit(commit_id=new_id(), thread_id=thread, run_id=None, ts=now_ms(), events=[StepStarted(step=1)])


async def take(follow: AsyncIterator[StoredCommit], n: int) -> list[int]:
    return [(await anext(follow)).seq for _ in range(n)]


async def seqs(store: JetStreamEventStore, thread: str, after: int = 0) -> list[int]:
    return [sc.seq async for sc in store.read_thread(thread, after)]


@pytest.fixture
async def store(nats_server: EmbeddedNatsServer) -> AsyncIterator[JetStreamEventStore]:
    async with asyncio.timeout(WAIT):
        s = await JetStreamEventStore.connect(nats_server.url, follow_heartbeat=0.3)
    try:
        yield s
    finally:
        await s.close()


async def test_follows_joining_during_writes_get_each_commit_once_in_order(store: JetStreamEventStore) -> None:
    tails = ThreadTails(store, ring_size=4)  # small: later joins read part of what they missed
    writes = 30
    async with asyncio.timeout(WAIT):
        await store.append(commit("a"), None)
        await store.append(commit("b"), None)
        follows: list[tuple[str, int, AsyncIterator[StoredCommit]]] = []

        async def writer() -> None:
            for i in range(writes):
                await store.append(commit("ab"[i % 2]), None)
                if i % 3 == 0:  # a follow joins between some writes, at the position seen so far
                    thread = "ab"[i % 2]
                    after = (await seqs(store, thread))[i // 4 % 2]
                    follow = tails.follow(thread, after)
                    follows.append((thread, after, follow))
                    await anext(follow)

        await writer()
        for thread, after, follow in follows:
            expected = await seqs(store, thread, after)
            assert [expected[0], *await take(follow, len(expected) - 1)] == expected
            await follow.aclose()  # type: ignore[attr-defined]
        assert tails.follows() == 0
        await tails.close()


async def test_a_follow_from_below_the_floor_reads_the_stream(store: JetStreamEventStore) -> None:
    tails = ThreadTails(store, ring_size=2)
    async with asyncio.timeout(WAIT):
        first = await store.append(commit("c"), None)
        live = tails.follow("c", first.seq)  # starts the tail: its floor is the first commit
        pending = asyncio.ensure_future(anext(live))
        written = [(await store.append(commit("c"), None)).seq for _ in range(5)]
        assert [(await pending).seq, *await take(live, 4)] == written
        assert tails.floor > first.seq  # the tail kept only the last two
        late = tails.follow("c", 0)
        assert await take(late, 6) == [first.seq, *written]
        for follow in (live, late):
            await follow.aclose()  # type: ignore[attr-defined]
        await tails.close()


async def test_a_follow_that_falls_behind_is_dropped_and_misses_nothing(store: JetStreamEventStore) -> None:
    tails = ThreadTails(store, queue_limit=2, ring_size=1)
    async with asyncio.timeout(WAIT):
        await store.append(commit("d"), None)
        slow, fast = tails.follow("d", 0), tails.follow("d", 0)
        assert await take(slow, 1) == await take(fast, 1)
        written = []
        for _ in range(6):
            written.append((await store.append(commit("d"), None)).seq)
            assert await take(fast, 1) == written[-1:]  # `fast` keeps up, `slow` reads nothing
        assert tails.follows("d") == 1  # `slow` was taken off the tail
        assert await take(slow, 6) == written
        written.append((await store.append(commit("d"), None)).seq)
        assert await take(slow, 1) == await take(fast, 1) == written[-1:]
        for follow in (slow, fast):
            await follow.aclose()  # type: ignore[attr-defined]
        await tails.close()


async def test_closing_the_tail_ends_its_follows(store: JetStreamEventStore) -> None:
    from agentlog.eventlog.errors import StoreUnavailable

    tails = ThreadTails(store)
    async with asyncio.timeout(WAIT):
        await store.append(commit("e"), None)
        follow = tails.follow("e", 0)
        await anext(follow)
        pending = asyncio.ensure_future(anext(follow))
        await tails.close()
        with pytest.raises(StoreUnavailable):
            await pending
        with contextlib.suppress(StopAsyncIteration, StoreUnavailable):
            await follow.aclose()  # type: ignore[attr-defined]


async def test_a_tail_that_failed_ends_its_follows_and_the_next_follow_starts_it_again(
        store: JetStreamEventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentlog.eventlog.errors import StoreUnavailable
    from agentlog.eventlog.jetstream.follow import Follower

    real = Follower.next_raw
    failures = [StoreUnavailable("the consumer went away")]

    async def fail_once(self: Follower) -> object:
        if failures:
            raise failures.pop()
        return await real(self)

    monkeypatch.setattr(Follower, "next_raw", fail_once)
    tails = ThreadTails(store)
    async with asyncio.timeout(WAIT):
        first = (await store.append(commit("f"), None)).seq
        broken = tails.follow("f", first)
        with pytest.raises(StoreUnavailable):
            await anext(broken)
        assert not tails.running and tails.follows() == 0
        again = tails.follow("f", first)
        pending = asyncio.ensure_future(anext(again))
        second = (await store.append(commit("f"), None)).seq
        assert (await pending).seq == second
        await again.aclose()  # type: ignore[attr-defined]
        await tails.close()
