"""The store's shared live tail: every `follow(thread_id, after)` of one store reads one consumer.

`ThreadTails` runs one `Follower` on the whole events stream while anyone follows, and hands each
commit to the follows of its thread and to the follows of every thread (`thread_id` None). A follow then costs no consumer of its own:
opening one is a dictionary entry, closing one is its removal, and no JetStream API request is
on the path of either (a consumer per follow cost a create and a delete request each, and the
server the consumer's set-up, on every SSE follow and every wait for a command's effect).

The tail keeps the last messages it saw (`ring_size`, `ring_bytes`) and its `floor`: every
message with a seq above the floor has been seen by the tail. A follow from `after`:

1. joins (in one step, no await): its queue gets every message the tail sees from then on, and
   it takes the kept messages of its thread above `after`;
2. when `after` is below the floor, first reads the thread from `after` with Direct Get (what the
   tail saw before the join, or never saw);
3. yields, in seq order and each once: the read, then the kept messages, then its queue.

Nothing is missed: a commit the tail saw before the join is in the stream (read) or kept; one it
sees after is queued. A follow that does not keep up (`queue_limit` commits waiting) is dropped
from the tail and joins again from its last commit, reading what it missed from the stream.

The tail starts with the first follow (one stream info request, then its consumer) and stops
`linger` seconds after the last follow ended, so a process nobody follows through receives
nothing. A failure of the tail (the connection closed) ends every follow with a `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncGenerator

from nats.aio.msg import Msg

from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.api import api_failure
from agentlog.eventlog.jetstream.follow import Follower
from agentlog.eventlog.jetstream.requests import JetStreamRequests
from agentlog.eventlog.subjects import EVENTS_SUBJECTS, thread_filter

log = logging.getLogger(__name__)


class _Seen:
    """One message the tail saw: decoded once, when a follow of its thread first needs it."""

    __slots__ = ("commit", "msg", "seq", "size", "thread")

    def __init__(self, seq: int, thread: str, msg: Msg) -> None:
        self.seq = seq
        self.thread = thread
        self.msg = msg
        self.size = len(msg.data)
        self.commit: StoredCommit | None = None


class _Member:
    """One follow's place in the tail."""

    __slots__ = ("dropped", "queue", "thread")

    def __init__(self, thread: str | None) -> None:
        self.thread = thread
        self.queue: asyncio.Queue[_Seen | BaseException] = asyncio.Queue()
        #: Set when the follow fell `queue_limit` behind and was taken off the tail.
        self.dropped = False


