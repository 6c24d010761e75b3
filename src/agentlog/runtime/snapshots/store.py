"""Run-context snapshots: a cold resume that reads one small KV entry and the log's tail.

Folding a long run from the log costs time linear in its history: a run that went through 222
approval cycles folds ~1,100 commits on every decision. A snapshot is the loop's working context
(`loop.RunContext`, the model's messages included) and the run's projection view (`RunView`) as
of one commit seq. Resume = one KV get + the thread's commits after that seq, folded by the same
`loop.apply_event`, so `snapshot(prefix) + fold(rest) == fold(all)` (a property test proves it).

What grows with a run is immutable once written: its messages, and the views of its finished
calls. Those go into **chunks** (`chunk_spans`: aligned spans of `CHUNK_SIZE * CHUNK_FANOUT**k`
items that only ever merge, each cut further to stay under `CHUNK_MAX_BYTES`), content-addressed
(by a digest of the bytes) and written once, under one key prefix per kind: the thread's
messages, the run's calls (`chunk_key`). The run's entry holds only the mutable rest (the
context without the chunked messages, the view without the chunked calls) and the chunks'
digests. A resume on a process that holds none of the thread's chunks reads the entry and every
chunk under those two prefixes in one batched get (`read_entry`: `get_with_prefixes`, subject
wildcards: it need not know the digests first), then the log's tail, checking and decoding the
chunks while the tail's read is out. A process that saw the thread reads the entry alone and
takes the chunks from its LRU (`ChunkCache`: decoded values, keyed by digest), fetching any it
lacks alongside the tail. A writer purges the chunks of the snapshot it replaces that the new
one no longer names (spans merged into a larger one), so the prefixes hold what the entry names.

The snapshot is a derived cache and never a source of truth:
- it is written only from a context that is exactly the fold of the thread up to `seq` (the
  loop's own, after the run suspended or finished, nothing staged, all messages loaded);
- a missing, undecodable, other-version or other-thread entry, or a chunk that is missing or
  whose bytes do not match its digest, is a miss, and the caller folds the log instead; a
  snapshot the log contradicts (the thread moved under a stale entry) shows up as an OCC conflict
  at the first append, and the retry folds the log without it;
- a failed write is logged and forgotten (the next suspension writes again); chunks are written
  before the entry that names them, so an entry never names a chunk that was not stored, and
  purged only after an entry that no longer names them is stored.

I/O stays behind `SnapshotStore` (KV for real, a dict for unit tests); splitting and joining
are pure (`make_snapshot`, `assemble` in `snapshots.format`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container, Mapping, Sequence
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from agentlog.projections.kv import ensure_bucket, jetstream_of, kv_get
from agentlog.projections.views import RunView
from agentlog.runtime.logs import get_logger

#: Bumped when the meaning of a snapshot changes (e.g. `apply_event` folds something new):
#: older entries are then misses. A change of shape needs no bump: see `schema`.
#: 2: messages and finished calls moved into chunks (a version-1 reader would take the entry's
#: few messages for the whole conversation, so it must miss).
#: 3: chunk keys by kind (`chunk_key`), so a cold read gets the entry and its chunks at once.
from agentlog.runtime.snapshots.format import (
    CALLS_KIND,
    CHUNKS,
    MESSAGES_KIND,
    SNAPSHOT_BUCKET,
    ChunkCache,
    ChunkValue,
    LoadedSnapshot,
    RunSnapshot,
    assemble,
    call_chunks_prefix,
    chunk_keys,
    chunk_matches,
    decode_snapshot,
    encode_snapshot,
    message_chunks_prefix,
)

_log = get_logger("agentlog.snapshot")


class SnapshotStore(Protocol):
    """Where snapshots live: each run's entry under its run id (ids are unique across threads),
    each chunk under `chunk_key`."""

    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of `keys`, in order (None for a key that has none)."""
        ...

    async def get_with_prefixes(self, key: str, prefixes: Sequence[str]) -> tuple[bytes | None, dict[str, bytes]]:
        """The value of `key` and, read with it (one round trip), the values of the keys that
        start with one of `prefixes` (key -> value; maybe not all of them, should there be very
        many: the reader gets the others it needs by `get_many`)."""
        ...

    async def put(self, key: str, data: bytes) -> None: ...

    async def purge(self, keys: Sequence[str]) -> None:
        """Remove `keys` (chunks no entry names any more)."""
        ...

    async def delete_thread(self, thread_id: str, run_ids: Sequence[str]) -> None:
        """Remove the entries of `run_ids` and every chunk of `thread_id`."""
        ...


