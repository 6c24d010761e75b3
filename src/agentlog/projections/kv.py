"""`KVViewStore`: views in JetStream KV buckets, with a generation pointer for rebuilds.

Layout (prefix "agentlog"): generation 0 lives in `agentlog_threads` / `agentlog_runs` (the
names of DESIGN 3); a rebuild writes generation n into `agentlog_threads_<n>` / `agentlog_runs_<n>`
and, only once complete, flips the pointer key `generation` in bucket `agentlog_projections`.
Each generation also has its listing index (`agentlog_index[_<n>]`, see `agentlog.projections.listing`),
written by the same runner pass and the same rebuild, so listings are O(limit).
Readers open whatever the pointer names and `refresh()` to follow a flip, so a half-built
generation is never visible. Buckets are created idempotently with explicit config (file storage,
history 1, direct gets on).

Writes are fenced (`pin_writes`, `agentlog.projections.kvpipe.WriteFence`): the puts of the views
and of the index to each bucket are a chain whose first put expects the bucket's stream at the
seq this writer last left it, the position and the batch end carry the revision of their key,
so a writer that lost the writer lease (`agentlog.projections.lease`) while it was stalled is
refused (`WriterFenced`) instead of writing over the next writer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from agentlog.eventlog.jetstream.replicas import placed, raise_replicas
from agentlog.projections.errors import ProjectionError
from agentlog.projections.kvpipe import WriteFence, get_many, update
from agentlog.projections.listing import IndexedListings, KVBlobs, ListingIndex, kv_get, put_pipelined
from agentlog.projections.views import RunView, ThreadView, ViewEncoder, decode_run, decode_thread

POINTER_KEY = "generation"
#: `position.<generation>`: the highest seq whose commits are all in that generation's views
#: (`read_position`).
POSITION_KEY = "position"
#: `batch.<generation>`: the end of the runner's latest batch, stored before its index changes
#: (`write_batch_end`).
BATCH_END_KEY = "batch"


def bucket_names(prefix: str, generation: int) -> tuple[str, str]:
    suffix = "" if generation == 0 else f"_{generation}"
    return f"{prefix}_threads{suffix}", f"{prefix}_runs{suffix}"


def index_bucket_name(prefix: str, generation: int) -> str:
    """The listing index (`agentlog.projections.listing`) of a generation, next to its views."""
    return f"{prefix}_index" + ("" if generation == 0 else f"_{generation}")


def generation_buckets(prefix: str, generation: int) -> tuple[str, str, str]:
    return (*bucket_names(prefix, generation), index_bucket_name(prefix, generation))


def jetstream_of(nc: NATS | JetStreamContext) -> JetStreamContext:
    return nc if isinstance(nc, JetStreamContext) else nc.jetstream()


async def ensure_bucket(js: JetStreamContext, bucket: str, *, replicas: int | None = None,
                        description: str = "", ttl: float | None = None,
                        storage: StorageType = StorageType.FILE) -> KeyValue:
    """Create the bucket with our config, or adopt an existing one (its config is the operator's,
    except that its replicas are raised when more are asked for; never lowered:
    `agentlog.eventlog.jetstream.replicas`). `ttl`: the bucket's max age (s), a key's value is
    removed that long after it was written."""
    config = KeyValueConfig(
        bucket=bucket, description=description, history=1, storage=storage,
        replicas=replicas or 1, direct=True, ttl=ttl,
    )
    try:
        await raise_replicas(js, f"KV_{bucket}", replicas)
    except NotFoundError:
        try:
            return await _answering(await placed(lambda: js.create_key_value(config), f"KV bucket {bucket}"), bucket)
        except BadRequestError:
            pass  # created by another process in between: adopt it
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        raise ProjectionError(f"cannot create or open KV bucket {bucket!r}") from None


#: How long a bucket this process just created may take to answer reads (a cluster elects the
#: new stream's leader first).
BUCKET_READY_TIMEOUT = 10.0


async def _answering(kv: KeyValue, bucket: str) -> KeyValue:
    """The bucket once it answers a read. On a cluster a just-created stream can answer a Direct
    Get with "no responders" until its leader is elected, and the first thing every caller does
    is read (the generation pointer, a view)."""
    deadline = asyncio.get_running_loop().time() + BUCKET_READY_TIMEOUT
    delay = 0.01
    while True:
        try:
            await kv.get(READY_PROBE_KEY)
            return kv
        except KeyNotFoundError:
            return kv  # an answer: the bucket serves reads
        except NoRespondersError:
            if asyncio.get_running_loop().time() > deadline:
                raise ProjectionError(f"KV bucket {bucket!r} was created but does not answer reads") from None
            await asyncio.sleep(delay)  # bounded back-off while the stream's leader is elected
            delay = min(delay * 2, 0.2)


#: A key never written: reading it answers "not found" once the bucket serves reads.
READY_PROBE_KEY = "_ready"


class KVViewStore(IndexedListings):
    """`ViewStore` on JetStream KV. Build with `await KVViewStore.open(nc)`."""

    def __init__(
        self, js: JetStreamContext, meta: KeyValue, threads: KeyValue, runs: KeyValue, index: KeyValue,
        *, prefix: str, generation: int, replicas: int | None,
    ) -> None:
        self.js = js
        self.meta = meta
        self.threads = threads
        self.runs = runs
        self.index_kv = index
        #: Where this writer last left the buckets it writes (module docstring: fenced writes).
        self.fence = WriteFence()
        #: The revision of each meta key (`position.<n>`, `batch.<n>`) as this writer last read or wrote it.
        self._revisions: dict[str, int] = {}
        self.index = ListingIndex(KVBlobs(index, self.fence))
        self.prefix = prefix
        self.generation = generation
        self.replicas = replicas
        #: The runner writes a long run's view after each commit: see `ViewEncoder`.
        self._encoder = ViewEncoder()

    @classmethod
    async def open(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog",
                   replicas: int | None = None) -> KVViewStore:
        js = jetstream_of(nc)
        meta = await ensure_bucket(js, f"{prefix}_projections", replicas=replicas,
                                   description="agentlog projections: generation pointer")
        generation = await read_generation(meta)
        threads, runs, index = await cls._buckets(js, prefix, generation, replicas)
        return cls(js, meta, threads, runs, index, prefix=prefix, generation=generation, replicas=replicas)

    @staticmethod
    async def _buckets(js: JetStreamContext, prefix: str, generation: int, replicas: int | None,
                       ) -> tuple[KeyValue, KeyValue, KeyValue]:
        tname, rname, iname = generation_buckets(prefix, generation)
        threads, runs, index = await asyncio.gather(
            ensure_bucket(js, tname, replicas=replicas, description="agentlog thread views"),
            ensure_bucket(js, rname, replicas=replicas, description="agentlog run views"),
            ensure_bucket(js, iname, replicas=replicas, description="agentlog listing index"))
        return threads, runs, index

    async def refresh(self) -> bool:
        """Follow a generation flip made by a rebuild (here or in another process). True if changed."""
        generation = await read_generation(self.meta)
        if generation == self.generation:
            return False
        self.threads, self.runs, self.index_kv = await self._buckets(self.js, self.prefix, generation, self.replicas)
        self.index = ListingIndex(KVBlobs(self.index_kv, self.fence))
        self.generation = generation
        self.reset_writes()
        return True

    async def new_generation(self) -> KVViewStore:
        """Empty buckets for the next generation (not yet visible to readers)."""
        generation = self.generation + 1
        await asyncio.gather(*(self._drop(name) for name in generation_buckets(self.prefix, generation)))
        # The next generation gets the replicas of the one it replaces unless told otherwise, so a
        # rebuild on an operator's R3 buckets does not fall back to R1.
        replicas = self.replicas or (await self.js.stream_info(self.threads._stream)).config.num_replicas
        threads, runs, index = await self._buckets(self.js, self.prefix, generation, replicas)
        # And purge: a file-backed stream re-created right after its deletion can come back with
        # the deleted one's messages (seen with the events stream on nats-server 2.15).
        await asyncio.gather(*(self.js.purge_stream(kv._stream) for kv in (threads, runs, index)))
        return KVViewStore(self.js, self.meta, threads, runs, index, prefix=self.prefix, generation=generation,
                           replicas=replicas)

    async def activate(self, *, drop_previous: bool = True) -> None:
        """Point readers at this generation; then drop the generation it replaced."""
        previous = await read_generation(self.meta)
        await self.meta.put(POINTER_KEY, str(self.generation).encode())
        if drop_previous and previous != self.generation:
            await asyncio.gather(*(self._drop(name) for name in generation_buckets(self.prefix, previous)))

    async def _drop(self, bucket: str) -> None:
        try:
            await self.js.delete_key_value(bucket)
        except (NotFoundError, BucketNotFoundError):
            pass

    # -- fenced writes ------------------------------------------------------------------------

    async def pin_writes(self) -> None:
        """Learn where the buckets and meta keys this store writes are now, for those it does not
        know (after `reset_writes`): called by the writer before it reads the views a batch
        folds on, so any write by someone else after that read makes its writes fail."""
        await self.fence.pin([self.threads, self.runs, self.index_kv])
        for name in (POSITION_KEY, BATCH_END_KEY):
            key = f"{name}.{self.generation}"
            if key not in self._revisions:
                self._revisions[key] = (await self._entry(key))[1]

    def reset_writes(self) -> None:
        """Forget where the buckets are and what the listing index cached: after a failed write,
        and whenever this process takes the writer lease or loses it."""
        self.fence.forget()
        self._revisions.clear()
        self.index.forget_cache()

    async def _entry(self, key: str) -> tuple[bytes | None, int]:
        """A meta key's value (None if it has none) and its revision (0 if never written)."""
        try:
            entry = await self.meta.get(key)
        except KeyNotFoundError as missing:  # never written, or deleted (then its marker's revision)
            marker = getattr(missing, "entry", None)
            return None, (marker.revision or 0) if marker is not None else 0
        return entry.value, entry.revision or 0

    # -- the runner's position ----------------------------------------------------------------

    async def read_position(self) -> int | None:
        """The seq up to which every commit is in this generation's views (written by the runner
        after each batch, and by the rebuild that made the generation), or None if never
        written. A resume hint that is never ahead of the views: the views themselves carry the
        seq they hold, so reading again from an older position changes nothing."""
        return await self._read_seq(POSITION_KEY)

    async def write_position(self, seq: int) -> None:
        await self._write_seq(POSITION_KEY, seq)

    async def read_batch_end(self) -> int | None:
        """The last seq of the runner's latest batch in this generation, or None. Above the
        position, that batch may have written index changes and not all its views: the runner
        then reads exactly up to it again (`agentlog.projections.runner`)."""
        return await self._read_seq(BATCH_END_KEY)

    async def write_batch_end(self, seq: int) -> None:
        await self._write_seq(BATCH_END_KEY, seq)

    async def _read_seq(self, name: str) -> int | None:
        """A seq stored under `<name>.<generation>` in the meta bucket; None if never written or
        unreadable (the runner then reads the log again from further back: the views skip it).
        Its revision is what this store's next write of it expects."""
        key = f"{name}.{self.generation}"
        data, self._revisions[key] = await self._entry(key)
        try:
            return int(data) if data is not None else None
        except ValueError:
            return None

    async def _write_seq(self, name: str, seq: int) -> None:
        """Write the key if it is still at the revision this store last read or wrote
        (`WriterFenced` if not)."""
        key = f"{name}.{self.generation}"
        last = self._revisions.get(key)
        if last is None:
            last = (await self._entry(key))[1]
        self._revisions.pop(key, None)  # unknown until this write is acked (it may land or not)
        self._revisions[key] = await update(self.meta, key, str(seq).encode(), last)

    # -- ViewStore ----------------------------------------------------------------------------

    async def get_thread(self, thread_id: str) -> ThreadView | None:
        data = await kv_get(self.threads, thread_id)
        return decode_thread(data) if data is not None else None

    async def get_run(self, run_id: str) -> RunView | None:
        data = await kv_get(self.runs, run_id)
        return decode_run(data) if data is not None else None

    async def get_views(self, thread_ids: Sequence[str], run_ids: Sequence[str],
                        ) -> tuple[list[ThreadView | None], list[RunView | None]]:
        """Many views in one exchange (`agentlog.projections.kvpipe`), None where there is none."""
        values = await get_many(self.js._nc, [(self.threads, t) for t in thread_ids] + [(self.runs, r) for r in run_ids])
        threads = [decode_thread(v) if v is not None else None for v in values[: len(thread_ids)]]
        runs = [decode_run(v) if v is not None else None for v in values[len(thread_ids):]]
        return threads, runs

    @property
    def max_value(self) -> int:
        """The most bytes a view may take: the server's max payload (1 MB by default), less a
        margin for the put's subject and headers."""
        return self.js._nc.max_payload - _PUT_MARGIN

    def fit_run(self, view: RunView) -> RunView:
        """The run view as this store can hold it (`ViewEncoder.fit`): writers fit a view before
        they write it and before they keep it, so what they keep is what a reader reads."""
        return self._encoder.fit(view, self.max_value)

    def fit_thread(self, view: ThreadView) -> ThreadView:
        """The thread view as this store can hold it (`ViewEncoder.fit_thread`), as `fit_run`."""
        return self._encoder.fit_thread(view, self.max_value)

    async def put_views(self, threads: Iterable[ThreadView], runs: Iterable[RunView]) -> None:
        """Pipelined puts (many in flight, each acked), one per view."""
        encode = self._encoder.encode
        try:
            writes = [(self.threads, t.thread_id, encode(t)) for t in threads]
            writes += [(self.runs, r.run_id, encode(r)) for r in runs]
        finally:
            self._encoder.forget_fitted()
        await put_pipelined(writes, fence=self.fence)

    async def list_threads(self) -> list[ThreadView]:
        return sorted((decode_thread(v) for v in await _values(self.threads, self.js)), key=lambda t: t.thread_id)

    async def list_runs(self) -> list[RunView]:
        return sorted((decode_run(v) for v in await _values(self.runs, self.js)), key=lambda r: r.run_id)


