"""Run-context snapshots: a cold resume that reads one KV entry and the log's tail.

Folding a long run from the log costs time linear in its history: a run that went through 222
approval cycles folds ~900 commits on every decision. A snapshot is the loop's working context
(`loop.RunContext`, the model's messages included) and the run's projection view (`RunView`) as
of one commit seq. Resume = one KV get + the thread's commits after that seq, folded by the same
`loop.apply_event`, so `snapshot(prefix) + fold(rest) == fold(all)` (a property test proves it).

The snapshot is a derived cache and never a source of truth:
- it is written only from a context that is exactly the fold of the thread up to `seq` (the
  loop's own, after the run suspended or finished, nothing staged, all messages loaded);
- a missing, undecodable, other-version or other-thread entry is a miss, and the caller folds
  the log instead; a snapshot the log contradicts (the thread moved under a stale entry) shows
  up as an OCC conflict at the first append, and the retry folds the log without it;
- a failed write is logged and forgotten (the next suspension writes again).

I/O stays behind `SnapshotStore` (KV for real, a dict for unit tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from projections.kv import ensure_bucket, jetstream_of, kv_get
from projections.views import RunView

from .loop import RunContext, get_logger

#: Bumped when the meaning of a snapshot changes (e.g. `apply_event` folds something new):
#: older entries are then misses. A change of shape needs no bump: see `schema`.
SNAPSHOT_FORMAT = 1
SNAPSHOT_BUCKET = "snapshots"

_log = get_logger("agentlog.snapshot")


class RunSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The run as of commit `seq` of its thread: the loop context and the run view.

    `run` stays encoded (`msgspec.Raw`) until `run_view()` asks for it: the loop needs only the
    context, so a resume decodes the view (the larger half of a long run's snapshot, one entry
    per call) off the critical path, while it waits for its first commit's ack. `call_ids`:
    every call of the run so far (what a decision may name), for `decide`'s checks."""

    v: int = SNAPSHOT_FORMAT
    #: Fingerprint of the shapes of `RunContext` and `RunView` (with everything they hold) that
    #: wrote it: an entry written by code with other shapes is a miss, never a decode error later.
    schema: str = ""
    seq: int
    agent_id: str
    ctx: RunContext
    call_ids: list[str]
    run: msgspec.Raw

    @classmethod
    def of(cls, *, seq: int, agent_id: str, ctx: RunContext, run: RunView) -> RunSnapshot:
        calls = list(run.calls)
        calls += [c.id for c in ctx.step_tool_calls if c.id not in run.calls]
        return cls(schema=SCHEMA, seq=seq, agent_id=agent_id, ctx=ctx, call_ids=calls,
                   run=msgspec.Raw(_encoder.encode(run)))

    def run_view(self) -> RunView:
        with _gc_paused():
            return _view_decoder.decode(self.run)


#: MessagePack: a quarter smaller than JSON for a long run's context (the read is on the resume
#: path), same decode speed.
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunSnapshot)
_view_decoder = msgspec.msgpack.Decoder(RunView)
SCHEMA = hashlib.sha256(
    msgspec.json.encode(msgspec.json.schema_components((RunContext, RunView)), order="sorted")
).hexdigest()[:16]


def encode_snapshot(snap: RunSnapshot) -> bytes:
    return _encoder.encode(snap)


def decode_snapshot(data: bytes) -> RunSnapshot | None:
    """The snapshot in `data`, or None when it cannot be used (corrupt, other format): a miss."""
    try:
        with _gc_paused():
            snap = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return snap if snap.v == SNAPSHOT_FORMAT and snap.schema == SCHEMA else None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding a long run's snapshot allocates thousands of tracked objects at once: every
    allocation threshold crossed mid-decode runs a collection, and now and then a full one over
    the whole heap (measured over 40 cold resumes of a 222-cycle run: decode 11 ms per resume
    on average with collections running inside it, 0.6 ms without). Paused, the objects are
    collected once afterwards at the usual thresholds."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SnapshotStore(Protocol):
    """Where snapshots live: the encoded entry per run id (ids are unique across threads)."""

    async def get(self, run_id: str) -> bytes | None: ...

    async def put(self, run_id: str, data: bytes) -> None: ...


