"""Large tool outputs stored by reference in the JetStream Object Store.

A commit must fit in one JetStream message (the server's max payload, 1 MB by default). A tool
can return more than that; rather than failing the commit (and with it the run), the store moves
the largest tool outputs of an oversized commit (`ToolCallCompleted.result` and the content of
the `tool` message that mirrors it) into the object store bucket `agentlog_payloads`, and the
event carries a `PayloadRef{bucket, name, size, sha256}` instead. Every read resolves the
references again, so projections, resume and verified replay see exactly the value the tool
returned. Only tool outputs move: an oversized user message or state is still `CommitTooLarge`.

Object names are derived from the commit id and the event index, so a retried append rewrites
the same objects (idempotent), and the sha256 in the reference is checked on read.

The two transformations are pure functions over a commit (`offload`, `resolve`) with the object
I/O behind a two-method protocol, so they are unit-testable and the store stays the only edge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec

from .errors import AgentlogError
from .events import Commit, MessageAppended, PayloadRef, ToolCallCompleted
from .replicas import raise_replicas

__all__ = ["PAYLOAD_BUCKET", "BlobStore", "ObjectStoreBlobs", "PayloadMissing", "has_refs", "offload", "resolve"]

PAYLOAD_BUCKET = "agentlog_payloads"
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()
#: Cheap pre-check on the raw bytes of a commit: no reference field, nothing to resolve.
_MARKERS = (b'"result_ref"', b'"content_ref"')


class PayloadMissing(AgentlogError):
    """A referenced payload is gone or does not match its reference's digest."""

    code = "payload_missing"


class BlobStore(Protocol):
    bucket: str

    async def put(self, name: str, data: bytes) -> None: ...

    async def get(self, name: str) -> bytes: ...


def has_refs(data: bytes | bytearray | memoryview) -> bool:
    raw = bytes(data) if not isinstance(data, bytes) else data
    return any(m in raw for m in _MARKERS)


def _ref(bucket: str, name: str, data: bytes) -> PayloadRef:
    return PayloadRef(bucket=bucket, name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest())


async def offload(commit: Commit, limit: int, blobs: BlobStore, size_of: Callable[[Commit], int]) -> Commit:
    """`commit` with its largest tool outputs moved to `blobs` until `size_of(commit) <= limit`
    (or nothing is left to move: the caller then rejects it as too large)."""
    candidates: list[tuple[int, int, str, bytes]] = []
    for i, ev in enumerate(commit.events):
        if type(ev) is ToolCallCompleted and ev.result is not None and ev.result_ref is None:
            data = _enc.encode(ev.result)
            candidates.append((len(data), i, "result", data))
        elif (type(ev) is MessageAppended and ev.message.role == "tool" and ev.message.content
              and ev.message.content_ref is None):
            data = ev.message.content.encode()
            candidates.append((len(data), i, "content", data))
    candidates.sort(key=lambda c: (-c[0], c[1]))
    events = list(commit.events)
    out = commit
    for _size, i, field, data in candidates:
        if size_of(out) <= limit:
            break
        name = f"{commit.commit_id}.{i}.{field}"
        await blobs.put(name, data)
        ref = _ref(blobs.bucket, name, data)
        ev = events[i]
        if field == "result":
            events[i] = msgspec.structs.replace(ev, result=None, result_ref=ref)
        else:
            assert isinstance(ev, MessageAppended)  # a "content" candidate is a tool message
            msg = msgspec.structs.replace(ev.message, content="", content_ref=ref)
            events[i] = msgspec.structs.replace(ev, message=msg)
        out = msgspec.structs.replace(commit, events=list(events))
    return out


async def resolve(commit: Commit, get: Callable[[PayloadRef], Awaitable[bytes]]) -> Commit:
    """`commit` with every payload reference replaced by its value (checked against its digest)."""
    events: list[Any] = list(commit.events)
    changed = False
    for i, ev in enumerate(events):
        if type(ev) is ToolCallCompleted and ev.result_ref is not None:
            data = await _fetch(ev.result_ref, get)
            events[i] = msgspec.structs.replace(ev, result=_dec.decode(data), result_ref=None)
            changed = True
        elif type(ev) is MessageAppended and ev.message.content_ref is not None:
            data = await _fetch(ev.message.content_ref, get)
            msg = msgspec.structs.replace(ev.message, content=data.decode(), content_ref=None)
            events[i] = msgspec.structs.replace(ev, message=msg)
            changed = True
    return msgspec.structs.replace(commit, events=events) if changed else commit


async def _fetch(ref: PayloadRef, get: Callable[[PayloadRef], Awaitable[bytes]]) -> bytes:
    try:
        data = await get(ref)
    except PayloadMissing:
        raise
    except Exception as exc:  # noqa: BLE001 - any object store failure is one typed error
        raise PayloadMissing(f"payload {ref.bucket}/{ref.name} could not be read: {type(exc).__name__}: {exc}") from None
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise PayloadMissing(f"payload {ref.bucket}/{ref.name} does not match its reference (size or sha256)")
    return data


async def ensure_payload_bucket(js: Any, bucket: str = PAYLOAD_BUCKET, *, replicas: int | None = None) -> Any:
    """Create the object store bucket with `replicas` (default 1), or adopt an existing one and
    raise its replicas when more are asked for (never lowered: `agentlog.log.replicas`), as for
    the streams and KV buckets: a large tool output must survive the loss of a node like the
    commit that refers to it."""
    from nats.js.api import ObjectStoreConfig, StorageType
    from nats.js.errors import BadRequestError, NotFoundError

    try:
        await raise_replicas(js, f"OBJ_{bucket}", replicas)
    except NotFoundError:
        config = ObjectStoreConfig(bucket=bucket, storage=StorageType.FILE, replicas=replicas or 1)
        try:
            return await js.create_object_store(bucket, config=config)
        except BadRequestError:
            pass  # created by another process in between: adopt it
    return await js.object_store(bucket)


class ObjectStoreBlobs:
    """`BlobStore` on a JetStream Object Store bucket (created idempotently on first use)."""

    def __init__(self, nc: Any, bucket: str = PAYLOAD_BUCKET, *, replicas: int | None = None) -> None:
        self._nc = nc
        self.bucket = bucket
        #: For a new bucket (default 1), or to raise an existing one's (never lowered).
        self.replicas = replicas
        self._obs: Any = None

    async def _store(self) -> Any:
        if self._obs is None:
            self._obs = await ensure_payload_bucket(self._nc.jetstream(), self.bucket, replicas=self.replicas)
        return self._obs

    async def put(self, name: str, data: bytes) -> None:
        from nats.js.api import ObjectMeta, ObjectMetaOptions

        # chunks must fit the server's max payload (the library's default chunk is 128 KiB)
        chunk = max(1024, min(128 * 1024, self._nc.max_payload - 4096))
        meta = ObjectMeta(name=name, options=ObjectMetaOptions(max_chunk_size=chunk))
        await (await self._store()).put(name, data, meta=meta)

    async def get(self, name: str) -> bytes:
        res = await (await self._store()).get(name)
        return bytes(res.data or b"")

    async def get_ref(self, ref: PayloadRef) -> bytes:
        if ref.bucket != self.bucket:
            raise PayloadMissing(f"payload {ref.bucket}/{ref.name}: unknown bucket (this store uses {self.bucket!r})")
        return await self.get(ref.name)
