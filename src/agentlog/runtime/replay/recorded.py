"""Recorded runs kept outside the log: export them to a file, import a file into a log, and verify
every run of a file or of a live log against the current app.

- `select_runs`: the runs a `RunSelection` (ids, agent, status, created time range) names, with
  their sub-agent runs and continuations (runs whose `parent_run_id` is one of them, and so on
  down) and their parent runs (up), folded from the log.
- `export_runs`: those runs' threads, each up to the end of the last selected run on it, read
  from the store (archived commits put back, large payloads resolved inline), as a `Recording`
  (`agentlog.eventlog.recording`: the file format) whose header names the app the runs recorded.
- `import_runs`: load a recording into a log. Idempotent: a thread the log already holds with the
  same commits (all of them, or a prefix of the file's) gets only what it lacks; ids and
  timestamps are kept (a recorded run's ids are part of what replay verifies); the log gives the
  commits new sequences. A thread the log holds with other content is `ThreadConflict`, checked
  for every thread before the first append, so a refused import writes nothing.
- `verify_all`: `agentlog.runtime.replay.verify.verify_run` for each run, from the recording's
  commits in memory (no store: a divergence is reported at the source log's `seq:index`, which
  the file keeps) or from a live store, into one `VerifyAllReport`: verified, diverged (the
  first differing event), skipped with the reason (the app lacks the run's agent, the run holds
  a quarantined commit).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import AppRef, CommitQuarantined, StoredCommit
from agentlog.eventlog.ids import now_ms, validate_id, validate_run_id
from agentlog.eventlog.recording import Recording, RecordingHeader
from agentlog.eventlog.store import EventStore, as_generator
from agentlog.projections.fold import Folder
from agentlog.projections.views import RunView
from agentlog.runtime.agents.catalog import AgentApp
from agentlog.runtime.agents.spec import AgentRegistry, UnknownAgent
from agentlog.runtime.replay.plan import NonDeterminismError, UnknownReplayRun, describe
from agentlog.runtime.replay.verify import ReplayReport, replay_app_digest, verify_run

__all__ = [
    "ImportReport", "RunSelection", "RunVerdict", "Selected", "ThreadConflict", "UnknownSelectedRun", "VerifyAllReport", "export_runs",
    "import_runs", "recording_runs", "select_runs", "selected_runs", "verify_all",
]

RunStatus = Literal["running", "waiting", "done"]


# == which runs ===================================================================================


@dataclass(frozen=True)
class RunSelection:
    """Which runs: all of `run_ids` (none: every run) that match every other filter given.
    `since_ms` / `until_ms` bound the run's creation time (unix ms, `since <= created < until`)."""

    run_ids: tuple[str, ...] = ()
    agent_id: str | None = None
    status: RunStatus | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def __post_init__(self) -> None:
        for run_id in self.run_ids:
            validate_run_id(run_id)
        if self.agent_id is not None:
            validate_id(self.agent_id, "agent_id")

    def matches(self, view: RunView) -> bool:
        return ((not self.run_ids or view.run_id in self.run_ids)
                and (self.agent_id is None or view.agent_id == self.agent_id)
                and (self.status is None or view.status == self.status)
                and (self.since_ms is None or view.created >= self.since_ms)
                and (self.until_ms is None or view.created < self.until_ms))

    def to_json(self) -> dict[str, Any]:
        """The filters given (for a recording's header)."""
        out: dict[str, Any] = {"runs": list(self.run_ids), "agent": self.agent_id, "status": self.status,
                               "since": self.since_ms, "until": self.until_ms}
        return {k: v for k, v in out.items() if v not in (None, [])}