class MemorySnapshotStore:
    """`SnapshotStore` in a dict (unit tests)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        return self.entries.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.entries.get(key) for key in keys]

    async def get_with_prefixes(self, key: str, prefixes: Sequence[str]) -> tuple[bytes | None, dict[str, bytes]]:
        under = {k: v for k, v in self.entries.items() if any(k.startswith(p) for p in prefixes)}
        return self.entries.get(key), under

    async def put(self, key: str, data: bytes) -> None:
        self.entries[key] = data

    async def purge(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.entries.pop(key, None)

    async def delete_thread(self, thread_id: str, run_ids: Sequence[str]) -> None:
        chunks = f"c.{thread_id}."
        for key in [k for k in self.entries if k in run_ids or k.startswith(chunks)]:
            del self.entries[key]


class KVSnapshotStore:
    """`SnapshotStore` on JetStream KV bucket `<prefix>_snapshots` (history 1, created
    idempotently like the view buckets). Build with `await KVSnapshotStore.open(nc)`, or
    `KVSnapshotStore.lazy(nc)` where nothing can be awaited (the bucket is then opened at the
    first get or put)."""

    def __init__(self, kv: object | None, *, opener: Callable[[], Awaitable[object]] | None = None,
                 js: JetStreamContext | None = None, bucket: str = f"agentlog_{SNAPSHOT_BUCKET}") -> None:
        self.kv = kv
        self._opener = opener
        self._lock = asyncio.Lock()
        self._js = js
        self.bucket = bucket
        #: Request timeout (seconds) of `get_many`'s batched Direct Get, and the most bytes the
        #: server sends for one (a batch cut short there: the rest are read one by one).
        self.timeout = 5.0
        self.read_max_bytes = 8 * 1024 * 1024
        # One wildcard reply subscription for every `get_many` (token -> its replies), opened at
        # the first one: a per-request subscription would cost a SUB and an UNSUB each.
        self._reply_prefix = ""
        self._replies: dict[str, _Batch] = {}
        self._next_token = 0

    @classmethod
    async def open(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog", replicas: int | None = None) -> KVSnapshotStore:
        return cls(await _open_bucket(nc, prefix, replicas), js=jetstream_of(nc), bucket=f"{prefix}_{SNAPSHOT_BUCKET}")

    @classmethod
    def lazy(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog", replicas: int | None = None) -> KVSnapshotStore:
        return cls(None, opener=lambda: _open_bucket(nc, prefix, replicas), js=jetstream_of(nc),
                   bucket=f"{prefix}_{SNAPSHOT_BUCKET}")

    async def _kv(self) -> Any:
        if self.kv is None:
            async with self._lock:
                if self.kv is None:
                    self.kv = await self._opener()  # type: ignore[misc]
        return self.kv

    async def get(self, key: str) -> bytes | None:
        return await kv_get(await self._kv(), key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of `keys` in one batched Direct Get (`multi_last`: the last message of each
        key's subject, then an end-of-batch status) instead of one request per key: what a cold
        resume fetches its chunks with (one round trip beats concurrent gets). Keys the server did not send because the batch was cut
        short (`read_max_bytes`) are read one by one."""
        if len(keys) <= 1 or self._js is None:
            return list(await asyncio.gather(*(self.get(key) for key in keys)))
        await self._kv()
        pre = f"$KV.{self.bucket}."
        found: dict[str, bytes] = {}
        cut = False
        for i in range(0, len(keys), _MULTI_LAST_MAX):
            group = keys[i : i + _MULTI_LAST_MAX]
            try:
                batch = await self._multi_last([pre + key for key in group])
            except _Refused as exc:  # e.g. a server without multi_last (before 2.11): one by one
                _log.info("snapshot.multi_get_refused", error=str(exc))
                return list(await asyncio.gather(*(self.get(key) for key in keys)))
            found.update(batch.values)
            cut = cut or batch.more
        out: list[bytes | None] = [found.get(pre + key) for key in keys]
        if cut:  # a batch cut short at read_max_bytes: the rest one by one
            rest = [i for i, value in enumerate(out) if value is None]
            for i, value in zip(rest, await asyncio.gather(*(self.get(keys[i]) for i in rest)), strict=True):
                out[i] = value
        return out

    async def _multi_last(self, subjects: list[str], limit: int | None = None) -> _Batch:
        js: Any = self._js
        nc = js._nc  # nats-py keeps the connection and the API prefix of a JetStreamContext here
        if not self._reply_prefix:
            async with self._lock:
                if not self._reply_prefix:
                    prefix = f"{nc.new_inbox()}."
                    await nc.subscribe(f"{prefix}*", cb=self._on_reply)
                    self._reply_prefix = prefix
        self._next_token += 1
        token = str(self._next_token)
        batch = self._replies[token] = _Batch()
        request = msgspec.json.encode({"multi_last": subjects, "batch": limit or len(subjects),
                                       "max_bytes": self.read_max_bytes})
        try:
            await nc.publish(f"{js._prefix}.DIRECT.GET.KV_{self.bucket}", request, reply=self._reply_prefix + token)
            async with asyncio.timeout(self.timeout):
                await batch.done
        finally:
            del self._replies[token]
        return batch

    async def _on_reply(self, msg: Any) -> None:
        batch = self._replies.get(msg.subject[len(self._reply_prefix) :])
        if batch is None or batch.done.done():
            return
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is None:
            subject = headers.get("Nats-Subject")
            if subject is not None and "KV-Operation" not in headers:  # a value, not a delete or purge marker
                batch.values[subject] = msg.data
            return
        if status == "204":  # end of batch; pending > 0: cut short
            batch.more = headers.get("Nats-Num-Pending", "0") != "0"
            batch.done.set_result(None)
        elif status == "404":  # none of the keys has a value
            batch.done.set_result(None)
        else:
            batch.done.set_exception(_Refused(f"batched direct get answered status {status} "
                                              f"{headers.get('Description', '')}".strip()))

    async def get_with_prefixes(self, key: str, prefixes: Sequence[str]) -> tuple[bytes | None, dict[str, bytes]]:
        """One batched Direct Get: `key`'s subject and a one-token wildcard per prefix (keys
        under a prefix have one more token: a digest), so a cold read of a run's entry and its
        message chunks is one round trip, not the entry's get and then the chunks' batch."""
        if self._js is None:
            return await self.get(key), {}
        await self._kv()
        pre = f"$KV.{self.bucket}."
        try:
            batch = await self._multi_last([pre + key, *(f"{pre}{p}*" for p in prefixes)], limit=_WILDCARD_BATCH)
        except _Refused as exc:  # e.g. a server without multi_last (before 2.11)
            _log.info("snapshot.multi_get_refused", error=str(exc))
            return await self.get(key), {}
        value = batch.values.pop(pre + key, None)
        if value is None and batch.more:  # cut short before the entry: read it alone
            value = await self.get(key)
        return value, {subject[len(pre) :]: data for subject, data in batch.values.items()}

    async def put(self, key: str, data: bytes) -> None:
        await (await self._kv()).put(key, data)

    async def purge(self, keys: Sequence[str]) -> None:
        """Purge the keys' messages from the bucket's stream: no delete markers left behind
        for a wildcard read to return."""
        if not keys:
            return
        await self._kv()
        assert self._js is not None, "purge needs KVSnapshotStore.open/lazy"
        stream, pre = f"KV_{self.bucket}", f"$KV.{self.bucket}."
        await asyncio.gather(*(self._js.purge_stream(stream, subject=pre + key) for key in keys))

    async def delete_thread(self, thread_id: str, run_ids: Sequence[str]) -> None:
        """Purge the keys' messages from the bucket's stream (no delete markers left behind):
        one purge per run entry, one for all of the thread's chunks (a subject wildcard)."""
        await self._kv()
        assert self._js is not None, "delete_thread needs KVSnapshotStore.open/lazy"
        stream, pre = f"KV_{self.bucket}", f"$KV.{self.bucket}."
        subjects = [f"{pre}c.{thread_id}.>", *(pre + r for r in run_ids)]
        await asyncio.gather(*(self._js.purge_stream(stream, subject=subj) for subj in subjects))


