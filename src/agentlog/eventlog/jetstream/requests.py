"""The store's request layer: one reply subscription for every request, and batched reads.

Every request the store makes (appends, JetStream API calls, Direct Gets) gets its reply on one
wildcard inbox subscription, keyed by a token; one sweeper task times them out instead of a
timer per request (what makes pipelined appends cheap). Reads are batched Direct Gets
(`_get_batch`, `_scan`) with no consumer to create or delete. Every NATS failure becomes a
`StoreUnavailable` bounded by `request_timeout`. `JetStreamRequests` is the base of
`agentlog.eventlog.jetstream.store.JetStreamEventStore` (which sets the state declared here); it is apart so
that the store reads as the log's operations, and the live tail (`agentlog.eventlog.jetstream.follow`) can
depend on this layer without importing the store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from agentlog.eventlog.codec import decode_commit
from agentlog.eventlog.errors import CodecError, NoAnswer, PermissionDenied, StoreUnavailable
from agentlog.eventlog.events import Commit
from agentlog.eventlog.jetstream.api import (
    HDR_NUM_PENDING,
    HDR_SEQUENCE,
    HDR_STATUS,
    HDR_SUBJECT,
    HDR_TIME_STAMP,
    ApiResponse,
    ack_reply_time,
    api_decoder,
    json_encoder,
)
from agentlog.eventlog.jetstream.payloads import ObjectStoreBlobs, has_refs, resolve
from agentlog.eventlog.quarantine import Quarantine


class _Waiter:
    """A request waiting for its single reply."""

    __slots__ = ("deadline", "done", "subject")

    def __init__(self, deadline: float, subject: str = "") -> None:
        self.done: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self.deadline = deadline
        self.subject = subject


class _Batch:
    """Collects the replies of one batched Direct Get, up to its end-of-batch status."""

    __slots__ = ("deadline", "done", "error", "items", "pending", "progressed")

    def __init__(self, deadline: float) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.deadline = deadline
        self.items: list[tuple[int, Msg]] = []
        self.pending = 0
        self.error: str | None = None
        self.progressed = False


class JetStreamRequests:
    """Request/reply and batched Direct Get over one reply subscription (the state is set by
    `JetStreamEventStore.__init__`)."""

    _nc: NATS
    stream: str
    request_timeout: float
    follow_heartbeat: float
    read_batch: int
    read_max_bytes: int
    _direct_subject: str
    _reply_prefix: str
    _reply_sub: Any
    _reply_lock: asyncio.Lock
    _next_token: int
    _waiters: dict[str, _Waiter | _Batch]
    #: Set when a waiter is registered: the sweeper sleeps on it while nothing can time out.
    _waiting: asyncio.Event
    _sweeper: asyncio.Task[None] | None
    _closed: bool
    #: Large tool outputs of an oversized commit go here by reference (`agentlog.eventlog.jetstream.payloads`).
    _blobs: ObjectStoreBlobs
    #: The undecodable messages this store's reads met (`agentlog.eventlog.quarantine`).
    quarantine: Quarantine

    def _on_denied(self, subject: str) -> None:
        """The server refused a publish of ours (it sends no reply): fail the requests waiting on
        that subject at once with a typed error instead of letting them time out. nats-py hands
        the server's message over lowercased, so subjects are compared without case (an upper-case
        one such as `$JS.API.STREAM.PURGE.<stream>` would never match otherwise)."""
        denied = subject.lower()
        for waiter in list(self._waiters.values()):
            if isinstance(waiter, _Waiter) and waiter.subject.lower() == denied and not waiter.done.done():
                waiter.done.set_exception(PermissionDenied(
                    f"NATS denied this connection's user publishing to {subject!r}: the user's role does "
                    "not allow it (e.g. readonly cannot append or queue commands)"))

    @property
    def nc(self) -> NATS:
        """The underlying client (e.g. for KV buckets or live subjects on the same connection)."""
        return self._nc

    async def _decode(self, seq: int, msg: Msg) -> Commit:
        """Decode the commit stored at `seq` (a Direct Get reply or a consumer's delivery) and
        resolve its payload references (only a commit that has any pays for more than a byte
        scan). A message that is not a decodable commit becomes its quarantine stand-in
        (`agentlog.eventlog.quarantine`): one bad message never fails a read."""
        data = msg.data
        try:
            return await self._decode_data(data)
        except CodecError as exc:
            headers = msg.headers or {}
            subject = headers.get(HDR_SUBJECT) or msg.subject
            ts: int | str | None = headers.get(HDR_TIME_STAMP)
            if ts is None and msg.reply:
                ts = ack_reply_time(msg.reply)
            return self.quarantine.hold(seq, subject, ts, data, exc)

    async def _decode_data(self, data: bytes) -> Commit:
        """Decode a commit's bytes (from the stream, or from a thread's archive, which holds
        only commits that decoded when they were archived) and resolve its payload references
        (only a commit that has any pays for more than a byte scan). Raises CodecError."""
        commit = decode_commit(data)
        if has_refs(data):
            commit = await resolve(commit, self._blobs.get_ref)
        return commit

    # -- internals: requests ------------------------------------------------------------------

    async def _wait_connected(self, deadline: float, what: str) -> None:
        """Wait (bounded) for a reconnect instead of letting nats-py buffer into a dead socket."""
        nc = self._nc
        while not nc.is_connected:
            if nc.is_closed or self._closed:
                raise StoreUnavailable(f"{what}: the NATS connection is closed")
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"{what}: not connected to NATS (reconnecting) for {self.request_timeout:g}s; "
                    "is nats-server running? retrying the same commit is safe"
                )
            await asyncio.sleep(0.02)

    async def _request(self, subject: str, payload: bytes, headers: dict[str, str] | None, what: str) -> Msg:
        """One request/reply, bounded by `request_timeout`, every failure a `StoreUnavailable`."""
        if self._reply_sub is None:
            await self._ensure_reply_sub()
        deadline = time.monotonic() + self.request_timeout
        if not self._nc.is_connected:
            await self._wait_connected(deadline, what)
        self._next_token += 1
        token = str(self._next_token)
        waiter = _Waiter(deadline, subject)
        self._register(token, waiter)
        try:
            await self._nc.publish(subject, payload, reply=self._reply_prefix + token, headers=headers)
            reply = await waiter.done
        except nats.errors.ConnectionClosedError:
            raise StoreUnavailable(f"{what}: the NATS connection is closed") from None
        except nats.errors.Error as exc:
            raise StoreUnavailable(f"{what}: NATS error: {exc or type(exc).__name__}") from None
        except TimeoutError:
            raise NoAnswer(
                f"{what}: JetStream did not answer within {self.request_timeout:g}s "
                "(server down or overloaded); retrying the same commit is safe"
            ) from None
        finally:
            self._waiters.pop(token, None)
        headers_in = reply.headers
        if headers_in and not reply.data and headers_in.get(HDR_STATUS) == "503":
            raise StoreUnavailable(
                f"{what}: no JetStream responder on {subject!r} (JetStream disabled or stream "
                f"{self.stream} missing)"
            )
        return reply

    async def _api(self, subject: str, payload: bytes) -> ApiResponse:
        reply = await self._request(subject, payload, None, subject)
        try:
            return api_decoder.decode(reply.data)
        except msgspec.DecodeError as exc:
            raise StoreUnavailable(f"unreadable JetStream API answer on {subject}: {exc}") from None

    # -- internals: batched direct get --------------------------------------------------------

    async def _ensure_reply_sub(self) -> None:
        async with self._reply_lock:
            if self._reply_sub is None:
                prefix = f"{self._nc.new_inbox()}."
                # No client-side pending limits: a dropped reply would be a silently missing
                # commit in a read. Memory is bounded by the requests in flight (read_max_bytes).
                self._reply_sub = await self._nc.subscribe(
                    f"{prefix}*", cb=self._on_reply, pending_msgs_limit=0, pending_bytes_limit=0
                )
                self._reply_prefix = prefix
                self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _register(self, token: str, waiter: _Waiter | _Batch) -> None:
        self._waiters[token] = waiter
        self._waiting.set()

    async def _sweep(self) -> None:
        """Fail waiters whose deadline passed (a batch that is still flowing gets more time).
        While no request waits, it sleeps until one registers: an idle process (a worker or a
        gateway between requests) does not wake 20 times a second for nothing."""
        tick = min(0.05, self.request_timeout / 4)
        while True:
            if not self._waiters:
                self._waiting.clear()
                await self._waiting.wait()
            await asyncio.sleep(tick)
            now = time.monotonic()
            for waiter in list(self._waiters.values()):
                if now >= waiter.deadline and not waiter.done.done():
                    if isinstance(waiter, _Batch) and waiter.progressed:
                        waiter.progressed = False
                        waiter.deadline = now + self.request_timeout
                        continue
                    waiter.done.set_exception(TimeoutError())

    async def _on_reply(self, msg: Msg) -> None:
        waiter = self._waiters.get(msg.subject[len(self._reply_prefix) :])
        if waiter is None or waiter.done.done():
            return
        if type(waiter) is _Waiter:
            waiter.done.set_result(msg)
            return
        batch: _Batch = waiter  # type: ignore[assignment]
        headers = msg.headers
        status = headers.get(HDR_STATUS) if headers else None
        if status is None:
            batch.items.append((int(headers[HDR_SEQUENCE]), msg))  # type: ignore[index]
            batch.progressed = True
            return
        if status == "204":  # end of batch
            batch.pending = int(headers.get(HDR_NUM_PENDING, "0"))  # type: ignore[union-attr]
        elif status != "404":  # 404: nothing (more) matches
            batch.error = f"status {status} {headers.get('Description', '')}".strip()  # type: ignore[union-attr]
        batch.done.set_result(None)

    async def _get_batch(self, subject_filter: str, start: int, direct: str | None = None) -> _Batch:
        """One batched Direct Get: up to `read_batch` messages / `read_max_bytes` from `start`
        (of the events stream, or of the stream whose Direct Get subject is `direct`)."""
        if self._reply_sub is None:
            await self._ensure_reply_sub()
        deadline = time.monotonic() + self.request_timeout
        what = f"read of {subject_filter!r}"
        if not self._nc.is_connected:
            await self._wait_connected(deadline, what)
        self._next_token += 1
        token = str(self._next_token)
        batch = _Batch(deadline)
        self._register(token, batch)
        request = {
            "seq": start,
            "next_by_subj": subject_filter,
            "batch": self.read_batch,
            "max_bytes": self.read_max_bytes,
        }
        try:
            await self._nc.publish(
                direct or self._direct_subject, json_encoder.encode(request), reply=self._reply_prefix + token
            )
            await batch.done
        except TimeoutError:
            raise StoreUnavailable(f"{what}: JetStream did not answer within {self.request_timeout:g}s") from None
        except nats.errors.Error as exc:
            raise StoreUnavailable(f"{what}: NATS error: {str(exc) or type(exc).__name__}") from None
        finally:
            self._waiters.pop(token, None)
        if batch.error is not None:
            raise StoreUnavailable(f"{what}: direct get failed: {batch.error}")
        return batch

    async def _scan(self, subject_filter: str, after: int, direct: str | None = None) -> AsyncIterator[tuple[int, Msg]]:
        """(seq, raw message) of every message matching the filter with seq > after, in order,
        up to what was in the stream when the last batch was served."""
        start = after + 1
        while True:
            batch = await self._get_batch(subject_filter, start, direct)
            for item in batch.items:
                yield item
            if not batch.items or batch.pending == 0:
                return
            start = batch.items[-1][0] + 1

