"""Full rebuild of the views from seq 1, into a fresh KV generation swapped in when complete.

Fast by construction: the log is read with one ordered push consumer (no acks, flow-controlled
by the server), every commit is folded in memory (`Folder`: no per-event copies, no I/O), and
each view is written exactly once at the end, pipelined, and so is every list of the listing
index (`agentlog.projections.listing`). Readers keep using the old generation
until the pointer flips, so they never see a half-built one.

With a live runner in this process, pass it: the tail that arrived during the rebuild is folded
under the runner's lock, then the runner switches to the new generation. A runner in another
process follows the flip on its next batch (`KVViewStore.refresh`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from agentlog.eventlog.codec import decode_commit
from agentlog.eventlog.errors import CodecError
from agentlog.eventlog.events import Commit
from agentlog.eventlog.jetstream.archive import ThreadArchive, marker_of
from agentlog.eventlog.quarantine import Quarantine
from agentlog.eventlog.subjects import EVENTS_STREAM, EVENTS_SUBJECTS
from agentlog.projections.errors import ProjectionError
from agentlog.projections.fold import Folder
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner

Progress = Callable[[int, int], None]

#: Logs each quarantined seq once per process, however many rebuilds meet it.
_QUARANTINE = Quarantine()


class RebuildResult(msgspec.Struct, frozen=True):
    generation: int
    last_seq: int
    commits: int
    events: int
    threads: int
    runs: int
    skipped: int
    seconds: float


async def stream_last_seq(js: JetStreamContext, stream: str = EVENTS_STREAM) -> int:
    try:
        return (await js.stream_info(stream)).state.last_seq
    except NotFoundError:
        return 0


async def read_range(
    js: JetStreamContext, start: int, end: int, *, stream: str = EVENTS_STREAM,
    subjects: str = EVENTS_SUBJECTS, chunk: int = 2000, timeout: float = 30.0,
) -> AsyncIterator[list[tuple[int, bytes]]]:
    """Raw `(seq, data)` of the stream's messages with start <= seq <= end, in chunks, through one
    ordered push consumer. Also the baseline the benchmark compares the rebuild with."""
    if end < start:
        return
    queue: asyncio.Queue[list[tuple[int, bytes]]] = asyncio.Queue()
    buf: list[tuple[int, bytes]] = []

    async def on_msg(msg: Msg) -> None:
        nonlocal buf
        seq = msg.metadata.sequence.stream
        if seq > end:
            return
        buf.append((seq, msg.data))
        if len(buf) >= chunk or seq >= end:
            queue.put_nowait(buf)
            buf = []

    sub = await js.subscribe(
        subjects, stream=stream, cb=on_msg, ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start),
        pending_msgs_limit=-1, pending_bytes_limit=-1,
    )
    try:
        last = start - 1
        while last < end:
            try:
                async with asyncio.timeout(timeout):
                    part = await queue.get()
            except TimeoutError:
                raise ProjectionError(f"reading the log stalled at seq {last} (wanted up to {end})") from None
            last = part[-1][0]
            yield part
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _decode(data: bytes) -> Commit:
    """As the stream's commits here: decoded, payload references left as they are (views never
    look at tool outputs)."""
    return decode_commit(data)


async def _fold_archived(archive: ThreadArchive, folder: Folder, thread_id: str, upto: int, counts: list[int]) -> None:
    """Fold the archived commits a marker stands for (those the stream no longer holds)."""
    if folder.thread(thread_id) is not None:
        return  # the thread's commits were in the stream: this marker stands for nothing purged
    for sc in await archive.archived(thread_id, 0, upto):
        folder.apply_commit(sc.seq, sc.commit)
        counts[0] += 1
        counts[1] += len(sc.commit.events)


async def _quarantined(js: JetStreamContext, stream: str, seq: int, data: bytes, error: CodecError) -> Commit:
    """The quarantine stand-in of the undecodable message at `seq`, folded as every reader folds
    it (`agentlog.eventlog.quarantine`). Its subject and stored time are fetched here, on this rare
    path, so the bulk read stays `(seq, data)`."""
    raw = await js.get_msg(stream, seq)
    return _QUARANTINE.hold(seq, raw.subject or "", raw.time, data, error)


async def _fold_range(
    js: JetStreamContext, folder: Folder, start: int, end: int, total: int, counts: list[int],
    progress: Progress | None, stream: str, subjects: str, archive: ThreadArchive,
) -> None:
    decode = decode_commit
    apply = folder.apply_commit
    async for part in read_range(js, start, end, stream=stream, subjects=subjects):
        for seq, data in part:
            try:
                commit = decode(data)
            except CodecError as exc:
                counts[2] += 1
                commit = await _quarantined(js, stream, seq, data, exc)
            else:
                upto = marker_of(commit)
                if upto is not None:  # an archived thread: its commits first (`agentlog.eventlog.jetstream.archive`)
                    await _fold_archived(archive, folder, commit.thread_id, upto, counts)
            apply(seq, commit)
            counts[0] += 1
            counts[1] += len(commit.events)
        if progress is not None:
            progress(part[-1][0], total)


async def rebuild(
    nc: NATS,
    *,
    prefix: str = "agentlog",
    stream: str = EVENTS_STREAM,
    subjects: str = EVENTS_SUBJECTS,
    progress: Progress | None = None,
    runner: ProjectionRunner | None = None,
    replicas: int | None = None,
) -> RebuildResult:
    """Fold the whole log into a new generation of buckets and make it current.

    `progress(done_seq, last_seq)` is called after each chunk (and once at the end)."""
    started = time.perf_counter()
    js = nc.jetstream()
    current = runner.store if runner is not None and isinstance(runner.store, KVViewStore) else None
    if current is None:
        current = await KVViewStore.open(nc, prefix=prefix, replicas=replicas)
    folder = Folder()
    counts = [0, 0, 0]  # commits, events, skipped
    last = await stream_last_seq(js, stream)
    archive = ThreadArchive(nc, _decode)
    await _fold_range(js, folder, 1, last, last, counts, progress, stream, subjects, archive)
    lock = runner._lock if runner is not None else contextlib.nullcontext()
    async with lock:
        tail_end = await stream_last_seq(js, stream)  # what arrived meanwhile
        await _fold_range(js, folder, last + 1, tail_end, tail_end, counts, progress, stream, subjects, archive)
        views = folder.views()
        fresh = await current.new_generation()
        threads = [fresh.fit_thread(thread) for thread in views.threads.values()]
        runs = [fresh.fit_run(run) for run in views.runs.values()]
        await fresh.put_views(threads, runs)
        await fresh.index.put_all(threads, runs)
        await fresh.write_position(tail_end)  # a runner reading this generation goes on from here
        await fresh.activate()
        if runner is not None:
            runner.store = fresh
            runner.forget_cache()
    if progress is not None:
        progress(tail_end, tail_end)
    return RebuildResult(
        generation=fresh.generation, last_seq=tail_end, commits=counts[0], events=counts[1],
        threads=len(views.threads), runs=len(views.runs), skipped=counts[2],
        seconds=time.perf_counter() - started,
    )
