"""The SSE fan-out hub (`agentlog.gateway.http.sse.FollowHub`) on a real nats-server: one store
follow per followed thread however many followers, same commits in log order for each, a slow
follower dropped alone, the follow stopped when the last follower leaves, and followers that join
while the thread is being written get every event exactly once (join, then history, dedupe)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.events import ThreadCreated, ThreadMetadataUpdated
from agentlog.gateway.http.sse import HUB, FollowHub, Membership, SlowFollower

from tests.support.http_stack import TIMEOUT, Api, api, sse_events  # noqa: F401

pytestmark = pytest.mark.asyncio


async def after(member: Membership, seq: int) -> int:
    """The seq of the member's next commit above `seq`: a feed starts at the store's live
    position, which may be below the history its members read (they drop the overlap)."""
    while (got := (await anext(member)).seq) <= seq:
        pass
    return got


def follows(api: Api, thread_id: str) -> int:
    """The store's live follows of `thread_id` (other tests' threads are not counted)."""
    return api.store.thread_follows(thread_id)


async def test_one_follow_per_thread_shared_and_stopped_by_the_last_leaver(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        created = await api.append("h1", None, [ThreadCreated()])
        assert follows(api, "h1") == 0
        hub = FollowHub(api.store)
        members = [await hub.join("h1") for _ in range(3)]
        assert hub.feeds == 1
        seqs = [await api.append("h1", None, [ThreadMetadataUpdated(metadata={"n": i})]) for i in range(4)]
        for member in members:
            assert [await after(member, created), *[(await anext(member)).seq for _ in seqs[1:]]] == seqs
        assert follows(api, "h1") == 1
        await members[0].aclose()
        assert hub.feeds == 1
        for member in members[1:]:
            await member.aclose()
        assert hub.feeds == 0
        assert follows(api, "h1") == 0
        # a new follower after that starts a new follow
        again = await hub.join("h1")
        seq = await api.append("h1", None, [ThreadMetadataUpdated(metadata={"n": 9})])
        assert await after(again, seqs[-1]) == seq
        await again.aclose()
        assert hub.feeds == 0


async def test_a_slow_follower_is_dropped_alone(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        last = await api.append("h2", None, [ThreadCreated()])
        hub = FollowHub(api.store, queue_size=2)
        slow, fast = await hub.join("h2"), await hub.join("h2")
        for i in range(5):
            seq = await api.append("h2", None, [ThreadMetadataUpdated(metadata={"n": i})])
            assert await after(fast, last) == seq  # `fast` keeps up; `slow` never reads
            last = seq
        with pytest.raises(SlowFollower):
            await anext(slow)
        await slow.aclose()
        assert hub.feeds == 1
        seq = await api.append("h2", None, [ThreadMetadataUpdated(metadata={"n": 99})])
        assert (await anext(fast)).seq == seq
        await hub.close()


async def test_followers_joining_during_writes_get_every_event_once(api: Api) -> None:
    """Follower k connects right after the k-th write, while the writes go on; each reads until
    the last event and must see exactly the log's events, in order."""
    writes = 12
    async with asyncio.timeout(TIMEOUT):
        await api.append("h3", None, [ThreadCreated()])
        joined: list[asyncio.Event] = [asyncio.Event() for _ in range(writes)]

        async def follower(k: int) -> list[str]:
            async with api.client.get("/v1/threads/h3/events", params={"follow": "true"}) as resp:
                assert resp.status == 200
                first = await sse_events(resp, 1)
                joined[k].set()  # open, history coming: the hub was joined before the read
                rest = await sse_events(resp, writes + 1 - len(first))
            return [e.id for e in first + rest]  # type: ignore[misc]

        tasks: list[asyncio.Task[list[str]]] = []
        for k in range(writes):
            await api.append("h3", None, [ThreadMetadataUpdated(metadata={"n": k})])
            tasks.append(asyncio.create_task(follower(k)))
            if k % 3 == 0:
                await joined[k].wait()  # some followers join between writes, others during them
        got = await asyncio.gather(*tasks)
        expected = [f"{c.seq}:{i}" async for c in api.store.read_thread("h3") for i, _ in enumerate(c.commit.events)]
        assert len(expected) == writes + 1
        assert all(ids == expected for ids in got), got
        app: Any = api.client.server.app
        assert app[HUB].feeds <= 1


async def test_a_member_that_starts_the_feed_from_a_seq_gets_every_commit_after_it(api: Api) -> None:
    """What `GET /v1/runs/{id}/events?follow=true` relies on to read the run once: the commits
    appended between the caller's read and its join come through the feed."""
    async with asyncio.timeout(TIMEOUT):
        read = await api.append("h4", None, [ThreadCreated()])
        missed = await api.append("h4", None, [ThreadMetadataUpdated(metadata={"n": 1})])  # after the read
        hub = FollowHub(api.store)
        first = await hub.join("h4", after=read)
        second = await hub.join("h4", after=read)
        assert (first.since, second.since) == (read, None)  # the second joined a running feed
        later = await api.append("h4", None, [ThreadMetadataUpdated(metadata={"n": 2})])
        assert [(await anext(first)).seq for _ in range(2)] == [missed, later]
        assert await after(second, missed) == later
        await hub.close()
