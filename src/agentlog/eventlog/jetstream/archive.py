"""Archived threads: their commits in the JetStream Object Store, read back as if still in the log.

Retention (`agentlog.eventlog.jetstream.retention`) moves a finished thread's commits out of the events stream
into ONE object per thread (bucket `agentlog_archive`, object name = thread id). Readers never
notice: `JetStreamEventStore.read_thread` / `read_run` pass their stream reads through
`ThreadArchive.fill_thread` / `fill_run`, which put the archived commits back in, with their
original stream sequences, so positions (`seq:index`), timelines, time travel and verified
replay are unchanged.

How a reader knows a thread was archived: retention appends a *marker* to the thread, a
thread-level commit with one `ThreadMetadataUpdated` (metadata key `agentlog.archived`, commit id
`archived-<upto>`) written under the thread's OCC, then purges the thread's commits below the
marker. The marker is an ordinary commit, so:

* every reader that follows the log (views, SSE, `events tail`) reads it like any other; the
  thread view shows `metadata["agentlog.archived"]`, and listings keep the thread;
* `thread_version` is the marker's sequence, never 0: a thread id stays taken, and a writer that
  read the thread before it was archived gets a version conflict (it re-reads, archive included);
* a new run on an archived thread just appends after the marker (see docs/guides/retention.md).

A thread read (`fill_thread`) meets the marker first in the stream when the commits below it were
purged: it then yields the archived commits before the marker. Before the purge (a crash between
writing the marker and purging) the stream still holds them, the read yields them before it meets
the marker, and the archive is not read: a thread is never absent and never doubled. Only a
marker that is the first commit of a read stands for archived commits, so a commit forged to look
like one (by a NATS user allowed to append) in the middle of a thread changes nothing.
A run read (`fill_run`) has no thread-level marker in its subject: when the stream holds nothing
of the run, the run index (KV bucket `agentlog_archive_runs`, run id -> thread id, written before
the marker) names the thread whose archive holds it.

The object is `encode_archive`'s text: one line per commit, `<seq> <commit JSON>`, preceded by a
header line; its sha256 is in the object's headers (`Agentlog-Sha256`) and is checked on every
read, as is JetStream's own digest of the chunks: any mismatch is `ArchiveCorrupt`, never a
silently different history.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from agentlog.eventlog.errors import AgentlogError, StoreUnavailable
from agentlog.eventlog.events import Commit, StoredCommit, ThreadMetadataUpdated

__all__ = [
    "ARCHIVE_BUCKET", "ARCHIVE_KEY", "RUN_INDEX_BUCKET", "SHA_HEADER", "ArchiveCorrupt", "ThreadArchive",
    "decode_archive", "encode_archive", "marker_commit", "marker_of",
]

ARCHIVE_BUCKET = "agentlog_archive"
RUN_INDEX_BUCKET = "agentlog_archive_runs"
#: Thread metadata key of the marker: `{"upto", "commits", "sha256", "at"}`.
ARCHIVE_KEY = "agentlog.archived"
SHA_HEADER = "Agentlog-Sha256"
#: Runs a store remembers having found in the stream (`ThreadArchive.fill_run`).
LIVE_RUNS_KEPT = 10_000
_MAGIC = b"agentlog-archive 1 "
_json = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


class ArchiveCorrupt(AgentlogError):
    """An archived thread's object is missing, unreadable, or does not match its checksum."""

    code = "archive_corrupt"


# -- the marker ---------------------------------------------------------------------------------


def marker_commit(thread_id: str, upto: int, commits: int, sha256: str, at_ms: int) -> Commit:
    """The thread-level commit that says "commits up to `upto` are in the archive object".
    Its id is derived from `upto`, so a retried append is deduplicated by JetStream."""
    info = {"upto": upto, "commits": commits, "sha256": sha256, "at": at_ms}
    return Commit(commit_id=f"archived-{upto}", thread_id=thread_id, run_id=None, ts=at_ms,
                  events=[ThreadMetadataUpdated(metadata={ARCHIVE_KEY: info})])


def marker_of(commit: Commit) -> int | None:
    """`upto` of an archive marker, None for any other commit. A metadata patch through the API
    gets a random commit id, so it cannot pass for a marker."""
    if commit.run_id is not None or len(commit.events) != 1 or not commit.commit_id.startswith("archived-"):
        return None
    event = commit.events[0]
    if type(event) is not ThreadMetadataUpdated:
        return None
    info = event.metadata.get(ARCHIVE_KEY)
    upto = info.get("upto") if isinstance(info, dict) else None
    if not isinstance(upto, int) or commit.commit_id != f"archived-{upto}":
        return None
    return upto


