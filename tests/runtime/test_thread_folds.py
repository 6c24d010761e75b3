"""A start's fold of its thread (`agentlog.runtime.inputs.thread_folds`, `agentlog.runtime.loop.thread_fold`):
kept and extended by the commits after it, it answers what a fold of the whole thread answers.

- property: for generated histories, cut into pieces at random, the fold extended piece by piece
  has the same views, gives a new run the same context, and admits or refuses the same starts
  as the fold of all the commits; where it declines to extend (a commit of a run it holds no
  view of), that is true of the commit;
- `ThreadFolds` reads only the commits after the fold it keeps (an in-memory store counts them).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import (
    Commit,
    ContextCompacted,
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    StateCleared,
    StateWritten,
    StoredCommit,
    Termination,
    ThreadCreated,
)
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime.inputs.admission import check_fold, check_thread
from agentlog.runtime.inputs.thread_folds import ThreadFolds
from agentlog.runtime.loop.run_context import RunContext, fold_context
from agentlog.runtime.loop.thread_fold import ThreadFold
from agentlog.testing import generate_history, stored


def outcome(check: Any, *args: Any, **kwargs: Any) -> Any:
    """What a check answers: the view it returns, or the type and text of what it raises."""
    try:
        return check(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared, not handled
        return type(exc), str(exc)


def cuts(rng: random.Random, n: int) -> list[int]:
    return sorted({0, n, *(rng.randint(0, n) for _ in range(rng.randint(0, 4)))})


def compacted_tail(thread_id: str, after: int) -> list[StoredCommit]:
    """Thread-wide events the generator does not write: a state write and clear, a compaction."""
    return stored([
        Commit(commit_id="x1", thread_id=thread_id, run_id="rx", ts=1, events=[
            RunStarted(run_id="rx", agent_id="a"),
            MessageAppended(message=Message(id="mx", role="user", content="hi")),
            StateWritten(key="k", scope="thread", ops=[{"op": "add", "path": "/k", "value": 1}]),
            StateWritten(key="t", scope="thread", ops=[{"op": "add", "path": "/t", "value": 2}], transient=True),
            ContextCompacted(summary="s", upto_message_id="mx"),
        ]),
        Commit(commit_id="x2", thread_id=thread_id, run_id="rx", ts=2, events=[
            StateCleared(scope="thread", keys=["t"]),
            RunFinished(termination=Termination(type="natural_end")),
        ]),
    ], first_seq=after + 1)


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False))
def test_a_fold_extended_piece_by_piece_answers_what_the_whole_fold_answers(rng: random.Random) -> None:
    history = stored(generate_history(rng, threads=2, max_runs=4, max_steps=3))
    for thread_id in ("t0", "t1"):
        commits = [sc for sc in history if sc.commit.thread_id == thread_id]
        commits += compacted_tail(thread_id, history[-1].seq) if rng.random() < 0.5 else []
        whole = ThreadFold.of(thread_id, commits)
        fold: ThreadFold | None = ThreadFold.of(thread_id, [])
        points = cuts(rng, len(commits))
        for start, end in itertools.pairwise(points):
            assert fold is not None
            piece = commits[start:end]
            extended = fold.extended(piece)
            if extended is None:  # declined: a commit of a run it holds no view of, not starting it
                assert any(sc.commit.run_id not in fold.runs
                           and not any(type(e) is RunStarted for e in sc.commit.events) for sc in piece)
                fold = ThreadFold.of(thread_id, commits[:end])  # what `ThreadFolds.read` does then
            else:
                fold = extended
        assert fold is not None
        assert (fold.seq, fold.thread, fold.runs) == (whole.seq, whole.thread, whole.runs)
        assert fold.run_context("new") == fold_context(RunContext(thread_id=thread_id, run_id="new"), commits)
        run_ids = [None, "new", *{sc.commit.run_id for sc in commits if sc.commit.run_id}]
        for run_id in run_ids:
            for parent in (None, "nope", *run_ids[2:3]):
                assert outcome(check_fold, fold, run_id=run_id, parent_run_id=parent) == \
                    outcome(check_thread, thread_id, commits, run_id=run_id, parent_run_id=parent)


class _CountingStore(MemoryEventStore):
    """Counts the commits its thread reads yield."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0

    async def read_thread(self, thread_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:  # type: ignore[override]
        async for sc in super().read_thread(thread_id, after):
            self.read += 1
            yield sc


def test_thread_folds_read_only_the_commits_after_the_fold_they_keep() -> None:
    async def go() -> None:
        store = _CountingStore()
        folds = ThreadFolds(ThreadFold)
        version = 0
        for n in range(5):
            events: list[Any] = [ThreadCreated()] if n == 0 else []
            events += [RunStarted(run_id=f"r{n}", agent_id="a"),
                       MessageAppended(message=Message(id=f"m{n}", role="user", content="hi")),
                       RunFinished(termination=Termination(type="natural_end"))]
            version = (await store.append(Commit(commit_id=f"c{n}", thread_id="t", run_id=f"r{n}", ts=n,
                                                 events=events), expected_version=version)).seq
            before = store.read
            fold = await folds.read(store, "t")
            assert store.read - before == 1  # the new commit only
            assert [m.id for m in fold.run_context("next").messages] == [f"m{i}" for i in range(n + 1)]
        assert await ThreadFolds(ThreadFold, size=0).read(store, "t") == fold
        assert store.read == 5 + 5  # a fold kept by none reads the whole thread

    asyncio.run(go())


async def _thread_with(store: MemoryEventStore, thread_id: str, messages: int) -> None:
    version = 0
    for n in range(messages):
        events: list[Any] = [ThreadCreated()] if n == 0 else []
        events += [RunStarted(run_id=f"{thread_id}r{n}", agent_id="a"),
                   MessageAppended(message=Message(id=f"{thread_id}m{n}", role="user", content="hi")),
                   RunFinished(termination=Termination(type="natural_end"))]
        version = (await store.append(Commit(commit_id=f"{thread_id}c{n}", thread_id=thread_id, run_id=f"{thread_id}r{n}",
                                             ts=n, events=events), expected_version=version)).seq


def test_thread_folds_keep_at_most_their_messages_dropping_the_least_recent_first() -> None:
    async def go() -> None:
        store = _CountingStore()
        for thread_id, messages in (("a", 2), ("b", 2), ("c", 4)):
            await _thread_with(store, thread_id, messages)
        folds = ThreadFolds(ThreadFold, size=10, messages=3)

        async def commits_read(thread_id: str) -> int:
            before = store.read
            await folds.read(store, thread_id)
            return store.read - before

        assert [await commits_read("a"), await commits_read("a")] == [2, 0]  # kept
        assert await commits_read("b") == 2  # kept: 4 messages now, over 3, so a is dropped
        assert [await commits_read("b"), await commits_read("a")] == [0, 2]
        assert [await commits_read("c"), await commits_read("c")] == [4, 4]  # 4 alone: never kept

    asyncio.run(go())
