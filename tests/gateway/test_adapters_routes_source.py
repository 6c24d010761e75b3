"""`source.Merge`: the order a route's translators see one run's committed events and live
deltas in (pure: fed by hand, as the log follower and the live subscription would)."""

from __future__ import annotations

from typing import Any

from agentlog.eventlog.events import (
    Commit,
    RunFinished,
    StepStarted,
    StoredCommit,
    Termination,
    ToolCallCompleted,
)
from agentlog.gateway.adapters.source import Merge
from agentlog.runtime import CommittedEvent


def sc(seq: int, *events: Any, run_id: str = "r1") -> StoredCommit:
    return StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id="t1", run_id=run_id, ts=0, events=list(events)))


def feed(merge: Merge, items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        out += merge.live(item) if isinstance(item, dict) else merge.commit(item)
    return [o.event if isinstance(o, CommittedEvent) else o for o in out]


def test_late_live_items_are_dropped_and_the_stream_ends_at_the_stop() -> None:
    early = {"type": "text_delta", "step": 1, "text": "a"}
    late = {"type": "text_delta", "step": 1, "text": "b"}
    next_step = {"type": "text_delta", "step": 2, "text": "c"}
    progress_late = {"type": "tool_progress", "call_id": "c1", "data": 1}
    progress_ok = {"type": "tool_progress", "call_id": "c2", "data": 1}
    started, completed = StepStarted(step=1), ToolCallCompleted(call_id="c1", outcome="succeeded")
    finished = RunFinished(termination=Termination(type="natural_end"))
    merge = Merge("r1")
    got = feed(merge, [early, sc(2, started), late, sc(3, completed), progress_late, progress_ok, next_step,
                       sc(4, finished), {"type": "text_delta", "step": 9, "text": "after the end"}])
    assert got == [early, started, completed, progress_ok, next_step, finished]
    assert merge.ended


def test_deltas_wait_for_the_commit_they_follow() -> None:
    """A worker's next step streams before the follow delivers the step before it: its deltas
    are held until the commit they follow (`seq`), then released in their own order."""
    step1 = StepStarted(step=1)
    done = ToolCallCompleted(call_id="c1", outcome="succeeded")
    d2 = [{"type": "text_delta", "step": 2, "text": t, "seq": 3} for t in ("x", "y")]
    merge = Merge("r1", after=1)
    assert feed(merge, d2) == []
    assert feed(merge, [sc(2, step1)]) == [step1]
    assert feed(merge, [sc(3, done, run_id="other")]) == d2  # the position counts, whatever run
    assert feed(merge, [{"type": "text_delta", "step": 2, "text": "z", "seq": 3}])[0]["text"] == "z"


def test_deltas_without_a_seq_pass_at_once_but_keep_their_order() -> None:
    held = {"type": "text_delta", "step": 1, "text": "a", "seq": 5}
    bare = {"type": "tool_progress", "call_id": "c9"}
    merge = Merge("r1", after=2)
    assert feed(merge, [bare]) == [bare]
    assert feed(merge, [held, bare]) == []
    assert feed(merge, [sc(5)]) == [held, bare]
    assert feed(merge, [sc(4)]) == []  # at or below the position: already passed