#: Keys per batched Direct Get (the server caps the subjects of one `multi_last`).
_MULTI_LAST_MAX = 256
#: The most values one wildcard read returns (`get_with_prefixes`; a run names a few dozen
#: chunks at most, see `chunk_spans`).
_WILDCARD_BATCH = 1024


class _Refused(Exception):
    """The server answered a batched Direct Get with an error status."""


class _Batch:
    """The replies of one `multi_last` Direct Get: subject -> value, until the end of batch."""

    __slots__ = ("done", "more", "values")

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.values: dict[str, bytes] = {}
        self.more = False


async def _open_bucket(nc: NATS | JetStreamContext, prefix: str, replicas: int | None) -> object:
    return await ensure_bucket(jetstream_of(nc), f"{prefix}_{SNAPSHOT_BUCKET}", replicas=replicas,
                               description="agentlog run-context snapshots (a cache of the log)")


async def read_entry(store: SnapshotStore, run_id: str, thread_id: str | None,
                     cache: ChunkCache | None = None) -> tuple[RunSnapshot, dict[str, bytes]] | None:
    """The run's entry, or None on a miss (absent, unusable, another thread's, or the store
    failing), with what was read along with it: on a cold read (the thread known, and this
    process holding none of its chunks lately: `ChunkCache.saw_thread`), the values under the
    thread's message chunks and the run's call chunks (key -> bytes), in the same round trip
    (`get_with_prefixes`), so that a resume waits for one read before the tail, not two; else
    nothing (the entry alone: the chunks are likely cached). `load_chunks` joins them."""
    cache = CHUNKS if cache is None else cache
    prefetched: dict[str, bytes] = {}
    try:
        if thread_id is not None and not cache.saw_thread(thread_id):
            data, prefetched = await store.get_with_prefixes(
                run_id, [message_chunks_prefix(thread_id), call_chunks_prefix(thread_id, run_id)])
        else:
            data = await store.get(run_id)
    except Exception as exc:  # noqa: BLE001 - a cache that cannot answer is a miss
        _log.warning("snapshot.get_failed", run_id=run_id, error=str(exc))
        return None
    if data is None:
        return None
    entry = decode_snapshot(data)
    if entry is None or entry.ctx.run_id != run_id or (thread_id is not None and entry.ctx.thread_id != thread_id):
        _log.info("snapshot.unusable", run_id=run_id, thread_id=thread_id)
        return None
    return entry, prefetched


