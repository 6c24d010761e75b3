"""Run-context snapshots: a cold resume that reads one small KV entry and the log's tail.

Folding a long run from the log costs time linear in its history: a run that went through 222
approval cycles folds ~1,100 commits on every decision. A snapshot is the loop's working context
(`loop.RunContext`, the model's messages included) and the run's projection view (`RunView`) as
of one commit seq. Resume = one KV get + the thread's commits after that seq, folded by the same
`loop.apply_event`, so `snapshot(prefix) + fold(rest) == fold(all)` (a property test proves it).

What grows with a run is immutable once written: its messages, and the views of its finished
calls. Those go into **chunks** (`chunk_spans`: aligned spans of `CHUNK_SIZE * CHUNK_FANOUT**k`
items that only ever merge, each cut further to stay under `CHUNK_MAX_BYTES`), content-addressed
(by a digest of the bytes) and written once, under one key prefix per kind: the thread's
messages, the run's calls (`chunk_key`). The run's entry holds only the mutable rest (the
context without the chunked messages, the view without the chunked calls) and the chunks'
digests. A resume on a process that holds none of the thread's chunks reads the entry and every
chunk under those two prefixes in one batched get (`read_entry`: `get_with_prefixes`, subject
wildcards: it need not know the digests first), then the log's tail, checking and decoding the
chunks while the tail's read is out. A process that saw the thread reads the entry alone and
takes the chunks from its LRU (`ChunkCache`: decoded values, keyed by digest), fetching any it
lacks alongside the tail. A writer purges the chunks of the snapshot it replaces that the new
one no longer names (spans merged into a larger one), so the prefixes hold what the entry names.

The snapshot is a derived cache and never a source of truth:
- it is written only from a context that is exactly the fold of the thread up to `seq` (the
  loop's own, after the run suspended or finished, nothing staged, all messages loaded);
- a missing, undecodable, other-version or other-thread entry, or a chunk that is missing or
  whose bytes do not match its digest, is a miss, and the caller folds the log instead; a
  snapshot the log contradicts (the thread moved under a stale entry) shows up as an OCC conflict
  at the first append, and the retry folds the log without it;
- a failed write is logged and forgotten (the next suspension writes again); chunks are written
  before the entry that names them, so an entry never names a chunk that was not stored, and
  purged only after an entry that no longer names them is stored.

I/O stays behind `SnapshotStore` (KV for real, a dict for unit tests); splitting and joining
are pure (`make_snapshot`, `assemble`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from agentlog.eventlog.events import Message
from agentlog.projections.kv import ensure_bucket, jetstream_of, kv_get
from agentlog.projections.views import TERMINAL_CALL_STATUSES, CallView, RunView
from agentlog.runtime.loop.driver import RunContext, get_logger

#: Bumped when the meaning of a snapshot changes (e.g. `apply_event` folds something new):
#: older entries are then misses. A change of shape needs no bump: see `schema`.
#: 2: messages and finished calls moved into chunks (a version-1 reader would take the entry's
#: few messages for the whole conversation, so it must miss).
#: 3: chunk keys by kind (`chunk_key`), so a cold read gets the entry and its chunks at once.
SNAPSHOT_FORMAT = 3
SNAPSHOT_BUCKET = "snapshots"

_log = get_logger("agentlog.snapshot")


#: Items (messages, or finished call views) per chunk. Small enough that the unchunked rest of a
#: run stays a few KB (under 16 messages and 16 call views), large enough that a long run names
#: few chunks (see `chunk_spans`: 446 messages and 221 finished calls: 10).
CHUNK_SIZE = 16
#: How many chunks of one size make one of the next (`chunk_spans`), and the largest chunk (in
#: items).
CHUNK_FANOUT = 4
CHUNK_MAX = CHUNK_SIZE * CHUNK_FANOUT**2
#: The most bytes of a chunk (a span of long messages is cut into several, see `_pieces`) and of
#: the entry (see `make_snapshot`): well under the server's max payload (1 MB by default), which
#: a KV value cannot exceed.
CHUNK_MAX_BYTES = 256 * 1024


class RunSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The stored entry of a run as of commit `seq` of its thread: the loop context and the run
    view, minus what sits in chunks.

    `ctx.messages` holds only the messages after those of `message_chunks` (digests, in order,
    of the spans `chunk_spans` gives); `run` (kept encoded until `LoadedSnapshot.tail_view` asks for it)
    holds only the calls after those of `call_chunks` (the longest prefix of finished calls, in
    the view's order, chunked the same way). `call_ids`: the calls of the run that are not in
    `call_chunks` (with those, what a decision may name, for `decide`'s checks)."""

    v: int = SNAPSHOT_FORMAT
    #: Fingerprint of the shapes of `RunContext` and `RunView` (with everything they hold) that
    #: wrote it: an entry written by code with other shapes is a miss, never a decode error later.
    schema: str = ""
    seq: int
    agent_id: str
    ctx: RunContext
    message_chunks: list[str] = []
    call_ids: list[str]
    run: msgspec.Raw
    call_chunks: list[str] = []

    @property
    def chunks(self) -> list[str]:
        return [*self.message_chunks, *self.call_chunks]


#: A chunk's content as `fetch_chunks` hands it over: decoded items (from the process's cache), or
#: the bytes read from the store, already checked against their digest and decoded when first
#: needed (`LoadedSnapshot`).
ChunkValue = tuple[Any, ...] | bytes


