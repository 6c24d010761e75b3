"""Many KV writes or reads in flight at once, their replies on one subscription.

Why not `asyncio.gather(kv.put(...) ...)`: each of those is a task, a future, a timer and a
lookup in the client's reply table; for the thousands of views a rebuild or a catching-up runner
writes, that bookkeeping costs more than the server's work. Here every request is one publish
with its own reply subject (`<inbox>.<exchange>.<index>`) under one inbox per connection,
subscribed once, and one callback files each reply by its exchange and index. Same requests and replies as nats-py's own `kv.put` (a JetStream publish,
acked) and `kv.get` (a Direct Get of the key's last message).

Fenced writes (`WriteFence`): the puts of one call to one bucket are a chain. The first expects
the bucket's stream at the seq this writer last left it (`Nats-Expected-Last-Sequence`); each
next one carries a message id of its own and expects the stream's last message to be the put
before it (`Nats-Expected-Last-Msg-Id`). So the server stores a prefix of the chain, in order,
and none of it if anyone else wrote the bucket since this writer last did. Why not each put
expecting the stream one seq further than the put before it: when the first of those is
refused, a later one is accepted if the other writer happened to write exactly as many
messages as there were puts before it. (JetStream's atomic batches would do as well, but each
costs the server many times what a put does: docs/design/decisions/gateways.md.)
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from agentlog.projections.errors import ProjectionError, WriterFenced

#: Bound of one exchange: every reply must have come by then (a lost server, a full disk).
TIMEOUT = 30.0
#: Requests in flight at once (the rest wait for replies), so a huge batch never floods the server.
WINDOW = 2048


#: JetStream's error code for a publish whose expected last sequence does not match.
WRONG_LAST_SEQUENCE = 10071
WRONG_LAST_SEQUENCE_CONSTANT = 10164
EXPECTED_LAST_SEQUENCE = "Nats-Expected-Last-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
#: ... and whose expected last message id does not match.
WRONG_LAST_MSG_ID = 10070
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
#: The duplicate window (s) the fence gives the buckets it writes: the chain needs no duplicate
#: detection, and the server keeps every message id for that long (2 min by default).
FENCED_DUPLICATE_WINDOW = 1.0

Request = tuple[str, bytes] | tuple[str, bytes, dict[str, str]]


class _Replies:
    """One connection's reply subscription for every exchange on it (`<inbox>.<exchange>.<index>`):
    subscribed once, so an exchange of one or two puts (the runner's usual batch) pays no
    subscription of its own (a SUB, an UNSUB and nats-py's task per subscription)."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.inbox = nc.new_inbox()
        self.waiting: dict[str, Callable[[int, Msg], None]] = {}
        self._next = 0
        self._sub: asyncio.Future[None] | None = None

    async def ready(self) -> None:
        if self._sub is None or (self._sub.done() and self._sub.exception() is not None):
            self._sub = asyncio.ensure_future(self._subscribe())
        await asyncio.shield(self._sub)

    async def _subscribe(self) -> None:
        await self.nc.subscribe(f"{self.inbox}.>", cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        exchange_id, _, index = msg.subject[len(self.inbox) + 1:].partition(".")
        handler = self.waiting.get(exchange_id)
        if handler is not None:
            handler(int(index), msg)

    def register(self, handler: Callable[[int, Msg], None]) -> str:
        self._next += 1
        exchange_id = str(self._next)
        self.waiting[exchange_id] = handler
        return exchange_id


_replies: weakref.WeakKeyDictionary[NATS, _Replies] = weakref.WeakKeyDictionary()


async def exchange(nc: NATS, requests: Sequence[Request], *, timeout: float = TIMEOUT) -> list[Msg]:
    """Publish every `(subject, payload[, headers])` as a request and return the replies in
    request order."""
    n = len(requests)
    if n == 0:
        return []
    replies: list[Msg | None] = [None] * n
    received = 0
    space = asyncio.Event()
    done = asyncio.Event()
    shared = _replies.get(nc)
    if shared is None:
        shared = _replies[nc] = _Replies(nc)
    await shared.ready()

    def on_reply(index: int, msg: Msg) -> None:
        nonlocal received
        if 0 <= index < n and replies[index] is None:
            replies[index] = msg
            received += 1
            space.set()
            if received == n:
                done.set()

    exchange_id = shared.register(on_reply)
    prefix = f"{shared.inbox}.{exchange_id}."
    try:
        async with asyncio.timeout(timeout):
            for index, request in enumerate(requests):
                while index - received >= WINDOW:
                    space.clear()
                    await space.wait()
                await nc.publish(request[0], request[1], reply=f"{prefix}{index}",
                                 headers=request[2] if len(request) == 3 else None)
            await done.wait()
    except TimeoutError:
        raise ProjectionError(f"KV: {n - received} of {n} requests got no reply within {timeout}s") from None
    finally:
        del shared.waiting[exchange_id]
    return replies  # type: ignore[return-value] # all filled: `done` was set


def _status(msg: Msg) -> str | None:
    return msg.headers.get("Status") if msg.headers else None


class WriteFence:
    """The last seq this writer knows of each bucket's stream (by stream name). Unknown streams
    are read (`pin`) before the writer reads what it is going to write from: a write is then
    refused if anything changed the bucket after that read. `forget` after any failed write
    (the fence no longer knows where the stream is)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._ids = map(f"{secrets.token_hex(8)}.{{}}".format, itertools.count())

    async def pin(self, kvs: Sequence[KeyValue]) -> None:
        """Learn the last seq of the streams of `kvs` this fence does not know yet (and shorten
        their duplicate window to `FENCED_DUPLICATE_WINDOW`)."""
        unknown = [kv for kv in kvs if kv._stream not in self._last]
        if not unknown:
            return
        infos = await asyncio.gather(*(kv._js.stream_info(kv._stream) for kv in unknown))
        for kv, info in zip(unknown, infos, strict=True):
            if not 0 < info.config.duplicate_window <= FENCED_DUPLICATE_WINDOW:
                info.config.duplicate_window = FENCED_DUPLICATE_WINDOW
                await kv._js.update_stream(info.config)
            self._last.setdefault(kv._stream, info.state.last_seq)

    def forget(self) -> None:
        self._last.clear()

    def known(self, stream: str) -> int | None:
        return self._last.get(stream)

    def next_id(self) -> str:
        """A message id no other put carries (this fence's random prefix, a counter)."""
        return next(self._ids)


async def put_many(nc: NATS, writes: Sequence[tuple[KeyValue, str, bytes]], *, fence: WriteFence | None = None) -> None:
    """Write every `(bucket, key, value)`; each is acked by the server (raises `ProjectionError`
    on any refusal). With `fence`, the puts to each bucket are a chain (module doc): a put is
    stored only if every put before it to that bucket was, the first only if the bucket's stream
    is where the fence knows it (`WriterFenced` if not: someone else wrote the bucket); streams
    the fence does not know are pinned first."""
    if fence is None:
        requests: list[Request] = [(f"{kv._pre}{key}", value) for kv, key, value in writes]
    else:
        await fence.pin(list({kv._stream: kv for kv, _, _ in writes}.values()))
        previous: dict[str, str] = {}
        requests = []
        for kv, key, value in writes:
            msg_id = fence.next_id()
            before = previous.get(kv._stream)
            expect = ({EXPECTED_LAST_SEQUENCE: str(fence._last[kv._stream])} if before is None
                      else {EXPECTED_LAST_MSG_ID: before})
            requests.append((f"{kv._pre}{key}", value, {MSG_ID: msg_id, **expect}))
            previous[kv._stream] = msg_id
    try:
        replies = await exchange(nc, requests)
        stored: dict[str, int] = {}
        for (kv, key, _), reply in zip(writes, replies, strict=True):
            stored[kv._stream] = _acked(reply, kv, key)
    except BaseException:
        if fence is not None:
            fence.forget()
        raise
    if fence is not None:
        fence._last.update(stored)


def _acked(reply: Msg, kv: KeyValue, key: str, fenced: tuple[int, ...] = (WRONG_LAST_SEQUENCE, WRONG_LAST_MSG_ID)) -> int:
    """The stream seq a publish ack gives; `WriterFenced` for a refusal whose code is one of
    `fenced` (an expectation another writer broke), `ProjectionError` for any other."""
    status = _status(reply)
    ack = _ack(reply.data) if status is None else None
    if ack is None or "error" in ack:
        error = ack.get("error") if ack is not None else None
        if isinstance(error, dict) and error.get("err_code") in fenced:
            raise WriterFenced(f"KV write of {key!r} in {kv._name!r} refused: another writer wrote the bucket")
        raise ProjectionError(f"KV write of {key!r} in {kv._name!r} failed: {status or reply.data!r}")
    return int(ack.get("seq", 0))


async def update(kv: KeyValue, key: str, value: bytes, last: int) -> int:
    """Write the key if its last revision is `last` (0: it has none) and return its new
    revision; `WriterFenced` if it is not (another writer wrote it). nats-py's `kv.update` as
    one request of an exchange."""
    (reply,) = await exchange(kv._js._nc, [(f"{kv._pre}{key}", value, {EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)})],
                              timeout=kv._js._timeout)
    return _acked(reply, kv, key, (WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT))


def _ack(data: bytes) -> dict[str, Any] | None:
    """A JetStream publish ack (`{"stream", "seq"}` or `{"error"}`), None if it is not one."""
    try:
        ack = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    return ack if isinstance(ack, dict) else None


async def get_many(nc: NATS, reads: Sequence[tuple[KeyValue, str]]) -> list[bytes | None]:
    """The value of every `(bucket, key)`, None where the key has none (never written, deleted)."""
    replies = await exchange(nc, [(f"{kv._js._prefix}.DIRECT.GET.{kv._stream}.{kv._pre}{key}", b"")
                                  for kv, key in reads])
    values: list[bytes | None] = []
    for (kv, key), reply in zip(reads, replies, strict=True):
        status = _status(reply)
        if status == "404":
            values.append(None)
        elif status is not None:
            raise ProjectionError(f"KV get of {key!r} in {kv._name!r} failed: status {status}")
        elif reply.headers and reply.headers.get("KV-Operation") in ("DEL", "PURGE"):
            values.append(None)
        else:
            values.append(reply.data)
    return values