async def fetch_chunks(store: SnapshotStore, entry: RunSnapshot, cache: ChunkCache | None = None,
                       prefetched: Mapping[str, bytes] | None = None) -> dict[str, ChunkValue] | None:
    """The values of `entry`'s chunks (digest -> value): decoded ones from `cache`, the others'
    bytes from `prefetched` (what `read_entry` read along with the entry) or fetched in one
    `get_many`, checked against their digests but not decoded (see `ChunkValue`); None on a miss
    (a chunk missing or not matching its digest, the store failing)."""
    cache = CHUNKS if cache is None else cache
    prefetched = prefetched or {}
    keys = chunk_keys(entry)
    values: dict[str, ChunkValue] = {}
    wanted = [(kind, d) for kind, ds in ((MESSAGES_KIND, entry.message_chunks), (CALLS_KIND, entry.call_chunks)) for d in ds]
    run_id, thread = entry.ctx.run_id, entry.ctx.thread_id
    raws: dict[tuple[bytes, str], bytes | None] = {}
    for kind, digest in wanted:
        value = cache.get(digest)
        if value is None:
            raws[(kind, digest)] = prefetched.get(keys[digest])
        else:
            values[digest] = value
    missing = [chunk for chunk, raw in raws.items() if raw is None]
    if missing:
        try:
            raws.update(zip(missing, await store.get_many([keys[d] for _, d in missing]), strict=True))
        except Exception as exc:  # noqa: BLE001
            _log.warning("snapshot.chunk_get_failed", run_id=run_id, thread_id=thread, error=str(exc))
            return None
    for (kind, digest), raw in raws.items():
        if raw is None or not chunk_matches(kind, digest, raw):
            _log.info("snapshot.chunk_unusable", run_id=run_id, thread_id=thread, chunk=digest)
            return None
        values[digest] = bytes(raw)
    cache.note_thread(thread)
    return values


