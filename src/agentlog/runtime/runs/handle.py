"""A run as its caller holds it: `RunHandle` (its commits as the loop appends them, its view, its
end) and `RunResult` (how it ended, or stopped to wait)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NamedTuple

from agentlog.eventlog.events import AnyEvent, Position, StoredCommit, Termination
from agentlog.eventlog.store import as_generator
from agentlog.projections.fold import RunFolder
from agentlog.projections.views import RunView
from agentlog.runtime.loop.driver import RunLoop
from agentlog.runtime.loop.run_context import RunContext
from agentlog.runtime.snapshots.format import LoadedSnapshot, with_finished_calls


class CommittedEvent(NamedTuple):
    """One event of a run as committed: its position in the log and the commit's timestamp."""

    position: Position
    event: AnyEvent
    ts: int


class RunResult:
    """How a run ended, or stopped to wait. `termination` is None while the run is `waiting`
    (suspended calls).

    `run`, the run view, is built when first read (then kept): for a run resumed from a snapshot
    that decodes the views of all its finished calls, which a caller that wants the status (a
    worker settling a command) or nothing at all never pays for. It is the view as of the
    result, whatever the run did since."""

    __slots__ = ("_run", "_view_of", "run_id", "status", "termination", "thread_id")

    def __init__(self, run_id: str, thread_id: str, status: str, termination: Termination | None,
                 run: RunView | None = None, *, view_of: Callable[[], RunView] | None = None) -> None:
        if (run is None) == (view_of is None):
            raise TypeError("RunResult needs the run view or view_of, the function that builds it")
        self.run_id = run_id
        self.thread_id = thread_id
        self.status = status
        self.termination = termination
        self._run = run
        self._view_of = view_of

    @property
    def run(self) -> RunView:
        if self._run is None:
            assert self._view_of is not None  # one of them is always set
            self._run, self._view_of = self._view_of(), None
        return self._run

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunResult):
            return NotImplemented
        return (self.run_id, self.thread_id, self.status, self.termination, self.run) == (
            other.run_id, other.thread_id, other.status, other.termination, other.run)

    __hash__ = None  # type: ignore[assignment]  # like the view it holds

    def __repr__(self) -> str:
        return (f"RunResult(run_id={self.run_id!r}, thread_id={self.thread_id!r}, status={self.status!r}, "
                f"termination={self.termination!r}, run={self.run!r})")


