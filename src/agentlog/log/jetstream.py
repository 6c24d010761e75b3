"""`JetStreamEventStore`: the real log, one JetStream stream, one message per commit.

Design notes (the why behind the code):

* Appends are raw `nc.request` publishes with JetStream headers, not `js.publish`: one request,
  one msgspec decode of the PubAck, nothing else on the hot path.
* Per-thread OCC uses `Nats-Expected-Last-Subject-Sequence` scoped by
  `Nats-Expected-Last-Subject-Sequence-Subject: agentlog.ev.<thread>.>` (nats-server >= 2.11.0).
  The server checks that header *before* `Nats-Msg-Id` dedup, so the retry of a commit that was in
  fact written gets "wrong last sequence" (err 10071) rather than a duplicate ack. On 10071 we look
  for the commit id in the thread after the expected version: found means the retry is a duplicate
  (which also makes OCC retries idempotent beyond the dedup window), not found is a real conflict.
* Reads use batched Direct Get (`$JS.API.DIRECT.GET.<stream>` with `next_by_subj` and `batch`):
  no consumer to create or delete, one round trip per batch, an empty thread costs one request.
  With replicas > 1 a Direct Get may be answered by a follower that lags the leader slightly.
* `follow` runs its own ephemeral push consumer (ack none, flow control, idle heartbeats) and keeps
  the last stream sequence it yielded; on a gap, a stall or any consumer error it recreates the
  consumer from last + 1, so nothing is missed or repeated across reconnects and server restarts.
* Every NATS failure (no connection, timeout, no responders) becomes `StoreUnavailable`, bounded by
  `request_timeout`. A failed append may still land later (the publish can sit in the client's
  reconnect buffer); retrying the same commit is always safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from .codec import decode_commit, encode_commit
from .errors import (
    AgentlogError,
    CommitTooLarge,
    NotAuthorized,
    PermissionDenied,
    ServerTooOld,
    StoreUnavailable,
    VersionConflict,
)
from .events import AppendResult, Commit, StoredCommit
from .headers import LeanHeadersClient
from .ids import validate_id
from .payloads import ObjectStoreBlobs, has_refs, offload, resolve
from .replicas import log_kept, replicas_target, wait_replicated
from .store import encode_checked
from .subjects import EVENTS_STREAM, EVENTS_SUBJECTS, event_subject, run_filter, thread_filter

log = logging.getLogger(__name__)

#: First nats-server release that honours `Nats-Expected-Last-Subject-Sequence-Subject`
#: (nats-io/nats-server#5281, shipped in v2.11.0).
MIN_SERVER_VERSION = "2.11.0"

ERR_WRONG_LAST_SEQUENCE = 10071
ERR_STREAM_NOT_FOUND = 10059
ERR_NO_MESSAGE_FOUND = 10037

_NS = 1_000_000_000
_HDR_MSG_ID = "Nats-Msg-Id"
_HDR_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_HDR_EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
_HDR_SEQUENCE = "Nats-Sequence"
_HDR_NUM_PENDING = "Nats-Num-Pending"
_HDR_STATUS = "Status"
_WRONG_LAST_RE = re.compile(r"wrong last sequence:\s*(\d+)")


# -- wire structs ---------------------------------------------------------------------------------


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


class _ApiResponse(msgspec.Struct):
    """Any JetStream API answer: the fields we look at, the rest kept raw."""

    error: _ApiError | None = None
    config: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    name: str | None = None


_ack_decoder = msgspec.json.Decoder(_PubAck)
_api_decoder = msgspec.json.Decoder(_ApiResponse)
_json_encoder = msgspec.json.Encoder()


# -- server version -------------------------------------------------------------------------------


def parse_version(text: str) -> tuple[int, int, int, bool]:
    """`"2.11.0-RC.1"` -> (2, 11, 0, True); the flag says it is a pre-release. ValueError if not
    a version."""
    match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$", text.strip())
    if match is None:
        raise ValueError(f"not a server version: {text!r}")
    return int(match[1]), int(match[2]), int(match[3]), match[4] is not None


def version_at_least(found: str, needed: str = MIN_SERVER_VERSION) -> bool:
    """Semver comparison: a pre-release of `needed` is older than `needed`; garbage is too old."""
    try:
        f_major, f_minor, f_patch, f_pre = parse_version(found)
    except ValueError:
        return False
    n_major, n_minor, n_patch, n_pre = parse_version(needed)
    if (f_major, f_minor, f_patch) != (n_major, n_minor, n_patch):
        return (f_major, f_minor, f_patch) > (n_major, n_minor, n_patch)
    return n_pre or not f_pre


def check_server_version(found: str, needed: str = MIN_SERVER_VERSION) -> None:
    """Raise `ServerTooOld(found, needed)` unless `found` >= `needed`."""
    if not version_at_least(found, needed):
        raise ServerTooOld(found, needed)


def _server_version(nc: NATS) -> str:
    version = nc.connected_server_version
    try:
        text = f"{version.major}.{version.minor}.{version.patch}"
        return f"{text}-{version.prerelease}" if version.prerelease else text
    except (ValueError, TypeError):
        return repr(version)


# -- helpers --------------------------------------------------------------------------------------


def _ack_reply_seqs(reply: str) -> tuple[int, int]:
    """(stream seq, consumer seq) from a JetStream ack subject, old or domain-qualified form."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
        return int(tokens[5]), int(tokens[6])
    if len(tokens) >= 12:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>...
        return int(tokens[7]), int(tokens[8])
    raise StoreUnavailable(f"unexpected JetStream ack subject {reply!r}")


