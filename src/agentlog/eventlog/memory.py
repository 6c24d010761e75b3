"""In-memory `EventStore` with the same semantics as the JetStream one. For pure unit tests only.

It enforces the same id rules, OCC, idempotent retries and (optionally) a max payload, so the
shared contract suite can run against both stores.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agentlog.eventlog.codec import decode_commit, decode_profile_commit, encode_profile_commit
from agentlog.eventlog.errors import CommitTooLarge, VersionConflict
from agentlog.eventlog.events import AppendResult, Commit, ProfileCommit, StoredCommit, StoredProfileCommit
from agentlog.eventlog.ids import validate_id
from agentlog.eventlog.store import check_profile_commit, encode_checked


class MemoryEventStore:
    def __init__(self, max_payload: int = 1024 * 1024) -> None:
        self.max_payload = max_payload
        self._log: list[StoredCommit] = []
        self._by_commit_id: dict[str, int] = {}
        self._thread_version: dict[str, int] = {}
        self._changed = asyncio.Condition()
        #: The profiles' stream (its own sequence numbers, as the JetStream store's own stream).
        self._profiles: list[StoredProfileCommit] = []
        self._profile_commit_ids: dict[str, int] = {}
        self._profile_version: dict[str, int] = {}

    async def append(self, commit: Commit, expected_version: int | None) -> AppendResult:
        data = encode_checked(commit)
        if len(data) > self.max_payload:
            raise CommitTooLarge(len(data), self.max_payload)
        if commit.commit_id in self._by_commit_id:
            return AppendResult(self._by_commit_id[commit.commit_id], duplicate=True)
        actual = self._thread_version.get(commit.thread_id, 0)
        if expected_version is not None and expected_version != actual:
            raise VersionConflict(commit.thread_id, expected_version, actual)
        seq = len(self._log) + 1
        # Store what a reader of the real log would get back: the decoded bytes.
        self._log.append(StoredCommit(seq, decode_commit(data)))
        self._by_commit_id[commit.commit_id] = seq
        self._thread_version[commit.thread_id] = seq
        async with self._changed:
            self._changed.notify_all()
        return AppendResult(seq)

    async def read_thread(self, thread_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        validate_id(thread_id, "thread_id")
        for sc in self._log[after:]:
            if sc.commit.thread_id == thread_id:
                yield sc

    async def read_run(self, run_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        validate_id(run_id, "run_id")
        for sc in self._log[after:]:
            if sc.commit.run_id == run_id:
                yield sc

    async def follow(self, thread_id: str | None = None, after: int = 0) -> AsyncIterator[StoredCommit]:
        if thread_id is not None:
            validate_id(thread_id, "thread_id")
        position = after
        while True:
            while position < len(self._log):
                sc = self._log[position]
                position += 1
                if thread_id is None or sc.commit.thread_id == thread_id:
                    yield sc
            async with self._changed:
                await self._changed.wait_for(lambda: position < len(self._log))  # noqa: B023  (awaited here)

    async def thread_version(self, thread_id: str) -> int:
        validate_id(thread_id, "thread_id")
        return self._thread_version.get(thread_id, 0)

    async def last_seq(self) -> int:
        return len(self._log)

    # -- profiles (`ProfileStore`) ---------------------------------------------------------------

    async def append_profile(self, commit: ProfileCommit, expected_version: int | None) -> AppendResult:
        check_profile_commit(commit)
        if commit.commit_id in self._profile_commit_ids:
            return AppendResult(self._profile_commit_ids[commit.commit_id], duplicate=True)
        actual = self._profile_version.get(commit.profile_id, 0)
        if expected_version is not None and expected_version != actual:
            raise VersionConflict(commit.profile_id, expected_version, actual)
        seq = len(self._profiles) + 1
        self._profiles.append(StoredProfileCommit(seq, decode_profile_commit(encode_profile_commit(commit))))
        self._profile_commit_ids[commit.commit_id] = seq
        self._profile_version[commit.profile_id] = seq
        return AppendResult(seq)

    async def read_profile(self, profile_id: str, after: int = 0) -> AsyncIterator[StoredProfileCommit]:
        for sc in self._profiles[after:]:
            if sc.commit.profile_id == profile_id:
                yield sc