class LoadedSnapshot:
    """A snapshot joined with its chunks: the whole context (every message) and the run view.

    The view comes in two parts, so that a resume never decodes what it does not use:
    `tail_view()` (the run's fields and its calls after the chunked ones: a few, however long
    the run) and `finished_calls()` (the views of the chunked finished calls, decoded from their
    chunks when first asked for). A resumed run's handle folds on the tail and reads the
    finished calls only when someone asks for the whole view (`run_view()`): the loop never
    needs them, nor does a worker that only wants the run's status. `call_ids`: the run's calls
    (the chunked ones read from the chunks' bytes without decoding the views). `chunks`: the
    chunks known to be in the store (digest -> key): those it names and those a cold read saw
    beside them; the run's next snapshot does not write them again, and purges those it does
    not name.

    Every chunk's bytes were checked against its digest before this was built (a mismatch is a
    miss, never something found later); decoding checked bytes cannot fail short of a bug."""

    __slots__ = ("_cache", "_call_ids", "_calls", "_finished", "_run", "_tail", "agent_id", "chunks", "ctx", "seq")

    def __init__(self, entry: RunSnapshot, values: Mapping[str, ChunkValue], cache: ChunkCache | None = None,
                 seen: Iterable[str] = ()) -> None:
        self.seq = entry.seq
        self.agent_id = entry.agent_id
        named = chunk_keys(entry)
        # Chunks under the entry's prefixes that it does not name (seen by a cold read): left by
        # a writer that did not know them (a run's first snapshot in a thread whose earlier runs
        # merged spans of its messages; a write cut short). They are in the store too, so the
        # run's next snapshot does not write them again, and purges those it does not name.
        self.chunks = {key.rsplit(".", 1)[1]: key for key in seen} | named
        self._cache = CHUNKS if cache is None else cache
        self._calls: list[tuple[str, ChunkValue]] = [(d, values[d]) for d in entry.call_chunks]
        self._call_ids = entry.call_ids
        self._run = entry.run
        self._tail: RunView | None = None
        self._finished: dict[str, CallView] | None = None
        ctx = entry.ctx
        if entry.message_chunks:
            with _gc_paused():
                older = [self._decoded(_MESSAGES, d, values[d]) for d in entry.message_chunks]
            ctx.messages = list(itertools.chain(*older, ctx.messages))
        self.ctx = ctx

    @property
    def call_ids(self) -> list[str]:
        out: list[str] = []
        for _d, value in self._calls:
            if isinstance(value, bytes):
                out.extend(call_id for call_id, _ in _call_ids_decoder.decode(value))
            else:
                out.extend(call_id for call_id, _ in value)
        return out + self._call_ids

    @property
    def has_finished_calls(self) -> bool:
        """Whether some finished calls are kept in chunks (out of `tail_view()`)."""
        return bool(self._calls)

    def tail_view(self) -> RunView:
        """The run view without the calls of `finished_calls()` (all finished: they never count
        towards its status)."""
        if self._tail is None:
            with _gc_paused():
                self._tail = _view_decoder.decode(self._run)
        return self._tail

    def finished_calls(self) -> dict[str, CallView]:
        """The views of the chunked finished calls, in the view's order (before every call of
        `tail_view()`), decoded from their chunks at the first call."""
        if self._finished is None:
            with _gc_paused():
                decoded = [(d, self._decoded(_CALLS, d, v)) for d, v in self._calls]
            self._calls = list(decoded)
            self._finished = dict(itertools.chain.from_iterable(v for _, v in decoded))
        return self._finished

    def run_view(self) -> RunView:
        """The whole run view: `finished_calls()` joined with `tail_view()`."""
        return with_finished_calls(self.tail_view(), self.finished_calls() if self._calls else {})

    def _decoded(self, kind: bytes, digest: str, value: ChunkValue) -> tuple[Any, ...]:
        """The items of a chunk: `value` itself, or its checked bytes decoded (then cached)."""
        if not isinstance(value, bytes):
            return value
        items = tuple(_chunk_decoders[kind].decode(value))
        self._cache.put(digest, items, len(value))
        return items


