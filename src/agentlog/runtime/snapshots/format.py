"""The snapshot format, pure: what a run-context snapshot holds, how it is cut into chunks and
joined back, and its bytes. No I/O: the stores (`snapshots.store`) read and write what this makes.

A snapshot is the loop's working context (`RunContext`, the model's messages included) and the
run's projection view (`RunView`) as of one commit seq. Resume = the snapshot + the thread's
commits after that seq, folded by the same `apply_event`, so `snapshot(prefix) + fold(rest) ==
fold(all)` (a property test proves it).

What grows with a run is immutable once written: its messages, and the views of its finished
calls. Those go into **chunks** (`chunk_spans`: aligned spans of `CHUNK_SIZE * CHUNK_FANOUT**k`
items that only ever merge, each cut further to stay under `CHUNK_MAX_BYTES`), content-addressed
(by a digest of the bytes) and written once, under one key prefix per kind: the thread's
messages, the run's calls (`chunk_key`). The run's entry holds only the mutable rest (the
context without the chunked messages, the view without the chunked calls) and the chunks'
digests. Splitting and joining are pure (`make_snapshot`, `assemble`); `ChunkCache` keeps
decoded chunks by digest so a process that saw a thread need not fetch them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import itertools
import operator
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from agentlog.eventlog.events import Message
from agentlog.projections.views import TERMINAL_CALL_STATUSES, CallView, RunView
from agentlog.runtime.loop.run_context import RunContext

#: Bumped when the meaning of a snapshot changes (e.g. `apply_event` folds something new):
#: older entries are then misses. A change of shape needs no bump: see `schema`.
#: 2: messages and finished calls moved into chunks (a version-1 reader would take the entry's
#: few messages for the whole conversation, so it must miss).
#: 3: chunk keys by kind (`chunk_key`), so a cold read gets the entry and its chunks at once.
SNAPSHOT_FORMAT = 3
SNAPSHOT_BUCKET = "snapshots"



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

    Every chunk's bytes are checked against its digest before this is built (a mismatch is a
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
            with gc_paused():
                older = [self._decoded(MESSAGES_KIND, d, values[d]) for d in entry.message_chunks]
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
            with gc_paused():
                self._tail = _view_decoder.decode(self._run)
        return self._tail

    def finished_calls(self) -> dict[str, CallView]:
        """The views of the chunked finished calls, in the view's order (before every call of
        `tail_view()`), decoded from their chunks at the first call."""
        if self._finished is None:
            with gc_paused():
                decoded = [(d, self._decoded(CALLS_KIND, d, v)) for d, v in self._calls]
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
    resumed from a snapshot still holds), so a writer does not encode them again. Every
    `run.calls.items()` makes new pairs: a pair is the same item when its view is the very
    object (`_anchor`, `_all_same`)."""

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
        self._ident[_ends(value)] = digest
        self.size += size
        while self.size > self.capacity and len(self._values) > 1:
            old_digest, old = self._values.popitem(last=False)
            self.size -= self._sizes.pop(old_digest)
            key = _ends(old)
            if self._ident.get(key) == old_digest:
                del self._ident[key]

    def digest_of(self, items: Sequence[Any]) -> str | None:
        digest = self._ident.get(_ends(items))
        value = self._values.get(digest) if digest is not None else None
        if value is None or len(value) != len(items) or not _all_same(value, items):
            return None
        return digest

    def split_of(self, items: Sequence[Any]) -> list[int] | None:
        """The lengths of the pieces `items` (the very objects) were cut into, if remembered."""
        record = self._splits.get((*_ends(items), len(items)))
        return None if record is None else record[2]

    def remember_split(self, items: Sequence[Any], lengths: list[int]) -> None:
        self._splits[(*_ends(items), len(items))] = (_anchor(items[0]), _anchor(items[-1]), lengths)
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


def _anchor(item: Any) -> Any:
    """The object whose identity is an item's: a message itself; a call chunk's
    `(call_id, CallView)` pair, its view (the pair is made anew by each `dict.items()`)."""
    return item[1] if type(item) is tuple else item