# -- the object's format (pure) -----------------------------------------------------------------


def encode_archive(thread_id: str, commits: Sequence[StoredCommit]) -> bytes:
    """One object: a header line, then `<seq> <commit JSON>` per commit, in log order (commit
    JSON never holds a raw newline)."""
    lines = [_MAGIC + thread_id.encode()]
    lines.extend(b"%d %s" % (sc.seq, _json.encode(sc.commit)) for sc in commits)
    return b"\n".join(lines) + b"\n"


def decode_archive(thread_id: str, data: bytes) -> list[tuple[int, bytes]]:
    """(seq, commit bytes) of an archive object, checked to be this thread's and in order."""
    header, _, body = data.partition(b"\n")
    if header != _MAGIC + thread_id.encode():
        raise ArchiveCorrupt(f"archive of thread {thread_id!r}: unexpected header {header[:80]!r}")
    items: list[tuple[int, bytes]] = []
    last = 0
    for line in body.splitlines():
        seq_text, _, raw = line.partition(b" ")
        try:
            seq = int(seq_text)
        except ValueError:
            raise ArchiveCorrupt(f"archive of thread {thread_id!r}: malformed line {line[:80]!r}") from None
        if seq <= last:
            raise ArchiveCorrupt(f"archive of thread {thread_id!r}: sequence {seq} out of order")
        items.append((seq, raw))
        last = seq
    return items


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- reading ------------------------------------------------------------------------------------