#: Bytes of a KV value's max payload left for the put's subject and headers (`max_value`).
_PUT_MARGIN = 1024


async def read_generation(meta: KeyValue) -> int:
    try:
        entry = await meta.get(POINTER_KEY)
    except KeyNotFoundError:
        return 0
    try:
        return int(entry.value or b"0")
    except ValueError:
        raise ProjectionError(f"bad generation pointer {entry.value!r} in {meta._name}") from None


async def _values(kv: KeyValue, js: JetStreamContext, timeout: float = 10.0) -> list[bytes]:
    """Latest value of every key, through one ordered watcher (no per-key round trips).

    The watcher's "initial values done" marker can come early (it is computed from consumer
    info racing with delivery), so we also count: with history 1 and no deletes, the bucket's
    stream holds exactly one message per key.
    """
    info = await js.stream_info(kv._stream)
    wanted = info.state.messages
    values: dict[str, bytes] = {}
    if wanted == 0:
        return []
    watcher = await kv.watchall(ignore_deletes=True)
    try:
        async with asyncio.timeout(timeout):
            while len(values) < wanted:
                entry = await watcher.updates(timeout=timeout)
                if entry is not None and entry.value:
                    values[entry.key] = entry.value
                elif entry is None and len(values) >= wanted:
                    break
    except TimeoutError:
        raise ProjectionError(f"listing bucket {kv._name!r} timed out ({len(values)}/{wanted} keys)") from None
    finally:
        await watcher.stop()
    return list(values.values())


__all__ = ["KVViewStore", "bucket_names", "ensure_bucket", "generation_buckets", "index_bucket_name",
           "jetstream_of", "kv_get", "read_generation"]