class ChunkCache:
    """Per-process LRU of decoded chunks, keyed by digest (content: a hit is always right).

    A chunk's value is a tuple (messages, or `(call_id, CallView)` pairs) shared by every context
    built from it: nothing mutates them (frozen structs; `ctx.messages` is a new list). `digest_of`
    finds the digest of a run of items that are the very objects of a cached chunk (what a loop
    resumed from a snapshot still holds), so a writer does not encode them again."""

    def __init__(self, capacity: int = 64 * 1024 * 1024) -> None:
        #: Encoded bytes of the chunks held, at most (the decoded objects take a few times that).
        self.capacity = capacity
        self.size = 0
        self._values: OrderedDict[str, tuple[Any, ...]] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._ident: dict[tuple[int, int], str] = {}
        #: How spans too large for one chunk were cut (`_pieces`), by the identity of their first
        #: and last items, which the record holds (so no other object can take their ids).
        self._splits: OrderedDict[tuple[int, int, int], tuple[Any, Any, list[int]]] = OrderedDict()
        #: Threads whose chunks this process read or wrote, most recent last (`saw_thread`).
        self._threads: OrderedDict[str, None] = OrderedDict()

    def get(self, digest: str) -> tuple[Any, ...] | None:
        value = self._values.get(digest)
        if value is not None:
            self._values.move_to_end(digest)
        return value

    def put(self, digest: str, value: tuple[Any, ...], size: int) -> None:
        """Keep `value` (whose encoding is `size` bytes) under `digest`, evicting the least
        recently used chunks past `capacity`."""
        if digest in self._values:
            self._values.move_to_end(digest)
            return
        self._values[digest] = value
        self._sizes[digest] = size
        self._ident[(id(value[0]), id(value[-1]))] = digest
        self.size += size
        while self.size > self.capacity and len(self._values) > 1:
            old_digest, old = self._values.popitem(last=False)
            self.size -= self._sizes.pop(old_digest)
            key = (id(old[0]), id(old[-1]))
            if self._ident.get(key) == old_digest:
                del self._ident[key]

    def digest_of(self, items: list[Any]) -> str | None:
        digest = self._ident.get((id(items[0]), id(items[-1])))
        value = self._values.get(digest) if digest is not None else None
        if value is None or len(value) != len(items) or any(a is not b for a, b in zip(value, items, strict=True)):
            return None
        return digest

    def split_of(self, items: list[Any]) -> list[int] | None:
        """The lengths of the pieces `items` (the very objects) were cut into, if remembered."""
        record = self._splits.get((id(items[0]), id(items[-1]), len(items)))
        return None if record is None else record[2]

    def remember_split(self, items: list[Any], lengths: list[int]) -> None:
        self._splits[(id(items[0]), id(items[-1]), len(items))] = (items[0], items[-1], lengths)
        while len(self._splits) > _SPLITS_KEPT:
            self._splits.popitem(last=False)

    def note_thread(self, thread_id: str) -> None:
        self._threads[thread_id] = None
        self._threads.move_to_end(thread_id)
        while len(self._threads) > _THREADS_KEPT:
            self._threads.popitem(last=False)

    def saw_thread(self, thread_id: str) -> bool:
        """Whether this process read or wrote chunks of `thread_id` lately: then it likely holds
        them (a resume reads the entry alone, then only the chunks it lacks); else it reads
        every chunk under the thread with the entry (`read_entry`)."""
        return thread_id in self._threads

    def clear(self) -> None:
        self._values.clear()
        self._sizes.clear()
        self._ident.clear()
        self._splits.clear()
        self._threads.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._values)


#: How many cuts of large spans a `ChunkCache` remembers (a few per long run of long messages).
_SPLITS_KEPT = 4096
#: How many threads a `ChunkCache` remembers having seen chunks of.
_THREADS_KEPT = 65536

#: The process's chunk cache (the default of `load_snapshot` and `make_snapshot`).
CHUNKS = ChunkCache()

_MESSAGES, _CALLS = b"m", b"c"


def _digest(kind: bytes, data: bytes) -> str:
    """Content address of a chunk: its kind, the shapes that wrote it, its bytes."""
    h = hashlib.sha256(kind + SCHEMA.encode())
    h.update(data)  # not concatenated: a long run's chunks are ~130 KB
    return h.hexdigest()[:32]


def chunk_key(thread_id: str, digest: str, run_id: str | None = None) -> str:
    """Store key of a chunk, by digest, under its thread (so a thread's chunks go with it):
    a message chunk under the thread's messages (`c.<thread>.m.`: a thread's runs share its
    conversation, so its chunks), a call chunk (`run_id` given) under its run's calls
    (`c.<thread>.c.<run>.`). One prefix per kind is what lets a cold read fetch all of a run's
    chunks with its entry, by subject wildcard, before it knows their digests."""
    prefix = message_chunks_prefix(thread_id) if run_id is None else call_chunks_prefix(thread_id, run_id)
    return prefix + digest


def message_chunks_prefix(thread_id: str) -> str:
    """The keys of a thread's message chunks start with this (then one token: the digest)."""
    return f"c.{thread_id}.m."


def call_chunks_prefix(thread_id: str, run_id: str) -> str:
    """The keys of a run's call chunks start with this (then one token: the digest)."""
    return f"c.{thread_id}.c.{run_id}."


def chunk_keys(entry: RunSnapshot) -> dict[str, str]:
    """digest -> store key of every chunk `entry` names."""
    thread, run = entry.ctx.thread_id, entry.ctx.run_id
    keys = {d: chunk_key(thread, d) for d in entry.message_chunks}
    keys.update((d, chunk_key(thread, d, run)) for d in entry.call_chunks)
    return keys


def chunk_spans(n: int, chunk_size: int = CHUNK_SIZE, fanout: int = CHUNK_FANOUT,
                max_size: int = CHUNK_MAX) -> list[tuple[int, int]]:
    """The chunks of the first `n` items: `[start, end)` spans of `chunk_size * fanout**k` items
    (at most `max_size`), largest first, each aligned to its size, at most `fanout - 1` of each
    size below the largest; the items past the last full `chunk_size` are left out (the entry
    holds them).

    As `n` grows, a span never changes: `fanout` spans of one size are replaced by the one span
    of the next size that covers them (written once, then never again). So a run names
    O(log n) chunks (446 messages in 16s: 6; a cold resume fetches that many), and every item
    is rewritten O(log n) times over the run's life."""
    spans: list[tuple[int, int]] = []
    size = chunk_size
    while size * fanout <= min(n, max_size):
        size *= fanout
    start = 0
    while size >= chunk_size:
        while start + size <= n:
            spans.append((start, start + size))
            start += size
        size //= fanout
    return spans


