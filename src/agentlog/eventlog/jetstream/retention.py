"""Retention: archive finished threads older than a cutoff, so the stream stays small and every
run stays replayable (the read side is `agentlog.eventlog.jetstream.archive`).

A thread is *due* when every run it started has finished and its last commit (archive markers
aside) is older than the cutoff. Archiving one thread, in this order, so that a crash at any point
leaves it readable (present twice is fine, absent never):

1. read the whole thread (archive included) at version V and check it is due;
2. write the archive object (all its commits with their sequences, sha256 in its headers), then
   read it back and check it against what was read in 1;
3. index its runs (KV `agentlog_archive_runs`: run id -> thread id) for `read_run`;
4. append the marker under the thread's OCC at V: if anything was appended meanwhile (a new run),
   nothing is purged and the thread is left for the next pass;
5. purge the thread's commits below the marker (a purge by subject filter bounded by sequence,
   so a commit appended after the marker is never touched).

A crash after 2 or 3 leaves an unused object (overwritten by the next pass); after 4, a thread
whose commits are both in the stream and in the archive: the next pass sees commits below the
marker, checks the archive again and purges them.

The candidates come from one pass over the stream (`tally`, a pure fold), which only sees what
is still in it: an archived thread shows its marker and whatever came after.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import RunFinished, RunStarted, StoredCommit
from agentlog.eventlog.ids import now_ms
from agentlog.eventlog.jetstream.archive import (
    ARCHIVE_BUCKET,
    RUN_INDEX_BUCKET,
    SHA_HEADER,
    ArchiveCorrupt,
    encode_archive,
    marker_commit,
    marker_of,
    sha256_hex,
)
from agentlog.eventlog.jetstream.payloads import ensure_payload_bucket
from agentlog.eventlog.jetstream.replicas import placed
from agentlog.eventlog.jetstream.store import JetStreamEventStore

__all__ = ["DAY_MS", "Outcome", "ThreadTally", "archive_due", "archive_thread", "due", "tally"]

DAY_MS = 86_400_000

Action = Literal["archive", "purge"]


@dataclass
class ThreadTally:
    """What one pass over the stream knows of a thread."""

    thread_id: str
    last_seq: int = 0
    #: ts of the last commit that is not an archive marker (0: none in the stream)
    last_ts: int = 0
    open_runs: set[str] = field(default_factory=set)
    #: sequence of the latest marker in the stream, and whether commits below it are still there
    marker_seq: int = 0
    below_marker: bool = False
    #: commits (not markers) after the latest marker, or in a thread with no marker
    unarchived: bool = False


def tally(commits: Iterable[StoredCommit], into: dict[str, ThreadTally] | None = None) -> dict[str, ThreadTally]:
    """Fold commits (in log order) into one `ThreadTally` per thread."""
    out = into if into is not None else {}
    for sc in commits:
        commit = sc.commit
        t = out.get(commit.thread_id)
        if t is None:
            t = out[commit.thread_id] = ThreadTally(commit.thread_id)
        t.last_seq = sc.seq
        if marker_of(commit) is not None:
            t.marker_seq = sc.seq
            t.below_marker = t.below_marker or t.unarchived
            t.unarchived = False
            continue
        t.last_ts = commit.ts
        t.unarchived = True
        for event in commit.events:
            if isinstance(event, RunStarted):
                t.open_runs.add(event.run_id)
            elif isinstance(event, RunFinished) and commit.run_id is not None:
                t.open_runs.discard(commit.run_id)
    return out


def due(t: ThreadTally, cutoff_ms: int) -> Action | None:
    """What retention does with a thread: archive it (finished, unarchived commits, last one
    before the cutoff), finish an interrupted purge, or nothing."""
    if t.unarchived and not t.open_runs and t.last_ts < cutoff_ms:
        return "archive"
    if t.below_marker and not t.unarchived:
        return "purge"
    return None


@dataclass(frozen=True)
class Outcome:
    """What happened to one thread: `archived`, `purged` (an interrupted archive finished),
    `skipped` (not due after all, or changed while archiving), or `due` (dry run)."""

    thread_id: str
    result: Literal["archived", "purged", "skipped", "due"]
    commits: int = 0
    removed: int = 0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "result": self.result, "commits": self.commits,
                "removed": self.removed, "reason": self.reason}


async def archive_due(store: JetStreamEventStore, older_than_ms: int, *, now: int | None = None,
                      dry_run: bool = False, replicas: int | None = None) -> list[Outcome]:
    """Archive every thread due at `now - older_than_ms` (one pass over the stream)."""
    cutoff = (now if now is not None else now_ms()) - older_than_ms
    tallies: dict[str, ThreadTally] = {}
    async for sc in store.read_log():
        tally((sc,), tallies)
    outcomes = []
    for t in tallies.values():
        action = due(t, cutoff)
        if action is None:
            continue
        if dry_run:
            outcomes.append(Outcome(t.thread_id, "due", reason=action))
            continue
        try:
            outcomes.append(await archive_thread(store, t.thread_id, cutoff_ms=cutoff, now=now, replicas=replicas))
        except ArchiveCorrupt as exc:  # this thread is left as it is; the others go on
            outcomes.append(Outcome(t.thread_id, "skipped", reason=f"{exc.code}: {exc}"))
    return outcomes


async def archive_thread(store: JetStreamEventStore, thread_id: str, *, cutoff_ms: int, now: int | None = None,
                         replicas: int | None = None, purge: bool = True) -> Outcome:
    """Archive one thread (steps 1-5 of the module doc); `purge=False` stops after the marker
    (what a crash before the purge leaves)."""
    history = [sc async for sc in store.read_thread(thread_id)]
    t = tally(history)[thread_id] if history else ThreadTally(thread_id)
    # Over the whole history (archive included), "unarchived" is "has commits after its last marker".
    if t.unarchived:
        if t.open_runs or t.last_ts >= cutoff_ms:
            return Outcome(thread_id, "skipped", reason="not finished" if t.open_runs else "too recent")
        return await _archive(store, thread_id, history, now=now, replicas=replicas, purge=purge)
    if t.marker_seq and purge:
        upto = marker_of(history[-1].commit) if history[-1].seq == t.marker_seq else None
        return await _finish_purge(store, thread_id, t.marker_seq, upto)
    return Outcome(thread_id, "skipped", reason="nothing to archive")


async def _archive(store: JetStreamEventStore, thread_id: str, history: list[StoredCommit], *,
                   now: int | None, replicas: int | None, purge: bool) -> Outcome:
    version = history[-1].seq
    data = encode_archive(thread_id, history)
    sha = sha256_hex(data)
    await _put_object(store, thread_id, data, sha, replicas)
    stored = await store.archive.load(thread_id)
    if [seq for seq, _ in stored] != [sc.seq for sc in history]:
        raise ArchiveCorrupt(f"archive of thread {thread_id!r} read back differently from what was written")
    runs = sorted({sc.commit.run_id for sc in history if sc.commit.run_id is not None})
    await _index_runs(store, thread_id, runs, replicas)
    marker = marker_commit(thread_id, version, len(history), sha, now if now is not None else now_ms())
    try:
        result = await store.append(marker, expected_version=version)
    except VersionConflict:
        return Outcome(thread_id, "skipped", reason="changed while archiving")
    removed = await store.purge_thread(thread_id, below=result.seq) if purge else 0
    return Outcome(thread_id, "archived", commits=len(history), removed=removed)


async def _finish_purge(store: JetStreamEventStore, thread_id: str, marker_seq: int, upto: int | None) -> Outcome:
    """A marker is in the stream with commits still below it: check the archive holds them, then purge."""
    if upto is None:
        return Outcome(thread_id, "skipped", reason="changed after its archive")
    stored = await store.archive.load(thread_id)
    if not stored or stored[-1][0] < upto:
        raise ArchiveCorrupt(f"archive of thread {thread_id!r} ends before its marker's position {upto}")
    removed = await store.purge_thread(thread_id, below=marker_seq)
    if not removed:
        return Outcome(thread_id, "skipped", reason="already archived")
    return Outcome(thread_id, "purged", commits=len(stored), removed=removed)


async def _put_object(store: JetStreamEventStore, thread_id: str, data: bytes, sha: str, replicas: int | None) -> None:
    from nats.js.api import ObjectMeta, ObjectMetaOptions

    obs = await ensure_payload_bucket(store.nc.jetstream(timeout=store.request_timeout), ARCHIVE_BUCKET,
                                      replicas=replicas)
    chunk = max(1024, min(128 * 1024, store.max_payload - 4096))
    meta = ObjectMeta(name=thread_id, headers={SHA_HEADER: sha}, options=ObjectMetaOptions(max_chunk_size=chunk))
    await obs.put(thread_id, data, meta=meta)


async def _index_runs(store: JetStreamEventStore, thread_id: str, runs: list[str], replicas: int | None) -> None:
    from nats.js.api import KeyValueConfig, StorageType
    from nats.js.errors import BadRequestError, NotFoundError

    js = store.nc.jetstream(timeout=store.request_timeout)
    try:
        kv = await js.key_value(RUN_INDEX_BUCKET)
    except NotFoundError:
        config = KeyValueConfig(bucket=RUN_INDEX_BUCKET, history=1, storage=StorageType.FILE,
                                replicas=replicas or 1, direct=True)
        try:
            kv = await placed(lambda: js.create_key_value(config=config), f"KV bucket {RUN_INDEX_BUCKET}")
        except BadRequestError:
            kv = await js.key_value(RUN_INDEX_BUCKET)
    for run_id in runs:
        await kv.put(run_id, thread_id.encode())
