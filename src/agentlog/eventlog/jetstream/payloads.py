"""Large tool outputs stored by reference in the JetStream Object Store.

A commit must fit in one JetStream message (the server's max payload, 1 MB by default). A tool
can return more than that; rather than failing the commit (and with it the run), the store moves
the largest tool outputs of an oversized commit (`ToolCallCompleted.result` and the content of
the `tool` message that mirrors it) into the object store bucket `agentlog_payloads`, and the
event carries a `PayloadRef{bucket, name, size, sha256}` instead. Every read resolves the
references again, so projections, resume and verified replay see exactly the value the tool
returned. Only tool outputs move: an oversized user message or state is still `CommitTooLarge`.

Binary message parts (images, files: `ContentPart.data`, base64) over `INLINE_BINARY_LIMIT`
always move, whatever the commit's size (`offload_binaries`): a log of conversations with
pictures stays a log of small commits, and the bytes are stored once, raw, by digest-checked
reference (`data_ref`).

Object names are derived from the commit id and the event index, so a retried append rewrites
the same objects (idempotent), and the sha256 in the reference is checked on read.

The two transformations are pure functions over a commit (`offload`, `resolve`) with the object
I/O behind a two-method protocol, so they are unit-testable and the store stays the only edge.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client as NATS

from agentlog.eventlog.cancel import cancel_wins
from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import (
    Commit,
    ContentPart,
    MessageAppended,
    MessageQueued,
    PayloadRef,
    ToolCallCompleted,
)
from agentlog.eventlog.jetstream.replicas import placed, raise_replicas

__all__ = ["INLINE_BINARY_LIMIT", "PAYLOAD_BUCKET", "BlobStore", "ObjectStoreBlobs", "PayloadMissing", "has_refs",
           "offload", "offload_binaries", "resolve", "without_binaries"]

PAYLOAD_BUCKET = "agentlog_payloads"
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()
#: Cheap pre-check on the raw bytes of a commit: no reference field, nothing to resolve.
_MARKERS = (b'"result_ref"', b'"content_ref"', b'"data_ref"')
#: Base64 characters of a binary part above which it goes to the Object Store (about 12 KiB).
INLINE_BINARY_LIMIT = 16 * 1024


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


def _big_parts(commit: Commit, limit: int) -> list[tuple[int, int]]:
    """(event index, part index) of every inline binary part over `limit`."""
    return [(i, j) for i, ev in enumerate(commit.events) if isinstance(ev, (MessageAppended, MessageQueued)) and ev.message.parts
            for j, p in enumerate(ev.message.parts) if p.data is not None and len(p.data) > limit]


def _replace_parts(commit: Commit, new: dict[tuple[int, int], ContentPart]) -> Commit:
    events: list[Any] = list(commit.events)
    for i in sorted({i for i, _ in new}):
        ev = events[i]
        parts = [new.get((i, j), p) for j, p in enumerate(ev.message.parts)]
        events[i] = msgspec.structs.replace(ev, message=msgspec.structs.replace(ev.message, parts=parts))
    return msgspec.structs.replace(commit, events=events)


def _part(commit: Commit, i: int, j: int) -> ContentPart:
    ev = commit.events[i]
    assert isinstance(ev, (MessageAppended, MessageQueued)) and ev.message.parts is not None  # from _big_parts
    return ev.message.parts[j]


def _raw(part: ContentPart) -> bytes:
    try:
        return base64.b64decode(part.data or "", validate=True)
    except (binascii.Error, ValueError):
        return (part.data or "").encode()  # checked at admission; stored as given if not base64


async def offload_binaries(commit: Commit, blobs: BlobStore, limit: int = INLINE_BINARY_LIMIT) -> Commit:
    """`commit` with every binary message part over `limit` moved to `blobs` (the raw bytes,
    named after the commit, event and part: a retried append rewrites the same object)."""
    big = _big_parts(commit, limit)
    if not big:
        return commit
    new: dict[tuple[int, int], ContentPart] = {}
    for i, j in big:
        part = _part(commit, i, j)
        data, name = _raw(part), f"{commit.commit_id}.{i}.part{j}"
        await blobs.put(name, data)
        new[(i, j)] = msgspec.structs.replace(part, data=None, data_ref=_ref(blobs.bucket, name, data))
    return _replace_parts(commit, new)


def without_binaries(commit: Commit, limit: int = INLINE_BINARY_LIMIT) -> Commit:
    """`commit` as `offload_binaries` will shape it (placeholder references, no I/O): what a
    size check must measure."""
    placeholder = PayloadRef(bucket=PAYLOAD_BUCKET, name="0" * 40, size=0, sha256="0" * 64)
    new = {(i, j): msgspec.structs.replace(_part(commit, i, j), data=None, data_ref=placeholder)
           for i, j in _big_parts(commit, limit)}
    return _replace_parts(commit, new) if new else commit


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
        if isinstance(ev, (MessageAppended, MessageQueued)) and any(p.data_ref is not None for p in ev.message.parts or ()):
            ev = events[i]
            parts = []
            for p in ev.message.parts or ():
                if p.data_ref is not None:
                    raw = await _fetch(p.data_ref, get)
                    p = msgspec.structs.replace(p, data=base64.b64encode(raw).decode(), data_ref=None)
                parts.append(p)
            events[i] = msgspec.structs.replace(ev, message=msgspec.structs.replace(ev.message, parts=parts))
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
    raise its replicas when more are asked for (never lowered: `agentlog.eventlog.jetstream.replicas`), as for
    the streams and KV buckets: a large tool output must survive the loss of a node like the
    commit that refers to it."""
    from nats.js.api import ObjectStoreConfig, StorageType
    from nats.js.errors import BadRequestError, NotFoundError

    try:
        await raise_replicas(js, f"OBJ_{bucket}", replicas)
    except NotFoundError:
        config = ObjectStoreConfig(bucket=bucket, storage=StorageType.FILE, replicas=replicas or 1)
        try:
            return await placed(lambda: js.create_object_store(bucket, config=config), f"object store {bucket}")
        except BadRequestError:
            pass  # created by another process in between: adopt it
    return await js.object_store(bucket)


class ObjectStoreBlobs:
    """`BlobStore` on a JetStream Object Store bucket (created idempotently on first use)."""

    def __init__(self, nc: NATS, bucket: str = PAYLOAD_BUCKET, *, replicas: int | None = None) -> None:
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
        # read inside follows, which are stopped by a cancel: it must not be lost (agentlog.eventlog.cancel)
        res = await cancel_wins((await self._store()).get(name))
        return bytes(res.data or b"")

    async def get_ref(self, ref: PayloadRef) -> bytes:
        if ref.bucket != self.bucket:
            raise PayloadMissing(f"payload {ref.bucket}/{ref.name}: unknown bucket (this store uses {self.bucket!r})")
        return await self.get(ref.name)