class MemorySnapshotStore:
    """`SnapshotStore` in a dict (unit tests)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    async def get(self, run_id: str) -> bytes | None:
        return self.entries.get(run_id)

    async def put(self, run_id: str, data: bytes) -> None:
        self.entries[run_id] = data


class KVSnapshotStore:
    """`SnapshotStore` on JetStream KV bucket `<prefix>_snapshots` (history 1, created
    idempotently like the view buckets). Build with `await KVSnapshotStore.open(nc)`, or
    `KVSnapshotStore.lazy(nc)` where nothing can be awaited (the bucket is then opened at the
    first get or put)."""

    def __init__(self, kv: object | None, *, opener: Callable[[], Awaitable[object]] | None = None) -> None:
        self.kv = kv
        self._opener = opener
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog", replicas: int | None = None) -> KVSnapshotStore:
        return cls(await _open_bucket(nc, prefix, replicas))

    @classmethod
    def lazy(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog", replicas: int | None = None) -> KVSnapshotStore:
        return cls(None, opener=lambda: _open_bucket(nc, prefix, replicas))

    async def _kv(self) -> Any:
        if self.kv is None:
            async with self._lock:
                if self.kv is None:
                    self.kv = await self._opener()  # type: ignore[misc]
        return self.kv

    async def get(self, run_id: str) -> bytes | None:
        return await kv_get(await self._kv(), run_id)

    async def put(self, run_id: str, data: bytes) -> None:
        await (await self._kv()).put(run_id, data)


async def _open_bucket(nc: NATS | JetStreamContext, prefix: str, replicas: int | None) -> object:
    return await ensure_bucket(jetstream_of(nc), f"{prefix}_{SNAPSHOT_BUCKET}", replicas=replicas,
                               description="agentlog run-context snapshots (a cache of the log)")


async def load_snapshot(store: SnapshotStore, run_id: str, thread_id: str | None) -> RunSnapshot | None:
    """The run's snapshot, or None on a miss (absent, unusable, another thread's, or the store
    failing: the log is always there to fold instead)."""
    try:
        data = await store.get(run_id)
    except Exception as exc:  # noqa: BLE001 - a cache that cannot answer is a miss
        _log.warning("snapshot.get_failed", run_id=run_id, error=str(exc))
        return None
    if data is None:
        return None
    snap = decode_snapshot(data)
    if snap is None or snap.ctx.run_id != run_id or (thread_id is not None and snap.ctx.thread_id != thread_id):
        _log.info("snapshot.unusable", run_id=run_id, thread_id=thread_id)
        return None
    return snap


async def save_snapshot(store: SnapshotStore, snap: RunSnapshot) -> bool:
    """Write `snap` (encoded before the first await). The caller must not change the context
    it holds meanwhile. Returns False if the write failed; never raises."""
    data = encode_snapshot(snap)
    try:
        await store.put(snap.ctx.run_id, data)
    except Exception as exc:  # noqa: BLE001 - a cache write must never fail a run
        _log.warning("snapshot.put_failed", thread_id=snap.ctx.thread_id, run_id=snap.ctx.run_id, error=str(exc))
        return False
    return True


class SnapshotWriter:
    """Keeps run snapshots current from the projection runner (`ProjectionRunner(after_batch=
    SnapshotWriter(runtime))`), for the runs no loop snapshots itself: one whose worker died
    mid-run is then resumed from a snapshot and a short tail, not from seq 1.

    Per batch, for each unfinished run it touched: `runtime.write_snapshot` (the run's current
    snapshot + the tail, folded) when the run waits, or when it moved `every` commits past the
    last snapshot this writer wrote (a long run is not rewritten on every commit). Runs of
    agents this runtime does not know are skipped; any failure is logged and skipped."""

    def __init__(self, runtime: Any, *, every: int = 32, concurrency: int = 8, remember: int = 10_000) -> None:
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
        if run.status == "done" or run.agent_id is None or run.agent_id not in self.runtime.agents:
            return False
        return run.status == "waiting" or run.last_seq - self._written.get(run.run_id, 0) >= self.every

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

    async def wait_written(self, run_id: str, seq: int, timeout: float = 5.0) -> None:
        """Return once this writer has written `run_id`'s snapshot at `seq` or later (tests,
        tools); `TimeoutError` after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            async with self._advanced:
                await self._advanced.wait_for(lambda: self._written.get(run_id, 0) >= seq)


__all__ = [
    "KVSnapshotStore", "SnapshotWriter", "MemorySnapshotStore", "RunSnapshot", "SNAPSHOT_FORMAT", "SnapshotStore",
    "decode_snapshot", "encode_snapshot", "load_snapshot", "save_snapshot",
]
