"""`LogFeed`: the events stream from a position on, through one ordered push consumer.

Why an ordered consumer and not a durable one: the runner's position is its own (the views store
it, `agentlog.projections.kv`), so nothing on the server remembers what a dead process had in flight.
A restarted runner reads from its last committed position at once; a durable consumer would
hold the dead process's unacked messages until their ack wait ran out, and every read in
between saw views older than the log. It is also the cheapest way to read the log (no acks,
flow-controlled by the server), the same reader the rebuild uses.

The buffer is bounded: once it holds `max_buffered` messages or `max_bytes` bytes the consumer's
callback waits, which holds back the server's flow control, so catching up on a long log never
buffers all of it. `take_through` lifts the bound until it holds the batch it waits for.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy


class LogFeed:
    """`(seq, subject, data)` of the stream's messages with seq >= `start`, in order, buffered."""

    def __init__(self, js: JetStreamContext, stream: str, subjects: str, *, max_buffered: int = 10_000,
                 max_bytes: int = 64 << 20) -> None:
        self.js = js
        self.stream = stream
        self.subjects = subjects
        self.max_buffered = max_buffered
        self.max_bytes = max_bytes
        self._buf: list[tuple[int, str, bytes]] = []
        self._bytes = 0
        self._ready = asyncio.Event()  # set while the buffer holds something
        self._room = asyncio.Event()  # set while the buffer has room
        self._room.set()
        self._grew = asyncio.Event()  # set by every append (what `take_through` waits on)
        self._through = 0  # while > 0, the bounds hold nothing back until the buffer reaches it
        self._sub: JetStreamContext.PushSubscription | None = None
        self._opened = 0  # which subscription may still append (a closed one's late callback may not)

    async def open(self, start: int) -> None:
        """(Re)subscribe from seq `start` (>= 1), dropping anything buffered."""
        await self.close()
        self._opened += 1
        mine = self._opened
        buf_append = self._buf.append

        async def on_msg(msg: Msg) -> None:
            while self._full() and self._opened == mine:
                self._room.clear()
                await self._room.wait()
            if self._opened != mine:
                return
            data = msg.data
            buf_append((msg.metadata.sequence.stream, msg.subject, data))
            self._bytes += len(data)
            self._ready.set()
            self._grew.set()

        self._sub = await self.js.subscribe(
            self.subjects, stream=self.stream, cb=on_msg, ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start)),
            pending_msgs_limit=-1, pending_bytes_limit=-1,
        )

    async def take(self, limit: int, timeout: float) -> list[tuple[int, str, bytes]]:
        """Up to `limit` buffered messages, oldest first; waits up to `timeout` s for the first."""
        if not self._buf:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
        buf = self._buf
        if len(buf) <= limit:
            taken = buf[:]
            buf.clear()  # in place: the callback appends to this very list
            self._ready.clear()
            self._bytes = 0
        else:
            taken = buf[:limit]
            del buf[:limit]
            self._bytes -= sum(len(data) for _, _, data in taken)
        if taken:
            self._room.set()
        return taken

    async def take_through(self, last: int, timeout: float) -> list[tuple[int, str, bytes]]:
        """Every buffered message with seq <= `last`, oldest first, once the feed has got that far
        (it holds a message at or past `last`); [] if it has not within `timeout`, the buffer
        left as it is. Meanwhile the buffer's bounds hold nothing back, so it can always get
        there: the caller (the runner) asks for a batch it once took whole, again, and the
        same batch must come, however large it was. [] also once past `last` with nothing up
        to it (those messages were purged since): see `reached`."""
        self._through = last
        self._room.set()  # a callback waiting for room goes on
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    while not self.reached(last):
                        self._grew.clear()
                        await self._grew.wait()
        finally:
            self._through = 0
        if not self.reached(last):
            return []
        return await self.take(bisect.bisect_right(self._buf, last, key=lambda item: item[0]), 0)

    def reached(self, seq: int) -> bool:
        """Whether the buffer holds a message at or past `seq`."""
        return bool(self._buf) and self._buf[-1][0] >= seq

    def _full(self) -> bool:
        if self._through and not self.reached(self._through):
            return False
        return len(self._buf) >= self.max_buffered or self._bytes >= self.max_bytes

    @property
    def buffered(self) -> int:
        return len(self._buf)

    async def close(self) -> None:
        self._opened += 1
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._buf.clear()
        self._bytes = 0
        self._ready.clear()
        self._room.set()  # a callback waiting for room sees it is closed and drops its message
