"""The projection runner: a durable JetStream pull consumer folding the log into KV views.

Per batch: fetch up to `batch` commits, load the views they touch (memory cache, else KV), fold
them in memory (`Folder`), write the listing index changes they make (`agentlog.views.listing`),
then each touched view ONCE (coalesced), then ack the batch (explicit
acks, the last one confirmed). A failed batch is nak'ed (redelivered at once); a crashed runner's
batch is redelivered after `ack_wait`. `max_ack_pending == batch` keeps at most one batch in
flight, so a redelivered batch always comes before anything newer (per-thread order holds).
A crash anywhere before the ack means the batch comes again; every
view stores the seq of the last commit applied to it and the fold skips commits at or below it,
so nothing is ever applied twice, and a crash between two puts of one batch is also safe (the
written views skip, the others apply).

Run ONE runner per view set: two runners sharing the durable consumer would each see part of a
thread's commits and could write its view out of order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from agentlog.log.codec import decode_commit
from agentlog.log.errors import CodecError
from agentlog.log.events import Commit
from agentlog.log.quarantine import Quarantine
from agentlog.log.subjects import EVENTS_STREAM, EVENTS_SUBJECTS

from .errors import ProjectionTimeout
from .fold import Folder, Views
from .index import diff
from .store import ViewStore
from .views import RunView, ThreadView

log = logging.getLogger("agentlog.projections")

DEFAULT_DURABLE = "agentlog_projections"


class ProjectionRunner:
    """Keeps a `ViewStore` up to date from the events stream. Use `start()`/`stop()` (or `async
    with`), or drive it by hand with `step()` (tests, tools)."""

    def __init__(
        self,
        nc: NATS,
        store: ViewStore,
        *,
        stream: str = EVENTS_STREAM,
        subjects: str = EVENTS_SUBJECTS,
        durable: str = DEFAULT_DURABLE,
        batch: int = 500,
        fetch_timeout: float = 1.0,
        ack_wait: float = 30.0,
        cache_size: int = 20_000,
        gap_retry: float = 0.2,
        after_batch: Callable[[list[RunView]], Awaitable[None]] | None = None,
        quarantine: Quarantine | None = None,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.store = store
        self.stream = stream
        self.subjects = subjects
        self.durable = durable
        self.batch = batch
        self.fetch_timeout = fetch_timeout
        self.ack_wait = ack_wait
        self.cache_size = cache_size
        self.gap_retry = gap_retry
        #: Highest stream seq whose batch is written and acked.
        self.applied_seq = 0
        #: Commits that could not be decoded (a newer writer's schema, raw bytes): quarantined.
        self.skipped: list[tuple[int, str]] = []
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self.batches = 0
        self.puts = 0
        self._threads: OrderedDict[str, ThreadView] = OrderedDict()
        self._runs: OrderedDict[str, RunView] = OrderedDict()
        self._psub: JetStreamContext.PullSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._advanced = asyncio.Condition()
        self._lock = asyncio.Lock()  # one batch (or rebuild swap) at a time
        #: Test hook: called after the KV puts of a batch, before its ack. Raising simulates a
        #: crash there (the batch is then redelivered to the next runner).
        self.before_ack: Callable[[list[int]], None] | None = None
        #: Called with the run views each batch wrote, once the batch is acked and visible (so
        #: it never delays read-your-writes): derived caches kept by someone else, e.g. the
        #: runtime's run-context snapshots (`agentlog.runtime.snapshot.SnapshotWriter`). Its failures are
        #: logged and never fail the batch. If it also has `threads_deleted`, that is awaited with
        #: the views of the threads the batch deleted (`ThreadDeleted`), so the cache can drop
        #: what it keeps for them (the snapshot writer: their runs' snapshots).
        self.after_batch = after_batch

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Create (idempotently) and bind the durable consumer; learn how far it got."""
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=self.subjects,
            ack_wait=self.ack_wait,
            max_ack_pending=self.batch,
            max_deliver=-1,
        )
        info = await self.js.add_consumer(self.stream, config)
        stream = await self.js.stream_info(self.stream)
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        self.applied_seq = max(self.applied_seq, floor, (stream.state.first_seq or 1) - 1)
        self._psub = await self.js.pull_subscribe_bind(durable=self.durable, stream=self.stream)
        ensure_index = getattr(self.store, "ensure_index", None)
        if ensure_index is not None and await ensure_index():
            log.info("indexed the existing views for listings (they predate the listing index)")

    async def start(self) -> None:
        if self._psub is None:
            await self.open()
        self._stopping = False
        self._task = asyncio.create_task(self._loop(), name="projection-runner")

    async def stop(self) -> None:
        """Stop the loop and wait for it. On Python 3.11 nats-py's fetch (`wait_for` inside) can
        swallow a cancel that lands as its timeout fires, so the loop also checks a flag and we
        cancel again until the task has really ended."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=self.fetch_timeout)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        if self._psub is not None:
            with contextlib.suppress(Exception):
                await self._psub.unsubscribe()
            self._psub = None

    async def __aenter__(self) -> ProjectionRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # NATS hiccup, KV error: the batch was not acked and comes again
                log.exception("projection batch failed; retrying")
                await asyncio.sleep(0.5)

    # -- one batch ----------------------------------------------------------------------------

    async def step(self, limit: int | None = None) -> int:
        """Fetch (up to `limit` <= `batch` commits), fold, write and ack one batch. Returns how
        many commits it held (0 if idle)."""
        if self._psub is None:
            await self.open()
        assert self._psub is not None
        try:
            msgs = await self._psub.fetch(min(limit or self.batch, self.batch), timeout=self.fetch_timeout)
        except TimeoutError:
            return 0
        if not msgs:
            return 0
        async with self._lock:
            try:
                await self._apply_batch(msgs)
            except BaseException:
                self.forget_cache()  # it may hold views that never reached the store
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.nak()
                raise
        return len(msgs)

    async def _apply_batch(self, msgs: list[Msg]) -> None:
        refresh = getattr(self.store, "refresh", None)
        if refresh is not None and await refresh():
            self._threads.clear()  # a rebuild flipped the generation: our cache is of the old one
            self._runs.clear()
        # Apply strictly in stream order: the consumer covers every subject of the stream, so its
        # seqs are contiguous. A message past a gap (an earlier one is still out at a dead runner,
        # or was nak'ed) waits for it: applying it first and the earlier one later would have the
        # apply-once check drop the earlier one.
        msgs = sorted(msgs, key=lambda m: m.metadata.sequence.stream)
        ready: list[Msg] = []
        later: list[Msg] = []
        decoded = []
        expected = self.applied_seq + 1
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq < expected:
                ready.append(msg)  # applied and acked before (the ack was lost): ack again
            elif seq == expected and not later:
                ready.append(msg)
                expected += 1
                decoded.append((seq, self._decode(seq, msg)))
            else:
                later.append(msg)
        for msg in later:
            await msg.nak(delay=self.gap_retry)
        if not ready:
            return
        seqs = [m.metadata.sequence.stream for m in ready]
        folder = Folder()
        before = await self._load(folder, decoded)
        for seq, commit in decoded:
            folder.apply_commit(seq, commit)
        touched = folder.take_touched()
        if touched.threads or touched.runs:
            # While the puts are in flight KV may already hold the new values: drop the cached
            # (older) ones first, so `cached_*` never answers older than KV (see `cached_run`).
            for cache, keys in ((self._threads, touched.threads), (self._runs, touched.runs)):
                for key in keys:
                    cache.pop(key, None)
            # The listing index first: its changes are computed from the views before and after
            # the batch, and a redelivered batch still finds the old views (then re-applies the
            # same, idempotent, changes). Written after the views, a crash in between would lose
            # them for good (the redelivery would see the new views and change nothing).
            update_index = getattr(self.store, "update_index", None)
            if update_index is not None:
                await update_index(diff(before.threads, touched.threads, before.runs, touched.runs))
            await self.store.put_views(touched.threads.values(), touched.runs.values())
            self.puts += len(touched.threads) + len(touched.runs)
        self._remember(touched.threads, touched.runs)
        if self.before_ack is not None:
            self.before_ack(seqs)
        for msg in ready[:-1]:
            await msg.ack()  # no round trip each; the server handles acks in order
        await ready[-1].ack_sync()  # confirmed: the whole batch is acked
        self.batches += 1
        async with self._advanced:
            self.applied_seq = max(self.applied_seq, expected - 1)
            self._advanced.notify_all()
        if self.after_batch is not None and touched.runs:
            try:
                await self.after_batch(list(touched.runs.values()))
            except Exception:  # noqa: BLE001 - a cache writer must not stop the projections
                log.exception("after_batch hook failed")
        deleted_hook = getattr(self.after_batch, "threads_deleted", None)
        if deleted_hook is None:
            return
        deleted = [t for t in touched.threads.values()
                   if t.deleted and not getattr(before.threads.get(t.thread_id), "deleted", False)]
        if deleted:
            try:
                await deleted_hook(deleted)
            except Exception:  # noqa: BLE001 - as above
                log.exception("threads_deleted hook failed")

    def _decode(self, seq: int, msg: Msg) -> Commit:
        """The commit at `seq`, or its quarantine stand-in (`agentlog.log.quarantine`), folded
        like every other reader folds it: it counts in the views' versions and changes nothing
        else. Also listed in `skipped`."""
        try:
            return decode_commit(msg.data)
        except CodecError as exc:
            self.skipped.append((seq, str(exc)))
            return self.quarantine.hold(seq, msg.subject, msg.metadata.timestamp, msg.data, exc)

    async def _load(self, folder: Folder, decoded: list) -> Views:
        """Seed `folder` with the views the batch touches; returns them (before the batch)."""
        thread_ids = {c.thread_id for _, c in decoded}
        run_ids = {c.run_id for _, c in decoded if c.run_id is not None}
        missing_t = [t for t in thread_ids if t not in self._threads]
        missing_r = [r for r in run_ids if r not in self._runs]
        loaded_t = await asyncio.gather(*(self.store.get_thread(t) for t in missing_t))
        loaded_r = await asyncio.gather(*(self.store.get_run(r) for r in missing_r))
        threads = [self._threads[t] for t in thread_ids if t in self._threads] + [v for v in loaded_t if v]
        runs = [self._runs[r] for r in run_ids if r in self._runs] + [v for v in loaded_r if v]
        folder.add_views(threads, runs)
        return Views({t.thread_id: t for t in threads}, {r.run_id: r for r in runs})

    def _remember(self, threads: dict[str, ThreadView], runs: dict[str, RunView]) -> None:
        _lru_put(self._threads, threads, self.cache_size)
        _lru_put(self._runs, runs, self.cache_size)

    # -- the cache as a read path --------------------------------------------------------------

    def cached_run(self, run_id: str) -> RunView | None:
        """The run's view as this runner last wrote it to `self.store`, or None (not cached: read
        the store). Never older than the store: an entry is only (re)added once its put has
        succeeded, is dropped before a put that changes it and on a failed batch, and the whole
        cache is dropped when the store changes (a rebuild's swap, a generation flip). So with
        ONE runner per view set (the rule above) a hit equals what the store would answer, and
        a read after `wait_for(seq)` sees every commit up to `seq`, like a store read.
        LRU order is left alone: reads must not keep views the runner no longer writes."""
        return self._runs.get(run_id)

    def cached_thread(self, thread_id: str) -> ThreadView | None:
        """Like `cached_run`, for a thread view."""
        return self._threads.get(thread_id)

    def forget_cache(self) -> None:
        self._threads.clear()
        self._runs.clear()

    # -- read-your-writes and lag -------------------------------------------------------------

    async def wait_for(self, seq: int, timeout: float = 5.0) -> None:
        """Return once every commit up to `seq` is in the views; `ProjectionTimeout` after
        `timeout` seconds."""
        if self.applied_seq >= seq:
            return
        try:
            async with asyncio.timeout(timeout):
                async with self._advanced:
                    await self._advanced.wait_for(lambda: self.applied_seq >= seq)
        except TimeoutError:
            raise ProjectionTimeout(seq, self.applied_seq, timeout) from None

    async def stream_last_seq(self) -> int:
        try:
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            return 0
        return info.state.last_seq

    async def lag(self) -> int:
        """Commits in the stream not yet in the views."""
        return max(0, await self.stream_last_seq() - self.applied_seq)


_V = TypeVar("_V")


def _lru_put(cache: OrderedDict[str, _V], items: dict[str, _V], size: int) -> None:
    """Put `items` in `cache` as the most recently used, then drop the least recent beyond `size`."""
    for key, view in items.items():
        cache[key] = view
        cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)
