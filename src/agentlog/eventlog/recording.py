"""Recorded runs as a portable file: the format of `agentlog export` / `agentlog import`.

A recording is JSON Lines. The first line is the header (`RecordingHeader`): what wrote it (the
format's version, agentlog's version, the log's `SCHEMA_VERSION`), the app the runs were
recorded with (`RunStarted.app`), when and with which filters it was made, the runs it was made
for, and how many commits follow. Every further line is one commit as the log stored it:
`{"seq": <its sequence in the source log>, "commit": <the commit, in the log's own codec>}`, in
log order. The commits are whole threads up to a point (a run's thread up to the run's end), with
large payloads resolved inline, so the file alone is enough to verify its runs and to load them
into another log.

Reading is all or nothing (`read_recording`): a header of a newer format or schema version, or a
commit of a newer schema version or an unknown event type, is `UnsupportedRecording`; a line that
is not what it should be, a repeated commit id, sequences out of order, or fewer or more commits
than the header announces is `CorruptRecording` naming the line. Nothing is returned, so nothing
is written anywhere, unless every line reads. Pure: no I/O here; the store side is
`agentlog.runtime.replay.recorded`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from agentlog.eventlog.codec import decode_commit, encode_commit
from agentlog.eventlog.errors import AgentlogError, CodecError, UnknownEventType, UnsupportedSchemaVersion
from agentlog.eventlog.events import JSON, SCHEMA_VERSION, AppRef, RunStarted, StoredCommit
from agentlog.eventlog.store import check_commit

__all__ = [
    "FORMAT", "FORMAT_VERSION", "CorruptRecording", "Recording", "RecordingError", "RecordingHeader",
    "UnsupportedRecording", "encode_recording", "read_recording", "recording_lines",
]

#: The header's `format`: what tells a recording from any other JSON Lines file.
FORMAT = "agentlog-recording"
#: The version of the file layout (header fields, line shape); a commit's own version is `v`.
FORMAT_VERSION = 1


class RecordingError(AgentlogError, ValueError):
    """A recording that cannot be read; nothing was loaded from it."""

    code = "recording_invalid"


class CorruptRecording(RecordingError):
    """A line of the file is not what the format says it is (`line`: 1-based, the header is 1)."""

    code = "recording_corrupt"

    def __init__(self, line: int, why: str) -> None:
        self.line = line
        super().__init__(f"line {line} of the recording: {why}")


class UnsupportedRecording(RecordingError):
    """The recording was written by a newer agentlog (format, schema version or event type)."""

    code = "recording_unsupported"

    def __init__(self, line: int, why: str) -> None:
        self.line = line
        super().__init__(f"line {line} of the recording: {why}")


class RecordingHeader(msgspec.Struct, frozen=True, kw_only=True):
    """The first line. `app_digest`: the digest (`agentlog.runtime.digest.app_digest`) of the app
    every run of the file was recorded with, None when they name none or several (`apps` lists
    each name and digest). `runs`: the runs the export was asked for (the file holds their
    threads, and the runs those hold, their sub-agents and parents too). `commits`: the lines
    that follow."""

    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    agentlog_version: str
    schema_version: int = SCHEMA_VERSION
    app_digest: str | None = None
    apps: list[AppRef] = []
    created_at: int
    filters: dict[str, JSON] = {}
    runs: list[str] = []
    commits: int


class _Line(msgspec.Struct, frozen=True):
    seq: int
    commit: msgspec.Raw


@dataclass(frozen=True)
class Recording:
    """A read recording: its header and its commits in log order (source sequences kept)."""

    header: RecordingHeader
    commits: tuple[StoredCommit, ...]

    def threads(self) -> dict[str, list[StoredCommit]]:
        """Each thread's commits, in log order; threads in the order they first appear."""
        out: dict[str, list[StoredCommit]] = {}
        for sc in self.commits:
            out.setdefault(sc.commit.thread_id, []).append(sc)
        return out

    def run_ids(self) -> list[str]:
        """Every run started in the file (a `RunStarted` in it), in log order."""
        return [e.run_id for sc in self.commits for e in sc.commit.events if type(e) is RunStarted]


