"""Pipelined KV writes and reads (`agentlog.projections.kvpipe`) against a real nats-server: the same
answers as nats-py's own `kv.put` / `kv.get`, and a refusal is an error, never a silent loss."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import KeyValueConfig

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.projections.errors import ProjectionError, WriterFenced
from agentlog.projections.kvpipe import FENCED_DUPLICATE_WINDOW, WriteFence, get_many, put_many, update


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


async def test_concurrent_exchanges_on_one_connection_each_get_their_own_replies(nats_server: EmbeddedNatsServer) -> None:
    """Every exchange of a connection shares its one reply subscription: replies are filed by
    exchange, so exchanges in flight together never take each other's answers."""
    nc = await nats.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            js = nc.jetstream()
            kv = await js.create_key_value(KeyValueConfig(bucket="pipe_c", history=1, direct=True))
            await asyncio.gather(*(put_many(nc, [(kv, f"e{e}k{i}", f"{e}:{i}".encode()) for i in range(e + 1)])
                                   for e in range(20)))
            reads = [(kv, f"e{e}k{i}") for e in range(20) for i in range(e + 1)]
            got = await asyncio.gather(*(get_many(nc, [read]) for read in reads))
            assert [value for (value,) in got] == [f"{e}:{i}".encode() for e in range(20) for i in range(e + 1)]
    finally:
        await nc.close()


async def test_update_writes_only_at_the_expected_revision(nats_server: EmbeddedNatsServer) -> None:
    """`update` is nats-py's `kv.update`: the new revision, or `WriterFenced` when the key moved."""
    nc = await nats.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            kv = await nc.jetstream().create_key_value(KeyValueConfig(bucket="pipe_d", history=1, direct=True))
            first = await update(kv, "pos", b"1", 0)
            assert (await kv.get("pos")).revision == first
            second = await update(kv, "pos", b"2", first)
            with pytest.raises(WriterFenced):
                await update(kv, "pos", b"3", first)  # another writer's revision is on the key
            with pytest.raises(WriterFenced):
                await update(kv, "new", b"1", second)  # the key has no revision yet
            entry = await kv.get("pos")
            assert (entry.value, entry.revision) == (b"2", second)
    finally:
        await nc.close()


async def test_a_fenced_call_whose_first_put_is_refused_lands_none_of_the_rest(nats_server: EmbeddedNatsServer) -> None:
    """What the fence is for: a writer that lost the bucket to another (stalled past its lease)
    writes nothing of a call, not even its later puts (with puts each expecting one more than
    the last, the second one here would land: one foreign write is what it expects)."""
    nc = await nats.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            kv = await nc.jetstream().create_key_value(KeyValueConfig(bucket="pipe_e", history=1, direct=True))
            fence = WriteFence()
            await put_many(nc, [(kv, "page", b"1"), (kv, "header", b"1")], fence=fence)
            await kv.put("other", b"x")  # another writer: the fence's known seq is behind now
            with pytest.raises(WriterFenced):
                await put_many(nc, [(kv, "page", b"2"), (kv, "header", b"2")], fence=fence)
            assert (await kv.get("page")).value == b"1" and (await kv.get("header")).value == b"1"
    finally:
        await nc.close()


async def test_fenced_writes_to_several_buckets_land_and_move_the_fence(nats_server: EmbeddedNatsServer) -> None:
    """A fenced call chains the puts of each bucket: everything lands, the fence then knows
    each stream's last seq, and the next call builds on it. The buckets it pins get a short
    duplicate window (the chain's message ids need no duplicate detection)."""
    nc = await nats.connect(nats_server.url)
    try:
        async with asyncio.timeout(60):
            js = nc.jetstream()
            a = await js.create_key_value(KeyValueConfig(bucket="pipe_f", history=1, direct=True))
            b = await js.create_key_value(KeyValueConfig(bucket="pipe_g", history=1, direct=True))
            await a.put("before", b"0")
            fence = WriteFence()
            many = 3000  # > one exchange's window
            await put_many(nc, [(a, f"k{i}", f"a{i}".encode()) for i in range(many)] + [(b, "only", b"b")], fence=fence)
            assert fence.known("KV_pipe_f") == 1 + many and fence.known("KV_pipe_g") == 1
            assert (await js.stream_info("KV_pipe_f")).config.duplicate_window == FENCED_DUPLICATE_WINDOW
            await put_many(nc, [(a, "k0", b"again"), (b, "only", b"again"), (a, "k1", b"again")], fence=fence)
            values = await get_many(nc, [(a, "k0"), (a, "k1"), (a, f"k{many - 1}"), (b, "only"), (a, "before")])
            assert values == [b"again", b"again", f"a{many - 1}".encode(), b"again", b"0"]
            assert fence.known("KV_pipe_f") == 3 + many and fence.known("KV_pipe_g") == 2
    finally:
        await nc.close()


async def test_a_fenced_call_stops_at_a_put_the_server_refuses(nats_server: EmbeddedNatsServer) -> None:
    """A put refused for any reason (here: over the bucket's value size) stops its bucket's
    chain: the puts before it land, none after it, and the error names the refused one."""
    nc = await nats.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            kv = await nc.jetstream().create_key_value(
                KeyValueConfig(bucket="pipe_i", history=1, direct=True, max_value_size=256))
            fence = WriteFence()
            with pytest.raises(ProjectionError, match="'big'") as refused:
                await put_many(nc, [(kv, "first", b"1"), (kv, "big", b"x" * 1024), (kv, "after", b"1")], fence=fence)
            assert not isinstance(refused.value, WriterFenced)
            assert await get_many(nc, [(kv, "first"), (kv, "big"), (kv, "after")]) == [b"1", None, None]
    finally:
        await nc.close()


@pytest.mark.parametrize("foreign_writes", [1, 2, 3])
async def test_a_refused_fenced_call_lands_nothing_in_that_bucket_whatever_the_other_writer_wrote(
        nats_server: EmbeddedNatsServer, foreign_writes: int) -> None:
    """However many messages the other writer wrote, no put of a refused batch lands, and the
    fence forgets where the streams are (the next call pins them again)."""
    nc = await nats.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            kv = await nc.jetstream().create_key_value(
                KeyValueConfig(bucket=f"pipe_h{foreign_writes}", history=1, direct=True))
            fence = WriteFence()
            await put_many(nc, [(kv, f"k{i}", b"1") for i in range(4)], fence=fence)
            for i in range(foreign_writes):
                await kv.put(f"other{i}", b"x")
            with pytest.raises(WriterFenced):
                await put_many(nc, [(kv, f"k{i}", b"2") for i in range(4)], fence=fence)
            assert await get_many(nc, [(kv, f"k{i}") for i in range(4)]) == [b"1"] * 4
            assert fence.known(f"KV_pipe_h{foreign_writes}") is None
            await put_many(nc, [(kv, f"k{i}", b"3") for i in range(4)], fence=fence)
            assert await get_many(nc, [(kv, f"k{i}") for i in range(4)]) == [b"3"] * 4
    finally:
        await nc.close()