class UnknownSelectedRun(UnknownReplayRun):
    """A run a selection names by id is not in the log (or the recording)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"unknown run {run_id!r}: the log has no commit of it")


@dataclass(frozen=True)
class Selected:
    """`matched`: the runs the selection named, by creation time; `runs`: those with their
    descendants and ancestors (views as folded), in creation order."""

    matched: tuple[str, ...]
    runs: tuple[RunView, ...]


def select_runs(views: Mapping[str, RunView], selection: RunSelection) -> Selected:
    """Pure. Raises `UnknownSelectedRun` for a run id of the selection the views do not have."""
    missing = [r for r in selection.run_ids if r not in views]
    if missing:
        raise UnknownSelectedRun(missing[0])
    order = sorted(views.values(), key=lambda v: (v.created, v.run_id))
    matched = [v.run_id for v in order if selection.matches(v)]
    children: dict[str, list[str]] = {}
    for v in order:
        if v.parent_run_id is not None:
            children.setdefault(v.parent_run_id, []).append(v.run_id)
    keep: set[str] = set()
    todo = list(matched)
    while todo:  # down: sub-agents, continuations
        run_id = todo.pop()
        if run_id not in keep:
            keep.add(run_id)
            todo += children.get(run_id, [])
    for run_id in list(keep):  # up: the parents of each
        parent = views[run_id].parent_run_id
        while parent is not None and parent in views and parent not in keep:
            keep.add(parent)
            parent = views[parent].parent_run_id
    return Selected(tuple(matched), tuple(v for v in order if v.run_id in keep))


async def fold_runs(log: AsyncIterable[StoredCommit]) -> dict[str, RunView]:
    """Every run's view, folded from `log` (one pass, commits not kept)."""
    folder = Folder()
    async for stored in log:
        folder.apply_commit(stored.seq, stored.commit)
    return folder.views().runs


async def whole_log(store: EventStore) -> AsyncIterator[StoredCommit]:
    """Every commit of the store up to its end now (for a store without a better scan)."""
    last = await store.last_seq()
    if last == 0:
        return
    async with contextlib.aclosing(as_generator(store.follow(None, 0))) as commits:
        async for stored in commits:
            yield stored
            if stored.seq >= last:
                return


async def selected_runs(store: EventStore, selection: RunSelection,
                        log: AsyncIterable[StoredCommit] | None = None) -> Selected:
    """`select_runs` over the views folded from `log` (default: the whole store)."""
    return select_runs(await fold_runs(log if log is not None else whole_log(store)), selection)


# == export =======================================================================================


async def export_runs(store: EventStore, selection: RunSelection, *,
                      log: AsyncIterable[StoredCommit] | None = None, created_at: int | None = None,
                      agentlog_version: str = "unknown") -> Recording:
    """The recording of the selected runs (see the module notes). `log`: the whole log to fold
    the views from, when the caller has a better scan than `store.follow` (archived threads).
    `agentlog_version`: what the header says wrote it (`agentlog.__version__`)."""
    chosen = await selected_runs(store, selection, log)
    ends: dict[str, int] = {}
    for view in chosen.runs:
        ends[view.thread_id] = max(ends.get(view.thread_id, 0), view.last_seq)
    commits: list[StoredCommit] = []
    for thread_id, end in ends.items():
        async with contextlib.aclosing(as_generator(store.read_thread(thread_id))) as thread:
            async for stored in thread:
                if stored.seq > end:
                    break
                commits.append(stored)
    commits.sort(key=lambda sc: sc.seq)
    apps = list(dict.fromkeys(v.app for v in chosen.runs if v.app is not None))
    digests = {a.digest for a in apps if a.digest}
    header = RecordingHeader(
        agentlog_version=agentlog_version, app_digest=digests.pop() if len(digests) == 1 else None,
        apps=apps, created_at=created_at if created_at is not None else now_ms(), filters=selection.to_json(),
        runs=list(chosen.matched), commits=len(commits),
    )
    return Recording(header, tuple(commits))


# == import =======================================================================================


class ThreadConflict(AgentlogError):
    """The log holds a thread of the recording with other commits: nothing was imported."""

    code = "import_conflict"

    def __init__(self, thread_id: str, index: int, in_log: str, in_file: str) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"thread {thread_id!r} exists in this log with other content (its commit #{index + 1}: "
            f"{in_log} in the log, {in_file} in the file); nothing was imported")