def _split(kind: bytes, items: list[Any], spans: list[tuple[int, int]], cache: ChunkCache,
           known: Collection[str], out: dict[str, bytes], max_bytes: int) -> list[str]:
    """Digests of the chunks of `items` over `spans`: one chunk per span, or several when its
    encoding is over `max_bytes` (`_pieces`). The encoding of each chunk not in `known` goes
    into `out` (to be written); a chunk the cache holds (same objects) is not encoded again
    unless it has to be written."""
    digests: list[str] = []
    for start, end in spans:
        for piece, data in _pieces(items[start:end], cache, max_bytes):
            digest = cache.digest_of(piece)
            if digest is None:
                data = _encoder.encode(piece) if data is None else data
                digest = _digest(kind, data)
                cache.put(digest, tuple(piece), len(data))
                if digest not in known:
                    out[digest] = data
            elif digest not in known:
                out[digest] = _encoder.encode(piece) if data is None else data
            digests.append(digest)
    return digests


def _pieces(part: list[Any], cache: ChunkCache, max_bytes: int) -> list[tuple[list[Any], bytes | None]]:
    """`part` as one chunk, or, when its encoding is over `max_bytes`, cut into runs of items
    that each encode within it (an item over it alone is a chunk of its own: it came in one
    commit, so it fits a KV value). A KV value cannot exceed the server's max payload: a chunk
    of long messages cut by count alone failed to be written. Each piece comes with its
    encoding when that was made here (else None). The cut is greedy over the items' sizes, so
    the same items are always cut the same way (written once, like the spans)."""
    if cache.digest_of(part) is not None:  # stored whole before: it fits
        return [(part, None)]
    lengths = cache.split_of(part)
    if lengths is None:
        data = _encoder.encode(part)
        if len(data) <= max_bytes:
            return [(part, data)]
        lengths = []
        size = 0
        for item in part:
            item_size = len(_encoder.encode(item))
            if lengths and size + item_size <= max_bytes - _ARRAY_HEADER:
                lengths[-1] += 1
                size += item_size
            else:
                lengths.append(1)
                size = item_size
        cache.remember_split(part, lengths)
    pieces: list[tuple[list[Any], bytes | None]] = []
    start = 0
    for n in lengths:
        pieces.append((part[start : start + n], None))
        start += n
    return pieces


#: Most bytes a msgpack array header takes (what a piece adds to its items' encodings).
_ARRAY_HEADER = 5


def make_snapshot(
    *, seq: int, agent_id: str, ctx: RunContext, run: RunView, known: Collection[str] = frozenset(),
    chunk_size: int = CHUNK_SIZE, cache: ChunkCache | None = None, max_bytes: int = CHUNK_MAX_BYTES,
) -> tuple[RunSnapshot, dict[str, bytes]]:
    """Split the context and view as of `seq` into the run's entry and its chunks; returns the
    entry and the encoded chunks that are not in `known` (digest -> bytes). Pure (the cache
    only saves work).

    The chunks cover the `chunk_spans` of the messages and of the longest prefix of finished
    calls, each cut to at most `max_bytes` (`_pieces`). The entry holds the rest, unless that
    makes it larger than `max_bytes` (a few long messages): then the rest of the messages and of
    the finished calls goes into chunks too (written again while it grows, as the entry is)."""
    cache = CHUNKS if cache is None else cache
    cache.note_thread(ctx.thread_id)
    new: dict[str, bytes] = {}
    messages = ctx.messages
    items = list(run.calls.items())
    finished = next((i for i, (_, c) in enumerate(items) if c.status not in TERMINAL_CALL_STATUSES), len(items))
    message_spans, call_spans = chunk_spans(len(messages), chunk_size), chunk_spans(finished, chunk_size)
    while True:
        chunked = message_spans[-1][1] if message_spans else 0
        covered = call_spans[-1][1] if call_spans else 0
        tail_run = msgspec.structs.replace(run, calls=dict(items[covered:])) if covered else run
        calls = [call_id for call_id, _ in items[covered:]]
        calls += [c.id for c in ctx.step_tool_calls if c.id not in run.calls]
        entry = RunSnapshot(
            schema=SCHEMA, seq=seq, agent_id=agent_id,
            ctx=dataclasses.replace(ctx, messages=messages[chunked:]),
            message_chunks=_split(_MESSAGES, messages, message_spans, cache, known, new, max_bytes),
            call_ids=calls, run=msgspec.Raw(_encoder.encode(tail_run)),
            call_chunks=_split(_CALLS, items, call_spans, cache, known, new, max_bytes),
        )
        if (chunked == len(messages) and covered == finished) or len(encode_snapshot(entry)) <= max_bytes:
            return entry, new
        # too large with its rest: that goes into chunks as well (the loop runs twice at most)
        if chunked < len(messages):
            message_spans = [*message_spans, (chunked, len(messages))]
        if covered < finished:
            call_spans = [*call_spans, (covered, finished)]


def with_finished_calls(tail: RunView, finished: Mapping[str, CallView]) -> RunView:
    """`tail` with the finished calls kept apart from it put back in front, as the fold orders
    them (created first). A call in both is `tail`'s: an event after the snapshot moved it into
    the tail (`RunFolder`'s lookup), where it kept its place."""
    if not finished:
        return tail
    return msgspec.structs.replace(tail, calls={**finished, **tail.calls})


def chunk_matches(kind: bytes, digest: str, data: bytes) -> bool:
    """Whether `data` are the bytes `digest` names (a chunk of `kind` written by these shapes)."""
    return _digest(kind, data) == digest


