"""Many KV writes or reads in flight at once, their replies on one subscription.

Why not `asyncio.gather(kv.put(...) ...)`: each of those is a task, a future, a timer and a
lookup in the client's reply table; for the thousands of views a rebuild or a catching-up runner
writes, that bookkeeping costs more than the server's work. Here every request is one publish
with its own reply subject under one inbox (`<inbox>.<index>`), and one callback files each
reply by its index. Same requests and replies as nats-py's own `kv.put` (a JetStream publish,
acked) and `kv.get` (a Direct Get of the key's last message).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from agentlog.projections.errors import ProjectionError

#: Bound of one exchange: every reply must have come by then (a lost server, a full disk).
TIMEOUT = 30.0
#: Requests in flight at once (the rest wait for replies), so a huge batch never floods the server.
WINDOW = 2048


async def exchange(nc: NATS, requests: Sequence[tuple[str, bytes]], *, timeout: float = TIMEOUT) -> list[Msg]:
    """Publish every `(subject, payload)` as a request and return the replies in request order."""
    n = len(requests)
    if n == 0:
        return []
    replies: list[Msg | None] = [None] * n
    received = 0
    space = asyncio.Event()
    done = asyncio.Event()
    inbox = nc.new_inbox()

    async def on_reply(msg: Msg) -> None:
        nonlocal received
        index = int(msg.subject.rpartition(".")[2])
        if replies[index] is None:
            replies[index] = msg
            received += 1
            space.set()
            if received == n:
                done.set()

    sub = await nc.subscribe(f"{inbox}.*", cb=on_reply)
    try:
        async with asyncio.timeout(timeout):
            for index, (subject, payload) in enumerate(requests):
                while index - received >= WINDOW:
                    space.clear()
                    await space.wait()
                await nc.publish(subject, payload, reply=f"{inbox}.{index}")
            await done.wait()
    except TimeoutError:
        raise ProjectionError(f"KV: {n - received} of {n} requests got no reply within {timeout}s") from None
    finally:
        await sub.unsubscribe()
    return replies  # type: ignore[return-value] # all filled: `done` was set


def _status(msg: Msg) -> str | None:
    return msg.headers.get("Status") if msg.headers else None


async def put_many(nc: NATS, writes: Sequence[tuple[KeyValue, str, bytes]]) -> None:
    """Write every `(bucket, key, value)`; each is acked by the server (raises `ProjectionError`
    on any refusal)."""
    replies = await exchange(nc, [(f"{kv._pre}{key}", value) for kv, key, value in writes])
    for (kv, key, _), reply in zip(writes, replies, strict=True):
        status = _status(reply)
        ack = _ack(reply.data) if status is None else None
        if ack is None or "error" in ack:
            raise ProjectionError(f"KV put of {key!r} in {kv._name!r} failed: {status or reply.data!r}")


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
