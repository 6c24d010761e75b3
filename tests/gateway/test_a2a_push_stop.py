"""A gateway's A2A push delivery (`PushDelivery`) stops while commits flow through its scan.

Its loops wait in nats-py's `fetch`, which waits with `asyncio.wait_for`: on Python 3.11 a cancel
that lands in the loop step where the fetched message arrives is lost, and a loop stopped by the
cancel alone fetched on forever, so `stop()` (and the gateway's shutdown: `agentlog gateway`, a
`serve` in-process) never returned. Under a steady flow of commits that happens in a good share of
stops; here each round stops the delivery while its scan is taking commits, a few dozen times."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.js.errors import NotFoundError

from agentlog.eventlog import JetStreamEventStore
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import Commit, StepStarted
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.subjects import EVENTS_STREAM
from agentlog.gateway.adapters.a2a.push import ACK_WAIT_ENV, SCAN_CONSUMER, PushConfigs, PushDelivery

ROUNDS = 25
#: Never reached by a stop that works (it returns at once); a lost cancel waits forever.
STOP_WAIT = 20.0


#: A webhook nobody listens on: these commits are no task's transitions, nothing is sent.
HOOK = {"id": "c1", "url": "http://127.0.0.1:9/hook", "token": ""}


def _commit() -> Commit:
    return Commit(commit_id=new_id(), thread_id="t-push-stop", run_id=None, ts=now_ms(), events=[StepStarted(step=1)])


async def _scan_delivered(store: JetStreamEventStore) -> int:
    info = await store.nc.jetstream().consumer_info(EVENTS_STREAM, SCAN_CONSUMER)
    return int(info.delivered.stream_seq)


async def test_push_delivery_stops_while_its_scan_takes_commits(nats_server: EmbeddedNatsServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # a delivery that a stop leaves unacked comes back soon, so the scan keeps taking commits
    monkeypatch.setenv(ACK_WAIT_ENV, "0.2")
    async with asyncio.timeout(120), await JetStreamEventStore.connect(nats_server.url) as writer:
        await PushConfigs(writer.nc).put("a-task", [HOOK])  # a task has a config: the scan reads
        first = PushDelivery(writer, PushConfigs(writer.nc))
        await first.start()  # the scan consumer starts at the log's head: the commits below are new
        await first.stop()

        async def write() -> None:
            while True:
                await writer.append(_commit(), None)

        writing = asyncio.create_task(write())
        try:
            for round_ in range(ROUNDS):
                # a connection per round: a stopped round's fetches cannot take the next round's commits
                async with await JetStreamEventStore.connect(nats_server.url) as store:
                    push = PushDelivery(store, PushConfigs(store.nc))
                    before = await _scan_delivered(store)
                    await push.start()
                    while await _scan_delivered(store) <= before:  # the scan is taking commits now
                        pass
                    try:
                        async with asyncio.timeout(STOP_WAIT):
                            await push.stop()
                    except TimeoutError:
                        raise AssertionError(f"round {round_}: PushDelivery.stop() did not return: a loop "
                                             "lost its cancel and fetched on") from None
        finally:
            writing.cancel()
            with contextlib.suppress(BaseException):
                await writing


async def test_the_scan_reads_only_while_a_task_has_configs_and_resumes_after_the_oldest(
        nats_server: EmbeddedNatsServer) -> None:
    """No task has a config: the scan takes no commit (a deployment that never uses push pays
    nothing per commit). Once one is set, the scan reads again from just after its `since`
    (the log's last seq when it was set), not through the commits made while it did not read."""
    async with asyncio.timeout(60), await JetStreamEventStore.connect(nats_server.url) as store:
        push = PushDelivery(store, PushConfigs(store.nc))
        await push.start()
        try:
            for _ in range(10):
                await store.append(_commit(), None)
            # the commits are past the consumer (it is at the log's head from before them) and
            # the loop goes round, yet nothing was delivered: it does not fetch
            js = store.nc.jetstream()
            assert (await js.consumer_info(EVENTS_STREAM, SCAN_CONSUMER)).delivered.consumer_seq == 0
            configs = PushConfigs(store.nc)
            await configs.put("a-task", [HOOK])
            assert await configs.oldest_since() == await store.last_seq()
            last = (await store.append(_commit(), None)).seq
            while True:  # the consumer's position, polled (the scan signals nothing)
                with contextlib.suppress(NotFoundError):  # between the scan's delete and re-create
                    info = await js.consumer_info(EVENTS_STREAM, SCAN_CONSUMER)
                    if info.ack_floor.stream_seq >= last:
                        break
                await asyncio.sleep(0.01)
            assert info.delivered.consumer_seq == 1, info  # the one commit after the config, no backlog
            await configs.put("a-task", [])  # the last config goes: the scan stops reading again
            assert await configs.oldest_since() is None
        finally:
            await push.stop()
