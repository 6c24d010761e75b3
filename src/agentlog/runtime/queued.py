"""Messages for a run that is running: steering and follow-ups, recorded in the log.

    res = await runtime.queue_messages(run_id, "also check the staging cluster", mode="steer")

A queued message is a `MessageQueued` commit on the run (the log is the queue): the loop folds it
(`RunContext.queued`) and takes it as a user message at its next step boundary (`steer`) or
when it would otherwise end naturally (`follow_up`; the run then goes on instead of ending).
Whoever drives the run, in any process, finds it there: a run resumed from the log after its
worker died takes it like the loop that was running would have. Recording is idempotent on the
message ids (a retried request with the same ids records nothing more), and is refused once the
run has finished (`RunEnded`): what the caller sent would never be read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from agentlog.eventlog.events import (
    Commit,
    Message,
    MessageAppended,
    MessageQueued,
    QueueMode,
    RunFinished,
    StoredCommit,
)
from agentlog.eventlog.store import EventStore
from agentlog.runtime.errors import RunEnded, RunNotFound, retry_on_conflict
from agentlog.runtime.loop.entropy import Entropy


class Queued(NamedTuple):
    """Where queued messages landed: the commit that recorded them (for a pure duplicate, the
    commit that recorded the first of them) and the run's thread."""

    thread_id: str
    seq: int
    duplicate: bool = False
    message_ids: tuple[str, ...] = ()


def recorded_ids(commits: Sequence[StoredCommit]) -> dict[str, int]:
    """Message id -> seq of the run's commit that queued (or appended) it."""
    seen: dict[str, int] = {}
    for sc in commits:
        for ev in sc.commit.events:
            if type(ev) is MessageQueued or type(ev) is MessageAppended:
                seen.setdefault(ev.message.id, sc.seq)
    return seen


async def queue_messages(store: EventStore, entropy: Entropy, run_id: str, thread_id: str,
                         messages: Sequence[Message], mode: QueueMode) -> Queued:
    """Append one `MessageQueued` commit for `messages` on run `run_id` unless it has finished
    (`RunEnded`). The version is read before the run: if the run finishes after that read, the
    append conflicts and we look again, so a queued message never lands after `RunFinished`."""
    ids = tuple(m.id for m in messages)

    async def attempt(_i: int) -> Queued:
        version = await store.thread_version(thread_id)
        commits = [sc async for sc in store.read_run(run_id)]
        if not commits:
            raise RunNotFound(f"unknown run {run_id!r}")
        seen = recorded_ids(commits)
        new = [m for m in messages if m.id not in seen]
        if not new:
            return Queued(thread_id, seen[messages[0].id], True, ids)
        if any(type(e) is RunFinished for sc in commits for e in sc.commit.events):
            raise RunEnded(f"run {run_id!r} has already finished: nothing can be queued for it "
                           "(continue the thread with a new run instead)")
        commit = Commit(commit_id=entropy.new_id(), thread_id=thread_id, run_id=run_id, ts=entropy.now_ms(),
                        events=[MessageQueued(message=m, mode=mode) for m in new])
        res = await store.append(commit, version)
        return Queued(thread_id, res.seq, False, ids)

    return await retry_on_conflict(attempt, f"queue messages for run {run_id!r}")
