"""Server-sent events from the log.

Each event is one SSE frame: `id: <seq>:<index>` (the event id, so a browser's automatic
`Last-Event-ID` resumes exactly after it, even in the middle of a commit), `event: <type>`, and
`data:` one line of JSON `{"thread_id", "run_id", "event"}`.

Why a pump with a bounded queue: the producer (a log read, then a live `follow`) must never wait
long on a slow client, or one stalled browser would pin a log follow and memory without
bound. When a client's queue is full the producer waits for room at most `stall` seconds; a client
that takes no frame for that long is dropped (the connection is closed) and reconnects with
`Last-Event-ID`, losing nothing. The wait is what lets a client read a history longer than its
queue: the log is read faster than any network writes, so a long history always fills the queue
once, and a client that keeps draining it is not slow. Live commits never wait on a client: the
hub below puts them into each follower's own bounded queue without waiting and drops a follower
whose queue is full. Heartbeat comment lines keep proxies from timing the stream out and are how
a vanished client is noticed while the log is quiet.

Why a fan-out hub (`FollowHub`): a follow per followed stream would mean N follows, each decoding
and queueing every commit, for N browsers on one run. The hub keeps one
`store.follow` per followed thread in the process, shared by every live follower of that thread
(thread streams and run streams alike), each with its own bounded queue: a slow follower is
dropped alone (and resumes with `Last-Event-ID`), the others never wait on it. The follow stops
when the thread's last follower leaves.

Why join before reading history: a follower joins the hub first, then reads the history from the
log. Every commit the hub delivers after the join is queued for it; every commit delivered
before the join was appended before the history read began, so it is in the history. History
then queue covers the log without gaps, and the overlap (commits both read and queued) is
dropped by seq (`positioned_events` skips live commits at or below the history's last seq).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Literal

import msgspec
import structlog
from aiohttp import web

from agentlog.eventlog.errors import AgentlogError, StoreUnavailable
from agentlog.eventlog.events import AnyEvent, Position, StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.store import as_generator

log = structlog.get_logger("agentlog.gateway.http.sse")

HEARTBEAT = b": heartbeat\n\n"
_encode = msgspec.json.Encoder().encode

Outcome = Literal["end", "overflow", "client_gone", "error"]


def frame(position: Position, thread_id: str, run_id: str | None, event: AnyEvent) -> bytes:
    data = _encode({"thread_id": thread_id, "run_id": run_id, "event": event})
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (str(position).encode(), type(event).__name__.encode(), data)


def error_frame(exc: AgentlogError) -> bytes:
    return b"event: error\ndata: %s\n\n" % _encode({"error": str(exc), "code": exc.code})


_FRAMES_CACHED = 2048
_frames: OrderedDict[tuple[str, int], list[tuple[Position, AnyEvent, bytes]]] = OrderedDict()


def commit_frames(stored: StoredCommit) -> list[tuple[Position, AnyEvent, bytes]]:
    """Every event of a commit with its encoded frame, encoded once per process for all the
    followers that receive it (a hub delivers the same commit to each of them): an LRU of the
    last `_FRAMES_CACHED` commits, keyed by commit id and seq (unique even across stores)."""
    key = (stored.commit.commit_id, stored.seq)
    cached = _frames.get(key)
    if cached is not None:
        _frames.move_to_end(key)
        return cached
    commit = stored.commit
    cached = [(position, event, frame(position, commit.thread_id, commit.run_id, event))
              for position, event in stored.positioned()]
    _frames[key] = cached
    if len(_frames) > _FRAMES_CACHED:
        _frames.popitem(last=False)
    return cached


async def positioned_events(
    history: Iterable[StoredCommit],
    live: AsyncIterator[StoredCommit] | None,
    after: Position | None,
    *,
    keep: Callable[[StoredCommit], bool] = lambda _c: True,
    stop: Callable[[AnyEvent], bool] = lambda _e: False,
) -> AsyncIterator[bytes]:
    """Frames of every event strictly after `after`: first from `history`, then from `live`
    (which may repeat commits of the history: those at or below the history's last seq are
    skipped, so a hub joined before the history read is exact). Ends after a live event `stop`
    accepts (history is replayed whole: a past suspension is not the end of a run that went on).
    Closes `live` (a log follower or a hub membership) however the stream ends."""

    def frames_of(stored: StoredCommit) -> tuple[list[bytes], bool]:
        out: list[bytes] = []
        if not keep(stored):
            return out, False
        for position, event, data in commit_frames(stored):
            if after is not None and position <= after:
                continue
            out.append(data)
            if stop(event):
                return out, True
        return out, False

    seen = 0
    try:
        for stored in history:
            seen = max(seen, stored.seq)
            out, _ = frames_of(stored)
            for item in out:
                yield item
        if live is not None:
            async for stored in live:
                if stored.seq <= seen:
                    continue
                seen = stored.seq
                out, stopped = frames_of(stored)
                for item in out:
                    yield item
                if stopped:
                    return
    finally:
        aclose = getattr(live, "aclose", None)
        if aclose is not None:
            await aclose()


class SlowFollower(asyncio.QueueFull):
    """A hub follower's queue overflowed: it was dropped (a `QueueFull`, so the pump treats it
    like its own overflow: close the connection, the client resumes with `Last-Event-ID`)."""



class Membership:
    """One follower's place in a thread's feed: an async iterator of the commits the feed
    delivers after the join, through a queue of at most `queue_size` commits. `aclose()` leaves
    (the feed stops when its last member leaves)."""

    def __init__(self, feed: _Feed, queue_size: int) -> None:
        self._feed = feed
        #: Set when this member started the feed from a seq it gave (`FollowHub.join`'s
        #: `after`): the feed delivers it every commit after that seq, so it reads no history
        #: after joining. None: only the commits delivered after the join.
        self.since: int | None = None
        # commits, or None once the membership failed (`_failure` says why)
        self._queue: asyncio.Queue[StoredCommit | None] = asyncio.Queue(maxsize=queue_size)
        self._failure: BaseException | None = None
        self._closed = False

    def _offer(self, stored: StoredCommit) -> bool:
        """Queue without waiting; False (and dropped) when full."""
        try:
            self._queue.put_nowait(stored)
        except asyncio.QueueFull:
            self._fail(SlowFollower(f"follower of {self._feed.thread_id!r} fell {self._queue.maxsize} commits behind"))
            return False
        return True

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)  # wakes a waiting reader; a full queue has none

    def __aiter__(self) -> Membership:
        return self

    async def __anext__(self) -> StoredCommit:
        if self._failure is not None:
            raise self._failure
        item = await self._queue.get()
        if item is None:
            assert self._failure is not None
            raise self._failure
        return item

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._feed.leave(self)


class _Feed:
    """One `store.follow(thread_id)` fanned out to its members, in log order."""

    def __init__(self, hub: FollowHub, thread_id: str) -> None:
        self.hub = hub
        self.thread_id = thread_id
        self.members: set[Membership] = set()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None

    async def start(self, after: int | None = None) -> None:
        """Follow from `after` (a seq its first member has read up to), else from the store's
        live position: anything at or below it is in the history every member reads after
        joining."""
        try:
            head = after if after is not None else await self.hub.store.live_position()
        except BaseException as exc:
            self._end(exc)
            raise
        self.task = asyncio.create_task(self._run(head), name=f"sse-feed-{self.thread_id}")
        if not self.ready.done():
            self.ready.set_result(None)

    async def _run(self, head: int) -> None:
        follow = as_generator(self.hub.store.follow(self.thread_id, after=head))
        try:
            async for stored in follow:
                for member in list(self.members):
                    if not member._offer(stored):  # noqa: SLF001 - the feed owns its members' queues
                        self.members.discard(member)
            raise AgentlogError(f"the follow of thread {self.thread_id!r} ended")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - every member is told, then the feed is gone
            log.warning("event feed failed", thread_id=self.thread_id, error=str(exc))
            # an AgentlogError, so each member's pump sends an error frame and ends the stream
            self._end(exc if isinstance(exc, AgentlogError)
                      else StoreUnavailable(f"following thread {self.thread_id!r} failed: {exc!r}"))
        finally:
            with contextlib.suppress(BaseException):
                await follow.aclose()

    def _end(self, exc: BaseException) -> None:
        """Fail every member and forget the feed (the next join starts a fresh one)."""
        self.hub._forget(self)  # noqa: SLF001
        if not self.ready.done():
            # members waiting for the start must not see a CancelledError that is not theirs
            err = exc if isinstance(exc, Exception) else AgentlogError(f"the follow of {self.thread_id!r} stopped")
            self.ready.set_exception(err)
            self.ready.exception()  # retrieved: members see it through their own await
        for member in list(self.members):
            member._fail(exc)  # noqa: SLF001
        self.members.clear()

    async def leave(self, member: Membership) -> None:
        self.members.discard(member)
        if self.members:
            return
        self.hub._forget(self)  # noqa: SLF001
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


class FollowHub:
    """Per process: thread id -> its shared feed (see the module docstring)."""

    def __init__(self, store: JetStreamEventStore, *, queue_size: int = 1000) -> None:
        self.store = store
        self.queue_size = queue_size
        self._feeds: dict[str, _Feed] = {}

    @property
    def feeds(self) -> int:
        """How many threads are followed now (one store follow each)."""
        return len(self._feeds)

    async def join(self, thread_id: str, after: int | None = None) -> Membership:
        """A membership of `thread_id`'s feed (started for the first member). Call before
        reading the history the live commits are to continue. `after`: a seq the caller has
        read the thread (or its run) up to; a member that starts the feed starts it there, and
        its `since` says it needs no history read after the join."""
        feed = self._feeds.get(thread_id)
        created = feed is None
        if feed is None:
            feed = self._feeds[thread_id] = _Feed(self, thread_id)
        member = Membership(feed, self.queue_size)
        feed.members.add(member)
        try:
            if created:
                await feed.start(after)
                member.since = after
            else:
                await asyncio.shield(feed.ready)
        except BaseException:
            await member.aclose()
            raise
        return member

    def _forget(self, feed: _Feed) -> None:
        if self._feeds.get(feed.thread_id) is feed:
            del self._feeds[feed.thread_id]

    async def close(self) -> None:
        """Stop every feed (app cleanup)."""
        feeds = list(self._feeds.values())
        self._feeds.clear()
        for feed in feeds:
            if feed.task is not None:
                feed.task.cancel()
        await asyncio.gather(*(f.task for f in feeds if f.task is not None), return_exceptions=True)


HUB = web.AppKey("agentlog.sse_hub", FollowHub)
#: The event streams the app is sending now (`stream`), which its shutdown ends (`end_streams`).
STREAMS = web.AppKey("agentlog.sse_streams", set)


async def end_streams(app: web.Application) -> None:
    """On the app's shutdown: end every event stream at once. A stream is open until its client
    leaves, so the server's graceful stop would otherwise wait out its whole timeout for each
    client still connected (and up to a heartbeat for each that left)."""
    for pump in list(app.get(STREAMS, ())):
        pump.stop()


def hub_of(request: web.Request) -> FollowHub:
    return request.app[HUB]


class Pump:
    """Moves frames from `frames` to `write` through a queue of at most `queue_size` frames."""

    def __init__(self, frames: AsyncIterator[bytes], write: Callable[[bytes], Awaitable[None]], *,
                 queue_size: int = 1000, heartbeat: float = 15.0, stall: float = 10.0) -> None:
        self.frames = frames
        self.write = write
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=queue_size)  # None: the end
        self.heartbeat = heartbeat
        self.stall = stall
        self.overflowed = False
        self._tasks: tuple[asyncio.Task[None], ...] = ()

    def stop(self) -> None:
        """End the stream now, as if the client had left (the gateway is stopping: the client
        resumes with `Last-Event-ID`, on another gateway or this one once it is back)."""
        for task in self._tasks:
            task.cancel()

    async def _put(self, item: bytes | None) -> None:
        """Queue `item`, waiting for room at most `stall` seconds (QueueFull after that)."""
        try:
            self.queue.put_nowait(item)
            return
        except asyncio.QueueFull:
            if self.stall <= 0:
                raise
        try:
            async with asyncio.timeout(self.stall):
                await self.queue.put(item)
        except TimeoutError:
            raise asyncio.QueueFull from None

    async def _produce(self) -> None:
        try:
            async for item in self.frames:
                await self._put(item)
            await self._put(None)
        except asyncio.QueueFull:
            self.overflowed = True
        except Exception as exc:  # noqa: BLE001 - e.g. NATS gone mid-read, or a bug: tell the client, then end
            if isinstance(exc, AgentlogError):
                log.warning("event stream source failed", error=str(exc), code=exc.code)
                frame = error_frame(exc)
            else:  # never leave the client on heartbeats of a stream that will not go on
                log.error("event stream source failed unexpectedly", exc_info=exc)
                frame = error_frame(AgentlogError("the event stream failed on the server"))
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(frame)
                self.queue.put_nowait(None)
                return
            self.overflowed = True
        finally:
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def _consume(self) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races
                # a completed get, and then this task would write on after being told to stop.
                async with asyncio.timeout(self.heartbeat):
                    item = await self.queue.get()
            except TimeoutError:
                await self.write(HEARTBEAT)
                continue
            if item is None:
                return
            await self.write(item)

    async def run(self) -> Outcome:
        producer = asyncio.create_task(self._produce(), name="sse-producer")
        consumer = asyncio.create_task(self._consume(), name="sse-consumer")
        self._tasks = (producer, consumer)
        try:
            await asyncio.wait({producer, consumer}, return_when=asyncio.FIRST_COMPLETED)
            if producer.done() and not self.overflowed:
                await asyncio.wait({consumer})  # drain what is queued, then END
        finally:
            for task in (producer, consumer):
                task.cancel()
            results = await asyncio.gather(producer, consumer, return_exceptions=True)
        if self.overflowed:
            return "overflow"
        failure = results[1]
        if isinstance(failure, (ConnectionError, asyncio.CancelledError)):
            return "client_gone"
        if isinstance(failure, BaseException):
            log.error("event stream writer failed", exc_info=failure)
            return "error"
        return "end"


async def stream(request: web.Request, frames: AsyncIterator[bytes], *,
                 queue_size: int, heartbeat: float, stall: float = 10.0) -> web.StreamResponse:
    """Answer `request` with the SSE stream of `frames`. Call only after every check that can
    fail with an error answer: once the headers are out the status is 200."""
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    pump = Pump(frames, response.write, queue_size=queue_size, heartbeat=heartbeat, stall=stall)
    streams = request.app.get(STREAMS)
    if streams is not None:
        streams.add(pump)
    try:
        outcome = await pump.run()
    finally:
        if streams is not None:
            streams.discard(pump)
    if outcome == "overflow":
        log.info("dropping slow event-stream client", path=request.path, queue_size=queue_size)
    if outcome != "end" and request.transport is not None:
        request.transport.close()  # the client resumes with Last-Event-ID
        return response
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


__all__ = ["HEARTBEAT", "HUB", "STREAMS", "FollowHub", "Membership", "Pump", "SlowFollower", "end_streams", "frame", "hub_of",
           "positioned_events", "stream"]
