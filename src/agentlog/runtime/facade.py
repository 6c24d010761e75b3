"""`Runtime`: start, follow, cancel and continue runs. The I/O shell around `loop.RunLoop`.

A run is started by folding its thread's log (so a continuation sees the whole conversation and
state), committing the run start, and driving the loop in a task. The caller gets a `RunHandle`:
`events()` streams the run's committed events in log order (from an in-process broadcaster fed by
the loop after each append), `result()` gives the termination and the final `RunView` (the
projections' fold over exactly those commits).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import (
    AnyEvent,
    AppRef,
    Commit,
    Message,
    Position,
    QueueMode,
    RunCancelRequested,
    StoredCommit,
    Termination,
    ToolCallDecided,
    ToolCallDecision,
)
from agentlog.eventlog.ids import validate_id, validate_run_id
from agentlog.eventlog.store import EventStore, as_generator
from agentlog.projections.fold import RunFolder, fold_commits
from agentlog.projections.store import ViewStore
from agentlog.projections.views import RunView, ThreadView
from agentlog.runtime.agents.spec import AgentRegistry, AgentSpec, ModelRegistry, derived_tools
from agentlog.runtime.context_policy import Summarizer
from agentlog.runtime.errors import RunConflict, RunNotFound, retry_on_conflict
from agentlog.runtime.inputs.admission import admit_thread, check_request
from agentlog.runtime.inputs.admission import as_messages as _as_messages
from agentlog.runtime.inputs.frontend import check_no_conflict, is_frontend_stub
from agentlog.runtime.inputs.request import RunRequest
from agentlog.runtime.inputs.run_input import OverrideScope
from agentlog.runtime.live import LiveSink, NullLiveSink
from agentlog.runtime.loading import Handoff, LoadedRun, RunLoader, known_calls
from agentlog.runtime.logs import get_logger
from agentlog.runtime.loop.driver import RunLoop
from agentlog.runtime.loop.entropy import SYSTEM_ENTROPY, Entropy
from agentlog.runtime.loop.hitl import (
    DecisionInput,
    check_decisions,
    decision_seqs,
    parse_decisions,
    ready_calls,
)
from agentlog.runtime.loop.run_context import RunContext, fold_context
from agentlog.runtime.models.base import Model
from agentlog.runtime.models.breaker import Breakers
from agentlog.runtime.models.providers import build_provider_model
from agentlog.runtime.outage import OutagePolicy
from agentlog.runtime.queued import Queued, queue_input, queue_messages
from agentlog.runtime.snapshots.format import LoadedSnapshot, RunSnapshot, make_snapshot, with_finished_calls
from agentlog.runtime.snapshots.store import SnapshotStore, save_snapshot
from agentlog.runtime.tools import Tool, ToolRegistry

_log = get_logger()

_SNAPSHOT_SEQS_KEPT = 10_000

#: A callable given every commit a run loop writes (`Runtime.observers`).
CommitObserver = Callable[[StoredCommit], None]


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


class RunHandle:
    """A started run. Its commits are collected as the loop appends them, so `events()` can be
    iterated any number of times, from the start, while the run goes on or after it ended.

    The run view is kept incrementally (`RunFolder`: each commit folded once as it arrives), so
    `view()`/`result()` cost the same at step 2 and step 230. A handle resumed from a snapshot
    starts from the snapshot's view as of `base_seq` (`base`): `commits` then holds the commits
    after `base_seq`, and `events()` reads the older ones from the log (`older`) before yielding
    those.

    Such a base may leave the run's finished calls out (`finished`: a long run's snapshot keeps
    them in chunks, decoded when first needed). The commits are folded on the base without them,
    and they are joined to the folded view only when the whole view is asked for: driving the
    run and knowing its status never decode them. That fold is the whole fold unless a commit
    touched one of those finished calls (an event for a call the base lacks starts a new one): the
    status is the same either way (a finished call and a new one both count for nothing), and
    the whole view, which has them all at hand, then folds the commits again on the base with
    the finished calls found by id (`RunFolder`'s lookup)."""

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

    def _on_commit(self, stored: StoredCommit) -> None:
        self.commits.append(stored)
        self._folder.apply(stored)
        self._changed.set()

    def _close(self, _task: Any = None) -> None:
        self._done = True
        self._changed.set()

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
        #: Optional `agentlog.runtime.snapshots.store.SnapshotStore` (e.g. `KVSnapshotStore`): run contexts are
        #: written there when a run this Runtime drives suspends or finishes, and a cold resume
        #: starts from one (see `_load`). A cache: every miss falls back to folding the log.
        self.snapshots = snapshots
        self._snapshot_writes: set[asyncio.Task[None]] = set()
        # run id -> seq of the last snapshot this Runtime wrote or is writing (see `snapshot_seq`)
        self._snapshot_seqs: OrderedDict[str, int] = OrderedDict()
        self._active: dict[str, tuple[RunLoop, RunHandle]] = {}
        #: Runs a gateway in this process loaded to check a decision and handed on, so that
        #: `decide` does not load them again (`agentlog.runtime.loading.Handoff`).
        self.handoff = Handoff()
        #: Called with every commit a run loop of this Runtime writes (telemetry, metrics,
        #: sub-agent lineage); an observer's `run_released(run_id, ts)`, if any, when a loop
        #: lets go of a run. Their failures are logged and never reach the run.
        self.observers: list[CommitObserver] = list(observers)
        #: The app this Runtime is (name + digest), recorded in each run it starts (`RunStarted.app`);
        #: set by the server processes (`agentlog.cli.server`), None in process unless set.
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
            await admit_thread(self.store, thread_id, run_id=request.run_id, parent_run_id=parent_run_id)
            await self._close_parent(parent_run_id, request.decisions)
        thread_id = thread_id or self.entropy.new_id()
        run_id = request.run_id or self.entropy.new_id()
        # only a chosen run id can be taken: a generated one is new
        history, thread = await admit_thread(self.store, thread_id, run_id=request.run_id, parent_run_id=parent_run_id)
        request = request.replace(thread_id=thread_id, run_id=run_id, frontend_tools=frontend)

        msgs = _as_messages(request.messages, self.entropy)
        ctx = fold_context(RunContext(thread_id=thread_id, run_id=run_id), history)
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

    def _save_run_snapshot(self, loop: RunLoop, handle: RunHandle) -> None:
        """After the run's loop stopped (waiting or finished): its context, which is exactly the
        fold of the thread up to `loop.version`, becomes the run's snapshot. Written in the
        background: the run's result is in the log already and does not wait for a cache (a
        resume that comes first reads the older snapshot and a longer tail). Nothing changes
        the stopped loop's context afterwards (a later resume folds its own)."""
        if self.snapshots is None or not loop.snapshot_ready:
            return
        self._snapshot_seqs[handle.run_id] = loop.version
        self._snapshot_seqs.move_to_end(handle.run_id)
        while len(self._snapshot_seqs) > _SNAPSHOT_SEQS_KEPT:
            self._snapshot_seqs.popitem(last=False)
        task = asyncio.get_running_loop().create_task(
            self._write_snapshot_later(loop, handle.view_as_of(), handle.stored_chunks))
        self._snapshot_writes.add(task)
        task.add_done_callback(self._snapshot_writes.discard)

    async def _write_snapshot_later(self, loop: RunLoop, view_of: Callable[[], RunView], known: Mapping[str, str]) -> None:
        snapshots = self.snapshots
        if snapshots is None:  # the caller checks first
            return
        # Yield first, so whoever awaits the run's result runs before the encoding (CPU work
        # that grows with the run's length: the run view too, whose finished calls a resumed
        # run decodes only now); this only orders work, nothing waits on time.
        for _ in range(3):
            await asyncio.sleep(0)
        snap, chunks = make_snapshot(seq=loop.version, agent_id=loop.spec.id, ctx=loop.ctx, run=view_of(),
                                     known=known)
        await save_snapshot(snapshots, snap, chunks, replaced=known)

    def snapshot_seq(self, run_id: str) -> int:
        """The seq of the last snapshot of `run_id` this Runtime wrote (or is writing in the
        background) when a loop of it stopped; 0 if none (of its last 10,000 runs). A
        `SnapshotWriter` over this Runtime (`agentlog serve`: the projections' hook) then does not
        fold and write the same snapshot a second time."""
        return self._snapshot_seqs.get(run_id, 0)

    async def flush_snapshots(self) -> None:
        """Wait for the snapshot writes in flight (tests, benchmarks, shutdown)."""
        while self._snapshot_writes:
            await asyncio.gather(*self._snapshot_writes)

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
            return handle._on_commit
        observers = self.observers

        def on_commit(sc: StoredCommit) -> None:
            handle._on_commit(sc)
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
        self._active[run_id] = (loop, handle)
        handle._loop = loop
        task = asyncio.get_running_loop().create_task(self._run_loop(loop, handle), name=f"agentlog-run-{run_id}")
        handle._task = task
        task.add_done_callback(handle._close)
        task.add_done_callback(lambda _t: self._forget(run_id, handle))
        if self.observers:
            task.add_done_callback(lambda _t: self._released(handle))

    async def _run_loop(self, loop: RunLoop, handle: RunHandle) -> RunContext:
        ctx = await loop.run()
        self._save_run_snapshot(loop, handle)
        return ctx

    def _forget(self, run_id: str, handle: RunHandle) -> None:
        active = self._active.get(run_id)
        if active is not None and active[1] is handle:
            del self._active[run_id]

    def active(self, run_id: str) -> RunHandle | None:
        """The handle of `run_id` if this Runtime drives it now (its loop has not returned),
        else None: the run is finished, waiting, or driven by another process."""
        active = self._active.get(run_id)
        return active[1] if active is not None and not active[1].done else None

    def active_handles(self) -> list[RunHandle]:
        """The handles of every run this Runtime drives now."""
        return [handle for _loop, handle in self._active.values() if not handle.done]

    def fence_runs(self) -> None:
        """Fence every run driven here: each writes nothing more (`RunLoop.fence`), while its
        task goes on until `abandon_runs` cancels it (so its worker can first hand it back)."""
        for loop, handle in list(self._active.values()):
            if not handle.done:
                loop.fence()

    def abandon_runs(self) -> list[asyncio.Task[Any]]:
        """Stop the runs driven here WITHOUT committing anything: each loop is fenced (it writes
        nothing more, even if a tool ignores the cancellation and returns later) and its task
        cancelled. A process going away leaves them to be resumed from the log by the next one,
        where a cancel would end them for good. Returns the cancelled tasks, to be awaited (a
        tool that ignores cancellation keeps its task alive until it returns: bound the wait)."""
        tasks = []
        for loop, handle in list(self._active.values()):
            task = handle._task
            if task is not None and not task.done():
                loop.fence()
                task.cancel()
                tasks.append(task)
        return tasks

    def signal_cancel(self, run_id: str) -> bool:
        """Signal a run driven by this process to cancel, without appending a cancel request
        (see `RunHandle.request_cancel`). Returns False if it is not running here."""
        active = self._active.get(run_id)
        return active is not None and active[1].request_cancel()

    def poke(self, run_id: str) -> bool:
        """Tell a run driven by this process that its thread has new commits for it (a queued
        message): it reads them at its next step boundary instead of at its next append.
        Returns False if it is not running here."""
        active = self._active.get(run_id)
        if active is None or active[1].done:
            return False
        active[0].poke()
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
        active = self._active.get(run_id)
        if thread_id is None:
            thread_id = active[1].thread_id if active is not None else await self._thread_of(run_id)
        res = await queue_messages(self.store, self.entropy, run_id, thread_id, msgs, mode)
        if not res.duplicate:
            _log.info("run.messages_queued", thread_id=thread_id, run_id=run_id, mode=mode, seq=res.seq)
        self.poke(run_id)
        return res

    async def resume(self, run_id: str, *, thread_id: str | None = None) -> RunHandle | None:
        """Continue an unfinished run from the log alone, on any worker, in any process.

        Nothing is appended before the loop's first commit point:
        - waiting, with recorded decisions that the execution mode lets resume now (appended by
          another process, or by one that crashed before resuming): they are applied as
          `decide` would (`RunResumed` + `ToolCallResuming` commit, then the replays);
        - running, its worker gone: it goes on from its last commit: calls started but not
          completed run again with the same call_id (at-least-once: the call_id is the
          idempotency key), un-started calls start, `resuming` calls are re-driven, an
          inference that was not committed is redone; a recorded cancel request finishes it.
        Returns the run's handle (its `commits` hold the run's log so far), the handle of the
        in-process loop if this Runtime drives it already, or None when there is nothing to
        drive: finished, or waiting with no applicable decision.

        Do not resume a run whose worker is alive elsewhere: per-thread OCC makes one of the two
        fail with `RunConflict`, but a call in flight may have run twice.
        """
        validate_run_id(run_id)
        active = self._active.get(run_id)
        if active is not None and not active[1].done:
            return active[1]

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
            handle._on_commit(sc)
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
        """Record human decisions for a run's suspended calls and resume what they unblock.

        Works from the log alone: the run is loaded here (no in-memory state of the worker that
        suspended it is needed), once: the run a gateway in this process loaded to check these
        same decisions is taken from `handoff` instead of being read again. Validation happens before anything is appended, so every error
        leaves the log unchanged: `InvalidDecision` (malformed), `RunNotWaiting` (finished, or
        nothing suspended), `UnknownCall`, `CallNotSuspended`, `RunNotFound`. A decision whose
        decision_id is already recorded has no effect (idempotent retries); if all are such,
        the answer is the original seq with `duplicate=True`.

        A waiting run: the decision commit holds `ToolCallDecided` and, when the execution mode
        lets calls resume now, `RunResumed` + `ToolCallResuming`; the run then goes on in a
        background task (its `handle`) until it finishes or waits again (`decide` = that commit
        + the continue path of `resume`).

        A running run with a suspended call (parallel modes: other calls still in flight): the
        decisions are recorded (a commit of `ToolCallDecided` only) and the running loop applies
        them as they arrive (parallel_streaming; parallel_batch_approval once the batch is
        decided): told at once through `RunLoop.poke` when it runs in this Runtime (the answer's
        `handle` is then its handle), else at its next append (OCC conflict path), or by
        whoever `resume`s it if its worker died. `resumed` is empty: the loop resumes them.
        """
        if run_id not in self.handoff:  # a run handed on here was loaded under a valid id
            validate_run_id(run_id)
        parsed = parse_decisions(decisions, self.entropy.now_ms())
        handed = self.handoff.take(run_id, (d.decision_id for d in parsed))
        if handed is not None and thread_id is not None and handed.thread_id != thread_id:
            handed = None
        active = self._active.get(run_id)
        if thread_id is None and active is not None:
            thread_id = active[1].thread_id

        async def attempt(i: int) -> DecideResult:
            # a conflict anywhere below: someone else moved the thread, re-fold and re-check
            nonlocal thread_id
            if i == 0 and handed is not None:
                loaded = self._loaded(handed)
            else:  # a conflict after a handed-on run: the snapshot is still worth a try
                fresh = i == 0 or (i == 1 and handed is not None)
                loaded = await self._load(run_id, thread_id, use_snapshot=fresh)
            thread_id = loaded.thread_id
            new, dups = check_decisions(loaded.ctx, parsed, self._known_calls(loaded, parsed))
            if not new:
                seq = await self._decision_seq(loaded, dups[0].decision_id)
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
        """The seq of the commit that first recorded `decision_id` (the answer to a duplicate).
        A snapshot does not keep it: that rare path reads the run's commits."""
        commits = loaded.run_commits
        if loaded.snapshot is not None:
            commits = [sc async for sc in self.store.read_run(loaded.ctx.run_id)]
        return decision_seqs(commits)[decision_id]

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

        A run that waits for decisions runs nowhere: it is cancelled here, from the log, in one
        commit (its suspended calls become `cancelled`, the run finishes `cancelled`). A running
        run gets a `RunCancelRequested` (and the signal, if it runs in this process), which its
        loop takes at its next commit.

        Which of the two is decided on each attempt from the run as read after the thread's
        version, and the commit is appended at that version: a run that suspends while the
        cancel is on its way (its loop commits the suspension and stops) makes the append
        conflict, and the next attempt sees it waiting. Deciding from whether a loop was running
        when the call began would leave a waiting run holding a request no loop reads."""
        validate_run_id(run_id)
        running = self._active.get(run_id)
        thread_id = running[1].thread_id if running is not None else await self._thread_of(run_id)

        async def attempt(i: int) -> bool:
            active = self._active.get(run_id)
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
            if active is not None and not active[1].done:
                active[0].request_cancel()
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
        for run_id, (_loop, handle) in list(self._active.items()):
            await self.cancel(run_id, reason="runtime closing")
            try:
                await handle.result()
            except Exception:  # noqa: BLE001
                pass
        await self.flush_snapshots()
