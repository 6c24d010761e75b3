"""Chunked run snapshots on a real nats-server: resume cost independent of run length.

A long run's messages and finished call views sit in immutable, content-addressed chunks written
once; the run's entry holds only the rest. A resume on a worker that saw the chunks before reads
nothing but the small entry; a worker that did not fetches the chunks (and writes the same log);
a chunk that is gone is a miss and the log is folded. Deleting a thread deletes its snapshots.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.events import Commit, ThreadDeleted
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.projections.fold import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner
from agentlog.runtime import DeterministicEntropy
from agentlog.runtime.snapshots.format import (
    CHUNKS,
    call_chunks_prefix,
    chunk_key,
    chunk_keys,
    decode_snapshot,
    encode_snapshot,
    message_chunks_prefix,
)
from agentlog.runtime.snapshots.store import KVSnapshotStore, SnapshotWriter

from tests.runtime.test_snapshot_resume import CountingStore, app, suspended_call
from tests.support.runtime import store, thread_log  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio

CYCLES = 40  # 81 messages, 40 calls: several chunks of 16


class CountingSnapshots:
    """The real snapshot store, recording the keys read and the bytes they returned."""

    def __init__(self, inner: KVSnapshotStore) -> None:
        self.inner = inner
        self.reads: list[tuple[str, int]] = []
        #: the keys of each `get_many` (one batched Direct Get each)
        self.batches: list[list[str]] = []

    async def get(self, key: str) -> bytes | None:
        data = await self.inner.get(key)
        self.reads.append((key, len(data or b"")))
        return data

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        values = await self.inner.get_many(keys)
        self.reads += [(key, len(data or b"")) for key, data in zip(keys, values, strict=True)]
        self.batches.append(list(keys))
        return values

    async def get_with_prefixes(self, key: str, prefixes: list[str]) -> tuple[bytes | None, dict[str, bytes]]:
        value, under = await self.inner.get_with_prefixes(key, prefixes)
        self.reads += [(key, len(value or b"")), *((k, len(v)) for k, v in under.items())]
        self.batches.append([key, *prefixes])
        return value, under

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def cycle(store: Any, snaps: Any, entropy: DeterministicEntropy, run_id: str, call: str, n: int,
                *, cold_cache: bool = False, text: str = "") -> tuple[str, int]:
    """One approval cycle by a fresh Runtime; returns (the next waiting call, commits read)."""
    if cold_cache:
        CHUNKS.clear()  # a worker process that never saw this run
    counting = CountingStore(store)
    rt = app(counting, entropy, snaps, text=text)
    res = await rt.decide(run_id, [{"target_id": call, "decision_id": f"d{n}", "action": "resume",
                                    "result": {"ok": True}, "updated_at": 1}],
                          thread_id=run_id.removesuffix("-run"))  # as a worker's command carries it
    assert res.handle is not None
    result = await res.handle.result()
    await rt.flush_snapshots()
    assert result.status == "waiting", result
    return suspended_call(result), counting.read


async def long_run(store: Any, snaps: Any, thread_id: str, cycles: int, **kw: Any) -> tuple[str, str, Any]:
    entropy = DeterministicEntropy(prefix=thread_id)
    first = app(store, entropy, snaps, text=kw.get("text", ""))
    result = await first.run("cycler", "go", thread_id=thread_id, run_id=f"{thread_id}-run")
    await first.flush_snapshots()
    call = suspended_call(result)
    for n in range(cycles):
        call, _ = await cycle(store, snaps, entropy, result.run_id, call, n, **kw)
    return result.run_id, call, entropy


async def test_a_warm_worker_reads_only_the_small_entry(store: Any) -> None:
    snaps = CountingSnapshots(await KVSnapshotStore.open(store.nc))
    run_id, call, entropy = await long_run(store, snaps, "chunk-w", CYCLES)
    snaps.reads.clear()
    _, commits_read = await cycle(store, snaps, entropy, run_id, call, CYCLES)
    assert commits_read == 0  # the snapshot is current: no tail
    # one KV get: the entry; the chunks come from this process's cache
    [(key, _)] = snaps.reads
    assert key == run_id
    # ...and the entry holds a bounded tail, not every message of the conversation
    data = await snaps.inner.get(run_id)
    log = await thread_log(store, "chunk-w")
    first = next(e.message.id for sc in log for e in sc.commit.events if type(e).__name__ == "MessageAppended")
    assert first.encode() not in data
    entry = decode_snapshot(data)
    assert entry is not None and len(entry.ctx.messages) < 16 and len(entry.message_chunks) >= 2
    # 81 messages: 4 chunks of 16 were merged into one of 64 on the way, and purged when the
    # entry that no longer names them was written: the thread's chunks are the ones it names
    _, under = await snaps.inner.get_with_prefixes(run_id, [message_chunks_prefix("chunk-w"),
                                                           call_chunks_prefix("chunk-w", run_id)])
    assert sorted(under) == sorted(chunk_keys(entry).values())


async def test_a_cold_worker_fetches_the_chunks_and_writes_the_same_log(store: Any) -> None:
    snaps = CountingSnapshots(await KVSnapshotStore.open(store.nc))
    run_id, call, entropy = await long_run(store, snaps, "chunk-c", 20, cold_cache=True)
    before = decode_snapshot(await snaps.inner.get(run_id))
    assert before is not None and before.chunks
    snaps.reads.clear()
    snaps.batches.clear()
    _, commits_read = await cycle(store, snaps, entropy, run_id, call, 20, cold_cache=True)
    assert commits_read == 0
    # one read (this process's cache was empty): the entry, and with it every chunk under the
    # thread's messages and the run's calls, which are the chunks it names (merged spans'
    # chunks were purged as they were replaced)
    fetched = [key for key, _ in snaps.reads]
    assert fetched[0] == run_id
    assert sorted(fetched[1:]) == sorted(chunk_keys(before).values())
    assert snaps.batches == [[run_id, message_chunks_prefix("chunk-c"), call_chunks_prefix("chunk-c", run_id)]]
    # the control (no snapshots; memory store, so the same commit ids can be written again):
    # the same cycles write exactly the same commits
    control = MemoryEventStore()
    await long_run(control, None, "chunk-c", 21)
    assert [sc.commit for sc in await thread_log(store, "chunk-c")] == [sc.commit for sc in await thread_log(control, "chunk-c")]


async def test_chunks_a_cold_read_finds_beside_the_named_ones_are_purged_by_the_next_snapshot(store: Any) -> None:
    """A cold read gets every chunk under the thread's messages and the run's calls. Chunks there
    that the entry does not name (a run's first snapshot does not know the spans its thread's
    earlier runs merged; a writer stopped between its chunks and its entry) would be read along
    on every cold resume: the next snapshot of the run purges them."""
    kv = await KVSnapshotStore.open(store.nc)
    run_id, call, entropy = await long_run(store, kv, "chunk-x", 20)
    left = [message_chunks_prefix("chunk-x") + "0" * 32, call_chunks_prefix("chunk-x", run_id) + "1" * 32]
    for key in left:
        await kv.put(key, b"left behind")
    _, commits_read = await cycle(store, kv, entropy, run_id, call, 20, cold_cache=True)
    assert commits_read == 0  # what it does not name changes nothing for the resume
    entry = decode_snapshot(await kv.get(run_id))
    assert entry is not None
    _, under = await kv.get_with_prefixes(run_id, [message_chunks_prefix("chunk-x"), call_chunks_prefix("chunk-x", run_id)])
    assert sorted(under) == sorted(chunk_keys(entry).values())


async def test_a_cold_resume_decodes_the_finished_calls_only_when_the_run_view_is_read(store: Any) -> None:
    """A worker that never saw the run drives it and learns its status (what it settles a
    command with) without decoding the views of the run's finished calls; reading the result's
    run view decodes them, and it is the view the projections fold from the log."""
    kv = await KVSnapshotStore.open(store.nc)
    run_id, call, entropy = await long_run(store, kv, "chunk-l", CYCLES)
    entry = decode_snapshot(await kv.get(run_id))
    assert entry is not None and entry.call_chunks and entry.message_chunks
    CHUNKS.clear()
    rt = app(store, entropy, kv)
    res = await rt.decide(run_id, [{"target_id": call, "decision_id": f"d{CYCLES}", "action": "resume",
                                    "result": {"ok": True}, "updated_at": 1}])
    assert res.handle is not None
    result = await res.handle.result()
    assert result.status == "waiting" and result.termination is None
    assert all(CHUNKS.get(d) is not None for d in entry.message_chunks)  # the model needed every message
    assert [CHUNKS.get(d) for d in entry.call_chunks] == [None] * len(entry.call_chunks)  # not decoded
    whole = fold_commits(await thread_log(store, "chunk-l")).runs[run_id]
    assert result.run == whole and res.handle.view() == whole
    assert all(CHUNKS.get(d) is not None for d in entry.call_chunks)
    await rt.flush_snapshots()


async def test_a_run_of_large_messages_keeps_its_snapshot_within_the_servers_max_payload(store: Any) -> None:
    """Chunks are cut by size as well as by item count: by count alone, 16 messages, 8 of them of
    150 KB, make a 1.2 MB chunk, over the server's max payload (1 MB), whose put fails (logged and
    forgotten, as a cache write may), so no entry is written after it and every later resume folds
    the run's whole log. A rest too large for the entry goes into chunks of its own."""
    kv = await KVSnapshotStore.open(store.nc)
    text = "x" * 150_000
    run_id, call, entropy = await long_run(store, kv, "chunk-big", 20, text=text, cold_cache=True)
    entry = decode_snapshot(await kv.get(run_id))
    assert entry is not None and entry.seq == await store.thread_version("chunk-big")
    sizes = [len(await kv.get(key) or b"") for key in chunk_keys(entry).values()]
    assert sizes and 0 < max(sizes) < store.max_payload and len(encode_snapshot(entry)) < store.max_payload
    _, commits_read = await cycle(store, kv, entropy, run_id, call, 20, cold_cache=True, text=text)
    assert commits_read == 0  # resumed from the snapshot, not from the log
    # the same log as a run without snapshots
    control = MemoryEventStore()
    await long_run(control, None, "chunk-big", 21, text=text)
    assert [sc.commit for sc in await thread_log(store, "chunk-big")] == [sc.commit for sc in await thread_log(control, "chunk-big")]


