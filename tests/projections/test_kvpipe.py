"""Pipelined KV writes and reads (`agentlog.projections.kvpipe`) against a real nats-server: the same
answers as nats-py's own `kv.put` / `kv.get`, and a refusal is an error, never a silent loss."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import KeyValueConfig

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.projections.errors import ProjectionError
from agentlog.projections.kvpipe import get_many, put_many


async def test_put_many_then_get_many_like_the_client(nats_server: EmbeddedNatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            js = nc.jetstream()
            a = await js.create_key_value(KeyValueConfig(bucket="pipe_a", history=1, direct=True))
            b = await js.create_key_value(KeyValueConfig(bucket="pipe_b", history=1, direct=True))
            writes = [(a if i % 2 else b, f"k{i}", f"v{i}".encode()) for i in range(3000)]  # > one window
            await put_many(nc, writes)
            assert (await a.get("k1")).value == b"v1" and (await b.get("k2998")).value == b"v2998"
            await a.delete("k3")
            values = await get_many(nc, [(a, "k1"), (b, "k0"), (a, "k3"), (a, "never"), (b, "k2998")])
            assert values == [b"v1", b"v0", None, None, b"v2998"]
            await js.delete_key_value("pipe_b")  # its stream is gone: no one answers the puts
            with pytest.raises(ProjectionError):
                await put_many(nc, [(b, "k0", b"x")])
    finally:
        await nc.close()
