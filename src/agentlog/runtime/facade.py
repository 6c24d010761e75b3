"""`Runtime`: start, decide, cancel, resume and continue runs, and carry out the commands a
worker takes (`execute`). The I/O shell around `loop.RunLoop`.

    handle = await runtime.start(RunRequest(agent_id="calc", messages=["2+3?"]))
    result = await handle.result()                 # termination + the final RunView
    await runtime.execute(command)                 # what a worker does with a queued command

Every operation works from the log alone (the run's snapshot and the log after it), so any
process can carry it out; a run it starts or resumes is driven in a task of this process, and
the caller holds its `RunHandle` (`agentlog.runtime.runs.handle`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from agentlog.eventlog.errors import AgentlogError, VersionConflict
from agentlog.eventlog.events import (
    AppRef,
    Commit,
    Message,
    QueueMode,
    RunCancelRequested,
    RunFinished,
    RunStarted,
    StoredCommit,
    Termination,
    ToolCallDecided,
    ToolCallDecision,
)
from agentlog.eventlog.ids import validate_id, validate_run_id
from agentlog.eventlog.store import EventStore, first_commit
from agentlog.projections.fold import fold_commits
from agentlog.projections.store import ViewStore
from agentlog.projections.views import RunView, ThreadView
from agentlog.runtime.agents.spec import AgentRegistry, AgentSpec, ModelRegistry, derived_tools
from agentlog.runtime.context_policy import Summarizer
from agentlog.runtime.errors import CommandRejected, RunConflict, RunEnded, RunNotFound, retry_on_conflict
from agentlog.runtime.inputs.admission import admit_thread, check_request, queue_input
from agentlog.runtime.inputs.admission import as_messages as _as_messages
from agentlog.runtime.inputs.commands import Cancel, Command, Decide, QueueMessages, StartRun
from agentlog.runtime.inputs.frontend import check_no_conflict, is_frontend_stub
from agentlog.runtime.inputs.request import RunRequest
from agentlog.runtime.inputs.run_input import OverrideScope
from agentlog.runtime.inputs.thread_folds import ThreadFolds
from agentlog.runtime.live import LiveSink, NullLiveSink
from agentlog.runtime.loading import LoadedRun, RunLoader, known_calls
from agentlog.runtime.logs import get_logger
from agentlog.runtime.loop.driver import RunLoop
from agentlog.runtime.loop.entropy import SYSTEM_ENTROPY, Entropy
from agentlog.runtime.loop.hitl import (
    DecisionInput,
    HitlError,
    RunNotWaiting,
    check_decisions,
    decision_seqs,
    parse_decisions,
    ready_calls,
)
from agentlog.runtime.loop.run_context import RunContext
from agentlog.runtime.loop.thread_fold import ThreadFold
from agentlog.runtime.models.base import Model
from agentlog.runtime.models.breaker import Breakers
from agentlog.runtime.models.providers import build_provider_model
from agentlog.runtime.outage import OutagePolicy
from agentlog.runtime.queued import Queued, queue_messages
from agentlog.runtime.runs.active import ActiveRuns
from agentlog.runtime.runs.handle import RunHandle, RunResult
from agentlog.runtime.runs.intake import Handoff
from agentlog.runtime.snapshots.format import LoadedSnapshot, RunSnapshot, make_snapshot
from agentlog.runtime.snapshots.store import SnapshotStore, save_snapshot
from agentlog.runtime.snapshots.writes import SnapshotWrites
from agentlog.runtime.tools import Tool, ToolRegistry

_log = get_logger()

#: What became of a command (`Runtime.execute`): carried out, or to be tried again later.
Executed = Literal["done", "later"]

#: A callable given every commit a run loop writes (`Runtime.observers`).
CommitObserver = Callable[[StoredCommit], None]


class DecideResult(NamedTuple):
    """Answer to `Runtime.decide`: the seq of the commit that recorded the decisions (for a pure
    duplicate, the seq that recorded them first), whether calls resumed now, and a handle on the
    run's continuation (`None` for a duplicate: nothing happened)."""

    seq: int
    duplicate: bool
    resumed: list[str]
    handle: RunHandle | None
    #: the run's thread (as the log says)
    thread_id: str = ""


def _decision_ids(decisions: Sequence[DecisionInput]) -> list[str]:
    """The decision ids given (unparsed: what a handed-on check is looked up by)."""
    ids = []
    for d in decisions:
        decision_id = d.decision_id if isinstance(d, ToolCallDecision) else d.get("decision_id") \
            if isinstance(d, Mapping) else None
        ids.append(decision_id if isinstance(decision_id, str) else "")
    return ids


class _Loaded(NamedTuple):
    """A run folded from the log: what `decide`/`cancel` need to act on it. `older_messages`
    is set when the context came from a thread-view snapshot: it loads the messages the snapshot
    covers. `snapshot` is set when it came from a run-context snapshot: `run_commits` then holds
    only the run's commits after `snapshot.seq`."""

    thread_id: str
    spec: AgentSpec
    ctx: RunContext
    version: int
    run_commits: list[StoredCommit]
    older_messages: Callable[[], Awaitable[list[Message]]] | None = None
    snapshot: LoadedSnapshot | None = None


@dataclass(frozen=True)
class App:
    """A user's application: its agents, the tools they use, and models by name (an agent whose
    `model` is a name resolves it here; one holding a model instance needs no entry). What
    `--app module:attr` names (`agentlog.gateway.operations.app_loader`), what verified replay
    runs again (its agents and tools), what the agent catalog lists."""

    agents: Iterable[AgentSpec]
    tools: Iterable[Tool] = ()
    models: Mapping[str, Model] = field(default_factory=dict)

    def runtime(self, store: EventStore, **options: Any) -> Runtime:
        """A `Runtime` over `store` (options: those of `Runtime`, e.g. live, entropy, views)."""
        return Runtime(store, agents=self.agents, tools=self.tools, models=dict(self.models), **options)