async def test_a_missing_chunk_is_a_miss_and_the_log_is_folded(store: Any) -> None:
    kv = await KVSnapshotStore.open(store.nc)
    run_id, call, entropy = await long_run(store, kv, "chunk-m", 20)
    entry = decode_snapshot(await kv.get(run_id))
    assert entry is not None and entry.message_chunks
    js = store.nc.jetstream()
    await js.purge_stream(f"KV_{kv.bucket}", subject=f"$KV.{kv.bucket}.{chunk_key('chunk-m', entry.message_chunks[0])}")
    call, commits_read = await cycle(store, kv, entropy, run_id, call, 20, cold_cache=True)
    assert commits_read > 0  # folded from the log
    # ...and that cycle wrote a complete snapshot again: the next cold worker reads only the tail
    call, commits_read = await cycle(store, kv, entropy, run_id, call, 21, cold_cache=True)
    assert commits_read == 0
    # a chunk of call views, the same
    entry = decode_snapshot(await kv.get(run_id))
    assert entry is not None and entry.call_chunks
    await js.purge_stream(f"KV_{kv.bucket}", subject=f"$KV.{kv.bucket}.{chunk_keys(entry)[entry.call_chunks[-1]]}")
    _, commits_read = await cycle(store, kv, entropy, run_id, call, 22, cold_cache=True)
    assert commits_read > 0


