"""The projection runner: folds the log into KV views, from its last committed position on.

Per batch: take up to `batch` commits from the log feed (`agentlog.projections.feed`: an ordered
consumer from the runner's position), load the views they touch (memory cache, else KV), fold
them in memory (`Folder`), write the listing index changes they make (`agentlog.projections.listing`),
then each touched view ONCE (coalesced), then the position (the batch's last seq, next to the
views: `KVViewStore.write_position`). A failed batch is read again from the position.

A crash anywhere before the position is written means the batch is read again by the next
runner; every view stores the seq of the last commit applied to it and the fold skips commits at
or below it, so nothing is ever applied twice, and a crash between two puts of one batch is also
safe (the written views skip, the others apply). Nothing of the log is leased: a runner that
takes over after a SIGKILL reads from the position at once.

The batch read again must end where the failed one did. The listing index is written before
the views, from the views before and after the batch; a crash in between leaves lists that
match the batch's end while the views not yet written are as before it. Read again up to the
same end, those views make the same, idempotent, changes. Read again further, they would not
undo what the failed batch added: a run started in it (listed as running, its view never
written) and finished by the next commit goes from no view straight to "done", and stays
listed as running too. So each batch that changes a list stores its end (`write_batch_end`,
next to the position) before it writes any index change, and the runner, this one or the next
after a crash, takes exactly the commits up to that end (`LogFeed.take_through`) before any new
batch. A batch that changes no list (most commits: a step, a message, a call) stores none: read
again to any end, it changes no list either.

One writer per view set: with a `WriterLease` (`agentlog.projections.lease`; every gateway
process passes one) any number of runners share a view set and only the lease's holder writes.
The others are standbys: they follow the position the writer stores (a KV watch of the meta
bucket, read again every second in case the watch went quiet), so `applied_seq` and
`wait_for` (read-your-writes) work whichever process wrote, and they try to take the lease.
A runner that takes it starts from the stored position with an empty cache; one that loses it
(it could not renew in time) drops its cache and follows again. Its writes are fenced
(`agentlog.projections.kv`), so even a writer stalled past its lease between its check and
its writes is refused (`WriterFenced`) rather than writing an older copy over a newer one.
The writer also publishes what each batch changed as a core NATS notice
(`agentlog.projections.notices`); a standby tells its `listeners` of it once its `applied_seq`
(the stored position) reaches it, so every gateway's listeners hear of every batch, and of a
`reload` when one may have been missed.
Without a lease (tools, tests driving `step()`) the runner is the writer, and must be the only one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from agentlog.eventlog.codec import decode_commit
from agentlog.eventlog.errors import CodecError
from agentlog.eventlog.events import Commit
from agentlog.eventlog.quarantine import Quarantine
from agentlog.eventlog.subjects import (
    EVENTS_STREAM,
    EVENTS_SUBJECTS,
    PREFIX,
    parse_event_subject,
    view_changes_subject,
)
from agentlog.projections.errors import ProjectionTimeout, WriterFenced
from agentlog.projections.feed import LogFeed
from agentlog.projections.fold import Folder, Views
from agentlog.projections.index import diff
from agentlog.projections.lease import WriterLease
from agentlog.projections.notices import BatchChanges, decode_changes, encode_changes
from agentlog.projections.store import ViewStore
from agentlog.projections.views import RunView, ThreadView

log = logging.getLogger("agentlog.projections")

#: `ProjectionRunner.listeners`: told what each batch changed (or `reload`: something unknown did).
BatchListener = Callable[[BatchChanges], None]

#: Most notices a standby holds for `applied_seq` to reach them (beyond: one reload instead).
MAX_PENDING = 1000

#: How long (s) a standby waits for the writer's next position write before it reads the
#: position itself (a KV watch can go quiet without telling, like the feed: `_check_stalled`).
FOLLOW_POLL = 1.0


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
        batch: int = 500,
        fetch_timeout: float = 1.0,
        cache_size: int = 20_000,
        after_batch: Callable[[list[RunView]], Awaitable[None]] | None = None,
        quarantine: Quarantine | None = None,
        refresh_interval: float = 1.0,
        catch_up_batch: int = 5000,
        stall_check_interval: float = 1.0,
        lease: WriterLease | None = None,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.store = store
        self.stream = stream
        self.subjects = subjects
        self.batch = batch
        #: Commits per batch while the runner is behind (more than `batch` wait in the feed):
        #: fewer, larger batches write each view and list page fewer times (a restart catching
        #: up). A runner keeping up takes what came, up to `batch`.
        self.catch_up_batch = max(batch, catch_up_batch)
        self.fetch_timeout = fetch_timeout
        self.cache_size = cache_size
        #: How often (s) a batch checks whether a rebuild elsewhere flipped the view generation
        #: (a KV read; every batch after a failed one).
        self.refresh_interval = refresh_interval
        self._refresh_due = 0.0
        #: How often (s) an idle runner asks the stream whether commits wait past its cursor
        #: (`_check_stalled`).
        self.stall_check_interval = stall_check_interval
        self._stall_check_due = 0.0
        self._stalled_at: int | None = None  # the cursor an idle check last found behind the stream
        self._reopened_at: int | None = None  # the cursor the feed was last opened again at
        #: Times the feed was found stalled and opened again (health, tests).
        self.feed_reopens = 0
        #: Highest stream seq whose batch is in the views (what `wait_for` waits on; never lowered).
        self.applied_seq = 0
        #: Commits that could not be decoded (a newer writer's schema, raw bytes): quarantined.
        self.skipped: list[tuple[int, str]] = []
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self.batches = 0
        self.puts = 0
        #: The log's last seq when the runner opened: until `applied_seq` reaches it the views
        #: are catching up on what was written while no runner ran (`catching_up`).
        self.head_at_open = 0
        #: Why the last batch failed (e.g. a KV write refused), None once a batch succeeds.
        self.failing: str | None = None
        self._threads: OrderedDict[str, ThreadView] = OrderedDict()
        self._runs: OrderedDict[str, RunView] = OrderedDict()
        #: Highest seq folded into the current store's views: where the feed goes on from. Below
        #: `applied_seq` only after a rebuild elsewhere made a generation that ends earlier.
        self._cursor = 0
        #: The end of the last batch that may have written index changes without its views (see
        #: the module docstring): while above `_cursor`, the next batch is the commits up to it.
        self._redo = 0
        self._feed: LogFeed | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._advanced = asyncio.Condition()
        self._lock = asyncio.Lock()  # one batch (or rebuild swap) at a time
        #: Test hook: called after the KV puts of a batch, before its position is written.
        #: Raising simulates a crash there (the batch is then read again).
        self.before_ack: Callable[[list[int]], None] | None = None
        #: Called with the run views each batch wrote, once the batch is committed and visible (so
        #: it never delays read-your-writes): derived caches kept by someone else, e.g. the
        #: runtime's run-context snapshots (`agentlog.runtime.snapshots.store.SnapshotWriter`). Its failures are
        #: logged and never fail the batch. If it also has `threads_deleted`, that is awaited with
        #: the views of the threads the batch deleted (`ThreadDeleted`), so the cache can drop
        #: what it keeps for them (the snapshot writer: their runs' snapshots).
        self.after_batch = after_batch
        #: Told of each batch as it becomes visible (in the same step that raises `applied_seq`,
        #: so a listener added before a read of `applied_seq` misses no batch after it): what it
        #: changed (`BatchChanges`). On every runner of the view set, whichever writes: a standby
        #: tells them the writer's notices (`agentlog.projections.notices`), and `reload` when it
        #: may have missed one. Called synchronously and must not block (e.g. the gateway's live
        #: listing changes, `agentlog.gateway.http.changes`); failures are logged and never fail
        #: the batch.
        self.listeners: list[BatchListener] = []
        #: The highest seq whose batch this runner heard of (folded it, or got the writer's
        #: notice of it, or told a reload up to it): a notice going on from past it was missed.
        self._heard = 0
        #: Notices heard before `applied_seq` reached them, told when it does.
        self._pending: list[BatchChanges] = []
        self._notices: Subscription | None = None
        #: Who may write: None, this runner always does; else only while it holds the lease.
        self.lease = lease
        self._writing = lease is None
        self._follower: asyncio.Task[None] | None = None
        #: Times this runner took over as the writer, and gave it up (health, tests).
        self.takeovers = 0
        self.stepped_down = 0

    @property
    def writer(self) -> bool:
        """This runner writes the views (it holds the lease, or runs without one)."""
        return self._writing

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Learn the position the store holds and start reading the log after it, trusting
        nothing cached about what was written before (by this runner or another)."""
        self._forget_writes()
        pin = getattr(self.store, "pin_writes", None)
        if pin is not None:
            await pin()  # before anything is read that a write (the index, below) is based on
        position = await self._stored_position()
        try:
            stream = await self.js.stream_info(self.stream)
            first, self.head_at_open = stream.state.first_seq or 1, stream.state.last_seq
        except NotFoundError:
            first = 1
        self._cursor = max(position, first - 1)
        end = await self._stored_batch_end()
        self._redo = end if end <= self.head_at_open else 0  # else not this stream's (re-created)
        self.applied_seq = max(self.applied_seq, self._cursor)
        ensure_index = getattr(self.store, "ensure_index", None)
        if ensure_index is not None and await ensure_index():
            log.info("brought the listing index to the views (they predate it, or its format)")
        self._feed = LogFeed(self.js, self.stream, self.subjects,
                             max_buffered=max(10_000, 4 * self.batch, 2 * self.catch_up_batch))
        await self._feed.open(self._cursor + 1)

    async def _stored_position(self) -> int:
        read = getattr(self.store, "read_position", None)
        position = await read() if read is not None else None
        return int(position) if position is not None else 0

    async def _stored_batch_end(self) -> int:
        read = getattr(self.store, "read_batch_end", None)
        end = await read() if read is not None else None
        return end or 0

    async def start(self) -> None:
        """Start the loop. Without a lease, as the writer (the log is opened first). With one,
        the lease is tried once at once (the only runner of a deployment writes from its first
        batch) and otherwise the runner follows the writer's position until it gets it."""
        self._stopping = False
        if self.lease is None:
            if self._feed is None:
                await self.open()
        else:
            await self._listen()
            if await self.lease.try_acquire():
                await self._take_over()
            else:
                await self._start_following()
        self._task = asyncio.create_task(self._loop(), name="projection-runner")

    async def stop(self) -> None:
        """Stop the loop and wait for it (cancelled again until it has really ended: a cancel
        landing as an inner timeout fires can be swallowed), then stop reading the log and give
        the lease up (a standby takes over at its next try)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=self.fetch_timeout)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        await self._stop_following()
        notices, self._notices = self._notices, None
        if notices is not None:
            with contextlib.suppress(Exception):
                await notices.unsubscribe()
        if self._feed is not None:
            await self._feed.close()
            self._feed = None
        if self.lease is not None:
            self._writing = False
            await self.lease.release()

    async def __aenter__(self) -> ProjectionRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                if self.lease is not None and not await self._hold():
                    continue
                await self.step()
            except asyncio.CancelledError:
                raise
            except WriterFenced as exc:  # someone else writes: find out now whether the lease is lost
                log.warning("projection batch refused: %s", exc)
                if self.lease is not None:
                    await self.lease.renew()
            except Exception:  # NATS hiccup, KV error: the batch is read again from the position
                log.exception("projection batch failed; retrying")
                await asyncio.sleep(0.5)

    # -- the writer lease ---------------------------------------------------------------------

    async def _hold(self) -> bool:
        """Whether this runner may write a batch now: it holds a valid lease (taking it over if
        it is free). Else it waits a little (the caller loops) and stays or becomes a standby."""
        assert self.lease is not None
        if self._writing and self.lease.valid():
            return True
        if self._writing and not self.lease.held:
            await self._step_down()
        if not self._writing and await self.lease.try_acquire():
            await self._take_over()
            return True
        # a standby, or a holder whose renewals fail (NATS unreachable): writes nothing meanwhile
        await asyncio.sleep(self.lease.acquire_interval)
        return False

    async def _take_over(self) -> None:
        """Become the writer: from the position the store holds, with nothing cached."""
        await self._stop_following()  # first: it may be waiting for the lock
        async with self._lock:
            refresh = getattr(self.store, "refresh", None)
            if refresh is not None:
                await refresh()  # the generation a rebuild elsewhere may have flipped to meanwhile
            self._refresh_due = 0.0
            self._stalled_at = self._reopened_at = None
            await self.open()
            self._writing = True
            self._tell_due()
            self._pending.clear()  # past the cursor: this runner folds those batches itself
            if self._heard < self._cursor:  # the notices of the batches up to here were not all heard
                self._tell_reload(self._cursor)
        self.takeovers += 1
        log.info("projection writer: this process writes the views from seq %d", self._cursor)

    async def _step_down(self) -> None:
        """Stop writing (the lease was lost): drop the cache and the feed, follow the writer."""
        async with self._lock:
            self._writing = False
            self._forget_writes()
            if self._feed is not None:
                await self._feed.close()
                self._feed = None
        self.stepped_down += 1
        log.warning("projection writer: lease lost; this process follows the writer's position")
        await self._start_following()

    def _forget_writes(self) -> None:
        """Drop everything cached about what this runner wrote: its views and the store's
        fence and index pages (`reset_writes`)."""
        self.forget_cache()
        reset = getattr(self.store, "reset_writes", None)
        if reset is not None:
            reset()

    # -- the writer's notices -----------------------------------------------------------------

    @property
    def changes_subject(self) -> str:
        """Where the writer of this view set publishes its batches' changes."""
        return view_changes_subject(getattr(self.store, "prefix", PREFIX))

    async def _listen(self) -> None:
        """Hear the writer's notices (whoever writes: from before this runner knows its position)."""
        if self._notices is None:
            self._notices = await self.nc.subscribe(self.changes_subject, cb=self._on_notice)

    async def _publish(self, changes: BatchChanges) -> None:
        """Tell the other runners of the view set (a core NATS notice, never failing the batch)."""
        try:
            await self.nc.publish(self.changes_subject, encode_changes(changes))
        except Exception:  # noqa: BLE001 - standbys find a missed notice (reload)
            log.debug("projections: could not publish a batch's changes", exc_info=True)

    async def _on_notice(self, msg: Msg) -> None:
        """A standby's listeners are told the writer's batch in the step that raises `applied_seq`
        to it (at once if it is there already; the position the writer stores after it moves it,
        as for reads); `reload` instead when the batch goes on from past what was heard (a notice
        was missed)."""
        if self._writing:
            return
        try:
            changes = decode_changes(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("projections: a batch notice on %s is not one; ignored", msg.subject)
            return
        if changes.generation != getattr(self.store, "generation", 0):
            return  # another generation's (a rebuild flipping): the flip itself says reload
        if changes.after > self._heard:
            changes = BatchChanges(seq=changes.seq, after=changes.after, generation=changes.generation, reload=True)
        self._heard = max(self._heard, changes.seq)
        if not (changes.reload or changes.threads or changes.runs):
            return
        if len(self._pending) >= MAX_PENDING:  # the position stopped moving: one reload for them all
            changes = BatchChanges(seq=max(changes.seq, *(c.seq for c in self._pending)), reload=True)
            self._pending.clear()
        self._pending.append(changes)
        self._tell_due()

    def _tell_due(self) -> None:
        """Tell the listeners the notices `applied_seq` has reached, in order."""
        if not self._pending or self._pending[0].seq > self.applied_seq:
            return
        due = [c for c in self._pending if c.seq <= self.applied_seq]
        self._pending = [c for c in self._pending if c.seq > self.applied_seq]
        for changes in due:
            self._tell(changes)

    # -- following another writer -------------------------------------------------------------

    async def _start_following(self) -> None:
        """Learn the stored position now, then keep following it (`_follow`)."""
        if self._follower is not None:
            return
        try:
            self.head_at_open = await self.stream_last_seq()
        except Exception:  # noqa: BLE001 - unknown head: not catching up as far as anyone can tell
            log.warning("projections: could not read the log's head", exc_info=True)
        await self._read_position()
        if self._heard < self.applied_seq:  # up to here, nothing was heard batch by batch
            self._tell_reload(self.applied_seq)
        self._follower = asyncio.get_running_loop().create_task(self._follow(), name="projection-follower")

    async def _stop_following(self) -> None:
        task, self._follower = self._follower, None
        if task is not None:
            while not task.done():  # again until it has ended (as `stop`)
                task.cancel()
                await asyncio.wait({task}, timeout=FOLLOW_POLL)

    async def _follow(self) -> None:
        """While a standby: advance `applied_seq` with each position the writer stores (a watch of
        the meta bucket), follow a generation flip (`refresh`), and read the position itself
        whenever `FOLLOW_POLL` s pass without a write. Then, with the writer idle, every notice
        up to the position has come: if one has not, tell the listeners `reload`."""
        meta: KeyValue | None = getattr(self.store, "meta", None)
        while True:
            watcher = None
            try:
                if meta is not None:
                    watcher = await meta.watchall(ignore_deletes=True)
                while True:
                    entry = None
                    with contextlib.suppress(TimeoutError):
                        # asyncio.timeout, not the watcher's own (wait_for): on 3.11 that can
                        # swallow a cancel
                        async with asyncio.timeout(FOLLOW_POLL):
                            if watcher is not None:
                                entry = await watcher.updates(timeout=None)
                            else:
                                await asyncio.sleep(FOLLOW_POLL)
                    if entry is None or not entry.value:
                        await self._read_position()
                        if self._heard < self.applied_seq and not self._writing:
                            self._tell_reload(self.applied_seq)
                    else:
                        await self._followed(entry.key, entry.value)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - NATS unreachable: watch again after a pause
                log.debug("projections: following the writer's position failed; again", exc_info=True)
                await asyncio.sleep(FOLLOW_POLL)
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()

    async def _followed(self, key: str, value: bytes) -> None:
        generation = getattr(self.store, "generation", 0)
        name, _, of = key.partition(".")
        if key == "generation":
            if value.strip() != str(generation).encode():
                await self._read_position()  # refreshes first
        elif name == "position" and of == str(generation):
            try:
                await self._advance(int(value))
            except ValueError:
                return

    async def _read_position(self) -> None:
        """Follow a generation flip, then advance to the position the store holds (a standby's
        read; never while this runner writes: the writer's own path does both). After a flip
        the listeners are told `reload` (every view may differ in the new generation)."""
        async with self._lock:
            if self._writing:
                return
            refresh = getattr(self.store, "refresh", None)
            try:
                flipped = bool(await refresh()) if refresh is not None else False
                read = getattr(self.store, "read_position", None)
                position = await read() if read is not None else None
            except Exception:  # noqa: BLE001 - NATS unreachable: the next poll reads again
                log.debug("projections: could not read the stored position", exc_info=True)
                return
        if position is not None:
            await self._advance(int(position))
        if flipped:
            self._tell_reload(self.applied_seq)

    async def _advance(self, seq: int) -> None:
        if seq > self.applied_seq:
            async with self._advanced:
                self.applied_seq = max(self.applied_seq, seq)
                self._advanced.notify_all()
                self._tell_due()

    @property
    def buffered(self) -> int:
        """Commits read from the log that wait for a batch (0 while not open)."""
        return self._feed.buffered if self._feed is not None else 0

    @property
    def catching_up(self) -> bool:
        """Still applying what was in the log when the runner opened (after a restart, a crash)."""
        return self.applied_seq < self.head_at_open

    # -- one batch ----------------------------------------------------------------------------

    async def step(self, limit: int | None = None) -> int:
        """Take up to `batch` commits (`catch_up_batch` while behind; never more than `limit`),
        fold, write and commit them. Returns how many commits it held (0 if idle: nothing came
        within `fetch_timeout`). After a failed batch, the same batch whatever the sizes."""
        if self._feed is None:
            await self.open()
        assert self._feed is not None
        if self._redo > self._cursor:
            msgs = await self._feed.take_through(self._redo, self.fetch_timeout)
            if not msgs and self._feed.reached(self._redo):
                self._redo = 0  # the stream no longer holds that batch's commits: nothing to redo
        else:
            size = self.catch_up_batch if self._feed.buffered > self.batch else self.batch
            msgs = await self._feed.take(min(limit, size) if limit else size, self.fetch_timeout)
        if not msgs:
            await self._check_stalled()
            return 0
        self._stalled_at = None
        async with self._lock:
            try:
                await self._apply_batch(msgs)
            except BaseException as exc:
                if isinstance(exc, Exception):
                    self.failing = f"{type(exc).__name__}: {exc}"
                self._forget_writes()  # it may hold views that never reached the store
                self._refresh_due = 0.0  # the store may have moved (a rebuild dropped its buckets)
                with contextlib.suppress(Exception):
                    await self._feed.open(self._cursor + 1)  # read the batch again
                raise
        return len(msgs)

    async def _check_stalled(self) -> None:
        """Open the feed again at the cursor when it has gone quiet while the stream holds commits
        past it: two idle checks in a row (`stall_check_interval` apart) with the cursor where it
        was. Why: the feed's ordered push consumer can die without telling. nats-py resets it
        when it misses two idle heartbeats (an event loop held up, e.g. by a process starting on
        a loaded machine) and, if creating the new consumer fails, the old one is gone and
        nothing comes until the next reset; reads waiting for a position then time out (a fresh
        gateway's views sat at seq 0 for 10 s and more). An ordered consumer delivers at once,
        so a whole idle interval with commits waiting is a stall, not a slow delivery."""
        assert self._feed is not None
        now = asyncio.get_running_loop().time()
        if now < self._stall_check_due:
            return
        self._stall_check_due = now + self.stall_check_interval
        redoing = self._redo > self._cursor
        try:
            behind = await self.stream_last_seq() > self._cursor and (
                not self._feed.reached(self._redo) if redoing else self._feed.buffered == 0)
        except Exception:  # noqa: BLE001 - NATS unreachable: the next idle check asks again
            return
        if not behind or self._reopened_at == self._cursor:
            # caught up; or already opened again here and still nothing: the stream's last
            # messages are not on the runner's subjects (a stream shared with other subjects)
            self._stalled_at = None
        elif self._stalled_at != self._cursor:
            self._stalled_at = self._cursor  # first sight: give the feed one more interval
        else:
            log.warning("projection feed stalled at seq %d with commits waiting; reading again from there",
                        self._cursor)
            self.feed_reopens += 1
            self._stalled_at, self._reopened_at = None, self._cursor
            await self._feed.open(self._cursor + 1)

    async def _apply_batch(self, msgs: list[tuple[int, str, bytes]]) -> None:
        refresh = getattr(self.store, "refresh", None)
        now = asyncio.get_running_loop().time()
        flipped = False
        if refresh is not None and now >= self._refresh_due:
            self._refresh_due = now + self.refresh_interval
            flipped = await refresh()
        if flipped:
            # A rebuild (in another process) flipped the generation: our cache is of the old
            # one, and the new one holds the log up to its own position, maybe not up to ours.
            # (Batches written to the old generation meanwhile are read again from there.)
            self.forget_cache()
            self._redo = await self._stored_batch_end()
            read = getattr(self.store, "read_position", None)
            position = await read() if read is not None else None
            if position is not None and position != self._cursor:
                self._cursor = int(position)
                assert self._feed is not None
                await self._feed.open(self._cursor + 1)
                return
        pin = getattr(self.store, "pin_writes", None)
        if pin is not None:
            await pin()  # before the views are read: a write by anyone else after it is refused
        after = self._cursor
        fresh = []
        last = self._cursor
        for item in msgs:
            if item[0] > last:  # else folded before (a feed reopened behind the cursor)
                fresh.append(item)
                last = item[0]
        if last == self._cursor:
            return
        # The views to load come from the subjects (`agentlog.ev.<thread>.<run>`); each commit is
        # then decoded and folded in turn, so a batch never holds all its decoded commits (they
        # die young: the collector has little to scan). A commit on a subject that does not name
        # its ids gets its views loaded when it comes.
        thread_ids: set[str] = set()
        run_ids: set[str] = set()
        for _, subject, _ in fresh:
            try:
                thread_id, run_id = parse_event_subject(subject)
            except ValueError:
                continue
            thread_ids.add(thread_id)
            if run_id is not None:
                run_ids.add(run_id)
        folder = Folder()
        update_index = getattr(self.store, "update_index", None)
        # The batch's end is stored before any index write (module docstring): alongside the
        # views' read when they are not cached, else only once the batch turns out to change
        # the index (most commits change no list: no write for them).
        end_stored = False
        if update_index is None or (all(t in self._threads for t in thread_ids)
                                    and all(r in self._runs for r in run_ids)):
            before = await self._load(folder, thread_ids, run_ids)
        else:
            self._redo = last
            before, _ = await asyncio.gather(self._load(folder, thread_ids, run_ids), self._store_batch_end(last))
            end_stored = True
        for seq, subject, data in fresh:
            try:
                commit = decode_commit(data)
            except CodecError as exc:
                commit = await self._quarantined(seq, subject, data, exc)
            if commit.thread_id not in thread_ids or (commit.run_id is not None and commit.run_id not in run_ids):
                new_runs = {commit.run_id} - run_ids if commit.run_id is not None else set()
                more = await self._load(folder, {commit.thread_id} - thread_ids, new_runs)
                thread_ids.add(commit.thread_id)
                if commit.run_id is not None:
                    run_ids.add(commit.run_id)
                before.threads.update(more.threads)
                before.runs.update(more.runs)
            folder.apply_commit(seq, commit)
        touched = folder.take_touched()
        fit_run, fit_thread = getattr(self.store, "fit_run", None), getattr(self.store, "fit_thread", None)
        if fit_run is not None and fit_thread is not None:  # kept (and folded on next) as the store holds it
            touched.runs.update((run_id, fit_run(view)) for run_id, view in touched.runs.items())
            touched.threads.update((thread_id, fit_thread(view)) for thread_id, view in touched.threads.items())
        if touched.threads or touched.runs:
            # While the puts are in flight KV may already hold the new values: drop the cached
            # (older) ones first, so `cached_*` never answers older than KV (see `cached_run`).
            for cache, keys in ((self._threads, touched.threads), (self._runs, touched.runs)):
                for key in keys:
                    cache.pop(key, None)
            # The listing index first: its changes are computed from the views before and after
            # the batch, and the batch read again (up to the same end: `_redo`) still finds the
            # old views (then re-applies the same, idempotent, changes). Written after the views,
            # a crash in between would lose them for good (the next reading would see the new
            # views and change nothing).
            list_changes = diff(before.threads, touched.threads, before.runs, touched.runs) if update_index else None
            if update_index is not None and list_changes:
                if not end_stored:
                    self._redo = last
                    await self._store_batch_end(last)
                await update_index(list_changes)
            await self.store.put_views(touched.threads.values(), touched.runs.values())
            self.puts += len(touched.threads) + len(touched.runs)
        self._remember(touched.threads, touched.runs)
        if self.before_ack is not None:
            self.before_ack([item[0] for item in msgs])
        self._cursor = last
        self.batches += 1
        self.failing = None
        changes = BatchChanges.of_views(last, touched.threads, touched.runs, after=after,
                                        generation=getattr(self.store, "generation", 0))
        async with self._advanced:
            self.applied_seq = max(self.applied_seq, last)
            self._advanced.notify_all()
            self._heard = max(self._heard, last)
            if touched.threads or touched.runs:
                self._tell(changes)
        if self.lease is not None:
            await self._publish(changes)  # before the position: standbys hear of it first
        write = getattr(self.store, "write_position", None)
        if write is not None:
            await write(last)  # after the views (never ahead of them), after the waiters
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

    def _tell(self, changes: BatchChanges) -> None:
        for listener in list(self.listeners):
            try:
                listener(changes)
            except Exception:  # noqa: BLE001 - a listener must not stop the projections
                log.exception("batch listener failed")

    def _tell_reload(self, seq: int) -> None:
        """Tell the listeners that anything up to `seq` may have changed (notices were missed)."""
        self._heard = max(self._heard, seq)
        self._tell(BatchChanges(seq=seq, reload=True))

    async def _store_batch_end(self, last: int) -> None:
        write = getattr(self.store, "write_batch_end", None)
        if write is not None:
            await write(last)

    async def _quarantined(self, seq: int, subject: str, data: bytes, error: CodecError) -> Commit:
        """The quarantine stand-in of the undecodable message at `seq` (`agentlog.eventlog.quarantine`),
        folded like every other reader folds it: it counts in the views' versions and changes
        nothing else. Its stored time is fetched on this rare path (the feed carries seq, subject
        and data only), so the views equal a rebuild's. Also listed in `skipped`."""
        self.skipped.append((seq, str(error)))
        try:
            ts = (await self.js.get_msg(self.stream, seq)).time
        except Exception:  # noqa: BLE001 - the stand-in without its time beats a stuck runner
            log.exception("could not read the stored time of the quarantined message at seq %d", seq)
            ts = None
        return self.quarantine.hold(seq, subject, ts, data, error)

    async def _load(self, folder: Folder, thread_ids: set[str], run_ids: set[str]) -> Views:
        """Seed `folder` with these views (those that exist); returns them (before the batch)."""
        missing_t = [t for t in thread_ids if t not in self._threads]
        missing_r = [r for r in run_ids if r not in self._runs]
        get_views = getattr(self.store, "get_views", None)
        if get_views is not None:
            loaded_t, loaded_r = await get_views(missing_t, missing_r)
        else:
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
        one writer per view set (the lease above) a hit equals what the store would answer, and
        a read after `wait_for(seq)` sees every commit up to `seq`, like a store read.
        LRU order is left alone: reads must not keep views the runner no longer writes.
        With a lease, a hit only while it is valid: once it may have expired, another process may
        be writing newer views."""
        if not self._cache_current():
            return None
        return self._runs.get(run_id)

    def cached_thread(self, thread_id: str) -> ThreadView | None:
        """Like `cached_run`, for a thread view."""
        if not self._cache_current():
            return None
        return self._threads.get(thread_id)

    def _cache_current(self) -> bool:
        return self.lease is None or (self._writing and self.lease.valid())

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
