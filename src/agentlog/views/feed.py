"""`LogFeed`: the events stream from a position on, through one ordered push consumer.

Why an ordered consumer and not a durable one: the runner's position is its own (the views store
it, `agentlog.views.kv`), so nothing on the server remembers what a dead process had in flight.
A restarted runner reads from its last committed position at once; a durable consumer would
hold the dead process's unacked messages until their ack wait ran out, and every read in
between saw views older than the log. It is also the cheapest way to read the log (no acks,
flow-controlled by the server), the same reader the rebuild uses.

The buffer is bounded: once it holds `max_buffered` messages the consumer's callback waits, which
holds back the server's flow control, so catching up on a long log never buffers all of it.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy


class LogFeed:
    """`(seq, data)` of the stream's messages with seq >= `start`, in order, buffered."""

    def __init__(self, js: JetStreamContext, stream: str, subjects: str, *, max_buffered: int = 10_000) -> None:
        self.js = js
        self.stream = stream
        self.subjects = subjects
        self.max_buffered = max_buffered
        self._buf: list[tuple[int, bytes]] = []
        self._changed = asyncio.Condition()
        self._sub: JetStreamContext.PushSubscription | None = None
        self._opened = 0  # which subscription may still append (a closed one's late callback may not)

    async def open(self, start: int) -> None:
        """(Re)subscribe from seq `start` (>= 1), dropping anything buffered."""
        await self.close()
        self._opened += 1
        mine = self._opened

        async def on_msg(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            async with self._changed:
                await self._changed.wait_for(lambda: len(self._buf) < self.max_buffered or self._opened != mine)
                if self._opened != mine:
                    return
                self._buf.append((seq, msg.data))
                self._changed.notify_all()

        self._sub = await self.js.subscribe(
            self.subjects, stream=self.stream, cb=on_msg, ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start)),
            pending_msgs_limit=-1, pending_bytes_limit=-1,
        )

    async def take(self, limit: int, timeout: float) -> list[tuple[int, bytes]]:
        """Up to `limit` buffered messages, oldest first; waits up to `timeout` s for the first."""
        async with self._changed:
            if not self._buf:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._changed.wait_for(lambda: bool(self._buf))
            taken, self._buf = self._buf[:limit], self._buf[limit:]
            if taken:
                self._changed.notify_all()  # room again for a waiting callback
            return taken

    @property
    def buffered(self) -> int:
        return len(self._buf)

    async def close(self) -> None:
        self._opened += 1
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        async with self._changed:
            self._buf = []
            self._changed.notify_all()