def _all_same(cached: Sequence[Any], items: Sequence[Any]) -> bool:
    """Whether the items of two runs of equal length are the same items (`_anchor`): not only
    equal, the same objects; pairs by their views, under equal keys. At C speed (`map`): a long
    run's snapshot asks this of each of its chunks."""
    if type(items[0]) is not tuple:
        return all(map(operator.is_, cached, items))
    return (all(map(operator.is_, map(_VIEW, cached), map(_VIEW, items)))
            and all(map(operator.eq, map(_KEY, cached), map(_KEY, items))))


_KEY, _VIEW = operator.itemgetter(0), operator.itemgetter(1)


def _ends(items: Sequence[Any]) -> tuple[int, int]:
    """The identities of a run of items' first and last anchors: what a cached chunk is found by."""
    return id(_anchor(items[0])), id(_anchor(items[-1]))


#: How many cuts of large spans a `ChunkCache` remembers (a few per long run of long messages).
_SPLITS_KEPT = 4096
#: How many threads a `ChunkCache` remembers having seen chunks of.
_THREADS_KEPT = 65536

#: The process's chunk cache (the default of `load_snapshot` and `make_snapshot`).
CHUNKS = ChunkCache()

MESSAGES_KIND, CALLS_KIND = b"m", b"c"


def chunk_digest(kind: bytes, data: bytes) -> str:
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
        part = items[start:end]
        whole = cache.digest_of(part)  # stored whole before: it fits, one piece
        pieces = ([(part, None, whole)] if whole is not None
                  else [(piece, data, cache.digest_of(piece)) for piece, data in _pieces(part, cache, max_bytes)])
        for piece, data, digest in pieces:
            if digest is None:
                data = _encoder.encode(piece) if data is None else data
                digest = chunk_digest(kind, data)
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
            message_chunks=_split(MESSAGES_KIND, messages, message_spans, cache, known, new, max_bytes),
            call_ids=calls, run=msgspec.Raw(_encoder.encode(tail_run)),
            call_chunks=_split(CALLS_KIND, items, call_spans, cache, known, new, max_bytes),
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
    return chunk_digest(kind, data) == digest


def decode_chunk(kind: bytes, digest: str, data: bytes) -> tuple[Any, ...] | None:
    """The items of a chunk read from the store, or None if its bytes are not what `digest`
    names (or do not decode): a miss."""
    if not chunk_matches(kind, digest, data):
        return None
    try:
        with gc_paused():
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
    MESSAGES_KIND: msgspec.msgpack.Decoder(list[Message]),
    CALLS_KIND: msgspec.msgpack.Decoder(list[tuple[str, CallView]]),
}
SCHEMA = hashlib.sha256(
    msgspec.json.encode(msgspec.json.schema_components((RunContext, RunView)), order="sorted")
).hexdigest()[:16]


def encode_snapshot(snap: RunSnapshot) -> bytes:
    return _encoder.encode(snap)


def decode_snapshot(data: bytes) -> RunSnapshot | None:
    """The entry in `data`, or None when it cannot be used (corrupt, other format): a miss."""
    try:
        with gc_paused():
            snap = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return snap if snap.v == SNAPSHOT_FORMAT and snap.schema == SCHEMA else None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Decoding a long run's snapshot allocates thousands of tracked objects at once: every
    allocation threshold crossed mid-decode runs a collection, and now and then a full one over
    the whole heap, which costs far more than the decode itself (figures in the docs' decision
    notes). Paused, the objects are collected once afterwards at the usual thresholds."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


__all__ = [
    "CALLS_KIND", "CHUNKS", "CHUNK_MAX_BYTES", "CHUNK_SIZE", "MESSAGES_KIND", "SNAPSHOT_BUCKET", "SNAPSHOT_FORMAT", "ChunkCache",
    "ChunkValue", "LoadedSnapshot", "RunSnapshot", "assemble", "call_chunks_prefix", "chunk_key", "chunk_keys", "chunk_matches",
    "chunk_digest", "chunk_spans", "decode_chunk", "decode_snapshot", "encode_snapshot", "gc_paused", "make_snapshot", "message_chunks_prefix",
    "with_finished_calls",
]