class DeletionWatcher(SnapshotWriter):
    """The snapshot writer, with an event set once it handled a thread deletion (what the test
    waits on: the runner calls the hook after it acked the batch)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.deleted = asyncio.Event()

    async def threads_deleted(self, threads: Any) -> None:
        await super().threads_deleted(threads)
        self.deleted.set()


async def test_deleting_a_thread_deletes_its_snapshots(store: Any) -> None:
    kv = await KVSnapshotStore.open(store.nc)
    run_id, _, entropy = await long_run(store, kv, "chunk-d", 20)
    keep_id, _, _ = await long_run(store, kv, "chunk-k", 20)  # another thread: untouched
    entry = decode_snapshot(await kv.get(run_id))
    assert entry is not None and entry.chunks
    writer = DeletionWatcher(app(store, entropy, kv))
    async with ProjectionRunner(store.nc, await KVViewStore.open(store.nc), after_batch=writer,
                                fetch_timeout=0.2) as runner:
        version = await store.thread_version("chunk-d")
        await store.append(Commit(commit_id="del-chunk-d", thread_id="chunk-d", run_id=None, ts=1,
                                  events=[ThreadDeleted()]), version)
        await runner.wait_for(version + 1)
        await asyncio.wait_for(writer.deleted.wait(), 5.0)
    assert await kv.get(run_id) is None
    assert [await kv.get(key) for key in chunk_keys(entry).values()] == [None] * len(entry.chunks)
    kept = decode_snapshot(await kv.get(keep_id))
    assert kept is not None and all([await kv.get(key) for key in chunk_keys(kept).values()])


async def test_get_many_answers_each_key_in_one_batched_get(store: Any) -> None:
    kv = await KVSnapshotStore.open(store.nc)
    await kv.put("gm.a", b"A")
    await kv.put("gm.b", b"B" * 70_000)
    await kv.put("gm.gone", b"x")
    await (await kv._kv()).delete("gm.gone")  # a delete marker is no value
    keys = ["gm.b", "gm.none", "gm.a", "gm.gone", "gm.a"]
    assert await kv.get_many(keys) == [b"B" * 70_000, None, b"A", None, b"A"]
    assert await kv.get_many(["gm.none", "gm.gone"]) == [None, None]  # the server answers 404: nothing
    assert await kv.get_many(["gm.a"]) == [b"A"] and await kv.get_many([]) == []


async def test_get_many_splits_large_requests_and_reads_the_rest_of_a_cut_batch(store: Any, monkeypatch: Any) -> None:
    kv = await KVSnapshotStore.open(store.nc)
    want = [str(i).encode() * 100 for i in range(5)]
    for i, value in enumerate(want):
        await kv.put(f"gm.cut{i}", value)
    keys = [f"gm.cut{i}" for i in range(5)]
    monkeypatch.setattr("agentlog.runtime.snapshots.store._MULTI_LAST_MAX", 2)  # three batched gets
    assert await kv.get_many(keys) == want
    kv.read_max_bytes = 150  # the server cuts each batch after a value or so: the rest one by one
    assert await kv.get_many(keys) == want
