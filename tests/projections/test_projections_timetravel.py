"""Time travel: thread state, messages and runs as of every event position of a recorded
multi-run thread equal the per-event fold of the events up to that position."""

from __future__ import annotations

import random

import pytest

from agentlog.eventlog import MemoryEventStore, Position, collect
from agentlog.eventlog.events import MessageAppended, StoredCommit
from agentlog.projections import (
    RunView,
    ThreadView,
    fold_messages,
    fold_run,
    fold_thread,
    messages_at,
    positions,
    run_at,
    runs_at,
    state_at,
    thread_at,
)
from agentlog.testing.synth import generate_history


async def recorded(seed: int) -> tuple[str, list[StoredCommit]]:
    """Append a generated history (3 interleaved threads, several runs each) to a store and read
    back one thread, as the gateway would for `?at=`."""
    store = MemoryEventStore()
    history = generate_history(random.Random(seed), threads=3, max_runs=4, max_steps=3)
    versions: dict[str, int] = {}
    for commit in history:
        res = await store.append(commit, versions.get(commit.thread_id, 0))
        versions[commit.thread_id] = res.seq
    thread_id = max(versions, key=lambda t: sum(1 for c in history if c.thread_id == t))
    return thread_id, await collect(store.read_thread(thread_id))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_position_equals_the_fold_up_to_it(seed):
    thread_id, commits = await recorded(seed)
    all_positions = positions(commits)
    assert len({sc.commit.run_id for sc in commits} - {None}) >= 2, "want a multi-run thread"
    assert len(all_positions) > 20

    thread = ThreadView(thread_id=thread_id)
    runs: dict[str, RunView] = {}
    messages: list = []
    flat = [(p, sc, ev) for sc in commits for p, ev in sc.positioned()]
    for position, sc, event in flat:
        c = sc.commit
        thread = fold_thread(thread, event, sc.seq, c.ts, c.run_id)
        if c.run_id:
            runs[c.run_id] = fold_run(runs.get(c.run_id) or RunView(run_id=c.run_id, thread_id=thread_id),
                                      event, sc.seq, c.ts)
        messages = list(fold_messages(messages, event))

        assert state_at(commits, thread_id, position) == thread.state, position
        assert thread_at(commits, thread_id, position) == thread, position
        assert messages_at(commits, thread_id, position) == messages, position
        assert runs_at(commits, position) == runs, position
        if c.run_id:
            assert run_at(commits, c.run_id, position) == runs[c.run_id]


async def test_positions_before_and_after():
    thread_id, commits = await recorded(4)
    first = commits[0]
    assert state_at(commits, thread_id, Position(first.seq, 0)) == {}
    assert runs_at(commits, Position(1, 0)) == {} or first.commit.run_id is not None
    last = positions(commits)[-1]
    everything = messages_at(commits, thread_id)
    assert messages_at(commits, thread_id, last) == everything
    assert everything == [e.message for sc in commits for e in sc.commit.events if isinstance(e, MessageAppended)]
    # A position past the end (or at an index beyond a commit's events) is the whole history.
    assert thread_at(commits, thread_id, Position(last.seq + 100, 0)) == thread_at(commits, thread_id, last)
    assert thread_at(commits, thread_id, Position(last.seq, 99)) == thread_at(commits, thread_id, last)