_encoder = msgspec.json.Encoder()
_raw = msgspec.json.Decoder()
_line = msgspec.json.Decoder(_Line)


def recording_lines(header: RecordingHeader, commits: Iterable[StoredCommit]) -> Iterator[bytes]:
    """The file, one line (with its newline) at a time: the header, then each commit."""
    yield _encoder.encode(header) + b"\n"
    for sc in commits:
        yield _encoder.encode(_Line(sc.seq, msgspec.Raw(encode_commit(sc.commit)))) + b"\n"


def encode_recording(header: RecordingHeader, commits: Iterable[StoredCommit]) -> bytes:
    return b"".join(recording_lines(header, commits))


def read_recording(data: bytes | Iterable[bytes]) -> Recording:
    """Parse a whole recording (its bytes, or its lines), checking every line; raise a
    `RecordingError` at the first line that does not read."""
    lines = data.splitlines() if isinstance(data, bytes) else data
    header: RecordingHeader | None = None
    commits: list[StoredCommit] = []
    ids: set[str] = set()
    last = 0
    number = 0
    for number, raw_line in enumerate(lines, start=1):
        line = raw_line.strip()
        if not line:
            continue
        if header is None:
            header = _header(number, line)
            continue
        sc = _commit(number, line)
        if sc.seq <= last:
            raise CorruptRecording(number, f"sequence {sc.seq} does not follow {last}: commits are in log order")
        if sc.commit.commit_id in ids:
            raise CorruptRecording(number, f"commit {sc.commit.commit_id!r} appears twice")
        if len(commits) == header.commits:
            raise CorruptRecording(number, f"more commits than the {header.commits} the header announces")
        ids.add(sc.commit.commit_id)
        last = sc.seq
        commits.append(sc)
    if header is None:
        raise CorruptRecording(1, "empty file: no header")
    if len(commits) != header.commits:
        raise CorruptRecording(number + 1, f"the file ends after {len(commits)} of the {header.commits} "
                                           "commits its header announces (truncated?)")
    return Recording(header, tuple(commits))


def _header(number: int, line: bytes) -> RecordingHeader:
    try:
        raw: Any = _raw.decode(line)
    except msgspec.DecodeError as exc:
        raise CorruptRecording(number, f"the header is not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CorruptRecording(number, f"not an agentlog recording (no header with format {FORMAT!r})")
    for field, newest in (("format_version", FORMAT_VERSION), ("schema_version", SCHEMA_VERSION)):
        value = raw.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > newest:
            raise UnsupportedRecording(number, f"{field} {value}; this build reads up to {newest}: "
                                               "upgrade agentlog to read it")
    try:
        header = msgspec.convert(raw, RecordingHeader)
    except msgspec.ValidationError as exc:
        raise CorruptRecording(number, f"invalid header: {exc}") from None
    if header.commits < 0:
        raise CorruptRecording(number, f"invalid header: commits {header.commits} < 0")
    return header


def _commit(number: int, line: bytes) -> StoredCommit:
    try:
        parsed = _line.decode(line)
    except msgspec.DecodeError as exc:
        raise CorruptRecording(number, f"not a commit line ({exc})") from None
    if parsed.seq < 1:
        raise CorruptRecording(number, f"sequence {parsed.seq} < 1")
    try:
        commit = decode_commit(parsed.commit)
    except (UnsupportedSchemaVersion, UnknownEventType) as exc:
        raise UnsupportedRecording(number, str(exc)) from None
    except CodecError as exc:
        raise CorruptRecording(number, str(exc)) from None
    try:
        check_commit(commit)
    except AgentlogError as exc:  # InvalidCommit, InvalidId
        raise CorruptRecording(number, str(exc)) from None
    return StoredCommit(parsed.seq, commit)
