"""A thread as a start needs it, folded once per process and extended by its new commits.

A start reads its thread to admit the run (`agentlog.runtime.inputs.admission.check_fold`: is
the thread deleted, the run id taken, another run running?) and, in the process that drives
it, to give the run its context (`agentlog.runtime.loop.thread_fold`). Both are left folds of the
thread's commits, so a process keeps them per thread as of the last commit it folded
(`ThreadFolds`, an LRU), and the next start on the thread reads only the commits after that
one: a start costs its thread's new commits, not its whole history.

Exact by construction: a fold extended by the commits after it is the fold of all of them (a
property test compares it with a fold from seq 1). The views kept are the thread's and its
unfinished runs'; a new commit of a run they do not hold (a finished run written to again)
makes the read take the whole thread instead.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from agentlog.eventlog.events import RunStarted, StoredCommit
from agentlog.eventlog.store import EventStore
from agentlog.projections.fold import fold_commits
from agentlog.projections.views import RunView, ThreadView

#: Threads a process keeps folded, and the messages their folds may hold together (a fold's
#: `weight`): the least recently started on are dropped first.
THREAD_FOLDS = 1024
KEPT_MESSAGES = 50_000

Fold = TypeVar("Fold", bound="ThreadViews")


@dataclass(frozen=True)
class ThreadViews:
    """A thread's views folded up to `seq` (0: it has no commits): its own (None when it has
    none) and its unfinished runs'."""

    thread_id: str
    seq: int = 0
    thread: ThreadView | None = None
    runs: Mapping[str, RunView] = field(default_factory=dict)

    @property
    def weight(self) -> int:
        """What keeping this fold costs, in messages held (views hold none)."""
        return 0

    @classmethod
    def of(cls: type[Fold], thread_id: str, history: Sequence[StoredCommit]) -> Fold:
        """The fold of a thread's whole history."""
        return cls(thread_id)._folded(history)

    def extended(self: Fold, commits: Sequence[StoredCommit]) -> Fold | None:
        """This fold with `commits` (the thread's commits after `seq`, in log order) folded on;
        None if one belongs to a run this fold holds no view of and does not start it."""
        known = set(self.runs)
        for stored in commits:
            run_id = stored.commit.run_id
            if run_id is not None and run_id not in known:
                if not any(type(event) is RunStarted for event in stored.commit.events):
                    return None
                known.add(run_id)
        return self._folded(commits)

    def _folded(self: Fold, commits: Sequence[StoredCommit]) -> Fold:
        if not commits:
            return self
        views = fold_commits(commits, {self.thread_id: self.thread} if self.thread is not None else None, self.runs)
        runs = {run_id: view for run_id, view in views.runs.items() if not view.finished}
        return dataclasses.replace(self, seq=commits[-1].seq, thread=views.threads.get(self.thread_id), runs=runs)


class ThreadFolds(Generic[Fold]):
    """The folds (`kind`) of the threads this process started runs on, kept up to `size` of them
    and `messages` of their weight (LRU; 0 keeps none)."""

    def __init__(self, kind: type[Fold], size: int = THREAD_FOLDS, messages: int = KEPT_MESSAGES) -> None:
        self.kind = kind
        self.size = size
        self.messages = messages
        self._kept: OrderedDict[str, Fold] = OrderedDict()
        self._weight = 0

    async def read(self, store: EventStore, thread_id: str) -> Fold:
        """The thread folded up to its last commit now: the kept fold and the commits after it,
        else the whole thread."""
        kept = self._kept.get(thread_id)
        fold = None
        if kept is not None:
            fold = kept.extended([stored async for stored in store.read_thread(thread_id, after=kept.seq)])
        if fold is None:
            fold = self.kind.of(thread_id, [stored async for stored in store.read_thread(thread_id)])
        self._keep(fold)
        return fold

    def _keep(self, fold: Fold) -> None:
        kept = self._kept.pop(fold.thread_id, None)
        if kept is not None:
            self._weight -= kept.weight
            if kept.seq > fold.seq:  # two starts at once: the later fold stays
                fold = kept
        if self.size <= 0 or fold.weight > self.messages:
            return
        self._kept[fold.thread_id] = fold
        self._weight += fold.weight
        while len(self._kept) > self.size or self._weight > self.messages:
            self._weight -= self._kept.popitem(last=False)[1].weight


__all__ = ["KEPT_MESSAGES", "THREAD_FOLDS", "ThreadFolds", "ThreadViews"]