@dataclass(frozen=True)
class ImportReport:
    """What an import did: `written` commits appended, `present` ones the log already held."""

    threads: int
    runs: tuple[str, ...]
    written: int
    present: int

    def to_json(self) -> dict[str, Any]:
        return {"threads": self.threads, "runs": list(self.runs), "written": self.written, "present": self.present}


def _differs(thread_id: str, in_log: Sequence[StoredCommit], in_file: Sequence[StoredCommit]) -> ThreadConflict | None:
    for i, (have, want) in enumerate(zip(in_log, in_file, strict=False)):
        if have.commit != want.commit:
            what = (f"commit {have.commit.commit_id!r}" if have.commit.commit_id != want.commit.commit_id
                    else f"commit {have.commit.commit_id!r} with other events")
            return ThreadConflict(thread_id, i, what, f"commit {want.commit.commit_id!r}")
    return None


async def import_runs(store: EventStore, recording: Recording) -> ImportReport:
    """Append the recording's commits the log lacks, in the recording's order (so a recording of
    a whole log imported into an empty one gets its sequences back), each under its thread's
    optimistic concurrency (see the module notes). Raises `ThreadConflict` before writing
    anything if a thread differs."""
    versions: dict[str, int] = {}
    todo: set[str] = set()
    present = 0
    threads = recording.threads()
    for thread_id, commits in threads.items():
        async with contextlib.aclosing(as_generator(store.read_thread(thread_id))) as thread:
            existing = [sc async for sc in thread]
        conflict = _differs(thread_id, existing, commits)
        if conflict is not None:
            raise conflict
        present += min(len(existing), len(commits))
        versions[thread_id] = existing[-1].seq if existing else 0
        todo.update(sc.commit.commit_id for sc in commits[len(existing):])
    written = 0
    for stored in recording.commits:
        if stored.commit.commit_id in todo:
            result = await store.append(stored.commit, versions[stored.commit.thread_id])
            versions[stored.commit.thread_id] = result.seq
            written += 0 if result.duplicate else 1
    return ImportReport(len(threads), tuple(recording.run_ids()), written, present)


# == verify =======================================================================================


Outcome = Literal["verified", "diverged", "skipped"]


@dataclass(frozen=True)
class RunVerdict:
    """One run's outcome. `report`: the verified replay's (verified or diverged); `reason`: why a
    run was skipped."""

    run_id: str
    thread_id: str
    agent_id: str | None
    outcome: Outcome
    report: ReplayReport | None = None
    reason: str | None = None

    @property
    def divergence(self) -> NonDeterminismError | None:
        return self.report.divergence if self.report is not None else None

    def explain(self) -> str:
        """One paragraph: the run, and for a divergence the first differing event (where, the
        recorded one, the replayed one, why)."""
        head = f"run {self.run_id} (agent {self.agent_id or '-'}, thread {self.thread_id}): {self.outcome}"
        d = self.divergence
        if d is None:
            return head + (f": {self.reason}" if self.reason else "")
        lines = [f"{head} at {d.position}",
                 f"  expected (log)   {type(d.expected).__name__ if d.expected else ''} {describe(d.expected, 400)}",
                 f"  actual (replay)  {type(d.actual).__name__ if d.actual else ''} {describe(d.actual, 400)}"]
        if d.detail:
            lines.append(f"  detail           {d.detail}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.run_id, "thread_id": self.thread_id, "agent_id": self.agent_id,
                               "outcome": self.outcome}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.report is not None:
            out["report"] = self.report.to_json()
        return out