def _status(msg: Msg) -> str | None:
    headers = msg.headers
    if not headers or msg.data:
        return None
    return headers.get(_HDR_STATUS)


async def _quiet_error_cb(exc: Exception) -> None:
    """nats-py prints async errors to stderr by default; reconnect noise belongs in logs."""
    log.debug("nats: %s", exc)


#: Connection -> its store's handler of denied publishes (see `_open_connection`'s error callback).
_DENIED_HOOKS: weakref.WeakKeyDictionary[NATS, weakref.WeakMethod[Any]] = weakref.WeakKeyDictionary()
_DENIED = re.compile(r"permissions violation for publish to \W?([^\s\"']+)", re.I)


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


# -- the store ------------------------------------------------------------------------------------


class JetStreamEventStore:
    """The `EventStore` on NATS JetStream. Build it with `await JetStreamEventStore.connect(...)`."""

    def __init__(
        self,
        nc: NATS,
        *,
        owns_connection: bool = False,
        stream: str = EVENTS_STREAM,
        request_timeout: float = 5.0,
        follow_heartbeat: float = 2.0,
        read_batch: int = 1000,
        read_max_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        """Wrap an already connected client. Prefer `connect()`, which also checks the server and
        sets up the stream."""
        self._nc = nc
        self._owns_connection = owns_connection
        self.stream = stream
        self.request_timeout = request_timeout
        self.follow_heartbeat = follow_heartbeat
        self.read_batch = read_batch
        self.read_max_bytes = read_max_bytes
        self._direct_subject = f"$JS.API.DIRECT.GET.{stream}"
        # One wildcard reply subscription for every request we make (appends, API calls, direct
        # gets): token -> waiter. Timeouts come from one sweeper task rather than a timer per
        # request, which is what makes pipelined appends cheap.
        self._reply_prefix = ""
        self._reply_sub: Any = None
        self._reply_lock = asyncio.Lock()
        self._next_token = 0
        self._waiters: dict[str, _Waiter | _Batch] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        #: Large tool outputs of an oversized commit go here by reference (`agentlog.log.payloads`).
        self._blobs = ObjectStoreBlobs(nc)
        _DENIED_HOOKS[nc] = weakref.WeakMethod(self._on_denied)

    def _on_denied(self, subject: str) -> None:
        """The server refused a publish of ours (it sends no reply): fail the requests waiting on
        that subject at once with a typed error instead of letting them time out."""
        for waiter in list(self._waiters.values()):
            if isinstance(waiter, _Waiter) and waiter.subject == subject and not waiter.done.done():
                waiter.done.set_exception(PermissionDenied(
                    f"NATS denied this connection's user publishing to {subject!r}: the user's role does "
                    "not allow it (e.g. readonly cannot append or queue commands)"))

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str] | NATS = "nats://127.0.0.1:4222",
        *,
        creds: str | os.PathLike[str] | None = None,
        nkey_seed: str | os.PathLike[str] | None = None,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        tls_hostname: str | None = None,
        name: str = "agentlog",
        stream: str = EVENTS_STREAM,
        replicas: int | None = None,
        duplicate_window: float = 120.0,
        request_timeout: float = 5.0,
        connect_timeout: float = 10.0,
        reconnect_wait: float = 0.5,
        follow_heartbeat: float = 2.0,
        setup_stream: bool = True,
    ) -> JetStreamEventStore:
        """Connect (or adopt a connected `nats.aio.client.Client`), refuse servers older than
        `MIN_SERVER_VERSION`, and create or update the events stream.

        `servers`: URL(s) or a client. `creds`: a .creds file; `nkey_seed`: a seed file or the
        seed itself; `token`, `user`/`password`, `tls`/`tls_hostname` as in nats-py. The client
        reconnects forever; every operation is bounded by `request_timeout` (seconds).
        `replicas`: for a new stream (default 1), or to raise an existing one's; never lowers it
        (`agentlog.log.replicas`).
        """
        owns = not isinstance(servers, NATS)
        if isinstance(servers, NATS):
            nc = servers
        else:
            nc = await _open_connection(
                [servers] if isinstance(servers, str) else list(servers),
                creds=creds,
                nkey_seed=nkey_seed,
                token=token,
                user=user,
                password=password,
                tls=tls,
                tls_hostname=tls_hostname,
                name=name,
                connect_timeout=connect_timeout,
                reconnect_wait=reconnect_wait,
            )
        store = cls(
            nc,
            owns_connection=owns,
            stream=stream,
            request_timeout=request_timeout,
            follow_heartbeat=follow_heartbeat,
        )
        try:
            check_server_version(_server_version(nc))
            if setup_stream:
                await store.ensure_stream(replicas=replicas, duplicate_window=duplicate_window)
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Drop our subscriptions; close the connection only if `connect()` opened it."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for waiter in self._waiters.values():
            if not waiter.done.done():
                waiter.done.set_exception(StoreUnavailable("the event store was closed"))
        self._waiters.clear()
        if self._reply_sub is not None and not self._nc.is_closed:
            try:
                await self._reply_sub.unsubscribe()
            except nats.errors.Error:
                pass
        if self._owns_connection and not self._nc.is_closed:
            # nats-py flushes on close; after a server restart the socket may already be reset.
            with contextlib.suppress(OSError, nats.errors.Error):
                await self._nc.close()

    async def __aenter__(self) -> JetStreamEventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def nc(self) -> NATS:
        """The underlying client (e.g. for KV buckets or live subjects on the same connection)."""
        return self._nc

    # -- stream setup -------------------------------------------------------------------------

    def desired_stream_config(self, *, replicas: int | None = None, duplicate_window: float = 120.0) -> dict[str, Any]:
        return {
            "name": self.stream,
            "subjects": [EVENTS_SUBJECTS],
            "retention": "limits",
            "storage": "file",
            "num_replicas": replicas or 1,
            "duplicate_window": int(duplicate_window * _NS),
            "discard": "old",
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "max_msgs_per_subject": -1,
            "max_msg_size": -1,
            "max_consumers": -1,
            "allow_direct": True,
            "deny_delete": False,
            "deny_purge": False,
        }

    async def ensure_stream(self, *, replicas: int | None = None, duplicate_window: float = 120.0) -> dict[str, Any]:
        """Create the stream, or check an existing one: its subjects and storage must match (we
        never move data); duplicate window and direct get are updated if they differ, replicas
        only raised when asked (never lowered: `agentlog.log.replicas`). Limits set by an operator are
        left alone. Returns the stream config in effect."""
        desired = self.desired_stream_config(replicas=replicas, duplicate_window=duplicate_window)
        info = await self._api(f"$JS.API.STREAM.INFO.{self.stream}", b"")
        if info.error is not None:
            if info.error.err_code != ERR_STREAM_NOT_FOUND:
                raise _api_failure("stream info", info.error)
            created = await self._api(f"$JS.API.STREAM.CREATE.{self.stream}", _json_encoder.encode(desired))
            if created.error is None:
                return created.config or desired
            # Lost a creation race with another process: fall through to checking its config.
            info = await self._api(f"$JS.API.STREAM.INFO.{self.stream}", b"")
            if info.error is not None:
                raise _api_failure("stream create", created.error)
        current = dict(info.config or {})
        if EVENTS_SUBJECTS not in current.get("subjects", []):
            raise AgentlogError(
                f"stream {self.stream} exists with subjects {current.get('subjects')}, not "
                f"{EVENTS_SUBJECTS!r}: refusing to use it; fix or remove the stream"
            )
        if current.get("storage") != "file":
            raise AgentlogError(
                f"stream {self.stream} exists with {current.get('storage')} storage; the log needs "
                "file storage: migrate it (storage cannot be changed in place)"
            )
        updates = {
            key: desired[key]
            for key in ("duplicate_window", "allow_direct")
            if current.get(key) != desired[key]
        }
        existing = int(current.get("num_replicas") or 1)
        target = replicas_target(existing, replicas)
        if target is not None:
            updates["num_replicas"] = target
        else:
            log_kept(self.stream, existing, replicas)
        if not updates:
            return current
        current.update(updates)
        updated = await self._api(f"$JS.API.STREAM.UPDATE.{self.stream}", _json_encoder.encode(current))
        if updated.error is not None:
            raise _api_failure(f"stream update of {sorted(updates)}", updated.error)
        if target is not None:
            await wait_replicated(self.stream, target, self._peer_state)
        return updated.config or current

    async def _peer_state(self) -> tuple[bool, list[bool]]:
        reply = await self._nc.request(f"$JS.API.STREAM.INFO.{self.stream}", b"", timeout=self.request_timeout)
        cluster = (msgspec.json.decode(reply.data).get("cluster") or {})
        return bool(cluster.get("leader")), [bool(p.get("current")) for p in cluster.get("replicas") or []]

    # -- EventStore ---------------------------------------------------------------------------

    @property
    def max_payload(self) -> int:
        """The server's max payload (headers + body): no commit can be larger."""
        return int(self._nc.max_payload)

    async def append(self, commit: Commit, expected_version: int | None) -> AppendResult:
        if expected_version is not None and expected_version < 0:
            raise ValueError(f"expected_version must be >= 0 or None, not {expected_version}")
        data = encode_checked(commit)
        thread = commit.thread_id
        headers = {_HDR_MSG_ID: commit.commit_id}
        if expected_version is not None:
            headers[_HDR_EXPECTED] = str(expected_version)
            headers[_HDR_EXPECTED_SUBJECT] = thread_filter(thread)
        head = _header_size(headers)
        size = len(data) + head
        limit = self._nc.max_payload
        if size > limit:
            smaller = await offload(commit, limit, self._blobs, lambda c: len(encode_commit(c)) + head)
            if smaller is not commit:
                data = encode_checked(smaller)
                size = len(data) + head
            if size > limit:
                raise CommitTooLarge(size, limit)
        reply = await self._request(event_subject(thread, commit.run_id), data, headers, "append")
        try:
            ack = _ack_decoder.decode(reply.data)
        except msgspec.DecodeError as exc:
            raise StoreUnavailable(f"unreadable JetStream publish ack {reply.data[:200]!r}: {exc}") from None
        if ack.error is None:
            return AppendResult(ack.seq, duplicate=ack.duplicate)
        if ack.error.err_code == ERR_WRONG_LAST_SEQUENCE and expected_version is not None:
            return await self._resolve_conflict(commit, expected_version, ack.error.description)
        raise _api_failure(f"append to thread {thread!r}", ack.error)

    async def read_thread(self, thread_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        validate_id(thread_id, "thread_id")
        async for seq, msg in self._scan(thread_filter(thread_id), after):
            yield StoredCommit(seq, await self._decode(msg.data))

    async def read_run(self, run_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        validate_id(run_id, "run_id")
        async for seq, msg in self._scan(run_filter(run_id), after):
            yield StoredCommit(seq, await self._decode(msg.data))

    async def thread_version(self, thread_id: str) -> int:
        validate_id(thread_id, "thread_id")
        payload = _json_encoder.encode({"last_by_subj": thread_filter(thread_id)})
        reply = await self._request(self._direct_subject, payload, None, "thread_version")
        status = reply.headers.get(_HDR_STATUS) if reply.headers else None
        if status == "404":
            return 0
        if status is not None:
            raise StoreUnavailable(f"direct get of thread {thread_id!r} answered status {status}")
        return int(reply.headers[_HDR_SEQUENCE])  # type: ignore[index]

    async def last_seq(self) -> int:
        info = await self._api(f"$JS.API.STREAM.INFO.{self.stream}", b"")
        if info.error is not None:
            raise _api_failure("stream info", info.error)
        return int((info.state or {}).get("last_seq", 0))

    async def follow(self, thread_id: str | None = None, after: int = 0) -> AsyncIterator[StoredCommit]:
        if thread_id is not None:
            validate_id(thread_id, "thread_id")
        subject = thread_filter(thread_id) if thread_id is not None else EVENTS_SUBJECTS
        follower = _Follower(self, subject, after)
        try:
            while True:
                yield await follower.next()
        finally:
            await follower.stop()

    async def _decode(self, data: bytes) -> Commit:
        """Decode a commit and resolve its payload references (only a commit that has any pays
        for more than a byte scan)."""
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
        self._waiters[token] = waiter
        try:
            await self._nc.publish(subject, payload, reply=self._reply_prefix + token, headers=headers)
            reply = await waiter.done
        except nats.errors.ConnectionClosedError:
            raise StoreUnavailable(f"{what}: the NATS connection is closed") from None
        except nats.errors.Error as exc:
            raise StoreUnavailable(f"{what}: NATS error: {exc or type(exc).__name__}") from None
        except TimeoutError:
            raise StoreUnavailable(
                f"{what}: JetStream did not answer within {self.request_timeout:g}s "
                "(server down or overloaded); retrying the same commit is safe"
            ) from None
        finally:
            self._waiters.pop(token, None)
        headers_in = reply.headers
        if headers_in and not reply.data and headers_in.get(_HDR_STATUS) == "503":
            raise StoreUnavailable(
                f"{what}: no JetStream responder on {subject!r} (JetStream disabled or stream "
                f"{self.stream} missing)"
            )
        return reply

    async def _api(self, subject: str, payload: bytes) -> _ApiResponse:
        reply = await self._request(subject, payload, None, subject)
        try:
            return _api_decoder.decode(reply.data)
        except msgspec.DecodeError as exc:
            raise StoreUnavailable(f"unreadable JetStream API answer on {subject}: {exc}") from None

    async def _resolve_conflict(self, commit: Commit, expected: int, description: str) -> AppendResult:
        """A 10071 is either a real conflict or the retry of a commit already written after
        `expected` (the server checks OCC before dedup). Look for the commit id to tell which."""
        last = expected
        async for seq, msg in self._scan(thread_filter(commit.thread_id), expected):
            last = seq
            if msg.headers and msg.headers.get(_HDR_MSG_ID) == commit.commit_id:
                return AppendResult(seq, duplicate=True)
        match = _WRONG_LAST_RE.search(description)
        actual = max(int(match[1]), last) if match else last
        raise VersionConflict(commit.thread_id, expected, actual)

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

    async def _sweep(self) -> None:
        """Fail waiters whose deadline passed (a batch that is still flowing gets more time)."""
        tick = min(0.05, self.request_timeout / 4)
        while True:
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
        status = headers.get(_HDR_STATUS) if headers else None
        if status is None:
            batch.items.append((int(headers[_HDR_SEQUENCE]), msg))  # type: ignore[index]
            batch.progressed = True
            return
        if status == "204":  # end of batch
            batch.pending = int(headers.get(_HDR_NUM_PENDING, "0"))  # type: ignore[union-attr]
        elif status != "404":  # 404: nothing (more) matches
            batch.error = f"status {status} {headers.get('Description', '')}".strip()  # type: ignore[union-attr]
        batch.done.set_result(None)

    async def _get_batch(self, subject_filter: str, start: int) -> _Batch:
        """One batched Direct Get: up to `read_batch` messages / `read_max_bytes` from `start`."""
        if self._reply_sub is None:
            await self._ensure_reply_sub()
        deadline = time.monotonic() + self.request_timeout
        what = f"read of {subject_filter!r}"
        if not self._nc.is_connected:
            await self._wait_connected(deadline, what)
        self._next_token += 1
        token = str(self._next_token)
        batch = _Batch(deadline)
        self._waiters[token] = batch
        request = {
            "seq": start,
            "next_by_subj": subject_filter,
            "batch": self.read_batch,
            "max_bytes": self.read_max_bytes,
        }
        try:
            await self._nc.publish(
                self._direct_subject, _json_encoder.encode(request), reply=self._reply_prefix + token
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

    async def _scan(self, subject_filter: str, after: int) -> AsyncIterator[tuple[int, Msg]]:
        """(seq, raw message) of every message matching the filter with seq > after, in order,
        up to what was in the stream when the last batch was served."""
        start = after + 1
        while True:
            batch = await self._get_batch(subject_filter, start)
            for item in batch.items:
                yield item
            if not batch.items or batch.pending == 0:
                return
            start = batch.items[-1][0] + 1


class _Follower:
    """One live tail: an ephemeral push consumer it recreates from `last + 1` whenever the
    delivery is in doubt (consumer sequence gap, missed heartbeats, consumer gone, errors)."""

    def __init__(self, store: JetStreamEventStore, subject_filter: str, after: int) -> None:
        self.store = store
        self.filter = subject_filter
        self.last = after
        self.heartbeat = store.follow_heartbeat
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()
        self.sub: Any = None
        self.consumer: str | None = None
        self.next_dseq = 1

    async def _on_msg(self, msg: Msg) -> None:
        self.queue.put_nowait(msg)

    async def _start(self) -> None:
        """(Re)create the consumer from last + 1 on a fresh inbox, retrying until it works.

        The name and the inbox are chosen once per (re)create and kept across the retries: a create
        whose answer was lost (a timeout on a loaded server) is then repeated with an identical
        config, which the server answers idempotently, instead of leaving an orphan consumer that
        delivers nowhere until its `inactive_threshold`."""
        nc = self.store.nc
        delay = min(self.heartbeat, 0.25)
        await self._drop()
        inbox = nc.new_inbox()
        name = f"agentlog_follow_{secrets.token_hex(8)}"
        config = {
            "name": name,
            "deliver_subject": inbox,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": self.last + 1,
            "filter_subject": self.filter,
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(self.heartbeat * _NS),
            "inactive_threshold": int(max(30.0, self.heartbeat * 10) * _NS),
            "mem_storage": True,
            "num_replicas": 1,
        }
        request = _json_encoder.encode({"stream_name": self.store.stream, "config": config})
        while True:
            if nc.is_closed or self.store._closed:
                raise StoreUnavailable("follow: the NATS connection is closed")
            try:
                if self.sub is None:
                    # Flow control bounds what is in flight; a drop would only cost a recreate.
                    self.sub = await nc.subscribe(inbox, cb=self._on_msg, pending_msgs_limit=0, pending_bytes_limit=0)
                self.consumer = name  # from here on `_drop` deletes it, created or not
                answer = await self.store._api(f"$JS.API.CONSUMER.CREATE.{self.store.stream}.{name}", request)
            except (StoreUnavailable, nats.errors.Error) as exc:
                log.debug("follow: consumer create failed, retrying: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if answer.error is not None:
                log.debug("follow: consumer create refused, retrying: %s", answer.error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self.next_dseq = 1
            return

    async def _drop(self, timeout: float | None = None) -> None:
        """Forget the current consumer and delete it on the server, bounded by `timeout` (default:
        briefly, as a recreate must not wait long on a server that is in trouble); if that fails
        it expires by itself after `inactive_threshold`."""
        nc = self.store.nc
        sub, self.sub = self.sub, None
        consumer, self.consumer = self.consumer, None
        self.queue = asyncio.Queue()
        if nc.is_closed:
            return
        try:
            if sub is not None:
                await sub.unsubscribe()
            if consumer is not None and nc.is_connected:
                await nc.request(
                    f"$JS.API.CONSUMER.DELETE.{self.store.stream}.{consumer}",
                    b"",
                    timeout=min(1.0, self.store.request_timeout) if timeout is None else timeout,
                )
        except nats.errors.Error:
            pass

    async def next(self) -> StoredCommit:
        if self.sub is None:
            await self._start()
        stall = self.heartbeat * 2.5
        while True:
            try:
                msg = await asyncio.wait_for(self.queue.get(), stall)
            except TimeoutError:
                log.debug("follow %s: no message or heartbeat for %.1fs, recreating", self.filter, stall)
                await self._start()
                continue
            status = _status(msg)
            if status is not None:
                if not await self._control(msg, status):
                    await self._start()
                continue
            if not msg.reply:
                continue
            sseq, dseq = _ack_reply_seqs(msg.reply)
            if dseq != self.next_dseq:
                log.debug("follow %s: consumer seq %d, expected %d, recreating", self.filter, dseq, self.next_dseq)
                await self._start()
                continue
            self.next_dseq = dseq + 1
            if sseq <= self.last:
                continue
            commit = await self.store._decode(msg.data)
            self.last = sseq
            return StoredCommit(sseq, commit)

    async def _control(self, msg: Msg, status: str) -> bool:
        """Handle a status message; False means the consumer must be recreated."""
        headers = msg.headers or {}
        if status != "100":
            log.debug("follow %s: status %s %s", self.filter, status, headers.get("Description"))
            return False
        nc = self.store.nc
        if msg.reply:  # flow control request: we have processed everything before it
            await nc.publish(msg.reply, b"")
            return True
        stalled = headers.get("Nats-Consumer-Stalled")
        if stalled:
            await nc.publish(stalled, b"")
        last_consumer = headers.get("Nats-Last-Consumer")
        if last_consumer is not None and int(last_consumer) != self.next_dseq - 1:
            return False  # a heartbeat that reveals messages we never got
        return True

    async def stop(self) -> None:
        try:
            # The full request timeout: a loaded server that answers in over a second must still
            # see the consumer go (the caller is done with it and may count consumers).
            await self._drop(self.store.request_timeout)
        except Exception:  # noqa: BLE001 - closing must not mask the reason the follow ended
            log.debug("follow: cleanup failed", exc_info=True)


# -- module helpers -------------------------------------------------------------------------------


def _header_size(headers: dict[str, str]) -> int:
    """Bytes the headers add to the message (NATS/1.0 line, `k: v` lines, blank line); the
    server's max_payload bounds headers + payload."""
    return 12 + sum(len(k) + len(v) + 4 for k, v in headers.items())


def _api_failure(what: str, error: _ApiError) -> AgentlogError:
    if error.code == 503 or error.code >= 500:
        return StoreUnavailable(f"{what}: JetStream unavailable: {error.description} (err {error.err_code})")
    return AgentlogError(f"{what}: JetStream refused: {error.description} (err {error.err_code})")


async def _open_connection(
    servers: list[str],
    *,
    creds: str | os.PathLike[str] | None,
    nkey_seed: str | os.PathLike[str] | None,
    token: str | None,
    user: str | None,
    password: str | None,
    tls: ssl.SSLContext | None,
    tls_hostname: str | None,
    name: str,
    connect_timeout: float,
    reconnect_wait: float,
) -> NATS:
    options: dict[str, Any] = {
        "servers": servers,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": reconnect_wait,
        "connect_timeout": max(1, int(min(connect_timeout, 5))),
        "error_cb": _quiet_error_cb,
    }
    if creds is not None:
        options["user_credentials"] = str(creds)
    if nkey_seed is not None:
        seed = str(nkey_seed)
        options["nkeys_seed" if Path(seed).is_file() else "nkeys_seed_str"] = seed
    if token is not None:
        options["token"] = token
    if user is not None:
        options["user"] = user
    if password is not None:
        options["password"] = password
    if tls is not None:
        options["tls"] = tls
    if tls_hostname is not None:
        options["tls_hostname"] = tls_hostname
    nc = LeanHeadersClient()
    # nats-py retries a refused login like a network error (forever, with max_reconnect_attempts
    # -1): notice the refusal in the error callback and fail at once with a typed error.
    refused: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

    async def error_cb(exc: Exception) -> None:
        await _quiet_error_cb(exc)
        if _AUTH_REFUSED.search(str(exc)) and not refused.done():
            refused.set_result(exc)
        denied = _DENIED.search(str(exc))
        hook = _DENIED_HOOKS.get(nc)
        handler = hook() if hook is not None else None
        if denied and handler is not None:
            handler(denied.group(1))

    options["error_cb"] = error_cb
    connecting = asyncio.ensure_future(nc.connect(**options))
    try:
        # With max_reconnect_attempts=-1 nats-py retries the first connect forever: bound it.
        racing: set[asyncio.Future[Any]] = {connecting, refused}
        done, _ = await asyncio.wait(racing, timeout=connect_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if connecting in done:
            connecting.result()
        elif refused in done:
            raise NotAuthorized(f"NATS at {', '.join(servers)} refused the login: {refused.result()}; "
                                "give the credentials of a user allowed to connect (--creds, --token, or the "
                                "data dir's generated credentials)")
        else:
            raise TimeoutError()
    except (TimeoutError, OSError, nats.errors.Error, NotAuthorized) as exc:
        connecting.cancel()
        try:
            await nc.close()
        except Exception:  # noqa: BLE001
            pass
        if isinstance(exc, NotAuthorized):
            raise
        raise StoreUnavailable(
            f"cannot connect to NATS at {', '.join(servers)} within {connect_timeout:g}s: "
            f"{str(exc) or type(exc).__name__}"
        ) from None
    return nc


_AUTH_REFUSED = re.compile(r"authorization violation|authentication (expired|revoked)|user authentication", re.I)


async def flush_subscriptions(nc: NATS, timeout: float = 10.0) -> None:
    """Return once every subscription made so far on `nc` is known to the server.

    A single `nc.flush()` does not promise that: nats-py writes its PING straight to the socket,
    ahead of commands (such as a fresh SUB) still queued for its flusher task, so the PONG can
    come back before the SUB was sent, and a request from another connection in that window gets
    "no responders". The first flush lets the flusher write the queue; the second PING is then
    written after it, so its PONG proves the server has processed the SUB.
    """
    await nc.flush(timeout)  # type: ignore[arg-type]  # nats-py annotates int; it takes seconds as float
    await nc.flush(timeout)  # type: ignore[arg-type]