async def load_chunks(store: SnapshotStore, entry: RunSnapshot, cache: ChunkCache | None = None,
                      prefetched: Mapping[str, bytes] | None = None) -> LoadedSnapshot | None:
    """`entry` joined with its chunks (`fetch_chunks`, `assemble`); None on a miss."""
    values = await fetch_chunks(store, entry, cache, prefetched)
    if values is None:
        return None
    try:
        return assemble(entry, values, cache, prefetched or ())
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # checked bytes: only a bug gets here
        _log.warning("snapshot.chunk_undecodable", run_id=entry.ctx.run_id, error=str(exc))
        return None


async def load_snapshot(
    store: SnapshotStore, run_id: str, thread_id: str | None, cache: ChunkCache | None = None,
) -> LoadedSnapshot | None:
    """The run's snapshot joined with its chunks (`read_entry`, then `load_chunks`), or None on
    a miss: the log is always there to fold instead."""
    read = await read_entry(store, run_id, thread_id, cache)
    return None if read is None else await load_chunks(store, read[0], cache, read[1])


async def save_snapshot(store: SnapshotStore, entry: RunSnapshot, chunks: Mapping[str, bytes],
                        replaced: Mapping[str, str] | None = None) -> bool:
    """Write `chunks` (digest -> bytes: those the store lacks, concurrently), then `entry`,
    which names them: an entry is never stored before its chunks. Then purge the chunks of
    `replaced` (digest -> key: what the snapshot this one replaces named) that `entry` does not
    name: spans merged into a larger one, a rest that grew (left in the store, a cold read would
    fetch them along with the live ones until the thread is deleted). Returns False if a write
    failed; never raises (a purge that fails is logged: it only costs bytes)."""
    thread_id, run_id = entry.ctx.thread_id, entry.ctx.run_id
    keys = chunk_keys(entry)
    try:
        if chunks:
            await asyncio.gather(*(store.put(keys[d], data) for d, data in chunks.items()))
        await store.put(run_id, encode_snapshot(entry))
    except Exception as exc:  # noqa: BLE001 - a cache write must never fail a run
        _log.warning("snapshot.put_failed", thread_id=thread_id, run_id=run_id, error=str(exc))
        return False
    stale = [key for digest, key in (replaced or {}).items() if digest not in keys]
    if stale:
        try:
            await store.purge(stale)
        except Exception as exc:  # noqa: BLE001
            _log.warning("snapshot.purge_failed", thread_id=thread_id, run_id=run_id, error=str(exc))
    return True