def decode_chunk(kind: bytes, digest: str, data: bytes) -> tuple[Any, ...] | None:
    """The items of a chunk read from the store, or None if its bytes are not what `digest`
    names (or do not decode): a miss."""
    if not chunk_matches(kind, digest, data):
        return None
    try:
        with _gc_paused():
            return tuple(_chunk_decoders[kind].decode(data))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def assemble(entry: RunSnapshot, values: Mapping[str, ChunkValue], cache: ChunkCache | None = None,
             seen: Iterable[str] = ()) -> LoadedSnapshot:
    """Join an entry with its chunks' values (every digest it names; bytes already checked):
    the whole context and a lazily decoded run view (`LoadedSnapshot`). `seen`: the chunk keys
    read along with the entry (`read_entry`), named by it or not."""
    return LoadedSnapshot(entry, values, cache, seen)


#: MessagePack: a quarter smaller than JSON for a long run's context (the read is on the resume
#: path), same decode speed.
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunSnapshot)
_view_decoder = msgspec.msgpack.Decoder(RunView)
#: The call ids of a call chunk, the views left undecoded (what `decide` checks decisions against).
_call_ids_decoder = msgspec.msgpack.Decoder(list[tuple[str, msgspec.Raw]])
_chunk_decoders: dict[bytes, msgspec.msgpack.Decoder[Any]] = {
    _MESSAGES: msgspec.msgpack.Decoder(list[Message]),
    _CALLS: msgspec.msgpack.Decoder(list[tuple[str, CallView]]),
}
SCHEMA = hashlib.sha256(
    msgspec.json.encode(msgspec.json.schema_components((RunContext, RunView)), order="sorted")
).hexdigest()[:16]


def encode_snapshot(snap: RunSnapshot) -> bytes:
    return _encoder.encode(snap)


