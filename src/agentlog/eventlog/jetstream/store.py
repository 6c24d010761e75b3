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
* Every `follow` of a store reads one live tail (`agentlog.eventlog.jetstream.tails`): an ephemeral
  push consumer on the whole stream (ack none, flow control, idle heartbeats) that keeps the last
  stream sequence it saw; on a gap, a stall or any consumer error it recreates the consumer from
  last + 1, so nothing is missed or repeated across reconnects and server restarts. A follow is
  a local registration: no consumer is created or deleted for it.
* Threads archived by retention (`agentlog.eventlog.jetstream.retention`) live in the Object Store; `read_thread`
  and `read_run` put their commits back at their positions (`agentlog.eventlog.jetstream.archive`), so no reader
  knows the difference. The stream refuses to run under limits that would delete commits
  (`agentlog.eventlog.jetstream.limits`).
* Every NATS failure (no connection, timeout, no responders) becomes `StoreUnavailable`, bounded by
  `request_timeout`. A failed append may still land later (the publish can sit in the client's
  reconnect buffer); retrying the same commit is always safe.

This module is the store: its lifecycle, stream setup, append with OCC and the `EventStore`
operations. Its parts: `js_api` (wire format, version gate), `js_connection` (connecting),
`js_requests` (request/reply and batched Direct Get), `js_follow` (the live tail), `js_tails` (the tail shared by every follow).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS

from agentlog.eventlog.codec import decode_commit, decode_profile_commit, encode_commit, encode_profile_commit
from agentlog.eventlog.errors import (
    AgentlogError,
    CodecError,
    CommitTooLarge,
    StoreUnavailable,
    VersionConflict,
)
from agentlog.eventlog.events import AppendResult, Commit, ProfileCommit, StoredCommit, StoredProfileCommit
from agentlog.eventlog.ids import validate_id
from agentlog.eventlog.jetstream.api import (
    ERR_NO_MESSAGE_FOUND,
    ERR_NO_SUITABLE_PEERS,
    ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
    HDR_EXPECTED,
    HDR_EXPECTED_SUBJECT,
    HDR_MSG_ID,
    HDR_SEQUENCE,
    HDR_STATUS,
    MIN_SERVER_VERSION,
    NS_PER_SECOND,
    WRONG_LAST_RE,
    ApiResponse,
    ack_decoder,
    api_failure,
    check_server_version,
    header_size,
    json_encoder,
    parse_version,
    server_version,
    version_at_least,
)
from agentlog.eventlog.jetstream.archive import ThreadArchive
from agentlog.eventlog.jetstream.connection import DENIED_HOOKS, flush_subscriptions, open_connection
from agentlog.eventlog.jetstream.limits import check_limits
from agentlog.eventlog.jetstream.payloads import ObjectStoreBlobs, offload, offload_binaries
from agentlog.eventlog.jetstream.replicas import (
    PlacementRefused,
    log_kept,
    placed,
    replicas_target,
    wait_replicated,
)
from agentlog.eventlog.jetstream.requests import JetStreamRequests
from agentlog.eventlog.jetstream.tails import ThreadTails
from agentlog.eventlog.quarantine import Quarantine
from agentlog.eventlog.store import check_profile_commit, encode_checked
from agentlog.eventlog.subjects import (
    EVENTS_STREAM,
    EVENTS_SUBJECTS,
    PROFILE_SUBJECTS,
    PROFILES_STREAM,
    event_subject,
    profile_subject,
    run_filter,
    thread_filter,
)
from agentlog.eventlog.write_health import WriteHealth

__all__ = [
    "ERR_NO_MESSAGE_FOUND", "ERR_STREAM_NOT_FOUND", "ERR_WRONG_LAST_SEQUENCE", "MIN_SERVER_VERSION",
    "JetStreamEventStore", "check_server_version", "flush_subscriptions", "parse_version", "version_at_least",
]


