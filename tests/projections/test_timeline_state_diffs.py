"""Property: the inspector's per-event state diffs (`agentlog.projections.timeline.event_state_diffs`) are the
state history of the run. Applied in log order to the state before the run, they give the state
the replay report ends with; only state events carry one. Pure: commits built in memory."""

from __future__ import annotations

from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import (
    Commit,
    Position,
    RunStarted,
    StatePatched,
    StateReplaced,
    StepStarted,
    StoredCommit,
    ThreadCreated,
)
from agentlog.projections import run_at, state_at, states_along
from agentlog.projections.timeline import build_replay, event_state_diffs

KEYS = st.sampled_from(["/a", "/b", "/c"])
OPS = st.one_of(
    st.builds(lambda p, v: {"op": "add", "path": p, "value": v}, KEYS, st.integers(0, 3)),
    st.builds(lambda p: {"op": "remove", "path": p}, KEYS),  # may not exist: a rejected patch, no diff
)
SCOPE = st.sampled_from(["thread", "run"])
EVENTS = st.one_of(
    st.builds(StatePatched, ops=st.lists(OPS, min_size=1, max_size=3), scope=SCOPE),
    st.builds(StateReplaced, state=st.dictionaries(st.sampled_from("ab"), st.integers(0, 3), max_size=2),
              scope=SCOPE),
    st.builds(StepStarted, step=st.integers(1, 3)),
)


def commits_of(batches: list[list[Any]]) -> list[StoredCommit]:
    first = [ThreadCreated(), RunStarted(run_id="r1", agent_id="a")]
    return [StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id="t1", run_id="r1", ts=seq, events=events))
            for seq, events in enumerate([first, *batches], start=1)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(EVENTS, min_size=1, max_size=3), max_size=6))
def test_event_diffs_replay_the_state_history(batches: list[list[Any]]) -> None:
    commits = commits_of(batches)
    report = build_replay("r1", commits)
    diffs = event_state_diffs(report, commits)
    state: dict[str, Any] = {"thread": {}, "run": {}}
    for group in report.groups:
        for item in group.events:
            patch = diffs.get(str(item.position))
            if patch is not None:
                assert isinstance(item.event, (StatePatched, StateReplaced)) and patch
                state = jsonpatch.apply_patch(state, patch)
    assert state == report.state


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(EVENTS, min_size=1, max_size=3), max_size=6), st.data())
def test_one_fold_gives_the_state_of_every_position(batches: list[list[Any]], data: st.DataObject) -> None:
    """`states_along` (one fold for all the inspector's positions) equals folding the log up to
    each position on its own (`state_at` / `run_at`), at event positions and between them."""
    commits = commits_of(batches)
    last = commits[-1].seq
    wanted = data.draw(st.lists(st.builds(Position, st.integers(1, last + 1), st.integers(0, 4)), max_size=12))
    got = states_along(commits, "t1", "r1", wanted)
    for position in wanted:
        run = run_at(commits, "r1", position)
        assert got[position] == {"thread": state_at(commits, "t1", position), "run": run.state if run else {}}
