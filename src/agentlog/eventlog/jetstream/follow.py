"""The store's live tail: `follow` as a self-healing ephemeral push consumer.

`Follower` keeps the last stream sequence it yielded and recreates its consumer from last + 1
on any doubt (a consumer sequence gap, missed heartbeats, the consumer gone, errors), so nothing
is missed or repeated across reconnects and server restarts. Its own module because it is the
one stateful, retrying piece of the store; it uses only the request layer
(`agentlog.eventlog.jetstream.requests`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.msg import Msg

from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.api import NS_PER_SECOND, ack_reply_seqs, json_encoder, msg_status
from agentlog.eventlog.jetstream.requests import JetStreamRequests

log = logging.getLogger(__name__)


_T = TypeVar("_T")


async def get_within(queue: asyncio.Queue[_T], seconds: float) -> _T:
    """`queue.get()`, or `TimeoutError` after `seconds`. Not `asyncio.wait_for`: on Python 3.11 it
    returns the item when the get completes in the same loop step as a cancel of the caller, so
    the cancel is lost. A follow closed just as its next message arrived then kept running (a
    follow is closed by cancelling its task), and whoever awaited its end (the SSE hub's last
    leaver, and so that follower's stream) waited forever. Here a cancel always wins, and the
    item stays in the queue."""
    async with asyncio.timeout(seconds):
        return await queue.get()


class Follower:
    """One live tail: an ephemeral push consumer it recreates from `last + 1` whenever the
    delivery is in doubt (consumer sequence gap, missed heartbeats, consumer gone, errors)."""

    def __init__(self, store: JetStreamRequests, subject_filter: str, after: int) -> None:
        self.store = store
        self.filter = subject_filter
        self.last = after
        self.heartbeat = store.follow_heartbeat
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()
        self.sub: Any = None
        self.consumer: str | None = None
        self.next_dseq = 1

    async def _on_msg(self, msg: Msg) -> None:
        self.queue.put_nowait(msg)

    async def _start(self) -> None:
        """(Re)create the consumer from last + 1 on a fresh inbox, retrying until it works.

        The name and the inbox are chosen once per (re)create and kept across the retries: a create
        whose answer was lost (a timeout on a loaded server) is then repeated with an identical
        config, which the server answers idempotently, instead of leaving an orphan consumer that
        delivers nowhere until its `inactive_threshold`."""
        nc = self.store.nc
        delay = min(self.heartbeat, 0.25)
        await self._drop()
        inbox = nc.new_inbox()
        name = f"agentlog_follow_{secrets.token_hex(8)}"
        config = {
            "name": name,
            "deliver_subject": inbox,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": self.last + 1,
            "filter_subject": self.filter,
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(self.heartbeat * NS_PER_SECOND),
            "inactive_threshold": int(max(30.0, self.heartbeat * 10) * NS_PER_SECOND),
            "mem_storage": True,
            "num_replicas": 1,
        }
        request = json_encoder.encode({"stream_name": self.store.stream, "config": config})
        while True:
            if nc.is_closed or self.store._closed:
                raise StoreUnavailable("follow: the NATS connection is closed")
            try:
                if self.sub is None:
                    # Flow control bounds what is in flight; a drop would only cost a recreate.
                    self.sub = await nc.subscribe(inbox, cb=self._on_msg, pending_msgs_limit=0, pending_bytes_limit=0)
                self.consumer = name  # from here on `_drop` deletes it, created or not
                answer = await self.store._api(f"$JS.API.CONSUMER.CREATE.{self.store.stream}.{name}", request)
            except (StoreUnavailable, nats.errors.Error) as exc:
                log.debug("follow: consumer create failed, retrying: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if answer.error is not None:
                log.debug("follow: consumer create refused, retrying: %s", answer.error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self.next_dseq = 1
            return

    async def _drop(self, timeout: float | None = None) -> None:
        """Forget the current consumer and delete it on the server, bounded by `timeout` (default:
        briefly, as a recreate must not wait long on a server that is in trouble); if that fails
        it expires by itself after `inactive_threshold`. The delete goes through the store's
        request layer, which a cancel always stops: nats-py's `request` can lose a cancel that
        lands as its reply arrives (`agentlog.eventlog.cancel`), and a follow closed during a recreate
        then read on, and whoever awaited its end waited forever."""
        nc = self.store.nc
        sub, self.sub = self.sub, None
        consumer, self.consumer = self.consumer, None
        self.queue = asyncio.Queue()
        if nc.is_closed:
            return
        try:
            if sub is not None:
                await sub.unsubscribe()
            if consumer is not None and nc.is_connected:
                async with asyncio.timeout(min(1.0, self.store.request_timeout) if timeout is None else timeout):
                    await self.store._api(f"$JS.API.CONSUMER.DELETE.{self.store.stream}.{consumer}", b"")
        except (nats.errors.Error, StoreUnavailable, TimeoutError):
            pass

    async def next(self) -> StoredCommit:
        sseq, msg = await self.next_raw()
        return StoredCommit(sseq, await self.store._decode(sseq, msg))

    async def next_raw(self) -> tuple[int, Msg]:
        """The next message's stream seq and the message itself, not decoded."""
        if self.sub is None:
            await self._start()
        stall = self.heartbeat * 2.5
        while True:
            try:
                msg = await get_within(self.queue, stall)
            except TimeoutError:
                log.debug("follow %s: no message or heartbeat for %.1fs, recreating", self.filter, stall)
                await self._start()
                continue
            status = msg_status(msg)
            if status is not None:
                if not await self._control(msg, status):
                    await self._start()
                continue
            if not msg.reply:
                continue
            sseq, dseq = ack_reply_seqs(msg.reply)
            if dseq != self.next_dseq:
                log.debug("follow %s: consumer seq %d, expected %d, recreating", self.filter, dseq, self.next_dseq)
                await self._start()
                continue
            self.next_dseq = dseq + 1
            if sseq <= self.last:
                continue
            self.last = sseq
            return sseq, msg

    async def _control(self, msg: Msg, status: str) -> bool:
        """Handle a status message; False means the consumer must be recreated."""
        headers = msg.headers or {}
        if status != "100":
            log.debug("follow %s: status %s %s", self.filter, status, headers.get("Description"))
            return False
        nc = self.store.nc
        if msg.reply:  # flow control request: we have processed everything before it
            await nc.publish(msg.reply, b"")
            return True
        stalled = headers.get("Nats-Consumer-Stalled")
        if stalled:
            await nc.publish(stalled, b"")
        last_consumer = headers.get("Nats-Last-Consumer")
        if last_consumer is not None and int(last_consumer) != self.next_dseq - 1:
            return False  # a heartbeat that reveals messages we never got
        return True

    async def stop(self) -> None:
        try:
            # The full request timeout: a loaded server that answers in over a second must still
            # see the consumer go (the caller is done with it and may count consumers).
            await self._drop(self.store.request_timeout)
        except Exception:  # noqa: BLE001 - closing must not mask the reason the follow ended
            log.debug("follow: cleanup failed", exc_info=True)


