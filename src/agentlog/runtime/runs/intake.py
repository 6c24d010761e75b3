"""Decisions for a run, checked against the run as the log holds it before anything is written:
for whoever takes them in ahead of the runtime that records them (a gateway).

    intake = DecisionIntake(store, snapshots=snapshots, handoff=runtime.handoff)  # handoff: serve
    checked = await intake.check(run_id, decisions, access=access)
    if checked.new: ...queue the decisions (`checked.new`) for the worker of `checked.app`

The run is read once (its snapshot and the log after it, `agentlog.runtime.loading`), the
decisions are parsed and checked once (`agentlog.runtime.loop.hitl`). When the runtime that
records them is in the same process (`agentlog serve`), the checked run is handed on to it
(`Handoff`), and its `decide` neither reads the run again nor checks them a second time. A run
handed on is as of the check: like a stale snapshot, a thread that moved meanwhile shows up as a
conflict at the first append, and the retry reads and checks afresh. It is taken only for the
very decisions it was checked for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple

from agentlog.eventlog.events import RunStarted, StoredCommit, ToolCallDecision
from agentlog.eventlog.ids import now_ms
from agentlog.eventlog.store import EventStore
from agentlog.runtime.loading import LoadedRun, RunLoader, known_calls
from agentlog.runtime.loop.hitl import check_decisions, decision_seqs, parse_decision, parse_decisions
from agentlog.runtime.loop.run_context import RunContext, fold_context
from agentlog.runtime.snapshots.store import SnapshotStore


class CheckedDecisions(NamedTuple):
    """Decisions parsed and checked against `run` (read once): those not recorded yet (`new`)
    and those recorded already (`duplicates`, a retry's)."""

    run: LoadedRun
    new: list[ToolCallDecision]
    duplicates: list[ToolCallDecision]

    @property
    def run_id(self) -> str:
        return self.run.ctx.run_id

    @property
    def thread_id(self) -> str:
        return self.run.thread_id

    @property
    def version(self) -> int:
        """The thread's version the run was read at."""
        return self.run.version

    @property
    def decision_ids(self) -> frozenset[str]:
        return frozenset(d.decision_id for d in (*self.new, *self.duplicates))

    @property
    def app(self) -> str | None:
        """The app the run's `RunStarted` records (None: not recorded)."""
        run = self.run
        started = next((e for sc in run.run_commits for e in sc.commit.events if type(e) is RunStarted), None)
        if started is not None:
            return started.app.name if started.app is not None else None
        if run.snapshot is not None:
            app = run.snapshot.tail_view().app
            return app.name if app is not None else None
        return None

    async def first_recorded(self, store: EventStore) -> int:
        """The seq of the commit that recorded the first duplicate (a retry's answer). A
        snapshot does not keep it: that rare path reads the run's commits."""
        run = self.run
        commits = run.run_commits if run.snapshot is None else [sc async for sc in store.read_run(self.run_id)]
        return decision_seqs(commits)[self.duplicates[0].decision_id]


def check_loaded(run: LoadedRun, decisions: Sequence[Any], now: int) -> CheckedDecisions:
    """`decisions` (structs or their JSON form) parsed, their `updated_at` filled with `now`
    where absent, and checked against `run` (`InvalidDecision`, `RunNotWaiting`, `UnknownCall`,
    `CallNotSuspended`)."""
    parsed = parse_decisions(decisions, now)
    new, dups = check_decisions(run.ctx, parsed, known_calls(run.ctx, run.run_commits, run.snapshot, parsed))
    return CheckedDecisions(run, new, dups)


def check_decision_on(commits: Sequence[StoredCommit], thread_id: str, run_id: str, decision: Any,
                      now: int) -> ToolCallDecision:
    """`decision` (a struct or its JSON form) parsed and checked against run `run_id` as `commits`
    hold it: commits not in the log yet, such as a counterfactual branch's before it is written
    (`InvalidDecision`: e.g. the ticket's `response_schema` refuses it)."""
    parsed = parse_decision(decision, now)
    check_decisions(fold_context(RunContext(thread_id=thread_id, run_id=run_id), commits), [parsed], ())
    return parsed


class Handoff:
    """Decisions checked by one part of a process, handed to the runtime in it that records
    them (see the module docstring): run id -> its `CheckedDecisions`. At most `limit` are kept
    (a command taken by another process's worker leaves its run here until newer ones push it
    out); each is taken once."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._runs: OrderedDict[str, CheckedDecisions] = OrderedDict()

    def give(self, checked: CheckedDecisions) -> None:
        """Hand `checked` on (its giver no longer uses the run)."""
        run_id = checked.run_id
        self._runs[run_id] = checked
        self._runs.move_to_end(run_id)
        while len(self._runs) > self.limit:
            self._runs.popitem(last=False)

    def take(self, run_id: str, decision_ids: Iterable[str]) -> CheckedDecisions | None:
        """What was checked for exactly these decisions of `run_id`, once; None otherwise (and
        what was checked for other decisions is dropped: the run has moved on from it)."""
        given = self._runs.pop(run_id, None)
        if given is None or given.decision_ids != frozenset(decision_ids):
            return None
        return given

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def __len__(self) -> int:
        return len(self._runs)


#: A caller's access check of the run, given its thread and the seq of one of its commits; it
#: raises to refuse.
Access = Callable[[str, int], Awaitable[None]]


class DecisionIntake:
    """Checks decisions for runs of `store` (read from `snapshots` and the log after them), and
    hands what it checked on to `handoff`, the runtime in this process that records them."""

    def __init__(self, store: EventStore, *, snapshots: SnapshotStore | None = None,
                 handoff: Handoff | None = None) -> None:
        self.store = store
        self.loader = RunLoader(store, snapshots=snapshots)
        self.handoff = handoff

    async def check(self, run_id: str, decisions: Sequence[Any], *, thread_id: str | None = None,
                    access: Access | None = None, hand_on: bool = True) -> CheckedDecisions:
        """The decisions checked against run `run_id` as the log holds it now (`RunNotFound`, and
        the errors of `check_loaded`). `access` is called right after the one read of the run,
        before anything looks at its state, so a refused caller learns nothing about it. New
        decisions are handed on (unless `hand_on=False`) before the caller queues them: a worker
        may take the command at once."""
        run = await self.loader.load(run_id, thread_id)
        if access is not None:
            await access(run.thread_id, _first_seq(run))
        checked = check_loaded(run, decisions, now_ms())
        if checked.new and hand_on and self.handoff is not None:
            self.handoff.give(checked)
        return checked


def _first_seq(run: LoadedRun) -> int:
    """A seq of the run's that the views have once they hold its thread: its first commit read,
    else its snapshot's."""
    if run.snapshot is not None:
        return run.snapshot.seq
    return run.run_commits[0].seq if run.run_commits else run.version


__all__ = ["Access", "CheckedDecisions", "DecisionIntake", "Handoff", "check_decision_on", "check_loaded"]
