"""`first_commit`: the first commit of a read, or None, and the read closed in the caller's
task before it returns (a read left open is closed by asyncio later, in a task of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentlog.eventlog.events import Commit, StepStarted, StoredCommit
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.eventlog.store import first_commit

pytestmark = pytest.mark.asyncio


def stored(seq: int) -> StoredCommit:
    return StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id="t", run_id="r", ts=0, events=[StepStarted(step=1)]))


async def test_the_first_commit_and_the_read_closed_in_the_callers_task() -> None:
    closed_in: list[asyncio.Task[object] | None] = []

    async def read() -> AsyncIterator[StoredCommit]:
        try:
            for seq in (3, 4, 5):
                yield stored(seq)
        finally:
            closed_in.append(asyncio.current_task())

    first = await first_commit(read())
    assert first is not None and first.seq == 3
    assert closed_in == [asyncio.current_task()]


async def test_none_when_the_read_is_empty() -> None:
    store = MemoryEventStore()
    assert await first_commit(store.read_run("nobody")) is None
    await store.append(stored(1).commit, None)
    found = await first_commit(store.read_run("r"))
    assert found is not None and found.commit.commit_id == "c1"