class RunHandle:
    """A started run: its commits as the loop appends them (`commits`, `events()`, which can be
    iterated any number of times, from the start), its view so far (`view()`, `status`) and its
    end (`result()`).

    The view is folded incrementally (each commit once, `RunFolder`), so it costs the same at
    step 2 and step 230. A handle resumed from a snapshot starts from the snapshot's view as of
    `base_seq` (`base`); `events()` then reads the older commits from the log (`older`). Such a
    base may leave out the run's finished calls (`finished`, kept in chunks): they are decoded
    and joined only when the whole view is asked for, never to drive the run or tell its status
    (see `_whole_view`)."""

    def __init__(
        self, run_id: str, thread_id: str, agent_id: str, *, base: RunView | None = None,
        finished: LoadedSnapshot | None = None,
        base_seq: int = 0, older: Callable[[], AsyncIterator[StoredCommit]] | None = None,
    ) -> None:
        self.run_id = run_id
        self.thread_id = thread_id
        self.agent_id = agent_id
        self.commits: list[StoredCommit] = []
        self.base_seq = base_seq
        self._older = older
        self._finished = finished
        self._base = base if base is not None else RunView(run_id=run_id, thread_id=thread_id)
        self._folder = RunFolder(self._base)
        #: The last whole view built (`view()`), and the folded view it was built from.
        self._whole: tuple[RunView, RunView] | None = None
        self._changed = asyncio.Event()
        self._done = False
        self._task: asyncio.Task[RunContext] | None = None
        self._loop: RunLoop | None = None
        #: The snapshot chunks already in the store (digest -> key: those of the snapshot this
        #: handle resumed from): the run's next snapshot does not write them again, and purges
        #: those it no longer names.
        self.stored_chunks: Mapping[str, str] = {}

    def request_cancel(self) -> bool:
        """Signal the run's loop in this process to cancel, without appending anything (the
        loop commits its cancelled finish itself). For callers that already have the cancel in
        the log, e.g. verified replay feeding a recorded `RunCancelRequested`. Returns False if
        the run is not being driven here (done, or a handle without a loop)."""
        if self._loop is None or self._done:
            return False
        self._loop.request_cancel()
        return True

    def on_commit(self, stored: StoredCommit) -> None:
        """Take one commit of the run (the loop's callback)."""
        self.commits.append(stored)
        self._folder.apply(stored)
        self._changed.set()

    def _close(self, _task: Any = None) -> None:
        self._done = True
        self._changed.set()

    def attach(self, loop: RunLoop, task: asyncio.Task[RunContext]) -> None:
        """Drive this handle by `loop`, run in `task`: its commits reach the handle through the
        loop's `on_commit` (`on_commit`), and the handle is done when the task is."""
        self._loop = loop
        self._task = task
        task.add_done_callback(self._close)

    async def events(self) -> AsyncIterator[CommittedEvent]:
        """The run's committed events in log order; ends when the run finishes or waits."""
        if self._older is not None:
            async with contextlib.aclosing(as_generator(self._older())) as older:
                async for sc in older:
                    if sc.seq > self.base_seq:
                        break
                    for i, ev in enumerate(sc.commit.events):
                        yield CommittedEvent(Position(sc.seq, i), ev, sc.commit.ts)
        index = 0
        while True:
            while index < len(self.commits):
                sc = self.commits[index]
                index += 1
                for i, ev in enumerate(sc.commit.events):
                    yield CommittedEvent(Position(sc.seq, i), ev, sc.commit.ts)
            if self._done:
                return
            self._changed.clear()
            await self._changed.wait()

    async def result(self) -> RunResult:
        """Wait for the run to finish (or suspend); raises what ended it abnormally
        (e.g. `RunConflict`). The result's status is known at once; its run view is built when
        first read (see `RunResult`)."""
        assert self._task is not None
        ctx = await asyncio.shield(self._task)
        folded = self._folder.view()
        return RunResult(self.run_id, self.thread_id, folded.status, ctx.finished, view_of=self.view_as_of())

    @property
    def status(self) -> str:
        """The run's status so far (what `view().status` says, without building the view)."""
        return self._folder.view().status

    def view(self) -> RunView:
        """The run view so far: the projections' fold over this run's commits (kept as they
        arrive, never refolded)."""
        return self._whole_view(self._folder.view())

    def view_as_of(self) -> Callable[[], RunView]:
        """A function that builds the run view as it is now, when called: what can be handed
        on (a result, a background snapshot write) without building the view first."""
        folded = self._folder.view()
        return lambda: self._whole_view(folded)

    def _whole_view(self, folded: RunView) -> RunView:
        """`folded` joined with the finished calls the base left out. The commits were folded
        without them; if one touched such a call (it then started a new one), they are folded
        again on the base with the finished calls found by id. The status is the same either
        way: a finished call and a new one count for nothing."""
        if self._finished is None:
            return folded
        whole = self._whole
        if whole is None or whole[0] is not folded:
            finished = self._finished.finished_calls()
            view = folded
            if not finished.keys().isdisjoint(folded.calls):  # a commit touched a finished call
                refold = RunFolder(self._base, lookup=finished.get)
                for sc in self.commits:
                    if sc.seq <= folded.last_seq:
                        refold.apply(sc)
                view = refold.view()
            whole = self._whole = (folded, with_finished_calls(view, finished))
        return whole[1]

    @property
    def done(self) -> bool:
        return self._done

    @property
    def task(self) -> asyncio.Task[RunContext] | None:
        """The task that drives the run's loop here (None for a handle without a loop)."""
        return self._task


__all__ = ["CommittedEvent", "RunHandle", "RunResult"]
