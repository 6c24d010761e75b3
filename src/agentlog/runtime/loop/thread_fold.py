"""`ThreadFold`: a thread's views and the thread-wide part of a run context, folded together
(`agentlog.runtime.inputs.thread_folds` says why and how they are kept): what `Runtime.start`
admits a run on and gives it as its context."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentlog.eventlog.events import StoredCommit
from agentlog.runtime.inputs.thread_folds import ThreadViews
from agentlog.runtime.loop.run_context import RunContext, fold_context

#: The run id the kept context is folded for: no commit's, so only the thread-wide parts fold
#: (what a new run's context holds before its own first commit).
NO_RUN = ""


@dataclass(frozen=True)
class ThreadFold(ThreadViews):
    """`ThreadViews` and `context`: the thread's commits folded for no run (`NO_RUN`)."""

    context: RunContext = field(kw_only=True, default_factory=lambda: RunContext(thread_id="", run_id=NO_RUN))

    @property
    def weight(self) -> int:
        return len(self.context.messages)

    def _folded(self, commits: Sequence[StoredCommit]) -> ThreadFold:
        if not commits:
            return self
        folded = super()._folded(commits)
        return dataclasses.replace(folded, context=fold_context(self._context_for(NO_RUN), commits))

    def run_context(self, run_id: str) -> RunContext:
        """The context of a new run `run_id` on this thread, before its first commit: what
        folding the thread's history for it gives (the history holds none of its commits)."""
        return self._context_for(run_id)

    def _context_for(self, run_id: str) -> RunContext:
        kept = self.context
        # each context appends to its own list of messages; a state is replaced by every change,
        # never changed in place (`agentlog.projections.state`), so it is shared
        return RunContext(thread_id=self.thread_id, run_id=run_id, thread_exists=kept.thread_exists,
                          resource_id=kept.resource_id, messages=list(kept.messages), state=kept.state,
                          compaction=kept.compaction)


__all__ = ["NO_RUN", "ThreadFold"]