class ThreadTails:
    """The thread follows of one store on one consumer of the events stream (module docstring)."""

    def __init__(self, store: JetStreamRequests, *, ring_size: int = 1024, ring_bytes: int = 16 << 20,
                 queue_limit: int = 10_000, linger: float = 30.0) -> None:
        self.store = store
        self.ring_size = ring_size
        self.ring_bytes = ring_bytes
        self.queue_limit = queue_limit
        self.linger = linger
        #: Thread id (None: every thread) -> the follows of it.
        self._members: dict[str | None, set[_Member]] = {}
        self._count = 0
        self._ring: collections.deque[_Seen] = collections.deque()
        self._ring_used = 0
        #: The kept messages again, by thread (a join looks at its own thread's only).
        self._kept: dict[str, collections.deque[_Seen]] = {}
        #: Every message with a seq above it has been seen by the tail (and is kept, or was).
        self.floor = 0
        self._started: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._follower: Follower | None = None
        self._idle: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def follows(self, thread_id: str | None = None) -> int:
        """The follows of `thread_id` on the tail now (None: every follow, of one thread or all)."""
        return self._count if thread_id is None else len(self._members.get(thread_id, ()))

    async def follow(self, thread_id: str | None, after: int) -> AsyncGenerator[StoredCommit, None]:
        """The thread's (every thread's: None) commits with seq > `after`, in order, each once,
        then live (as `EventStore.follow`)."""
        subjects = thread_filter(thread_id) if thread_id is not None else EVENTS_SUBJECTS
        last = after
        while True:
            await self._start()
            if not self.running:
                continue  # it failed before this follow could join: start it again
            member, kept, floor = self._join(thread_id, last)
            try:
                if last < floor:
                    async for seq, msg in self.store._scan(subjects, last):
                        commit = await self.store._decode(seq, msg)
                        last = seq
                        yield StoredCommit(seq, commit)
                for seen in kept:
                    if seen.seq > last:
                        last = seen.seq
                        yield await self._decoded(seen)
                while True:
                    if member.dropped and member.queue.empty():
                        break  # join again from `last`
                    item = await member.queue.get()
                    if isinstance(item, BaseException):
                        raise item
                    if item.seq > last:
                        last = item.seq
                        yield await self._decoded(item)
            finally:
                self._leave(member)

    async def position(self) -> int:
        """A seq every message at or below which is in the stream, and from which a follow
        misses nothing: the last the tail saw (it starts the tail if need be; no request once
        it runs). What a follow that reads its history after joining can start from."""
        await self._start()
        follower = self._follower
        return follower.last if follower is not None else self.floor

    async def _decoded(self, seen: _Seen) -> StoredCommit:
        if seen.commit is None:
            seen.commit = StoredCommit(seen.seq, await self.store._decode(seen.seq, seen.msg))
        return seen.commit

    def _join(self, thread_id: str | None, after: int) -> tuple[_Member, list[_Seen], int]:
        """Register a follow (synchronous: nothing the tail sees can fall between the kept
        messages and the queue); returns it, the kept messages of its thread above `after`, and
        the floor at the join."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        member = _Member(thread_id)
        self._members.setdefault(thread_id, set()).add(member)
        self._count += 1
        kept: list[_Seen] = []
        ring = self._ring if thread_id is None else self._kept.get(thread_id, ())
        for seen in reversed(ring):  # in seq order: from the newest back to `after` only
            if seen.seq <= after:
                break
            kept.append(seen)
        kept.reverse()
        return member, kept, self.floor

    def _leave(self, member: _Member) -> None:
        members = self._members.get(member.thread)
        if members is None or member not in members:
            return
        members.discard(member)
        self._count -= 1
        if not members:
            del self._members[member.thread]
        if self._count == 0 and self.running and self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(self.linger, self._stop_idle)

    async def _start(self) -> None:
        """Start the tail if it is not running (one stream info request: its floor is the
        stream's last seq then); concurrent callers wait for the same start."""
        while self._started is None or (self._started.done() and not self.running):
            started = self._started = asyncio.get_running_loop().create_future()
            try:
                info = await self.store._api(f"$JS.API.STREAM.INFO.{self.store.stream}", b"")
                if info.error is not None:
                    raise api_failure("stream info", info.error)
            except BaseException as exc:
                if self._started is started:
                    self._started = None
                started.set_exception(exc if isinstance(exc, Exception) else StoreUnavailable(repr(exc)))
                started.exception()  # retrieved: every waiter sees it through its own await
                raise
            if self._started is not started:
                continue  # closed meanwhile
            self._ring.clear()
            self._kept.clear()
            self._ring_used = 0
            self.floor = int((info.state or {}).get("last_seq", 0))
            self._follower = Follower(self.store, EVENTS_SUBJECTS, self.floor)
            self._task = asyncio.get_running_loop().create_task(self._run(self._follower), name="agentlog-thread-tail")
            started.set_result(None)
        await self._started

    async def _run(self, follower: Follower) -> None:
        try:
            while True:
                seq, msg = await follower.next_raw()
                self._see(seq, msg)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - every follow is told; the next one starts anew
            if self._follower is follower:
                self._task = self._started = self._follower = None
                self._fail(exc if isinstance(exc, Exception) else StoreUnavailable(f"the live tail stopped: {exc!r}"))
        finally:
            with contextlib.suppress(Exception):
                await follower.stop()

    def _see(self, seq: int, msg: Msg) -> None:
        parts = msg.subject.split(".", 3)
        seen = _Seen(seq, parts[2] if len(parts) > 2 else "", msg)
        self._ring.append(seen)
        self._kept.setdefault(seen.thread, collections.deque()).append(seen)
        self._ring_used += seen.size
        while len(self._ring) > self.ring_size or (self._ring_used > self.ring_bytes and len(self._ring) > 1):
            gone = self._ring.popleft()
            thread = self._kept[gone.thread]
            thread.popleft()  # its oldest: the ring and each thread's deque are in the same order
            if not thread:
                del self._kept[gone.thread]
            self._ring_used -= gone.size
            self.floor = gone.seq
        for member in [*self._members.get(seen.thread, ()), *self._members.get(None, ())]:
            if member.queue.qsize() >= self.queue_limit:
                member.dropped = True  # it reads what it missed from the stream when it joins again
                self._leave(member)
            else:
                member.queue.put_nowait(seen)

    def _fail(self, exc: Exception) -> None:
        log.debug("thread tail failed: %s", exc)
        for members in list(self._members.values()):
            for member in members:
                error = StoreUnavailable(str(exc) or type(exc).__name__)  # one each: raised in its own task
                error.__cause__ = exc
                member.queue.put_nowait(error)
        self._members.clear()
        self._count = 0

    def _stop_idle(self) -> None:
        self._idle = None
        if self._count == 0 and self._task is not None:
            self._task.cancel()  # its consumer is deleted as it ends
            self._task = self._started = self._follower = None

    async def close(self) -> None:
        """Stop the tail (its consumer deleted) and end every follow with `StoreUnavailable`."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        task, self._task = self._task, None
        self._started = self._follower = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._fail(StoreUnavailable("the event store was closed"))


__all__ = ["ThreadTails"]