@dataclass(frozen=True)
class VerifyAllReport:
    """Every run's verdict, in the order verified (parents before their sub-agents). `ok`: none
    diverged. `app_digest`: the app verified with; `recorded_apps`: what the runs recorded (the
    same digest means the app's agents and tools did not change)."""

    runs: tuple[RunVerdict, ...]
    app_digest: str
    recorded_apps: tuple[AppRef, ...] = ()
    source: str = "log"
    counts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        counts = dict.fromkeys(("verified", "diverged", "skipped"), 0)
        for verdict in self.runs:
            counts[verdict.outcome] += 1
        object.__setattr__(self, "counts", counts)

    @property
    def ok(self) -> bool:
        return self.counts["diverged"] == 0

    def of(self, outcome: Outcome) -> list[RunVerdict]:
        return [v for v in self.runs if v.outcome == outcome]

    @property
    def app_changed(self) -> bool | None:
        """Whether the app's digest differs from what the runs recorded (None: none recorded)."""
        digests = {a.digest for a in self.recorded_apps if a.digest}
        return None if not digests else digests != {self.app_digest}

    def summary(self) -> str:
        c = self.counts
        return f"{c['verified']} verified, {c['diverged']} diverged, {c['skipped']} skipped of {len(self.runs)} run(s)"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "source": self.source, "counts": dict(self.counts), "app_digest": self.app_digest,
                "recorded_apps": msgspec.to_builtins(list(self.recorded_apps)), "app_changed": self.app_changed,
                "runs": [v.to_json() for v in self.runs]}


def _skip_reason(view_agent: str | None, commits: Iterable[StoredCommit], run_id: str,
                 agents: AgentRegistry) -> str | None:
    if view_agent is not None and view_agent not in agents:
        return f"the app has no agent {view_agent!r}"
    for sc in commits:
        if sc.commit.run_id == run_id and any(type(e) is CommitQuarantined for e in sc.commit.events):
            return f"the run holds a commit no reader can decode (quarantined at seq {sc.seq})"
    return None


async def verify_all(
    source: Recording | EventStore,
    app: AgentApp,
    runs: Sequence[RunView] | None = None,
    *,
    tools_from_log: bool | Iterable[str] = True,
    timeout_s: float = 60.0,
    source_name: str | None = None,
) -> VerifyAllReport:
    """Verify each run of `runs` (default: every run the recording starts; from a store, pass
    `selected_runs(...).runs`) with `app`. A recording is verified from its commits in memory.
    Never raises a divergence: each is a verdict."""
    agents = app.agents if isinstance(app.agents, AgentRegistry) else AgentRegistry(app.agents)
    threads = source.threads() if isinstance(source, Recording) else {}
    if runs is None:
        if not isinstance(source, Recording):
            raise TypeError("verify_all over a store needs the runs (selected_runs(...).runs)")
        runs = recording_runs(source).runs
    verdicts: list[RunVerdict] = []
    from_log = tools_from_log if isinstance(tools_from_log, bool) else list(tools_from_log)
    for view in runs:
        if isinstance(source, Recording):
            log: Any = threads.get(view.thread_id, [])
            commits: Sequence[StoredCommit] = log
        else:
            log = source
            async with contextlib.aclosing(as_generator(source.read_run(view.run_id))) as read:
                commits = [sc async for sc in read]
        reason = _skip_reason(view.agent_id, commits, view.run_id, agents)
        if reason is None:
            try:
                report = await verify_run(log, view.run_id, app, tools_from_log=from_log, raise_on_divergence=False,
                                          timeout_s=timeout_s)
            except (UnknownReplayRun, UnknownAgent) as exc:
                reason = str(exc).strip("'\"")
            else:
                verdicts.append(RunVerdict(view.run_id, view.thread_id, view.agent_id,
                                           "verified" if report.ok else "diverged", report))
                continue
        verdicts.append(RunVerdict(view.run_id, view.thread_id, view.agent_id, "skipped", reason=reason))
    recorded = (tuple(source.header.apps) if isinstance(source, Recording)
                else tuple(dict.fromkeys(v.app for v in runs if v.app is not None)))
    name = source_name or ("recording" if isinstance(source, Recording) else "log")
    return VerifyAllReport(tuple(verdicts), replay_app_digest(app), recorded, name)


def recording_runs(recording: Recording, selection: RunSelection | None = None) -> Selected:
    """`select_runs` over the runs a recording starts (all of them by default), folded from it."""
    folder = Folder()
    for stored in recording.commits:
        folder.apply_commit(stored.seq, stored.commit)
    started = set(recording.run_ids())
    views = {r: v for r, v in folder.views().runs.items() if r in started}
    return select_runs(views, selection or RunSelection())
