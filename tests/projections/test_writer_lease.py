"""Several projection runners on one view set (`agentlog.projections.lease`), on a real nats-server.

* One holder of the writer lease at a time; a holder that stops renewing loses it after the
  TTL and a standby takes it; an orderly release hands it over at the next try.
* Two runners, each on its own connection (two gateways): only the holder writes, the standby's
  `wait_for` follows the holder's stored position, and the views equal the fold of the log; when
  the holder's process dies (its connection closes) the standby takes over and goes on from the
  stored position.
* Every runner's listeners hear of every batch, whichever runner writes: the standby tells the
  writer's notices as the writer tells its own, `reload` when it missed some (found by the next
  notice, or by the position moving on while the writer is idle), and after a takeover.
* Fencing: a writer that lost the lease while it was stalled (past its lease check, before its
  writes) is refused and writes nothing over the new holder's views.

A short TTL (1 s) keeps the takeovers quick; every wait is on a condition, bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
import pytest
from nats.aio.client import Client as NATS

from agentlog.eventlog import Commit, collect
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunFinished, RunStarted, StepStarted, Termination, ThreadCreated
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections import fold_commits
from agentlog.projections.errors import WriterFenced
from agentlog.projections.kv import KVViewStore
from agentlog.projections.lease import WriterLease
from agentlog.projections.notices import BatchChanges
from agentlog.projections.runner import ProjectionRunner

TTL = 1.0
BOUND = 30.0  # a bound on every wait below, never a synchronisation



@asynccontextmanager
async def connection(server: EmbeddedNatsServer) -> AsyncIterator[NATS]:
    nc = await nats.connect(server.url)
    try:
        yield nc
    finally:
        await nc.close()


async def acquired(lease: WriterLease) -> None:
    """Until `lease` is taken (the holder's key has to expire first)."""
    while not await lease.try_acquire():
        await asyncio.sleep(lease.acquire_interval)


async def test_one_holder_at_a_time_expiry_and_release(nats_server: EmbeddedNatsServer) -> None:
    async with connection(nats_server) as nc, asyncio.timeout(BOUND):
        a = await WriterLease.open(nc, prefix="l1", ttl=TTL, holder="a")
        b = await WriterLease.open(nc, prefix="l1", ttl=TTL, holder="b")
        assert await a.try_acquire() and a.held and a.valid()
        assert not await b.try_acquire() and not b.held
        assert await a.current_holder() == "a"
        for _ in range(3):  # renewals keep it: b never gets it meanwhile
            assert await a.renew()
            assert not await b.try_acquire()
        # a stops renewing (a stalled or dead process): b gets it once the key expired
        a.renew_interval = 3600.0
        await a.renew()
        await acquired(b)
        assert await b.current_holder() == "b"
        assert not a.valid()  # its own clock ran out before the server's
        assert not await a.renew() and not a.held  # and its renewal is refused
        # an orderly stop hands over at once: the key is gone
        await b.release()
        assert not b.held and await a.current_holder() is None
        assert await a.try_acquire()
        await a.release()


def _commits(thread: str, n: int) -> list[Commit]:
    run = f"{thread}-r"
    out = [Commit(commit_id=f"{thread}-c0", thread_id=thread, run_id=run, ts=1,
                  events=[ThreadCreated(), RunStarted(run_id=run, agent_id="a")])]
    out += [Commit(commit_id=f"{thread}-c{i}", thread_id=thread, run_id=run, ts=1 + i, events=[StepStarted(step=i)])
            for i in range(1, n)]
    return out


async def append(store: JetStreamEventStore, commits: list[Commit]) -> int:
    seq = 0
    for commit in commits:
        seq = (await store.append(commit, await store.thread_version(commit.thread_id))).seq
    return seq


async def assert_views_are_the_fold(store: JetStreamEventStore, views: KVViewStore, threads: list[str]) -> None:
    commits = sorted([sc for t in threads for sc in await collect(store.read_thread(t))], key=lambda sc: sc.seq)
    expected = fold_commits(commits)
    assert {t.thread_id: t for t in await views.list_threads()} == expected.threads
    assert {r.run_id: r for r in await views.list_runs()} == expected.runs


async def test_two_runners_one_writes_the_other_follows_then_takes_over(nats_server: EmbeddedNatsServer) -> None:
    async with connection(nats_server) as nc_a, connection(nats_server) as nc_b, \
            connection(nats_server) as nc_log:
        store = await JetStreamEventStore.connect(nc_log)
        runners: list[ProjectionRunner] = []

        async def runner(nc: NATS, holder: str) -> ProjectionRunner:
            r = ProjectionRunner(nc, await KVViewStore.open(nc, prefix="two"), fetch_timeout=0.2,
                                 lease=await WriterLease.open(nc, prefix="two", ttl=TTL, holder=holder))
            await r.start()
            runners.append(r)
            return r

        try:
            async with asyncio.timeout(BOUND):
                a = await runner(nc_a, "a")
                b = await runner(nc_b, "b")
                assert a.writer and not b.writer  # the first one started took the lease at once
                last = await append(store, _commits("t1", 5) + _commits("t2", 3))
                await asyncio.gather(a.wait_for(last), b.wait_for(last))  # b: the stored position
                assert a.puts > 0 and b.puts == 0 and b.batches == 0
                await assert_views_are_the_fold(store, b.store, ["t1", "t2"])
                assert b.cached_run("t1-r") is None  # a standby never answers from a cache

                await nc_a.close()  # a's process dies: no renewals, no writes
                more = await append(store, _commits("t3", 4))
                await b.wait_for(more)
                assert b.writer and b.takeovers == 1
                await assert_views_are_the_fold(store, b.store, ["t1", "t2", "t3"])
                assert b.cached_run("t3-r") is not None  # the writer's cache, once it writes
        finally:
            for r in runners:
                await r.stop()
            await store.close()


async def test_a_writer_that_lost_its_lease_while_stalled_writes_nothing(nats_server: EmbeddedNatsServer) -> None:
    """`a` is driven by hand, as a writer whose loop checked its lease and then stalled: it never
    renews, `b` takes over when the lease expires and writes, then `a` goes on with its batch."""
    async with connection(nats_server) as nc_a, connection(nats_server) as nc_b, \
            connection(nats_server) as nc_log:
        store = await JetStreamEventStore.connect(nc_log)
        views_a = await KVViewStore.open(nc_a, prefix="fence")
        views_b = await KVViewStore.open(nc_b, prefix="fence")
        lease_a = await WriterLease.open(nc_a, prefix="fence", ttl=TTL, holder="a")
        lease_a.renew_interval = 3600.0  # stalled: it never renews
        a = ProjectionRunner(nc_a, views_a, fetch_timeout=0.2, lease=lease_a)
        b = ProjectionRunner(nc_b, views_b, fetch_timeout=0.2,
                             lease=await WriterLease.open(nc_b, prefix="fence", ttl=TTL, holder="b"))
        try:
            async with asyncio.timeout(BOUND):
                assert await lease_a.try_acquire()
                await a.open()
                first = await append(store, _commits("t1", 3))
                while a.applied_seq < first:
                    await a.step()
                await b.start()
                assert not b.writer
                done = Commit(commit_id="t1-end", thread_id="t1", run_id="t1-r", ts=9,
                              events=[RunFinished(termination=Termination(type="natural_end"))])
                second = await append(store, [done])
                await b.wait_for(second)  # only b writes it: once a's lease has expired
                assert b.writer
                written = await views_b.get_run("t1-r")
                assert written is not None and written.status == "done"
                # a wakes up with the same commit in its feed: its batch is refused
                with pytest.raises(WriterFenced):
                    while await a.step() == 0:  # (each step waits for the feed)
                        pass
                assert a.applied_seq == first and a.failing is not None and "WriterFenced" in a.failing
                assert await views_b.get_run("t1-r") == written
                await assert_views_are_the_fold(store, views_b, ["t1"])
        finally:
            await a.stop()
            await b.stop()
            await store.close()


class Heard:
    """A runner's listener: every `BatchChanges` it was told, and a wait for one that covers a seq."""

    def __init__(self) -> None:
        self.told: list[BatchChanges] = []
        self._changed = asyncio.Condition()

    def __call__(self, changes: BatchChanges) -> None:
        self.told.append(changes)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def covers(self, changes: BatchChanges) -> bool:
        """Told of `changes` itself, or of a reload up to it or past it."""
        return changes in self.told or any(c.reload and c.seq >= changes.seq for c in self.told)

    async def until(self, test: object) -> None:
        async with self._changed:
            await self._changed.wait_for(test)  # type: ignore[arg-type]

    def threads(self) -> set[str]:
        return {t for c in self.told for t in c.threads}


async def test_every_runners_listeners_hear_every_batch_whichever_writes(nats_server: EmbeddedNatsServer) -> None:
    async with connection(nats_server) as nc_a, connection(nats_server) as nc_b, \
            connection(nats_server) as nc_log:
        store = await JetStreamEventStore.connect(nc_log)
        runners: list[ProjectionRunner] = []

        async def runner(nc: NATS, holder: str) -> tuple[ProjectionRunner, Heard]:
            r = ProjectionRunner(nc, await KVViewStore.open(nc, prefix="told"), fetch_timeout=0.2,
                                 lease=await WriterLease.open(nc, prefix="told", ttl=TTL, holder=holder))
            heard = Heard()
            r.listeners.append(heard)
            await r.start()
            runners.append(r)
            return r, heard

        try:
            async with asyncio.timeout(BOUND):
                a, heard_a = await runner(nc_a, "a")
                b, heard_b = await runner(nc_b, "b")
                assert a.writer and not b.writer
                last = await append(store, _commits("t1", 3) + _commits("t2", 2))
                await heard_a.until(lambda: heard_a.told and heard_a.told[-1].seq == last)
                # the standby is told each of the writer's batches: the same ids, scopes and seqs
                await heard_b.until(lambda: all(heard_b.covers(c) for c in heard_a.told))
                assert heard_a.threads() == {"t1", "t2"} and not any(c.reload for c in heard_a.told)
                assert b.applied_seq >= last and b.puts == 0
                assert heard_b.told[-1].runs == heard_a.told[-1].runs

                # notices missed (the standby hears nothing for a while): once the writer is
                # idle, the standby tells a reload up to the position
                assert b._notices is not None
                await b._notices.unsubscribe()
                b._notices = None
                await nc_b.flush()  # the server has it before the writer's next notice
                missed = await append(store, _commits("t3", 2))
                await heard_b.until(lambda: any(c.reload and c.seq >= missed for c in heard_b.told))
                assert "t3" not in heard_b.threads()
                # heard again: the next batch goes on from what was heard, and is told as it is
                await b._listen()
                heard_b.told.clear()
                again = await append(store, _commits("t4", 1))
                await heard_b.until(lambda: any(c.seq >= again for c in heard_b.told))
                assert heard_b.threads() == {"t4"} and not any(c.reload for c in heard_b.told)

                # the writer dies: the standby takes over and tells its own batches
                await nc_a.close()
                more = await append(store, _commits("t5", 2))
                await b.wait_for(more)
                assert b.writer
                await heard_b.until(lambda: "t5" in heard_b.threads())
        finally:
            for r in runners:
                await r.stop()
            await store.close()