def decode_snapshot(data: bytes) -> RunSnapshot | None:
    """The entry in `data`, or None when it cannot be used (corrupt, other format): a miss."""
    try:
        with _gc_paused():
            snap = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return snap if snap.v == SNAPSHOT_FORMAT and snap.schema == SCHEMA else None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding a long run's snapshot allocates thousands of tracked objects at once: every
    allocation threshold crossed mid-decode runs a collection, and now and then a full one over
    the whole heap (measured over 40 cold resumes of a 222-cycle run: decode 11 ms per resume
    on average with collections running inside it, 0.6 ms without). Paused, the objects are
    collected once afterwards at the usual thresholds."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SnapshotStore(Protocol):
    """Where snapshots live: each run's entry under its run id (ids are unique across threads),
    each chunk under `chunk_key`."""

    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of `keys`, in order (None for a key that has none)."""
        ...

    async def get_with_prefixes(self, key: str, prefixes: Sequence[str]) -> tuple[bytes | None, dict[str, bytes]]:
        """The value of `key` and, read with it (one round trip), the values of the keys that
        start with one of `prefixes` (key -> value; maybe not all of them, should there be very
        many: the reader gets the others it needs by `get_many`)."""
        ...

    async def put(self, key: str, data: bytes) -> None: ...

    async def purge(self, keys: Sequence[str]) -> None:
        """Remove `keys` (chunks no entry names any more)."""
        ...

    async def delete_thread(self, thread_id: str, run_ids: Sequence[str]) -> None:
        """Remove the entries of `run_ids` and every chunk of `thread_id`."""
        ...


class MemorySnapshotStore:
    """`SnapshotStore` in a dict (unit tests)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        return self.entries.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.entries.get(key) for key in keys]

    async def get_with_prefixes(self, key: str, prefixes: Sequence[str]) -> tuple[bytes | None, dict[str, bytes]]:
        under = {k: v for k, v in self.entries.items() if any(k.startswith(p) for p in prefixes)}
        return self.entries.get(key), under

    async def put(self, key: str, data: bytes) -> None:
        self.entries[key] = data

    async def purge(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.entries.pop(key, None)

    async def delete_thread(self, thread_id: str, run_ids: Sequence[str]) -> None:
        chunks = f"c.{thread_id}."
        for key in [k for k in self.entries if k in run_ids or k.startswith(chunks)]:
            del self.entries[key]


class KVSnapshotStore:
    """`SnapshotStore` on JetStream KV bucket `<prefix>_snapshots` (history 1, created
    idempotently like the view buckets). Build with `await KVSnapshotStore.open(nc)`, or
    `KVSnapshotStore.lazy(nc)` where nothing can be awaited (the bucket is then opened at the
    first get or put)."""

    def __init__(self, kv: object | None, *, opener: Callable[[], Awaitable[object]] | None = None,
                 js: JetStreamContext | None = None, bucket: str = f"agentlog_{SNAPSHOT_BUCKET}") -> None:
        self.kv = kv
        self._opener = opener
        self._lock = asyncio.Lock()
        self._js = js
        self.bucket = bucket
        #: Request timeout (seconds) of `get_many`'s batched Direct Get, and the most bytes the
        #: server sends for one (a batch cut short there: the rest are read one by one).
        self.timeout = 5.0
        self.read_max_bytes = 8 * 1024 * 1024
        # One wildcard reply subscription for every `get_many` (token -> its replies), opened at
        # the first one: a per-request subscription would cost a SUB and an UNSUB each.
        self._reply_prefix = ""
        self._replies: dict[str, _Batch] = {}
        self._next_token = 0

    @classmethod
    async def open(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog", replicas: int | None = None) -> KVSnapshotStore:
        return cls(await _open_bucket(nc, prefix, replicas), js=jetstream_of(nc), bucket=f"{prefix}_{SNAPSHOT_BUCKET}")

    @classmethod
    def lazy(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog", replicas: int | None = None) -> KVSnapshotStore:
        return cls(None, opener=lambda: _open_bucket(nc, prefix, replicas), js=jetstream_of(nc),
                   bucket=f"{prefix}_{SNAPSHOT_BUCKET}")

    async def _kv(self) -> Any:
        if self.kv is None:
            async with self._lock:
                if self.kv is None:
                    self.kv = await self._opener()  # type: ignore[misc]
        return self.kv

    async def get(self, key: str) -> bytes | None:
        return await kv_get(await self._kv(), key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of `keys` in one batched Direct Get (`multi_last`: the last message of each
        key's subject, then an end-of-batch status) instead of one request per key: what a cold
        resume fetches its chunks with (measured, the 10 chunks of a 222-cycle run: 0.47 ms vs
        0.72 ms for 10 concurrent gets). Keys the server did not send because the batch was cut
        short (`read_max_bytes`) are read one by one."""
        if len(keys) <= 1 or self._js is None:
            return list(await asyncio.gather(*(self.get(key) for key in keys)))
        await self._kv()
        pre = f"$KV.{self.bucket}."
        found: dict[str, bytes] = {}
        cut = False
        for i in range(0, len(keys), _MULTI_LAST_MAX):
            group = keys[i : i + _MULTI_LAST_MAX]
            try:
                batch = await self._multi_last([pre + key for key in group])
            except _Refused as exc:  # e.g. a server without multi_last (before 2.11): one by one
                _log.info("snapshot.multi_get_refused", error=str(exc))
                return list(await asyncio.gather(*(self.get(key) for key in keys)))
            found.update(batch.values)
            cut = cut or batch.more
        out: list[bytes | None] = [found.get(pre + key) for key in keys]
        if cut:  # a batch cut short at read_max_bytes: the rest one by one
            rest = [i for i, value in enumerate(out) if value is None]
            for i, value in zip(rest, await asyncio.gather(*(self.get(keys[i]) for i in rest)), strict=True):
                out[i] = value
        return out

    async def _multi_last(self, subjects: list[str], limit: int | None = None) -> _Batch:
        js: Any = self._js
        nc = js._nc  # nats-py keeps the connection and the API prefix of a JetStreamContext here
        if not self._reply_prefix:
            async with self._lock:
                if not self._reply_prefix:
                    prefix = f"{nc.new_inbox()}."
                    await nc.subscribe(f"{prefix}*", cb=self._on_reply)
                    self._reply_prefix = prefix
        self._next_token += 1
        token = str(self._next_token)
        batch = self._replies[token] = _Batch()
        request = msgspec.json.encode({"multi_last": subjects, "batch": limit or len(subjects),
                                       "max_bytes": self.read_max_bytes})
        try:
            await nc.publish(f"{js._prefix}.DIRECT.GET.KV_{self.bucket}", request, reply=self._reply_prefix + token)
            async with asyncio.timeout(self.timeout):
                await batch.done
        finally:
            del self._replies[token]
        return batch

    async def _on_reply(self, msg: Any) -> None:
        batch = self._replies.get(msg.subject[len(self._reply_prefix) :])
        if batch is None or batch.done.done():
            return
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is None:
            subject = headers.get("Nats-Subject")
            if subject is not None and "KV-Operation" not in headers:  # a value, not a delete or purge marker
                batch.values[subject] = msg.data
            return
        if status == "204":  # end of batch; pending > 0: cut short
            batch.more = headers.get("Nats-Num-Pending", "0") != "0"
            batch.done.set_result(None)
        elif status == "404":  # none of the keys has a value
            batch.done.set_result(None)
        else:
            batch.done.set_exception(_Refused(f"batched direct get answered status {status} "
                                              f"{headers.get('Description', '')}".strip()))

    async def get_with_prefixes(self, key: str, prefixes: Sequence[str]) -> tuple[bytes | None, dict[str, bytes]]:
        """One batched Direct Get: `key`'s subject and a one-token wildcard per prefix (keys
        under a prefix have one more token: a digest). Measured here, a cold read of a 222-cycle
        run's entry and its 6 message chunks: 0.48 ms, against 0.82 ms for the entry's get and
        then the chunks' batch."""
        if self._js is None:
            return await self.get(key), {}
        await self._kv()
        pre = f"$KV.{self.bucket}."
        try:
            batch = await self._multi_last([pre + key, *(f"{pre}{p}*" for p in prefixes)], limit=_WILDCARD_BATCH)
        except _Refused as exc:  # e.g. a server without multi_last (before 2.11)
            _log.info("snapshot.multi_get_refused", error=str(exc))
            return await self.get(key), {}
        value = batch.values.pop(pre + key, None)
        if value is None and batch.more:  # cut short before the entry: read it alone
            value = await self.get(key)
        return value, {subject[len(pre) :]: data for subject, data in batch.values.items()}

    async def put(self, key: str, data: bytes) -> None:
        await (await self._kv()).put(key, data)

    async def purge(self, keys: Sequence[str]) -> None:
        """Purge the keys' messages from the bucket's stream: no delete markers left behind
        for a wildcard read to return."""
        if not keys:
            return
        await self._kv()
        assert self._js is not None, "purge needs KVSnapshotStore.open/lazy"
        stream, pre = f"KV_{self.bucket}", f"$KV.{self.bucket}."
        await asyncio.gather(*(self._js.purge_stream(stream, subject=pre + key) for key in keys))

    async def delete_thread(self, thread_id: str, run_ids: Sequence[str]) -> None:
        """Purge the keys' messages from the bucket's stream (no delete markers left behind):
        one purge per run entry, one for all of the thread's chunks (a subject wildcard)."""
        await self._kv()
        assert self._js is not None, "delete_thread needs KVSnapshotStore.open/lazy"
        stream, pre = f"KV_{self.bucket}", f"$KV.{self.bucket}."
        subjects = [f"{pre}c.{thread_id}.>", *(pre + r for r in run_ids)]
        await asyncio.gather(*(self._js.purge_stream(stream, subject=subj) for subj in subjects))


#: Keys per batched Direct Get (the server caps the subjects of one `multi_last`).
_MULTI_LAST_MAX = 256
#: The most values one wildcard read returns (`get_with_prefixes`; a run names a few dozen
#: chunks at most, see `chunk_spans`).
_WILDCARD_BATCH = 1024


class _Refused(Exception):
    """The server answered a batched Direct Get with an error status."""


class _Batch:
    """The replies of one `multi_last` Direct Get: subject -> value, until the end of batch."""

    __slots__ = ("done", "more", "values")

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.values: dict[str, bytes] = {}
        self.more = False


async def _open_bucket(nc: NATS | JetStreamContext, prefix: str, replicas: int | None) -> object:
    return await ensure_bucket(jetstream_of(nc), f"{prefix}_{SNAPSHOT_BUCKET}", replicas=replicas,
                               description="agentlog run-context snapshots (a cache of the log)")


async def read_entry(store: SnapshotStore, run_id: str, thread_id: str | None,
                     cache: ChunkCache | None = None) -> tuple[RunSnapshot, dict[str, bytes]] | None:
    """The run's entry, or None on a miss (absent, unusable, another thread's, or the store
    failing), with what was read along with it: on a cold read (the thread known, and this
    process holding none of its chunks lately: `ChunkCache.saw_thread`), the values under the
    thread's message chunks and the run's call chunks (key -> bytes), in the same round trip
    (`get_with_prefixes`), so that a resume waits for one read before the tail, not two; else
    nothing (the entry alone: the chunks are likely cached). `load_chunks` joins them."""
    cache = CHUNKS if cache is None else cache
    prefetched: dict[str, bytes] = {}
    try:
        if thread_id is not None and not cache.saw_thread(thread_id):
            data, prefetched = await store.get_with_prefixes(
                run_id, [message_chunks_prefix(thread_id), call_chunks_prefix(thread_id, run_id)])
        else:
            data = await store.get(run_id)
    except Exception as exc:  # noqa: BLE001 - a cache that cannot answer is a miss
        _log.warning("snapshot.get_failed", run_id=run_id, error=str(exc))
        return None
    if data is None:
        return None
    entry = decode_snapshot(data)
    if entry is None or entry.ctx.run_id != run_id or (thread_id is not None and entry.ctx.thread_id != thread_id):
        _log.info("snapshot.unusable", run_id=run_id, thread_id=thread_id)
        return None
    return entry, prefetched


async def fetch_chunks(store: SnapshotStore, entry: RunSnapshot, cache: ChunkCache | None = None,
                       prefetched: Mapping[str, bytes] | None = None) -> dict[str, ChunkValue] | None:
    """The values of `entry`'s chunks (digest -> value): decoded ones from `cache`, the others'
    bytes from `prefetched` (what `read_entry` read along with the entry) or fetched in one
    `get_many`, checked against their digests but not decoded (see `ChunkValue`); None on a miss
    (a chunk missing or not matching its digest, the store failing)."""
    cache = CHUNKS if cache is None else cache
    prefetched = prefetched or {}
    keys = chunk_keys(entry)
    values: dict[str, ChunkValue] = {}
    wanted = [(kind, d) for kind, ds in ((_MESSAGES, entry.message_chunks), (_CALLS, entry.call_chunks)) for d in ds]
    run_id, thread = entry.ctx.run_id, entry.ctx.thread_id
    raws: dict[tuple[bytes, str], bytes | None] = {}
    for kind, digest in wanted:
        value = cache.get(digest)
        if value is None:
            raws[(kind, digest)] = prefetched.get(keys[digest])
        else:
            values[digest] = value
    missing = [chunk for chunk, raw in raws.items() if raw is None]
    if missing:
        try:
            raws.update(zip(missing, await store.get_many([keys[d] for _, d in missing]), strict=True))
        except Exception as exc:  # noqa: BLE001
            _log.warning("snapshot.chunk_get_failed", run_id=run_id, thread_id=thread, error=str(exc))
            return None
    for (kind, digest), raw in raws.items():
        if raw is None or not chunk_matches(kind, digest, raw):
            _log.info("snapshot.chunk_unusable", run_id=run_id, thread_id=thread, chunk=digest)
            return None
        values[digest] = bytes(raw)
    cache.note_thread(thread)
    return values


async def load_chunks(store: SnapshotStore, entry: RunSnapshot, cache: ChunkCache | None = None,
                      prefetched: Mapping[str, bytes] | None = None) -> LoadedSnapshot | None:
    """`entry` joined with its chunks (`fetch_chunks`, `assemble`); None on a miss."""
    values = await fetch_chunks(store, entry, cache, prefetched)
    if values is None:
        return None
    try:
        return assemble(entry, values, cache, prefetched or ())
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # checked bytes: only a bug gets here
        _log.warning("snapshot.chunk_undecodable", run_id=entry.ctx.run_id, error=str(exc))
        return None


async def load_snapshot(
    store: SnapshotStore, run_id: str, thread_id: str | None, cache: ChunkCache | None = None,
) -> LoadedSnapshot | None:
    """The run's snapshot joined with its chunks (`read_entry`, then `load_chunks`), or None on
    a miss: the log is always there to fold instead."""
    read = await read_entry(store, run_id, thread_id, cache)
    return None if read is None else await load_chunks(store, read[0], cache, read[1])


async def save_snapshot(store: SnapshotStore, entry: RunSnapshot, chunks: Mapping[str, bytes],
                        replaced: Mapping[str, str] | None = None) -> bool:
    """Write `chunks` (digest -> bytes: those the store lacks, concurrently), then `entry`,
    which names them: an entry is never stored before its chunks. Then purge the chunks of
    `replaced` (digest -> key: what the snapshot this one replaces named) that `entry` does not
    name: spans merged into a larger one, a rest that grew (left in the store, a cold read would
    fetch them along with the live ones until the thread is deleted). Returns False if a write
    failed; never raises (a purge that fails is logged: it only costs bytes)."""
    thread_id, run_id = entry.ctx.thread_id, entry.ctx.run_id
    keys = chunk_keys(entry)
    try:
        if chunks:
            await asyncio.gather(*(store.put(keys[d], data) for d, data in chunks.items()))
        await store.put(run_id, encode_snapshot(entry))
    except Exception as exc:  # noqa: BLE001 - a cache write must never fail a run
        _log.warning("snapshot.put_failed", thread_id=thread_id, run_id=run_id, error=str(exc))
        return False
    stale = [key for digest, key in (replaced or {}).items() if digest not in keys]
    if stale:
        try:
            await store.purge(stale)
        except Exception as exc:  # noqa: BLE001
            _log.warning("snapshot.purge_failed", thread_id=thread_id, run_id=run_id, error=str(exc))
    return True


class SnapshotWriter:
    """Keeps run snapshots current from the projection runner (`ProjectionRunner(after_batch=
    SnapshotWriter(runtime))`), for the runs no loop snapshots itself: one whose worker died
    mid-run is then resumed from a snapshot and a short tail, not from seq 1.

    Per batch, for each unfinished run it touched: `runtime.write_snapshot` (the run's current
    snapshot + the tail, folded) when the run waits, or when it moved `every` commits past the
    last snapshot this writer wrote (a long run is not rewritten on every commit). Runs of
    agents this runtime does not know are skipped, and so are runs whose snapshot is already at
    their last commit (written here, or by the runtime's own loop: `Runtime.snapshot_seq`, which
    in `agentlog serve` covers every run it drives); any failure is logged and skipped."""

    def __init__(self, runtime: Any, *, every: int = 32, concurrency: int = 8, remember: int = 10_000) -> None:
        self.runtime = runtime
        self.every = every
        self._limit = asyncio.Semaphore(concurrency)
        self._written: OrderedDict[str, int] = OrderedDict()
        self._remember = remember
        self._advanced = asyncio.Condition()
        self.writes = 0

    async def __call__(self, runs: list[RunView]) -> None:
        due = [r for r in runs if self._due(r)]
        await asyncio.gather(*(self._write(r) for r in due))

    def _due(self, run: RunView) -> bool:
        if run.status == "done" or run.agent_id is None or run.agent_id not in self.runtime.agents:
            return False
        # the runtime's own loop snapshots a run it drives when it stops: not the same again
        own = getattr(self.runtime, "snapshot_seq", None)
        written = max(self._written.get(run.run_id, 0), own(run.run_id) if own is not None else 0)
        if written >= run.last_seq:
            return False
        return run.status == "waiting" or run.last_seq - written >= self.every

    async def _write(self, run: RunView) -> None:
        async with self._limit:
            try:
                snap = await self.runtime.write_snapshot(run.run_id, thread_id=run.thread_id)
            except Exception as exc:  # noqa: BLE001 - a cache: the fold still works without it
                _log.warning("snapshot.write_failed", thread_id=run.thread_id, run_id=run.run_id, error=str(exc))
                return
        async with self._advanced:
            self.writes += 1
            self._written[run.run_id] = snap.seq
            self._written.move_to_end(run.run_id)
            while len(self._written) > self._remember:
                self._written.popitem(last=False)
            self._advanced.notify_all()

    async def threads_deleted(self, threads: Sequence[Any]) -> None:
        """Called by the projection runner with the threads a batch deleted (`ThreadDeleted`):
        their runs' entries and their chunks are removed (a cache of a deleted thread is just
        data to leak). Failures are logged; the entries then stay, unused."""
        store = self.runtime.snapshots
        for thread in threads:
            for run_id in thread.run_ids:
                self._written.pop(run_id, None)
            try:
                await store.delete_thread(thread.thread_id, list(thread.run_ids))
            except Exception as exc:  # noqa: BLE001 - a cache: never stops the projections
                _log.warning("snapshot.delete_failed", thread_id=thread.thread_id, error=str(exc))

    async def wait_written(self, run_id: str, seq: int, timeout: float = 5.0) -> None:
        """Return once this writer has written `run_id`'s snapshot at `seq` or later (tests,
        tools); `TimeoutError` after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            async with self._advanced:
                await self._advanced.wait_for(lambda: self._written.get(run_id, 0) >= seq)


__all__ = [
    "CHUNKS", "CHUNK_MAX_BYTES", "CHUNK_SIZE", "SNAPSHOT_FORMAT", "ChunkCache", "KVSnapshotStore", "LoadedSnapshot",
    "MemorySnapshotStore", "RunSnapshot", "SnapshotStore", "SnapshotWriter", "assemble", "call_chunks_prefix",
    "chunk_key", "chunk_keys", "chunk_matches", "decode_chunk", "decode_snapshot", "encode_snapshot",
    "fetch_chunks", "load_chunks", "load_snapshot", "make_snapshot", "message_chunks_prefix", "read_entry",
    "save_snapshot", "with_finished_calls"
]