class JetStreamEventStore(JetStreamRequests):
    """The `EventStore` on NATS JetStream. Build it with `await JetStreamEventStore.connect(...)`."""

    def __init__(
        self,
        nc: NATS,
        *,
        owns_connection: bool = False,
        stream: str = EVENTS_STREAM,
        request_timeout: float = 5.0,
        follow_heartbeat: float = 2.0,
        follow_linger: float = 30.0,
        read_batch: int = 1000,
        read_max_bytes: int = 8 * 1024 * 1024,
        replicas: int | None = None,
    ) -> None:
        """Wrap an already connected client. Prefer `connect()`, which also checks the server and
        sets up the stream. `replicas`: for the large-payload bucket, created on first use.
        `follow_linger`: seconds the live tail of thread follows runs on after the last one ended."""
        self._nc = nc
        self._owns_connection = owns_connection
        self.stream = stream
        self.request_timeout = request_timeout
        self.follow_heartbeat = follow_heartbeat
        self.read_batch = read_batch
        self.read_max_bytes = read_max_bytes
        self._direct_subject = f"$JS.API.DIRECT.GET.{stream}"
        self._profiles_direct = f"$JS.API.DIRECT.GET.{PROFILES_STREAM}"
        # One wildcard reply subscription for every request we make (appends, API calls, direct
        # gets): token -> waiter. Timeouts come from one sweeper task rather than a timer per
        # request, which is what makes pipelined appends cheap.
        self._reply_prefix = ""
        self._reply_sub: Any = None
        self._reply_lock = asyncio.Lock()
        self._next_token = 0
        self._waiters = {}
        self._waiting = asyncio.Event()
        self._sweeper = None
        self._closed = False
        #: Large tool outputs of an oversized commit go here by reference (`agentlog.eventlog.jetstream.payloads`).
        self._blobs = ObjectStoreBlobs(nc, replicas=replicas)
        #: Every thread's follow reads this one live tail.
        self._tails = ThreadTails(self, linger=follow_linger)
        self.quarantine = Quarantine()
        #: Whether this process's appends go through (`/health`: `agentlog.eventlog.write_health`).
        self.writes = WriteHealth()
        #: Commits of archived threads, put back into reads (`agentlog.eventlog.jetstream.archive`).
        self.archive = ThreadArchive(nc, self._decode_data, timeout=request_timeout)
        DENIED_HOOKS[nc] = weakref.WeakMethod(self._on_denied)

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
        follow_linger: float = 30.0,
        setup_stream: bool = True,
    ) -> JetStreamEventStore:
        """Connect (or adopt a connected `nats.aio.client.Client`), refuse servers older than
        `MIN_SERVER_VERSION`, and create or update the events stream.

        `servers`: URL(s) or a client. `creds`: a .creds file; `nkey_seed`: a seed file or the
        seed itself; `token`, `user`/`password`, `tls`/`tls_hostname` as in nats-py. The client
        reconnects forever; every operation is bounded by `request_timeout` (seconds).
        `replicas`: for a new stream (default 1), or to raise an existing one's; never lowers it
        (`agentlog.eventlog.jetstream.replicas`).
        """
        owns = not isinstance(servers, NATS)
        if isinstance(servers, NATS):
            nc = servers
        else:
            nc = await open_connection(
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
            follow_linger=follow_linger,
            replicas=replicas,
        )
        try:
            check_server_version(server_version(nc))
            if setup_stream:
                await store.ensure_stream(replicas=replicas, duplicate_window=duplicate_window)
                await store.ensure_profiles_stream(replicas=replicas, duplicate_window=duplicate_window)
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Drop our subscriptions; close the connection only if `connect()` opened it."""
        if self._closed:
            return
        await self._tails.close()  # its consumer deleted while the connection is still ours
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

    # -- stream setup -------------------------------------------------------------------------

    def desired_stream_config(self, *, replicas: int | None = None, duplicate_window: float = 120.0) -> dict[str, Any]:
        return {
            "name": self.stream,
            "subjects": [EVENTS_SUBJECTS],
            "retention": "limits",
            "storage": "file",
            "num_replicas": replicas or 1,
            "duplicate_window": int(duplicate_window * NS_PER_SECOND),
            # no limits are set; if an operator adds a size limit, new commits are refused rather
            # than old ones dropped (`agentlog.eventlog.jetstream.limits`)
            "discard": "new",
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

    async def _create_stream(self, config: dict[str, Any]) -> ApiResponse:
        created = await self._api(f"$JS.API.STREAM.CREATE.{self.stream}", json_encoder.encode(config))
        if created.error is not None and created.error.err_code == ERR_NO_SUITABLE_PEERS:
            raise PlacementRefused(str(api_failure("stream create", created.error)))
        return created

    async def ensure_stream(self, *, replicas: int | None = None, duplicate_window: float = 120.0) -> dict[str, Any]:
        """Create the stream, or check an existing one: its subjects and storage must match (we
        never move data); duplicate window and direct get are updated if they differ, replicas
        only raised when asked (never lowered: `agentlog.eventlog.jetstream.replicas`). Limits set by an operator are
        left alone, unless they would delete commits: then `LossyStreamLimits` (`agentlog.eventlog.jetstream.limits`).
        Returns the stream config in effect."""
        desired = self.desired_stream_config(replicas=replicas, duplicate_window=duplicate_window)
        info = await self._api(f"$JS.API.STREAM.INFO.{self.stream}", b"")
        if info.error is not None:
            if info.error.err_code != ERR_STREAM_NOT_FOUND:
                raise api_failure("stream info", info.error)
            created = await placed(lambda: self._create_stream(desired), f"stream {self.stream}")
            if created.error is None:
                return created.config or desired
            # Lost a creation race with another process: fall through to checking its config.
            info = await self._api(f"$JS.API.STREAM.INFO.{self.stream}", b"")
            if info.error is not None:
                raise api_failure("stream create", created.error)
        current = dict(info.config or {})
        check_limits(self.stream, current)
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
        updated = await self._api(f"$JS.API.STREAM.UPDATE.{self.stream}", json_encoder.encode(current))
        if updated.error is not None:
            raise api_failure(f"stream update of {sorted(updates)}", updated.error)
        if target is not None:
            await wait_replicated(self.stream, target, self._peer_state)
        return updated.config or current

    async def ensure_profiles_stream(self, *, replicas: int | None = None, duplicate_window: float = 120.0) -> None:
        """Create the profiles' stream (`AGENTLOG_PROFILES` on `agentlog.pf.>`) if it is missing,
        with the events stream's settings; an existing one is used as it is (its subjects must
        match). Profiles are written rarely and read per profile, so one stream for all of them,
        apart from the events (whose readers, the projection runner first, never see them)."""
        info = await self._api(f"$JS.API.STREAM.INFO.{PROFILES_STREAM}", b"")
        if info.error is None:
            if PROFILE_SUBJECTS not in (info.config or {}).get("subjects", []):
                raise AgentlogError(f"stream {PROFILES_STREAM} exists with subjects {(info.config or {}).get('subjects')}, "
                                    f"not {PROFILE_SUBJECTS!r}: refusing to use it; fix or remove the stream")
            return
        if info.error.err_code != ERR_STREAM_NOT_FOUND:
            raise api_failure("profiles stream info", info.error)
        config = {**self.desired_stream_config(replicas=replicas, duplicate_window=duplicate_window),
                  "name": PROFILES_STREAM, "subjects": [PROFILE_SUBJECTS]}
        created = await self._api(f"$JS.API.STREAM.CREATE.{PROFILES_STREAM}", json_encoder.encode(config))
        if created.error is not None:  # lost a creation race? then it exists now
            again = await self._api(f"$JS.API.STREAM.INFO.{PROFILES_STREAM}", b"")
            if again.error is not None:
                raise api_failure("profiles stream create", created.error)

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
        commit = await offload_binaries(commit, self._blobs)
        data = encode_checked(commit)
        thread = commit.thread_id
        headers = {HDR_MSG_ID: commit.commit_id}
        if expected_version is not None:
            headers[HDR_EXPECTED] = str(expected_version)
            headers[HDR_EXPECTED_SUBJECT] = thread_filter(thread)
        head = header_size(headers)
        size = len(data) + head
        limit = self._nc.max_payload
        if size > limit:
            smaller = await offload(commit, limit, self._blobs, lambda c: len(encode_commit(c)) + head)
            if smaller is not commit:
                data = encode_checked(smaller)
                size = len(data) + head
            if size > limit:
                raise CommitTooLarge(size, limit)
        try:
            reply = await self._request(event_subject(thread, commit.run_id), data, headers, "append")
            try:
                ack = ack_decoder.decode(reply.data)
            except msgspec.DecodeError as exc:
                raise StoreUnavailable(f"unreadable JetStream publish ack {reply.data[:200]!r}: {exc}") from None
        except StoreUnavailable as exc:
            self.writes.failed("append", exc)
            raise
        if ack.error is None:
            self.writes.succeeded()
            if commit.run_id is not None:
                self.archive.saw_live(commit.run_id)
            return AppendResult(ack.seq, duplicate=ack.duplicate)
        if ack.error.err_code == ERR_WRONG_LAST_SEQUENCE and expected_version is not None:
            self.writes.succeeded()  # the server took the request and checked it: writes work
            return await self._resolve_conflict(commit, expected_version, ack.error.description)
        failure = api_failure(f"append to thread {thread!r}", ack.error)
        self.writes.failed("append", failure)
        raise failure

    # -- profiles (`ProfileStore`) -----------------------------------------------------------------

    async def append_profile(self, commit: ProfileCommit, expected_version: int | None) -> AppendResult:
        """Append to the profile's subject under per-profile OCC; idempotent on `commit_id`."""
        check_profile_commit(commit)
        data = encode_profile_commit(commit)
        subject = profile_subject(commit.profile_id)
        headers = {HDR_MSG_ID: commit.commit_id}
        if expected_version is not None:
            headers[HDR_EXPECTED] = str(expected_version)
            headers[HDR_EXPECTED_SUBJECT] = subject
        if len(data) + header_size(headers) > self._nc.max_payload:
            raise CommitTooLarge(len(data) + header_size(headers), self._nc.max_payload)
        reply = await self._request(subject, data, headers, "profile append")
        try:
            ack = ack_decoder.decode(reply.data)
        except msgspec.DecodeError as exc:
            raise StoreUnavailable(f"unreadable JetStream publish ack {reply.data[:200]!r}: {exc}") from None
        if ack.error is None:
            return AppendResult(ack.seq, duplicate=ack.duplicate)
        if ack.error.err_code == ERR_WRONG_LAST_SEQUENCE and expected_version is not None:
            last = expected_version
            async for seq, msg in self._scan(subject, expected_version, self._profiles_direct):
                last = seq
                if msg.headers and msg.headers.get(HDR_MSG_ID) == commit.commit_id:
                    return AppendResult(seq, duplicate=True)
            raise VersionConflict(commit.profile_id, expected_version, last)
        raise api_failure(f"append to profile {commit.profile_id!r}", ack.error)

    async def read_profile(self, profile_id: str, after: int = 0) -> AsyncIterator[StoredProfileCommit]:
        """The profile's commits after `after`; one a reader cannot decode is skipped (and
        counted by the quarantine), as a profile holds only state writes, folded by key."""
        async for seq, msg in self._scan(profile_subject(profile_id), after, self._profiles_direct):
            try:
                commit = decode_profile_commit(msg.data)
            except CodecError:
                continue
            if commit.profile_id == profile_id:  # a digest collision is not this profile's
                yield StoredProfileCommit(seq, commit)

    async def read_thread(self, thread_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        validate_id(thread_id, "thread_id")
        async for sc in self.archive.fill_thread(thread_id, after, self._stream_commits(thread_filter(thread_id), after)):
            yield sc

    async def read_run(self, run_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        validate_id(run_id, "run_id")
        async for sc in self.archive.fill_run(run_id, after, self._stream_commits(run_filter(run_id), after)):
            yield sc

    async def read_run_tail(self, run_id: str, after: int) -> AsyncIterator[StoredCommit]:
        """The run's commits after `after` in the stream, without the archive fallback of
        `read_run`: for a reader that has just read the run's earlier commits (from the stream,
        or from the archive of a finished, archived run, which has no later ones). An empty tail
        is the common case (a follow that waits for what comes next), and `read_run` would pay an
        archive index lookup for it, on the path of every follow."""
        validate_id(run_id, "run_id")
        async for sc in self._stream_commits(run_filter(run_id), after):
            yield sc

    async def read_log(self, after: int = 0) -> AsyncIterator[StoredCommit]:
        """Every commit in the stream with seq > `after` (all threads, archived ones as their
        markers), up to the end at call time: batched reads, no consumer. Large-payload
        references are left as they are (a scan of the whole log, e.g. retention's, never needs
        the tool outputs)."""
        async for seq, msg in self._scan(EVENTS_SUBJECTS, after):
            try:
                commit = decode_commit(msg.data)
            except CodecError:
                commit = await self._decode(seq, msg)  # its quarantine stand-in
            yield StoredCommit(seq, commit)

    async def _stream_commits(self, subject_filter: str, after: int) -> AsyncIterator[StoredCommit]:
        """The commits in the stream matching the filter (without archived ones)."""
        async for seq, msg in self._scan(subject_filter, after):
            yield StoredCommit(seq, await self._decode(seq, msg))

    async def purge_thread(self, thread_id: str, below: int) -> int:
        """Remove the thread's commits with seq < `below` from the stream (retention, after they
        were archived: `agentlog.eventlog.jetstream.retention`). Needs a login allowed to purge (the `archiver`
        role). Returns how many were removed."""
        validate_id(thread_id, "thread_id")
        body = json_encoder.encode({"filter": thread_filter(thread_id), "seq": below})
        reply = await self._request(f"$JS.API.STREAM.PURGE.{self.stream}", body, None, "purge")
        try:
            answer = msgspec.json.decode(reply.data)
        except msgspec.DecodeError as exc:
            raise StoreUnavailable(f"unreadable JetStream purge answer: {exc}") from None
        if answer.get("error"):
            error = answer["error"]
            raise AgentlogError(f"purge of thread {thread_id!r} refused: {error.get('description')} "
                                f"(err {error.get('err_code')})")
        return int(answer.get("purged", 0))

    async def thread_version(self, thread_id: str) -> int:
        validate_id(thread_id, "thread_id")
        payload = json_encoder.encode({"last_by_subj": thread_filter(thread_id)})
        reply = await self._request(self._direct_subject, payload, None, "thread_version")
        status = reply.headers.get(HDR_STATUS) if reply.headers else None
        if status == "404":
            return 0
        if status is not None:
            raise StoreUnavailable(f"direct get of thread {thread_id!r} answered status {status}")
        return int(reply.headers[HDR_SEQUENCE])  # type: ignore[index]

    async def last_seq(self) -> int:
        info = await self._api(f"$JS.API.STREAM.INFO.{self.stream}", b"")
        if info.error is not None:
            raise api_failure("stream info", info.error)
        return int((info.state or {}).get("last_seq", 0))

    async def stream_full(self, name: str | None = None) -> str | None:
        """Why stream `name` (default: the events stream) cannot take a commit of the largest
        size now, or None: with `discard: new`, a stream at its `max_bytes` or `max_msgs`
        refuses every write (a full disk, as an operator's limit or a quota models it). A stream
        that discards old messages never refuses; one that does not exist is not full."""
        stream = name or self.stream
        info = await self._api(f"$JS.API.STREAM.INFO.{stream}", b"")
        if info.error is not None:
            if info.error.err_code == ERR_STREAM_NOT_FOUND:
                return None
            raise api_failure("stream info", info.error)
        config, state = info.config or {}, info.state or {}
        if config.get("discard") != "new":
            return None
        max_bytes, used = int(config.get("max_bytes") or -1), int(state.get("bytes") or 0)
        if max_bytes > 0 and max_bytes - used < self.max_payload:
            return f"stream {stream} is full: {used} of its max_bytes {max_bytes} used"
        max_msgs, count = int(config.get("max_msgs") or -1), int(state.get("messages") or 0)
        if max_msgs > 0 and count >= max_msgs:
            return f"stream {stream} is full: {count} of its max_msgs {max_msgs}"
        return None

    async def follow(self, thread_id: str | None = None, after: int = 0) -> AsyncIterator[StoredCommit]:
        """Every follow of this store, of one thread or of all, reads its one live tail
        (`agentlog.eventlog.jetstream.tails`)."""
        if thread_id is not None:
            validate_id(thread_id, "thread_id")
        async with contextlib.aclosing(self._tails.follow(thread_id, after)) as commits:
            async for sc in commits:
                yield sc

    async def live_position(self) -> int:
        """A seq at or below which every commit is in the stream, as recent as this process
        knows without asking the server (the live tail's; one request to start the tail when it
        is not running): a follow from it that reads the history after it joined misses nothing."""
        return await self._tails.position()

    def thread_follows(self, thread_id: str | None = None) -> int:
        """How many follows of `thread_id` (of any thread: None) read this store's live tail now."""
        return self._tails.follows(thread_id)

    async def _resolve_conflict(self, commit: Commit, expected: int, description: str) -> AppendResult:
        """A 10071 is either a real conflict or the retry of a commit already written after
        `expected` (the server checks OCC before dedup). Look for the commit id to tell which."""
        last = expected
        async for seq, msg in self._scan(thread_filter(commit.thread_id), expected):
            last = seq
            if msg.headers and msg.headers.get(HDR_MSG_ID) == commit.commit_id:
                return AppendResult(seq, duplicate=True)
        match = WRONG_LAST_RE.search(description)
        actual = max(int(match[1]), last) if match else last
        raise VersionConflict(commit.thread_id, expected, actual)