class SnapshottingRuntime(Protocol):
    """What a `SnapshotWriter` uses of the `Runtime` (which sits above this room)."""

    @property
    def agents(self) -> Container[str]: ...

    @property
    def snapshots(self) -> SnapshotStore | None: ...

    async def write_snapshot(self, run_id: str, *, thread_id: str | None = None) -> RunSnapshot: ...


class SnapshotWriter:
    """Keeps run snapshots current from the projection runner (`ProjectionRunner(after_batch=
    SnapshotWriter(runtime))`), for the runs no loop snapshots itself: one whose worker died
    mid-run is then resumed from a snapshot and a short tail, not from seq 1.

    Per batch, for each unfinished run it touched: `runtime.write_snapshot` (the run's current
    snapshot + the tail, folded) when the run waits, or when it moved `every` commits past the
    last snapshot this writer wrote (a long run is not rewritten on every commit). Runs of
    agents this runtime does not know are skipped, and so are runs whose snapshot is already at
    their last commit (written here, or by the runtime's own loop: `Runtime.snapshot_seq`, which
    in `agentlog serve` covers every run it drives); any failure is logged and skipped."""

    def __init__(self, runtime: SnapshottingRuntime, *, every: int = 32, concurrency: int = 8,
                 remember: int = 10_000) -> None:
        self.runtime = runtime
        self.every = every
        self._limit = asyncio.Semaphore(concurrency)
        self._written: OrderedDict[str, int] = OrderedDict()
        self._remember = remember
        self._advanced = asyncio.Condition()
        self.writes = 0

    async def __call__(self, runs: list[RunView]) -> None:
        due = [r for r in runs if self._due(r)]
        await asyncio.gather(*(self._write(r) for r in due))

    def _due(self, run: RunView) -> bool:
        if run.finished or run.agent_id is None or run.agent_id not in self.runtime.agents:
            return False
        # the runtime's own loop snapshots a run it drives when it stops: not the same again
        own = getattr(self.runtime, "snapshot_seq", None)
        written = max(self._written.get(run.run_id, 0), own(run.run_id) if own is not None else 0)
        if written >= run.last_seq:
            return False
        return run.status == "waiting" or run.last_seq - written >= self.every

    async def _write(self, run: RunView) -> None:
        async with self._limit:
            try:
                snap = await self.runtime.write_snapshot(run.run_id, thread_id=run.thread_id)
            except Exception as exc:  # noqa: BLE001 - a cache: the fold still works without it
                _log.warning("snapshot.write_failed", thread_id=run.thread_id, run_id=run.run_id, error=str(exc))
                return
        async with self._advanced:
            self.writes += 1
            self._written[run.run_id] = snap.seq
            self._written.move_to_end(run.run_id)
            while len(self._written) > self._remember:
                self._written.popitem(last=False)
            self._advanced.notify_all()

    async def threads_deleted(self, threads: Sequence[Any]) -> None:
        """Called by the projection runner with the threads a batch deleted (`ThreadDeleted`):
        their runs' entries and their chunks are removed (a cache of a deleted thread is just
        data to leak). Failures are logged; the entries then stay, unused."""
        store = self.runtime.snapshots
        if store is None:  # a runtime without snapshots has none to remove
            return
        for thread in threads:
            for run_id in thread.run_ids:
                self._written.pop(run_id, None)
            try:
                await store.delete_thread(thread.thread_id, list(thread.run_ids))
            except Exception as exc:  # noqa: BLE001 - a cache: never stops the projections
                _log.warning("snapshot.delete_failed", thread_id=thread.thread_id, error=str(exc))

    async def wait_written(self, run_id: str, seq: int, timeout: float = 5.0) -> None:
        """Return once this writer has written `run_id`'s snapshot at `seq` or later (tests,
        tools); `TimeoutError` after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            async with self._advanced:
                await self._advanced.wait_for(lambda: self._written.get(run_id, 0) >= seq)


__all__ = [
    "KVSnapshotStore", "MemorySnapshotStore", "SnapshotStore", "SnapshotWriter", "fetch_chunks", "load_chunks",
    "load_snapshot", "read_entry", "save_snapshot",
]