class Runtime:
    """Agents, tools and models wired to one event store.

    `Runtime(store, agents=[...], tools=[...], models={"name": model}, live=..., entropy=...)`.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        agents: Iterable[AgentSpec] = (),
        tools: Iterable[Tool] | ToolRegistry = (),
        models: Mapping[str, Model] | ModelRegistry | None = None,
        live: LiveSink | None = None,
        entropy: Entropy | None = None,
        views: ViewStore | None = None,
        store_outage_deadline: float | None = None,
        summarizer: Summarizer | None = None,
        snapshots: SnapshotStore | None = None,
        observers: Iterable[CommitObserver] = (),
        breakers: Breakers | None = None,
        effects: bool = True,
    ) -> None:
        self.store = store
        #: Run plugins' post-commit effects (`agentlog.runtime.plugins.Effect`); verified replay does not.
        self.effects = effects
        #: The models' circuit breakers (`agentlog.runtime.models.breaker`); None: none.
        self.breakers = breakers
        #: A run waits this long through a NATS outage before it stops uncommitted (resumable);
        #: None: $AGENTLOG_STORE_OUTAGE_DEADLINE, else 60 s (`agentlog.runtime.outage`).
        self.outage = OutagePolicy.from_env(store_outage_deadline)
        self.agents = AgentRegistry(agents)
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.models = models if isinstance(models, ModelRegistry) else ModelRegistry(models, build=build_provider_model)
        self.live: LiveSink = live or NullLiveSink()
        self.entropy: Entropy = entropy or SYSTEM_ENTROPY
        #: Optional projections `ViewStore` (e.g. `agentlog.projections.kv.KVViewStore`): when given, a
        #: cold resume starts from the thread view snapshot (see `_load`). Never written here.
        self.views = views
        #: Answers context-compaction summaries (`agentlog.runtime.context_policy`); default: the registry's models.
        self.summarizer = summarizer
        self.snapshots = snapshots
        #: The threads this Runtime started runs on, folded (a start reads only their new commits).
        self.thread_folds = ThreadFolds(ThreadFold)
        #: The runs this Runtime drives now.
        self.runs = ActiveRuns()
        #: Decisions a gateway in this process checked and handed on, with the run it read, so
        #: that `decide` neither reads nor checks them again (`agentlog.runtime.runs.intake`).
        self.handoff = Handoff()
        #: Called with every commit a run loop of this Runtime writes (telemetry, metrics,
        #: sub-agent lineage); an observer's `run_released(run_id, ts)`, if any, when a loop
        #: lets go of a run. Their failures are logged and never reach the run.
        self.observers: list[CommitObserver] = list(observers)
        #: The app this Runtime is (name + digest), recorded in each run it starts (`RunStarted.app`);
        #: set by the server processes (`agentlog.cli.assembly`), None in process unless set.
        self.app: AppRef | None = None
        self._register_handoff_tools(self.agents)
        # tools that act on runs (sub-agents: `agentlog.runtime.toolkits.subagents`) bind to the runtime they run in
        for t in self.tools:
            bind = getattr(t, "bind_runtime", None)
            if bind is not None:
                bind(self)

    # -- starting ------------------------------------------------------------------------------

    async def start(self, request: RunRequest | str, messages: Any = (), **fields: Any) -> RunHandle:
        """Commit the start of a run and drive it in the background; returns once the run start
        is in the log. `start(RunRequest(...))`, or `start(agent_id, messages, **fields)` with
        the fields of a `RunRequest` (`thread_id`, `run_id`, `parent_run_id`, `decisions`,
        `frontend_tools`, `run_input`, ...).

        Everything that can refuse it is checked before the first write: the input
        (`agentlog.runtime.inputs.admission.check_request`), the agent, its tools and models, its
        override policy, the thread (`RunConflict`: it has an active run; `ThreadNotFound`;
        `RunNotFound`: a parent not on it). A frontend tool named like one of the agent's tools
        is `FrontendToolConflict`, unless the agent declares it as a frontend stub, which then
        handles it.

        A continuation (`parent_run_id`) of a waiting parent first applies `decisions` to the
        parent, which runs until it finishes or waits again, and then closes what it still waits
        for (its suspended calls `cancelled`), so the thread never holds an unanswered tool call
        when the new run's model reads it. With `parent_thread_id` the run is a sub-agent's, on
        its own child thread (`agentlog.runtime.toolkits.subagents`)."""
        if isinstance(request, str):
            request = RunRequest(agent_id=request, messages=messages, **fields)
        elif messages or fields:
            raise TypeError("give a RunRequest alone, or an agent id with the request's fields")
        spec = self.agents.get(request.agent_id)
        self._register_handoff_tools([spec])  # an agent registered after this Runtime was made
        missing = [n for n in spec.tools if n not in self.tools]
        if missing:
            raise LookupError(f"agent {spec.id!r} lists unknown tools: {', '.join(missing)}")
        self.models.resolve(spec.model)  # fail now, not at the first inference
        request = check_request(request, max_payload=getattr(self.store, "max_payload", None),
                                overrides=OverrideScope(spec.model_name, spec.overrides, spec.tools))
        overrides = request.run_input.overrides if request.run_input is not None else None
        if overrides is not None and overrides.model is not None:
            self.models.resolve(overrides.model)
        frontend = self._frontend_tools_for(spec, request.frontend_tools)
        parent_run_id, thread_id = request.continues, request.thread_id
        if parent_run_id is not None:  # a continuation on the parent's thread
            parent_thread = await self._thread_of(parent_run_id)
            if thread_id is not None and thread_id != parent_thread:
                raise RunNotFound(f"parent run {parent_run_id!r} is not on thread {thread_id!r}")
            thread_id = parent_thread
            # the whole admission before the parent is closed (a write): a refused continuation
            # leaves the log as it was; after the close the thread is checked again as it is then
            await admit_thread(self.store, thread_id, run_id=request.run_id, parent_run_id=parent_run_id,
                               folds=self.thread_folds)
            await self._close_parent(parent_run_id, request.decisions)
        thread_id = thread_id or self.entropy.new_id()
        run_id = request.run_id or self.entropy.new_id()
        # only a chosen run id can be taken: a generated one is new
        fold, thread = await admit_thread(self.store, thread_id, run_id=request.run_id, parent_run_id=parent_run_id,
                                          folds=self.thread_folds)
        request = request.replace(thread_id=thread_id, run_id=run_id, frontend_tools=frontend)

        msgs = _as_messages(request.messages, self.entropy)
        ctx = fold.run_context(run_id)
        handle = RunHandle(run_id, thread_id, spec.id)
        loop = RunLoop(
            spec=spec, ctx=ctx, version=thread.version if thread else 0, store=self.store,
            tools=self._tools_for(spec), models=self.models, live=self.live, entropy=self.entropy,
            on_commit=self._on_commit_for(handle), outage=self.outage,
            summarizer=self.summarizer, agents=self._agent_for, breakers=self.breakers,
            effects=self.effects,
        )
        try:
            await loop.begin(request, msgs, app=self.app)
        except VersionConflict as exc:
            raise RunConflict(f"thread {thread_id!r} changed while run {run_id!r} was starting: {exc}") from None
        self._drive(loop, handle)
        return handle

    async def run(self, request: RunRequest | str, messages: Any = (), **fields: Any) -> RunResult:
        """Start a run (`start`) and wait for its result."""
        handle = await self.start(request, messages, **fields)
        return await handle.result()

    def _frontend_tools_for(self, spec: AgentSpec, frontend: list[Any]) -> list[Any]:
        """The normalised frontend tools to record for a run of `spec`: those it declares as
        stubs left out (the stub handles them); one named like its other tools is
        `FrontendToolConflict`."""
        if not frontend:
            return frontend
        stubs = {n for n in spec.tools if is_frontend_stub(self.tools.get(n))}
        frontend = [t for t in frontend if t["name"] not in stubs]
        check_no_conflict(frontend, spec.tools)
        return frontend

    def _tools_for(self, spec: AgentSpec) -> dict[str, Tool]:
        return {n: t for n in spec.tools if (t := self.tools.get(n)) is not None}

    def _register_handoff_tools(self, specs: Iterable[AgentSpec]) -> None:
        """The tools the specs call for (`agentlog.runtime.agents.spec.derived_tools`: their handoffs'
        `transfer_to_<agent>`, `tool_search`); a tool of that name already registered stays."""
        described = {a.id: a.description for a in self.agents}
        for derived in derived_tools(specs, described):
            existing = self.tools.get(derived.name)
            if existing is None:
                self.tools.register(derived)
            elif existing is not derived and getattr(derived, "provided_by", None) is not None \
                    and getattr(existing, "provided_by", None) is None:
                raise ValueError(f"plugin {derived.provided_by!r} gives a tool named {derived.name!r}, "
                                 "and the app registers another tool of that name")

    def _agent_for(self, agent_id: str) -> tuple[AgentSpec, dict[str, Tool]]:
        """A handoff target's spec and tools (raises `UnknownAgent`)."""
        spec = self.agents.get(agent_id)
        return spec, self._tools_for(spec)

    async def _thread_of(self, run_id: str) -> str:
        return await self.loader().thread_of(run_id)

    # -- human in the loop ---------------------------------------------------------------------

    def loader(self, *, views: bool = True) -> RunLoader:
        """The run loader over this Runtime's store, snapshots and (unless `views=False`) views,
        using run-context snapshots of this Runtime's agents only (`agentlog.runtime.loading`)."""
        return RunLoader(self.store, snapshots=self.snapshots, views=self.views if views else None,
                         agents=self.agents)

    async def _load(self, run_id: str, thread_id: str | None = None, *, use_snapshot: bool = True) -> _Loaded:
        """The run folded from the log alone (any process) into a RunContext: the run-context
        snapshot + the thread's tail, else the thread view + tail, else the whole thread
        (`RunLoader.load`). `use_snapshot=False`: the retry after an OCC conflict."""
        return self._loaded(await self.loader().load(run_id, thread_id, use_snapshot=use_snapshot))

    def _loaded(self, run: LoadedRun) -> _Loaded:
        # after a handoff: the agent the loop goes on with (the open step's, else the active one)
        agent_id = run.ctx.step_agent or run.ctx.agent_id or run.agent_id
        return _Loaded(run.thread_id, self.agents.get(agent_id), run.ctx, run.version, run.run_commits,
                       run.older_messages, run.snapshot)

    async def write_snapshot(self, run_id: str, *, thread_id: str | None = None) -> RunSnapshot:
        """Fold the run as of the log's head (its current snapshot + the tail, else the whole
        thread) and write that as its snapshot: for a process that keeps snapshots current
        without driving the run (a catch-up job, a benchmark). Needs `snapshots`."""
        if self.snapshots is None:
            raise ValueError("write_snapshot needs Runtime(snapshots=...)")
        validate_run_id(run_id)
        if thread_id is not None:
            validate_id(thread_id, "thread_id")
        loader = self.loader(views=False)
        loaded = self._loaded(await loader.from_run_snapshot(run_id, thread_id) or await loader.fold(run_id, thread_id))
        known = loaded.snapshot.chunks if loaded.snapshot else {}
        snap, chunks = make_snapshot(seq=loaded.version, agent_id=loaded.spec.id, ctx=loaded.ctx,
                                     run=self._handle_for(loaded).view(), known=known)
        await save_snapshot(self.snapshots, snap, chunks, replaced=known)
        return snap

    @property
    def snapshots(self) -> SnapshotStore | None:
        """Where run contexts are kept (e.g. `KVSnapshotStore`), if anywhere: written when a run
        this Runtime drives suspends or finishes, read by a cold resume (`loader`). A cache:
        every miss falls back to folding the log."""
        return self._snapshots

    @snapshots.setter
    def snapshots(self, store: SnapshotStore | None) -> None:
        self._snapshots = store
        self._snapshot_writes = SnapshotWrites(store) if store is not None else None

    def snapshot_seq(self, run_id: str) -> int:
        """The seq of the last snapshot of `run_id` this Runtime wrote (or is writing in the
        background) when a loop of it stopped; 0 if none. A `SnapshotWriter` over this Runtime
        (`agentlog serve`: the projections' hook) then does not write the same snapshot again."""
        return self._snapshot_writes.seq(run_id) if self._snapshot_writes is not None else 0

    async def flush_snapshots(self) -> None:
        """Wait for the snapshot writes in flight (tests, benchmarks, shutdown)."""
        if self._snapshot_writes is not None:
            await self._snapshot_writes.flush()

    def _loop_for(self, loaded: _Loaded, handle: RunHandle) -> RunLoop:
        return RunLoop(
            spec=loaded.spec, ctx=loaded.ctx, version=loaded.version, store=self.store,
            tools=self._tools_for(loaded.spec), models=self.models, live=self.live, entropy=self.entropy,
            on_commit=self._on_commit_for(handle), older_messages=loaded.older_messages, outage=self.outage,
            summarizer=self.summarizer, agents=self._agent_for, breakers=self.breakers,
            effects=self.effects,
        )

    def _on_commit_for(self, handle: RunHandle) -> Callable[[StoredCommit], None]:
        """The loop's commit callback: the handle, then the observers (see `observers`)."""
        if not self.observers:
            return handle.on_commit
        observers = self.observers

        def on_commit(sc: StoredCommit) -> None:
            handle.on_commit(sc)
            for observer in observers:
                try:
                    observer(sc)
                except Exception:  # noqa: BLE001 - an observer never ends a run
                    _log.exception("observer.failed", observer=type(observer).__name__, run_id=handle.run_id)

        return on_commit

    def _released(self, handle: RunHandle) -> None:
        ts = handle.commits[-1].commit.ts if handle.commits else self.entropy.now_ms()
        for observer in self.observers:
            release = getattr(observer, "run_released", None)
            if release is not None:
                try:
                    release(handle.run_id, ts)
                except Exception:  # noqa: BLE001
                    _log.exception("observer.failed", observer=type(observer).__name__, run_id=handle.run_id)

    def _drive(self, loop: RunLoop, handle: RunHandle) -> None:
        run_id = handle.run_id
        self.runs.add(loop, handle)
        task = asyncio.get_running_loop().create_task(self._run_loop(loop, handle), name=f"agentlog-run-{run_id}")
        handle.attach(loop, task)
        task.add_done_callback(lambda _t: self.runs.forget(handle))
        if self.observers:
            task.add_done_callback(lambda _t: self._released(handle))

    async def _run_loop(self, loop: RunLoop, handle: RunHandle) -> RunContext:
        ctx = await loop.run()
        if self._snapshot_writes is not None:  # a cache: the result is in the log already
            self._snapshot_writes.after_stop(loop, handle.view_as_of(), handle.stored_chunks)
        return ctx

    def active(self, run_id: str) -> RunHandle | None:
        """The handle of `run_id` if this Runtime drives it now (its loop has not returned),
        else None: the run is finished, waiting, or driven by another process."""
        return self.runs.handle(run_id)

    def active_handles(self) -> list[RunHandle]:
        """The handles of every run this Runtime drives now."""
        return self.runs.handles()

    def fence_runs(self) -> None:
        """Fence every run driven here: each writes nothing more (`RunLoop.fence`), while its
        task goes on until `abandon_runs` cancels it (so its worker can first hand it back)."""
        self.runs.fence()

    def abandon_runs(self) -> list[asyncio.Task[Any]]:
        """Stop the runs driven here WITHOUT committing anything: each loop is fenced (it writes
        nothing more, even if a tool ignores the cancellation and returns later) and its task
        cancelled. A process going away leaves them to be resumed from the log by the next one,
        where a cancel would end them for good. Returns the cancelled tasks, to be awaited (a
        tool that ignores cancellation keeps its task alive until it returns: bound the wait)."""
        return self.runs.abandon()

    def signal_cancel(self, run_id: str) -> bool:
        """Signal a run driven by this process to cancel, without appending a cancel request
        (see `RunHandle.request_cancel`). Returns False if it is not running here."""
        handle = self.runs.entry(run_id)
        return handle is not None and handle.request_cancel()

    def poke(self, run_id: str) -> bool:
        """Tell a run driven by this process that its thread has new commits for it (a queued
        message): it reads them at its next step boundary instead of at its next append.
        Returns False if it is not running here."""
        loop = self.runs.loop(run_id)
        if loop is None:
            return False
        loop.poke()
        return True

    async def queue_messages(
        self, run_id: str, messages: str | Message | Mapping[str, Any] | Sequence[Any], *,
        mode: QueueMode = "steer", thread_id: str | None = None,
    ) -> Queued:
        """Record messages for a run that has not finished (`agentlog.runtime.queued`): `steer`
        ones join the conversation at its next step boundary, `follow_up` ones when it would
        otherwise end. A run driven here is poked, so it reads them at that boundary; one driven
        elsewhere meets them at its next append (or its worker is poked through the control
        subject). Raises `RunEnded` (finished), `RunNotFound`, `ValueError` (bad input)."""
        validate_run_id(run_id)
        msgs = queue_input(messages, mode, self.entropy)
        known = self.runs.entry(run_id)
        if thread_id is None:
            thread_id = known.thread_id if known is not None else await self._thread_of(run_id)
        res = await queue_messages(self.store, self.entropy, run_id, thread_id, msgs, mode)
        if not res.duplicate:
            _log.info("run.messages_queued", thread_id=thread_id, run_id=run_id, mode=mode, seq=res.seq)
        self.poke(run_id)
        return res

    async def resume(self, run_id: str, *, thread_id: str | None = None) -> RunHandle | None:
        """Continue an unfinished run from the log alone, in any process. Returns its handle
        (the one of this Runtime's loop if it drives the run already), or None when there is
        nothing to drive: finished, or waiting with no decision that may apply now.

        Nothing is appended before the loop's first commit point. A waiting run applies its
        recorded decisions as `decide` would. A running run whose worker is gone goes on from
        its last commit: a call started and not completed runs again with the same call_id
        (at-least-once: the call_id is the idempotency key), an uncommitted inference is redone,
        a recorded cancel request finishes it. Resuming a run whose worker is alive elsewhere
        makes one of the two fail with `RunConflict` (per-thread OCC), after a call in flight
        may have run twice."""
        validate_run_id(run_id)
        active = self.runs.handle(run_id)
        if active is not None:
            return active

        async def attempt(i: int) -> RunHandle | None:
            nonlocal thread_id
            loaded = await self._load(run_id, thread_id, use_snapshot=i == 0)
            thread_id = loaded.thread_id
            handle = self._handle_for(loaded)
            loop = self._loop_for(loaded, handle)
            if not await self._begin_continue(loaded, loop):  # a conflict: re-fold and look again
                return None
            self._drive(loop, handle)
            return handle

        return await retry_on_conflict(attempt, f"resume run {run_id!r}")

    def _handle_for(self, loaded: _Loaded) -> RunHandle:
        run_id = loaded.ctx.run_id
        if loaded.snapshot is None:
            handle = RunHandle(run_id, loaded.thread_id, loaded.spec.id)
        else:
            store = self.store
            snap = loaded.snapshot
            handle = RunHandle(run_id, loaded.thread_id, loaded.spec.id, base=snap.tail_view(),
                               finished=snap if snap.has_finished_calls else None,
                               base_seq=snap.seq, older=lambda: store.read_run(run_id))
            handle.stored_chunks = loaded.snapshot.chunks
        for sc in loaded.run_commits:
            handle.on_commit(sc)
        return handle

    @staticmethod
    async def _begin_continue(loaded: _Loaded, loop: RunLoop, decisions: Sequence[ToolCallDecision] = ()) -> bool:
        """Get `loop` ready to continue the folded run: record `decisions` and/or apply the
        recorded ones (a waiting run: the decision commit), or continue from the last commit
        point (a running run). Shared by `decide` and `resume`, so both take the same path,
        entropy draws included. False if there is nothing to drive. Raises VersionConflict."""
        ctx = loaded.ctx
        if ctx.finished is not None:
            return False
        if decisions or (ctx.waiting and not ctx.running and not ctx.resuming):
            if not decisions and not ready_calls(loaded.spec.tool_execution_mode, ctx):
                return False
            await loop.begin_resume(decisions)
            return True
        loop.prepare_continue()
        return True

    async def decide(
        self, run_id: str, decisions: Sequence[DecisionInput] | DecisionInput, *, thread_id: str | None = None
    ) -> DecideResult:
        """Record human decisions for a run's suspended calls and resume what they unblock;
        returns where they were recorded (`DecideResult`).

        Raises before anything is appended: `InvalidDecision`, `RunNotWaiting`, `UnknownCall`,
        `CallNotSuspended`, `RunNotFound`. A decision whose decision_id is recorded already has
        no effect; if all are such, the answer is the seq that recorded them, `duplicate=True`.

        A waiting run resumes the calls its execution mode lets go on now, in a background task
        (the answer's `handle`). A running one (parallel modes) gets the decisions recorded for
        its loop to apply: at once if it runs here (`handle` is its handle), else at its next
        append. Decisions a gateway in this process checked already are taken from `handoff`
        with the run it read: neither read nor checked again.
        """
        return await self._decide(run_id, decisions, thread_id, first_recorded=True)

    async def _decide(self, run_id: str, decisions: Sequence[DecisionInput] | DecisionInput, thread_id: str | None,
                      *, first_recorded: bool) -> DecideResult:
        """`decide`. `first_recorded=False` (a worker carrying out a command, or its live
        shortcut, which use only the handle): a pure duplicate answers the thread's head as its
        seq, a position at which the decisions are recorded, instead of looking up the commit
        that first recorded them (for a run loaded from a snapshot, that reads the run's log
        from its first commit)."""
        if isinstance(decisions, (ToolCallDecision, Mapping)):
            decisions = [decisions]
        handed = self.handoff.take(run_id, _decision_ids(decisions))
        if handed is not None and thread_id is not None and handed.thread_id != thread_id:
            handed = None
        if handed is None:  # a run handed on here was loaded under a valid id
            validate_run_id(run_id)
        parsed = None if handed is not None else parse_decisions(decisions, self.entropy.now_ms())
        known = self.runs.entry(run_id)
        if thread_id is None and known is not None:
            thread_id = known.thread_id

        async def attempt(i: int) -> DecideResult:
            # a conflict anywhere below: someone else moved the thread, re-fold and re-check
            nonlocal thread_id, parsed
            if i == 0 and handed is not None:
                loaded = self._loaded(handed.run)
                new, dups = handed.new, handed.duplicates
            else:  # a conflict after a handed-on run: the snapshot is still worth a try
                fresh = i == 0 or (i == 1 and handed is not None)
                loaded = await self._load(run_id, thread_id, use_snapshot=fresh)
                if parsed is None:
                    parsed = parse_decisions(decisions, self.entropy.now_ms())
                new, dups = check_decisions(loaded.ctx, parsed, self._known_calls(loaded, parsed))
            thread_id = loaded.thread_id
            if not new:
                seq = await self._decision_seq(loaded, dups[0].decision_id) if first_recorded else loaded.version
                return DecideResult(seq, True, [], None, loaded.thread_id)
            ctx = loaded.ctx
            if not (ctx.waiting and not ctx.running and not ctx.resuming):
                commit = Commit(
                    commit_id=self.entropy.new_id(), thread_id=loaded.thread_id, run_id=run_id,
                    ts=self.entropy.now_ms(), events=[ToolCallDecided(call_id=d.target_id, decision=d) for d in new],
                )
                res = await self.store.append(commit, loaded.version)
                live = self.active(run_id)
                if live is not None:  # the loop folds the commit (and hands it to its handle)
                    self.poke(run_id)
                _log.info("run.decided_live", thread_id=loaded.thread_id, run_id=run_id, seq=res.seq,
                          here=live is not None)
                return DecideResult(res.seq, False, [], live, loaded.thread_id)
            handle = self._handle_for(loaded)
            loop = self._loop_for(loaded, handle)
            await self._begin_continue(loaded, loop, new)
            self._drive(loop, handle)
            return DecideResult(loop.version, False, list(loop.resumed), handle, loaded.thread_id)

        return await retry_on_conflict(attempt, f"record decisions for run {run_id!r}")

    @staticmethod
    def _known_calls(loaded: _Loaded, decisions: Sequence[ToolCallDecision]) -> set[str]:
        """`agentlog.runtime.loading.known_calls` of a loaded run."""
        return known_calls(loaded.ctx, loaded.run_commits, loaded.snapshot, decisions)

    async def _decision_seq(self, loaded: _Loaded, decision_id: str) -> int:
        """The seq of the commit that first recorded `decision_id` (the answer to a duplicate):
        in the commits loaded, else (recorded before the run's snapshot, which does not keep it)
        in the run's commits read from the log, the rare path."""
        seqs = decision_seqs(loaded.run_commits)
        if decision_id not in seqs and loaded.snapshot is not None:
            seqs = decision_seqs([sc async for sc in self.store.read_run(loaded.ctx.run_id)])
        return seqs[decision_id]

    async def _close_parent(self, parent_run_id: str, decisions: Sequence[DecisionInput]) -> None:
        """Before a continuation: apply its decisions to the parent (and let it run to its next
        stop), then cancel the parent if it still waits."""
        if decisions:
            result = await self.decide(parent_run_id, decisions)
            if result.handle is not None:
                await result.handle.result()
        loaded = await self._load(parent_run_id)
        if loaded.ctx.finished is None and loaded.ctx.suspended and not loaded.ctx.running:
            await self.cancel(parent_run_id, reason="superseded by a continuation run")

    # -- cancelling ----------------------------------------------------------------------------

    async def cancel(self, run_id: str, reason: str | None = None) -> bool:
        """Cancel the run. Returns False if it had already finished (nothing appended).

        A waiting run is cancelled here, from the log, in one commit (its suspended calls and
        the run finish `cancelled`). A running run gets a `RunCancelRequested` (and the signal,
        if it runs here), which its loop takes at its next commit. Which of the two is decided
        from the run as read on each attempt, and appended at that version: a run that suspends
        meanwhile makes the append conflict, and the next attempt sees it waiting."""
        validate_run_id(run_id)
        known = self.runs.entry(run_id)
        thread_id = known.thread_id if known is not None else await self._thread_of(run_id)

        async def attempt(i: int) -> bool:
            loop = self.runs.loop(run_id)
            loaded = await self._load(run_id, thread_id, use_snapshot=i == 0)
            ctx = loaded.ctx
            if ctx.finished is not None:
                return False
            if ctx.waiting and ctx.suspended and not ctx.running:
                loop = self._loop_for(loaded, RunHandle(run_id, thread_id, loaded.spec.id))
                await loop.cancel_waiting(reason)
                _log.info("run.cancelled_while_waiting", thread_id=thread_id, run_id=run_id)
                return True
            commit = Commit(
                commit_id=self.entropy.new_id(), thread_id=thread_id, run_id=run_id,
                ts=self.entropy.now_ms(), events=[RunCancelRequested(reason=reason)],
            )
            await self.store.append(commit, loaded.version)  # a conflict: the run moved on, look again
            _log.info("run.cancel_requested", thread_id=thread_id, run_id=run_id)
            if loop is not None:
                loop.request_cancel()
            return True

        return await retry_on_conflict(attempt, f"cancel run {run_id!r}")

    async def settled(self, run_id: str, *, recover: bool = False) -> None:
        """Wait for the observers' asynchronous effects of `run_id`'s commits (sub-agent lineage:
        the parent's decision when a child finishes, cancelling children): observers with a
        `drain(run_id)` coroutine. A worker calls it before acking a command. `recover=True`
        (a redelivered command of a run that ended elsewhere): observers with `recover(run_id)`
        first re-derive those effects from the log, in case the process that wrote the run's
        end died before they ran."""
        if recover:
            for observer in self.observers:
                redo = getattr(observer, "recover", None)
                if redo is not None:
                    await redo(run_id)
        for observer in self.observers:
            drain = getattr(observer, "drain", None)
            if drain is not None:
                await drain(run_id)

    # -- commands ------------------------------------------------------------------------------

    async def execute(self, command: Command, *, unheld: Callable[[], Awaitable[bool]] | None = None,
                      first_delivery: bool = False) -> Executed:
        """Carry out `command` until its effects are in the log: a start, or a decision, until
        its run finishes or waits (following a continuation made here on the way), a cancel
        once recorded, queued messages once recorded. `"done"`, or `"later"`: it cannot be
        carried out now (the thread has another active run, or the run goes on elsewhere). A
        command carried out again picks up where the last attempt stopped: a run already
        started is resumed, decisions already recorded are not recorded twice.

        Raises `CommandRejected` for a command that can never succeed (nothing written).
        `unheld` (a cancel): whether nobody drives the run, which is then resumed here so that
        the recorded cancel ends it. An interrupting continuation's cancel of its parent
        (`ContinueRun.interruption`) is the caller's to execute first. `first_delivery`: the
        queue hands `command` out for the first time, so no attempt of it can have started its
        run: a start is tried at once, without first reading whether the run is in the log (a run
        that is, started some other way, is refused by the start's admission and resumed)."""
        if isinstance(command, StartRun):
            return await self._execute_start(command, first_delivery)
        if isinstance(command, Decide):
            return await self._execute_decide(command)
        if isinstance(command, Cancel):
            return await self._execute_cancel(command, unheld)
        return await self._execute_queue(command)

    async def _execute_start(self, cmd: StartRun, first_delivery: bool) -> Executed:
        async def attempt(i: int) -> Executed:
            if i:
                _log.info("command.reevaluate", thread_id=cmd.thread_id, run_id=cmd.run_id)
            handle = self.active(cmd.run_id)  # not None: carried out again while it runs here
            if handle is None and not (first_delivery and i == 0) and await self._started(cmd.run_id):
                handle = await self._resume_from_log(cmd.run_id, cmd.thread_id)
            elif handle is None:
                try:
                    handle = await self.start(cmd)
                except RunConflict as exc:
                    if await self._started(cmd.run_id):
                        raise  # started meanwhile (here before, or elsewhere): look again, and resume it
                    _log.info("command.thread_busy", thread_id=cmd.thread_id, run_id=cmd.run_id, reason=str(exc))
                    return "later"
                except (HitlError, RunNotFound, LookupError, ValueError, TypeError) as exc:
                    raise CommandRejected.of(exc) from None
            if handle is None:  # finished or waiting: the effects of a process that died may be missing
                await self.settled(cmd.run_id, recover=True)
                return "done"
            await self._until_settled(handle)
            return "done"

        return await self._reevaluating(attempt, f"start run {cmd.run_id!r}")

    async def _execute_decide(self, cmd: Decide) -> Executed:
        async def attempt(i: int) -> Executed:
            if i:
                _log.info("command.reevaluate", thread_id=cmd.thread_id, run_id=cmd.run_id)
            active = self.active(cmd.run_id)
            if active is not None:
                await self._until_settled(active)  # it runs here: decide once it waits
            try:
                res = await self._decide(cmd.run_id, cmd.decisions, cmd.thread_id, first_recorded=False)
            except RunNotWaiting as exc:
                if (await self.run_view(cmd.run_id)).finished:
                    raise CommandRejected("run_not_waiting", f"decision after the run finished: {exc}") from None
                if self.active(cmd.run_id) is not None:
                    raise RunConflict("the run goes on here: decide once it waits") from None
                _log.info("command.run_busy_elsewhere", thread_id=cmd.thread_id, run_id=cmd.run_id)
                return "later"
            except (HitlError, RunNotFound) as exc:
                raise CommandRejected.of(exc) from None
            handle = res.handle
            if handle is None:
                # recorded before, by an earlier attempt whose process may have died mid-way (the
                # decision moved the run, nobody drives it now): resume it
                handle = await self._resume_from_log(cmd.run_id, cmd.thread_id)
                if handle is None:
                    await self.settled(cmd.run_id, recover=True)
                    return "done"
            await self._until_settled(handle)
            return "done"

        return await self._reevaluating(attempt, f"decide for run {cmd.run_id!r}")

    async def _execute_cancel(self, cmd: Cancel, unheld: Callable[[], Awaitable[bool]] | None) -> Executed:
        try:
            done = await self.cancel(cmd.run_id, reason=cmd.reason)
        except RunNotFound as exc:
            raise CommandRejected.of(exc) from None
        except RunConflict:
            return "later"
        await self.settled(cmd.run_id)  # e.g. its sub-agents cancelled
        _log.info("run.cancel_command", thread_id=cmd.thread_id, run_id=cmd.run_id, appended=done)
        if done and unheld is not None and self.active(cmd.run_id) is None and await unheld():
            # nobody drives the run, so nobody would act on its recorded cancel: resume it here,
            # and the loop meets the request and finishes the run `cancelled`
            _log.info("run.cancel_orphan", thread_id=cmd.thread_id, run_id=cmd.run_id)
            try:
                handle = await self._resume_from_log(cmd.run_id, cmd.thread_id)
                if handle is not None:
                    await self._until_settled(handle)
            except RunConflict as exc:  # someone else moved it on: it is not ours to finish
                _log.info("command.reevaluate", thread_id=cmd.thread_id, run_id=cmd.run_id, reason=str(exc))
        return "done"

    async def _execute_queue(self, cmd: QueueMessages) -> Executed:
        try:
            await self.queue_messages(cmd.run_id, cmd.messages, mode=cmd.mode, thread_id=cmd.thread_id)
        except (RunEnded, RunNotFound, ValueError, TypeError) as exc:
            raise CommandRejected.of(exc) from None
        except RunConflict:
            return "later"
        return "done"

    @staticmethod
    async def _reevaluating(attempt: Callable[[int], Awaitable[Executed]], what: str) -> Executed:
        """`attempt` again from a fresh read of the log while it meets a `RunConflict` (another
        writer moved the run on); `"later"` if it still does after `CONFLICT_ATTEMPTS`."""
        try:
            return await retry_on_conflict(attempt, what, conflicts=(RunConflict,))
        except RunConflict:
            return "later"

    async def _started(self, run_id: str) -> bool:
        first = await first_commit(self.store.read_run(run_id))
        return first is not None and any(type(e) is RunStarted for e in first.commit.events)

    async def _resume_from_log(self, run_id: str, thread_id: str) -> RunHandle | None:
        handle = await self.resume(run_id, thread_id=thread_id)
        if handle is not None:
            _log.info("run.resumed_from_log", thread_id=thread_id, run_id=run_id)
        return handle

    async def _until_settled(self, handle: RunHandle) -> None:
        """Wait until the run finishes or waits, following a continuation of it made here
        meanwhile (a decision that resumed it again), then for its observers' effects."""
        while True:
            result = await handle.result()
            nxt = self.active(handle.run_id)
            if nxt is not None and nxt is not handle:
                handle = nxt
                continue
            await self.settled(handle.run_id)
            _log.info("run.settled", thread_id=handle.thread_id, run_id=handle.run_id, status=result.status,
                      termination=None if result.termination is None else result.termination.type)
            return

    async def control(self, command: Command) -> None:
        """Apply `command` at once to a run this Runtime drives now: it came on the run's control
        subject ahead of its place in the queue. A cancel is recorded and signalled, a decision
        recorded, queued messages (recorded already) read at the run's next step boundary. A run
        not driven here, or a refusal, is left to the queued command."""
        try:
            if isinstance(command, QueueMessages):
                self.poke(command.run_id)
            elif self.active(command.run_id) is None:
                return
            elif isinstance(command, Cancel):
                # recorded first, then signalled (`cancel` does both): a loop stopped by the
                # signal alone would finish `cancelled` with no request in the log to say why
                await self.cancel(command.run_id, reason=command.reason)
            elif isinstance(command, Decide):
                await self._decide(command.run_id, command.decisions, command.thread_id, first_recorded=False)
        except AgentlogError as exc:
            _log.debug("control.not_applied", run_id=command.run_id, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - the queued command is the truth
            _log.warning("control.failed", run_id=command.run_id, error=f"{type(exc).__name__}: {exc}")

    async def record_failure(self, run_id: str, thread_id: str, code: str, detail: str) -> bool:
        """Finish run `run_id` as an `error` with `code` when it started, has not finished and is
        not driven here: its command was given up on, and it must not look `running` forever.
        Returns whether it was recorded."""

        async def attempt(_i: int) -> bool:
            if self.active(run_id) is not None:
                return False
            commits = [sc async for sc in self.store.read_run(run_id)]
            events = [type(e) for sc in commits for e in sc.commit.events]
            if RunStarted not in events or RunFinished in events:
                return False
            commit = Commit(commit_id=self.entropy.new_id(), thread_id=thread_id, run_id=run_id,
                            ts=self.entropy.now_ms(),
                            events=[RunFinished(termination=Termination(type="error", code=code, detail=detail))])
            await self.store.append(commit, await self.store.thread_version(thread_id))
            _log.warning("run.failed_by_dead_letter", thread_id=thread_id, run_id=run_id, code=code)
            return True

        try:
            return await retry_on_conflict(attempt, f"record the failure of run {run_id!r}")
        except RunConflict:
            return False

    # -- views ---------------------------------------------------------------------------------

    async def thread_view(self, thread_id: str) -> ThreadView:
        """The thread view folded from the log (projections' pure fold)."""
        commits = [sc async for sc in self.store.read_thread(thread_id)]
        return fold_commits(commits).threads.get(thread_id) or ThreadView(thread_id=thread_id)

    async def run_view(self, run_id: str) -> RunView:
        commits = [sc async for sc in self.store.read_run(run_id)]
        if not commits:
            raise RunNotFound(f"unknown run {run_id!r}")
        return fold_commits(commits).runs[run_id]

    async def aclose(self) -> None:
        """Cancel every run still going in this process and wait for them to finish."""
        for handle in self.runs.handles():
            await self.cancel(handle.run_id, reason="runtime closing")
            try:
                await handle.result()
            except Exception:  # noqa: BLE001
                pass
        await self.flush_snapshots()
