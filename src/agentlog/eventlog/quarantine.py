"""Quarantine: what every reader makes of a message of the log it cannot decode.

Anyone allowed to publish on `agentlog.ev.<thread>.<run>` (the `worker` and `gateway` roles) can
put bytes there that are not a commit, and a newer agentlog may write a schema this build does not
know. Failing the read would take down every listing that folds the log and the thread itself, so
readers instead put a stand-in commit in its place: same seq, its thread from the subject, the
stored time, and one `CommitQuarantined` event naming the error. Every fold then treats it
the same way (it changes nothing but the seq the views count), OCC versions still count it (it is
a message on the thread's subjects), and the timeline shows it where it sits.

`Quarantine` counts, per process, the distinct seqs quarantined (the Prometheus counter) and logs
each once, not once per read.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from datetime import UTC, datetime, timedelta

from agentlog.eventlog.codec import decode_commit
from agentlog.eventlog.errors import CodecError
from agentlog.eventlog.events import Commit, CommitQuarantined
from agentlog.eventlog.ids import THREAD_LEVEL_RUN

log = logging.getLogger("agentlog.quarantine")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Longest codec message kept in the marker (the bytes themselves are never copied into it).
_REASON_LIMIT = 500


def quarantined_commit(seq: int, subject: str, ts: int, data: bytes, error: CodecError) -> Commit:
    """The stand-in for undecodable `data` stored at `seq` on `subject` at `ts` (ms).

    Its thread is the subject's thread token (`agentlog.ev.<thread>.<run>`): what the thread's
    reads filter on and its OCC version counts. It belongs to no run (`run_id` None, the subject
    kept in the event): nothing vouches that it is a run's, and a run view made of it alone would
    list a run that never started."""
    tokens = subject.split(".")
    thread_id = tokens[2] if len(tokens) > 2 else ""
    reason = str(error)
    if len(reason) > _REASON_LIMIT:
        reason = reason[: _REASON_LIMIT - 1] + "…"
    marker = CommitQuarantined(code=error.code, reason=reason, subject=subject, size=len(data),
                               sha256=hashlib.sha256(data).hexdigest())
    return Commit(commit_id=f"quarantined-{seq}", thread_id=thread_id, ts=ts, events=[marker])


def quarantined_run(commit: Commit) -> str | None:
    """The run token of the subject a quarantined message was published on, if any."""
    marker = commit.events[0]
    tokens = marker.subject.split(".") if isinstance(marker, CommitQuarantined) else []
    return tokens[3] if len(tokens) > 3 and tokens[3] != THREAD_LEVEL_RUN else None


def is_quarantined(commit: Commit) -> bool:
    """Whether `commit` is a reader's stand-in for an undecodable message."""
    events = commit.events
    return len(events) == 1 and type(events[0]) is CommitQuarantined


def time_ms(value: int | str | datetime | None) -> int:
    """A stored message's time in ms since the epoch, from nanoseconds (a JetStream ack subject's
    token), a `Nats-Time-Stamp` header (RFC 3339) or a parsed datetime; 0 if there is none.
    Integer arithmetic throughout, truncating: every reader gets the same ms for one message."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value // 1_000_000
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return 0
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // timedelta(milliseconds=1)


class Quarantine:
    """The undecodable messages this process has met: the count of distinct seqs (a counter:
    it only grows) and the most recent ones, for logs and health. Logs each seq once."""

    def __init__(self, keep: int = 1000) -> None:
        self.total = 0
        self.keep = keep
        self.recent: OrderedDict[int, str] = OrderedDict()

    def note(self, seq: int, commit: Commit) -> None:
        if seq in self.recent:
            return
        self.total += 1
        marker = commit.events[0]
        reason = marker.reason if isinstance(marker, CommitQuarantined) else ""
        self.recent[seq] = reason
        while len(self.recent) > self.keep:
            self.recent.popitem(last=False)
        log.warning("quarantined undecodable message at seq %d (thread %r): %s", seq, commit.thread_id, reason)

    def hold(self, seq: int, subject: str, ts: int | str | datetime | None, data: bytes,
             error: CodecError) -> Commit:
        """The stand-in for `data`, which failed to decode with `error` (noted). `ts`: the stored
        time, as `time_ms` takes it."""
        commit = quarantined_commit(seq, subject, time_ms(ts), bytes(data), error)
        self.note(seq, commit)
        return commit

    def decode(self, seq: int, subject: str, ts: int | str | datetime | None, data: bytes) -> Commit:
        """`decode_commit(data)`, or the stand-in (noted) if it cannot be decoded."""
        try:
            return decode_commit(data)
        except CodecError as exc:
            return self.hold(seq, subject, ts, data, exc)


__all__ = ["Quarantine", "is_quarantined", "quarantined_commit", "quarantined_run", "time_ms"]
