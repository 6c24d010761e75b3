"""The `EventStore` protocol and the commit checks every implementation shares.

A thread's *version* is the stream sequence of its last commit (0 for a thread with none).
`append(commit, expected_version)` succeeds only if the thread is still at `expected_version`;
`expected_version=None` skips the check (use it only for writers that cannot race, e.g. imports).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol, TypeVar, cast, runtime_checkable

import msgspec

from agentlog.eventlog.codec import decode_commit, encode_commit
from agentlog.eventlog.errors import CodecError, InvalidCommit
from agentlog.eventlog.events import (
    AppendResult,
    Commit,
    CommitQuarantined,
    ProfileCommit,
    RunStarted,
    StoredCommit,
    StoredProfileCommit,
)
from agentlog.eventlog.ids import validate_id, validate_run_id


@runtime_checkable
class EventStore(Protocol):
    async def append(self, commit: Commit, expected_version: int | None) -> AppendResult:
        """Append atomically under per-thread OCC; a retry of the same `commit_id` is a no-op
        that returns the original sequence with `duplicate=True`."""
        ...

    def read_thread(self, thread_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        """Commits of a thread with seq > `after`, in log order, up to the end at call time."""
        ...

    def read_run(self, run_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        """Commits of one run with seq > `after`, in log order."""
        ...

    def follow(self, thread_id: str | None = None, after: int = 0) -> AsyncIterator[StoredCommit]:
        """Commits with seq > `after` (of one thread, or of all threads), then tail new ones
        forever; survives reconnects without gaps or repeats. Stop by breaking out / cancelling."""
        ...

    async def thread_version(self, thread_id: str) -> int:
        """Sequence of the thread's last commit, 0 if it has none."""
        ...

    async def last_seq(self) -> int:
        """Sequence of the last commit in the whole log, 0 if empty."""
        ...


@runtime_checkable
class ProfileStore(Protocol):
    """A store that also keeps profiles: one stream of `ProfileCommit`s per profile id, with
    its own sequence numbers and optimistic concurrency per profile (a profile's version is the
    sequence of its last commit, 0 for none)."""

    async def append_profile(self, commit: ProfileCommit, expected_version: int | None) -> AppendResult:
        """Append under per-profile OCC (`VersionConflict`); a retry of the same `commit_id`
        answers the original sequence with `duplicate=True`."""
        ...

    def read_profile(self, profile_id: str, after: int = 0) -> AsyncIterator[StoredProfileCommit]:
        """The profile's commits with seq > `after`, in order, up to the end at call time."""
        ...


#: The longest profile id (a thread's `resource_id`).
MAX_PROFILE_ID = 256


def check_profile_commit(commit: ProfileCommit) -> None:
    """Reject a profile commit that breaks the envelope's invariants, before it is published."""
    validate_id(commit.commit_id, "commit_id")
    if not isinstance(commit.profile_id, str) or not 0 < len(commit.profile_id) <= MAX_PROFILE_ID:
        raise InvalidCommit(f"a profile id is 1-{MAX_PROFILE_ID} characters")
    if not commit.events:
        raise InvalidCommit("a profile commit holds at least one write")
    for event in commit.events:
        if event.scope != "profile" or event.profile_id not in (None, commit.profile_id):
            raise InvalidCommit(f"a profile commit holds writes of its profile only, not {event.scope!r} scope "
                                f"of {event.profile_id!r}")


def check_commit(commit: Commit) -> None:
    """Reject a commit that breaks the envelope's invariants, before anything is published."""
    validate_id(commit.commit_id, "commit_id")
    validate_id(commit.thread_id, "thread_id")
    if commit.run_id is not None:
        validate_run_id(commit.run_id)
    if not commit.events:
        raise InvalidCommit("a commit holds at least one event")
    for event in commit.events:
        if isinstance(event, CommitQuarantined):
            raise InvalidCommit("CommitQuarantined stands in for an undecodable message, made by readers; "
                                "no writer may append one")
        if isinstance(event, RunStarted):
            validate_run_id(event.run_id)
            if event.run_id != commit.run_id:
                raise InvalidCommit(
                    f"RunStarted for run {event.run_id!r} in a commit of run {commit.run_id!r}"
                )
            validate_id(event.agent_id, "agent_id")


def encode_checked(commit: Commit) -> bytes:
    """`check_commit`, encode, and prove the bytes decode back before anything is published.

    msgspec does not validate field types when a Struct is constructed, so a commit built with a
    value outside its type (a role or outcome not in its Literal, a non-JSON value) would otherwise
    reach the log and break every reader after it. One extra decode per append buys "every commit
    in the log can be read".
    """
    check_commit(commit)
    try:
        data = encode_commit(commit)
    except (TypeError, msgspec.EncodeError, UnicodeError, RecursionError) as exc:
        # UnicodeError: a lone surrogate in some string; RecursionError: absurd nesting
        raise InvalidCommit(f"commit {commit.commit_id!r} cannot be encoded: {exc}") from None
    try:
        decode_commit(data)
    except CodecError as exc:
        raise InvalidCommit(f"commit {commit.commit_id!r} would not decode: {exc}") from None
    return data


_T = TypeVar("_T")


def as_generator(commits: AsyncIterator[_T]) -> AsyncGenerator[_T, None]:
    """`commits` (from a store's `read_thread` / `read_run` / `follow`) typed as what it is: every
    store implements those as async generators, which callers close with `aclose()` /
    `contextlib.aclosing`, but the protocol and its implementations declare only `AsyncIterator`.
    Returns its argument unchanged; a caller that needs `aclose()` says so here rather than with a
    cast of its own."""
    return cast("AsyncGenerator[_T, None]", commits)


async def collect(commits: AsyncIterator[StoredCommit]) -> list[StoredCommit]:
    return [c async for c in commits]


async def first_commit(commits: AsyncIterator[StoredCommit]) -> StoredCommit | None:
    """The first of `commits` (a store's `read_run` / `read_thread`), or None when there is none;
    the read is closed here, in the caller's task, rather than left to the garbage collector
    (which asyncio closes later, in a task of its own, after a wake-up of its loop)."""
    reader = as_generator(commits)
    try:
        async for sc in reader:
            return sc
        return None
    finally:
        await reader.aclose()