class ThreadArchive:
    """The read side: archived commits, fetched (and checked) from the Object Store on demand.

    `decode` is the store's commit decoder (it resolves large-payload references). A few parsed
    archives are kept in memory (keyed by their checksum, so a re-archived thread is re-read)."""

    def __init__(self, nc: NATS, decode: Callable[[bytes], Awaitable[Commit]], *, timeout: float = 5.0,
                 cache_size: int = 16) -> None:
        self._nc = nc
        self._decode = decode
        self.timeout = timeout
        self._cache: OrderedDict[str, tuple[str, list[tuple[int, bytes]]]] = OrderedDict()
        self._cache_size = cache_size
        self._obs: Any = None
        #: Runs this process last found in the stream (most recent last, at most `LIVE_RUNS_KEPT`):
        #: `fill_run` asks the archive index about them only when the stream turns out empty.
        self._live_runs: OrderedDict[str, None] = OrderedDict()

    def forget(self) -> None:
        """Drop the parsed archives kept in memory (the next read fetches and checks again)."""
        self._cache.clear()

    async def fill_thread(self, thread_id: str, after: int,
                          live: AsyncIterator[StoredCommit]) -> AsyncIterator[StoredCommit]:
        """`live` (the thread's commits in the stream with seq > after) with the archived ones
        put back before the marker that stands for them."""
        last = after
        async for sc in live:
            upto = marker_of(sc.commit)
            if upto is not None and last == after < upto:
                for archived in await self.archived(thread_id, last, upto):
                    yield archived
            last = sc.seq
            yield sc

    async def fill_log(self, live: AsyncIterator[StoredCommit]) -> AsyncIterator[StoredCommit]:
        """`live` (commits of all threads in log order, from the start of the log) with each
        archived thread's commits put back just before its marker. Those come out of log order
        (lower sequences than commits of other threads already yielded) but in order within
        their thread: what a fold of the whole log (listings from the log, view rebuilds) needs."""
        seen: set[str] = set()
        async for sc in live:
            thread_id = sc.commit.thread_id
            upto = marker_of(sc.commit)
            if upto is not None and thread_id not in seen:
                for archived in await self.archived(thread_id, 0, upto):
                    yield archived
            seen.add(thread_id)
            yield sc

    async def archived(self, thread_id: str, after: int, upto: int) -> list[StoredCommit]:
        """The archived commits of a thread with after < seq <= upto, decoded."""
        return [StoredCommit(seq, await self._decode(raw))
                for seq, raw in await self.load(thread_id) if after < seq <= upto]

    async def fill_run(self, run_id: str, after: int,
                       live: AsyncIterator[StoredCommit]) -> AsyncIterator[StoredCommit]:
        """`live` (the run's commits in the stream), or, when the stream holds none, the run's
        commits in its thread's archive. A run is archived whole (only finished threads are), so
        the stream holds all of it or none."""
        # The index lookup is sent at once, alongside the stream read, so that a run the stream
        # does not hold (a run being started, an archived run) costs no extra round trip; when
        # the stream holds the run its answer is dropped. For a run last found in the stream it
        # is sent only if the stream turns out empty (archived since): the lookup, its reply and
        # its task would be spent on every read of a live run (a gateway reads each run it serves).
        lookup: asyncio.Future[str | None] | None = None
        if run_id not in self._live_runs:
            lookup = asyncio.ensure_future(self.thread_of_run(run_id))
            lookup.add_done_callback(_retrieved)
        found = False
        try:
            async for sc in live:
                if not found:
                    found = True
                    self.saw_live(run_id)
                yield sc
            if found:
                return
            self._live_runs.pop(run_id, None)
            thread_id = await (lookup if lookup is not None else self.thread_of_run(run_id))
        finally:
            if lookup is not None:
                lookup.cancel()  # a no-op once it is done
        if thread_id is None:
            return
        for seq, raw in await self.load(thread_id):
            if seq > after:
                commit = await self._decode(raw)
                if commit.run_id == run_id:
                    yield StoredCommit(seq, commit)

    def saw_live(self, run_id: str) -> None:
        """`run_id` has commits in the stream (read there, or appended by this process)."""
        self._live_runs[run_id] = None
        self._live_runs.move_to_end(run_id)
        if len(self._live_runs) > LIVE_RUNS_KEPT:
            self._live_runs.popitem(last=False)

    async def thread_of_run(self, run_id: str) -> str | None:
        """The thread an archived run belongs to (one Direct Get on the run index), None when the
        run was never archived or no run was ever archived."""
        import nats.errors

        # the subject form of Direct Get: what the roles' `$JS.API.DIRECT.GET.*.$KV.>` allows
        subject = f"$JS.API.DIRECT.GET.KV_{RUN_INDEX_BUCKET}.$KV.{RUN_INDEX_BUCKET}.{run_id}"
        try:
            reply = await self._nc.request(subject, b"", timeout=self.timeout)
        except nats.errors.NoRespondersError:
            return None  # no run index: nothing was ever archived
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"archive index lookup of run {run_id!r}: {exc or type(exc).__name__}") from None
        status = reply.headers.get("Status") if reply.headers else None
        if status == "404":
            return None
        if status is not None:
            raise StoreUnavailable(f"archive index lookup of run {run_id!r} answered status {status}")
        if reply.headers and reply.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return reply.data.decode() or None

    async def load(self, thread_id: str) -> list[tuple[int, bytes]]:
        """The archived (seq, commit bytes) of a thread, checked against its sha256. A missing or
        corrupt object is `ArchiveCorrupt`; NATS not answering is `StoreUnavailable` (retry)."""
        import nats.errors
        from nats.js.errors import BadObjectMetaError, DigestMismatchError, NotFoundError

        store = await self._store()
        try:
            info = await store.get_info(thread_id)
        except (NotFoundError, BadObjectMetaError) as exc:
            raise ArchiveCorrupt(f"thread {thread_id!r} is archived but its object cannot be found: "
                                 f"{type(exc).__name__}") from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"archive of thread {thread_id!r}: {type(exc).__name__}: {exc}") from None
        expected = (info.headers or {}).get(SHA_HEADER)
        if isinstance(expected, list):
            expected = expected[0] if expected else None
        cached = self._cache.get(thread_id)
        if cached is not None and cached[0] == expected:
            self._cache.move_to_end(thread_id)
            return cached[1]
        try:
            data = bytes((await store.get(thread_id)).data or b"")
        except (DigestMismatchError, NotFoundError, BadObjectMetaError) as exc:
            raise ArchiveCorrupt(f"archive of thread {thread_id!r} cannot be read: {type(exc).__name__}") from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"archive of thread {thread_id!r}: {type(exc).__name__}: {exc}") from None
        actual = sha256_hex(data)
        if expected is None or actual != expected:
            raise ArchiveCorrupt(f"archive of thread {thread_id!r} does not match its checksum "
                                 f"(recorded {expected}, content {actual})")
        items = decode_archive(thread_id, data)
        self._cache[thread_id] = (actual, items)
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return items

    async def _store(self) -> Any:
        import nats.errors
        from nats.js.errors import NotFoundError

        if self._obs is None:
            try:
                self._obs = await self._nc.jetstream(timeout=self.timeout).object_store(ARCHIVE_BUCKET)
            except NotFoundError:
                raise ArchiveCorrupt(f"a thread is archived but the archive bucket {ARCHIVE_BUCKET!r} "
                                     "does not exist") from None
            except (nats.errors.Error, TimeoutError) as exc:
                raise StoreUnavailable(f"the archive bucket {ARCHIVE_BUCKET!r}: {type(exc).__name__}: {exc}") from None
        return self._obs


def _retrieved(lookup: asyncio.Future[str | None]) -> None:
    """Mark an index lookup's failure as seen: when the stream held the run nobody awaits it."""
    if not lookup.cancelled():
        lookup.exception()
