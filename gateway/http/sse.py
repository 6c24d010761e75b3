"""Server-sent events from the log.

Each event is one SSE frame: `id: <seq>:<index>` (the event id, so a browser's automatic
`Last-Event-ID` resumes exactly after it, even in the middle of a commit), `event: <type>`, and
`data:` one line of JSON `{"thread_id", "run_id", "event"}`.

Why a pump with a bounded queue: the producer (a log read, then a live `follow`) must never wait
on a slow client, or one stalled browser would pin a JetStream consumer and memory without bound.
The producer only ever `put_nowait`s; when a client's queue is full the client is dropped (the
connection is closed) and it reconnects with `Last-Event-ID`, losing nothing. Heartbeat comment
lines keep proxies from timing the stream out and are how a vanished client is noticed while the
log is quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Literal

import msgspec
import structlog
from aiohttp import web

from eventlog.errors import AgentlogError
from eventlog.events import AnyEvent, Position, StoredCommit

log = structlog.get_logger("agentlog.http.sse")

HEARTBEAT = b": heartbeat\n\n"
_END = object()
_encode = msgspec.json.Encoder().encode

Outcome = Literal["end", "overflow", "client_gone", "error"]


def frame(position: Position, thread_id: str, run_id: str | None, event: AnyEvent) -> bytes:
    data = _encode({"thread_id": thread_id, "run_id": run_id, "event": event})
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (str(position).encode(), type(event).__name__.encode(), data)


def error_frame(exc: AgentlogError) -> bytes:
    return b"event: error\ndata: %s\n\n" % _encode({"error": str(exc), "code": exc.code})


async def positioned_events(
    history: Iterable[StoredCommit],
    live: AsyncIterator[StoredCommit] | None,
    after: Position | None,
    *,
    keep: Callable[[StoredCommit], bool] = lambda _c: True,
    stop: Callable[[AnyEvent], bool] = lambda _e: False,
) -> AsyncIterator[bytes]:
    """Frames of every event strictly after `after`: first from `history`, then from `live`
    (whose commits must continue where history ended). Ends after a live event `stop` accepts
    (history is replayed whole: a past suspension is not the end of a run that went on).
    Closes `live` (a log follower holding a consumer) however the stream ends."""

    def frames_of(stored: StoredCommit) -> tuple[list[bytes], bool]:
        out: list[bytes] = []
        if not keep(stored):
            return out, False
        commit = stored.commit
        for position, event in stored.positioned():
            if after is not None and position <= after:
                continue
            out.append(frame(position, commit.thread_id, commit.run_id, event))
            if stop(event):
                return out, True
        return out, False

    try:
        for stored in history:
            out, _ = frames_of(stored)
            for item in out:
                yield item
        if live is not None:
            async for stored in live:
                out, stopped = frames_of(stored)
                for item in out:
                    yield item
                if stopped:
                    return
    finally:
        aclose = getattr(live, "aclose", None)
        if aclose is not None:
            await aclose()


class Pump:
    """Moves frames from `frames` to `write` through a queue of at most `queue_size` frames."""

    def __init__(self, frames: AsyncIterator[bytes], write: Callable[[bytes], Awaitable[None]], *,
                 queue_size: int = 1000, heartbeat: float = 15.0) -> None:
        self.frames = frames
        self.write = write
        self.queue: asyncio.Queue[object] = asyncio.Queue(maxsize=queue_size)
        self.heartbeat = heartbeat
        self.overflowed = False

    async def _produce(self) -> None:
        try:
            async for item in self.frames:
                self.queue.put_nowait(item)
            self.queue.put_nowait(_END)
        except asyncio.QueueFull:
            self.overflowed = True
        except AgentlogError as exc:  # e.g. NATS gone mid-read: tell the client, then end
            log.warning("event stream source failed", error=str(exc), code=exc.code)
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(error_frame(exc))
                self.queue.put_nowait(_END)
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
            if item is _END:
                return
            await self.write(item)  # type: ignore[arg-type]

    async def run(self) -> Outcome:
        producer = asyncio.create_task(self._produce(), name="sse-producer")
        consumer = asyncio.create_task(self._consume(), name="sse-consumer")
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
                 queue_size: int, heartbeat: float) -> web.StreamResponse:
    """Answer `request` with the SSE stream of `frames`. Call only after every check that can
    fail with an error answer: once the headers are out the status is 200."""
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    pump = Pump(frames, response.write, queue_size=queue_size, heartbeat=heartbeat)
    outcome = await pump.run()
    if outcome == "overflow":
        log.info("dropping slow event-stream client", path=request.path, queue_size=queue_size)
    if outcome != "end" and request.transport is not None:
        request.transport.close()  # the client resumes with Last-Event-ID
        return response
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


__all__ = ["HEARTBEAT", "Pump", "frame", "positioned_events", "stream"]
