"""The one seam every way in (HTTP, the NATS micro service, protocol adapters) uses to change a run.

    dispatcher = InProcessDispatcher(runtime)            # `agentlog serve`: gateway + worker
    dispatcher = QueueDispatcher(store.nc, store)        # `agentlog gateway`: workers elsewhere
    accepted = await dispatcher.start_run("calc", "hi")  # Accepted(thread_id, run_id, seq)
    accepted = await dispatcher.submit_inputs(run_id, decisions=[...])   # or messages=[...]
    accepted = await dispatcher.submit_inputs(run_id, messages="...", mode="steer")  # or follow_up
    accepted = await dispatcher.cancel(run_id)

Why one seam: the callers must not know whether runs execute in this process or on workers, and
both implementations must reject bad input with the SAME typed errors (`agentlog.runtime.loop.hitl`'s
`InvalidDecision`, `UnknownCall`, `CallNotSuspended`, `RunNotWaiting`, `RunNotFound`, and the ones
below) before anything is written, so an HTTP or NATS answer does not depend on the deployment.
So the opening of an input to a run and of a cancel (routing, checks, the caller's access) is
written once (`_submit_inputs`, `_cancellable`); each dispatcher only executes what passed.

Every answer carries `seq`: the log seq of the commit that made the request visible (the run's
`RunStarted`, the `ToolCallDecided`, the `RunCancelRequested`, the `MessageQueued`), which a client passes as `min_seq`
to read its own write from the views.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, overload

import msgspec
from nats.aio.client import Client as NATS

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import (
    AgentHandedOff,
    MessageAppended,
    MessageQueued,
    QueueMode,
    RunCancelRequested,
    RunFinished,
    RunStarted,
    StoredCommit,
    ToolCallDecided,
    ToolCallDecision,
)
from agentlog.eventlog.ids import new_id, now_ms, validate_run_id
from agentlog.eventlog.store import EventStore, as_generator
from agentlog.gateway.operations.agents import agent_catalog
from agentlog.gateway.operations.errors import about_run
from agentlog.projections.fold import fold_commits
from agentlog.runtime.errors import RunConflict, RunNotFound, ThreadNotFound
from agentlog.runtime.facade import Runtime
from agentlog.runtime.inputs.admission import (
    InvalidRunInput,
    PlaceholderIds,
    admit_thread,
    check_messages,
    check_start,
    check_start_ids,
    check_storable,
)
from agentlog.runtime.inputs.frontend import InvalidFrontendTools, normalize_frontend_tools
from agentlog.runtime.inputs.run_input import (
    OverridePolicy,
    RunInput,
    as_run_input,
    check_overrides,
    run_input_wire,
)
from agentlog.runtime.loading import Handoff, LoadedRun, RunLoader, known_calls
from agentlog.runtime.loop.hitl import check_decisions, decision_seqs, parse_decisions
from agentlog.runtime.outage import is_transient
from agentlog.runtime.queued import QUEUE_MODES, queue_input, recorded_ids
from agentlog.runtime.snapshots.store import SnapshotStore
from agentlog.runtime.workers.claims import StartClaims, Withdrawal
from agentlog.runtime.workers.commands import (
    DLQ_CODE,
    DLQ_COMMAND_ID,
    DLQ_ERROR,
    DLQ_SUBJECTS,
    INTERRUPTED,
    Cancel,
    CommandClient,
    ContinueRun,
    Decide,
    QueueMessages,
    StartRun,
)

Messages = str | Sequence[Any]


class Accepted(NamedTuple):
    """A request the log has taken: where it landed. `duplicate`: a retry of a request already
    taken (every decision given was already recorded; a start whose run id already started, or
    was taken by a worker); `seq` is then the commit that recorded it first. `queued`: a start a
    worker has taken but not yet committed; it will run, and `seq` is the thread's position when
    it was queued."""

    thread_id: str
    run_id: str
    seq: int
    duplicate: bool = False
    queued: bool = False


# == errors (codes map to statuses in src/agentlog/gateway/http/errors.STATUS_BY_CODE) ==========================


class AgentNotFound(AgentlogError, LookupError):
    code = "agent_not_found"


class RunAlreadyFinished(AgentlogError):
    """Cancel of a run that already finished: nothing was appended."""

    code = "run_finished"


class InvalidInput(AgentlogError, ValueError):
    """Input the runtime would refuse (bad message shape, inconsistent ids)."""

    code = "invalid_input"


class CommandFailed(AgentlogError, ValueError):
    """A worker gave up on the command (dead-lettered it, see `agentlog.runtime.workers.worker`): the answer
    carries the worker's error code (e.g. `commit_too_large` -> 413), so a request fails in
    gateway mode as it would in serve mode instead of waiting into a `DispatchTimeout`. A code
    the API has no status for is a refusal of the input (400, as the runtime's ValueErrors are
    in serve mode); `max_deliveries` (503) and `command_failed` (500) are the worker's own."""

    code = "command_failed"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code:
            self.code = code


class DispatchTimeout(AgentlogError):
    """No worker made the command's effect visible in time (no worker running, or all busy). A
    start is then withdrawn (`agentlog.runtime.workers.claims`): it will not run, and retrying it
    is safe. Any other command stays queued and is applied when a worker takes it (decisions
    sent again with the same decision ids are recorded once)."""

    code = "dispatch_timeout"

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


# == the seam ======================================================================================


#: The caller's access check of a run (a tenant's gateway request): given the run's thread and
#: the seq of one of its commits (so the views can be waited for up to it), it raises to refuse.
#: A dispatcher calls it on the run as it read it for the request, before anything else reads
#: the run's state: the check costs no read of its own, and a refused caller learns nothing.
RunAccess = Callable[[str, int], Awaitable[None]]


class Dispatcher(Protocol):
    async def start_run(
        self,
        agent_id: str,
        messages: Messages = (),
        *,
        thread_id: str | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        decisions: Sequence[Mapping[str, Any]] | None = None,
        resource_id: str | None = None,
        frontend_tools: Sequence[Mapping[str, Any]] | None = None,
        interrupt: bool = False,
        run_input: RunInput | Mapping[str, Any] | None = None,
    ) -> Accepted: ...

    async def submit_inputs(
        self, run_id: str, *, decisions: Sequence[Mapping[str, Any]] = (), messages: Messages = (),
        mode: str | None = None, access: RunAccess | None = None,
    ) -> Accepted: ...

    async def cancel(self, run_id: str, reason: str | None = None) -> Accepted: ...

    async def resume_run(self, run_id: str, thread_id: str, after: int) -> Accepted:
        """Have an unfinished run that nobody drives (its log written whole, e.g. a counterfactual
        branch's copy) go on from the log, like a run whose worker died; answers once the run's
        first commit after seq `after` is in the log."""
        ...

    def check_overrides(self, agent_id: str, run_input: RunInput | Mapping[str, Any] | None) -> None: ...

    @property
    def runtime(self) -> Runtime | None:
        """The `Runtime` that executes the runs in this process (it can also replay them), or
        None: the runs execute on workers."""

    def agent_catalog(self) -> list[dict[str, Any]]:
        """The agents this dispatcher can start (`agentlog.gateway.operations.agents.agent_catalog`)."""
        ...


def _has_messages(messages: Messages | None) -> bool:
    return bool(messages)


def _check_storable(value: Any, what: str) -> None:
    """Both dispatchers, before anything: input that can never be written is `InvalidInput`."""
    try:
        check_storable(value if not isinstance(value, Sequence) or isinstance(value, str) else list(value), what)
    except InvalidRunInput as exc:
        raise InvalidInput(str(exc)) from None


def _seq_of(commits: Sequence[StoredCommit], pred: Callable[[Any], bool], last: bool = False) -> int:
    seqs = [sc.seq for sc in commits if any(pred(e) for e in sc.commit.events)]
    if not seqs:
        raise RunNotFound("the run's commit was not found in the log")
    return seqs[-1] if last else seqs[0]


async def _run_commits(store: EventStore, run_id: str) -> list[StoredCommit]:
    validate_run_id(run_id)
    commits = [sc async for sc in store.read_run(run_id)]
    if not commits:
        raise RunNotFound(f"unknown run {run_id!r}")
    return commits


def _agent_of(commits: Sequence[StoredCommit]) -> str:
    """The run's active agent: the target of its last handoff, else its `RunStarted` agent. A
    continuation that names no agent (messages sent to a run) goes on with it."""
    agent = next(e.agent_id for sc in commits for e in sc.commit.events if type(e) is RunStarted)
    for sc in commits:
        for e in sc.commit.events:
            if type(e) is AgentHandedOff:
                agent = e.to_agent
    return agent


def _app_of(commits: Sequence[StoredCommit]) -> str | None:
    """The app name the run's `RunStarted` records (None: not recorded)."""
    app = next((e.app for sc in commits for e in sc.commit.events if type(e) is RunStarted), None)
    return app.name if app is not None else None


def _app_of_loaded(run: LoadedRun) -> str | None:
    """`_app_of` for a run loaded from its snapshot + tail: the tail's `RunStarted` if it holds
    it, else the app the snapshot's run view recorded."""
    if any(type(e) is RunStarted for sc in run.run_commits for e in sc.commit.events):
        return _app_of(run.run_commits)
    if run.snapshot is not None:
        app = run.snapshot.tail_view().app
        return app.name if app is not None else None
    return None


def _first_seq(run: LoadedRun) -> int:
    """A seq of the run's that the views have once they hold its thread: its first commit read,
    else its snapshot's."""
    if run.snapshot is not None:
        return run.snapshot.seq
    return run.run_commits[0].seq if run.run_commits else run.version


def _check_decisions(run: LoadedRun, decisions: Sequence[Mapping[str, Any]]) -> tuple[list[ToolCallDecision],
                                                                                      list[ToolCallDecision]]:
    """`Runtime.decide`'s validation (new decisions, duplicates), on a run loaded from the log."""
    parsed = parse_decisions(decisions, now_ms())
    return check_decisions(run.ctx, parsed, known_calls(run.ctx, run.run_commits, run.snapshot, parsed))


def _finished(commits: Sequence[StoredCommit]) -> bool:
    return any(type(e) is RunFinished for sc in commits for e in sc.commit.events)


async def _decision_seq(store: EventStore, run: LoadedRun, decision_id: str) -> int:
    """The seq of the commit that first recorded `decision_id` (a retried decision's answer). A
    snapshot does not keep it: that rare path reads the run's commits."""
    commits = run.run_commits if run.snapshot is None else [sc async for sc in store.read_run(run.ctx.run_id)]
    return decision_seqs(commits)[decision_id]


async def _started_already(store: EventStore, run_id: str, agent_id: str, thread_id: str | None,
                           parent_run_id: str | None, messages: Messages) -> Accepted | None:
    """The answer to a start whose run id is taken: the original start's (`duplicate`, the seq
    of its `RunStarted`) when the log's start of `run_id` is this one (the same agent, parent,
    thread if given, and input messages: a client's retry), else None (a `RunConflict`: the id
    names another start)."""
    commits = [sc async for sc in store.read_run(run_id)]
    for sc in commits:
        started = next((e for e in sc.commit.events if type(e) is RunStarted), None)
        if started is None:
            continue
        given = [(m.role, m.content, m.parts) for m in check_messages(_wire_messages(messages))]
        recorded = [(e.message.role, e.message.content, e.message.parts)
                    for e in sc.commit.events if type(e) is MessageAppended]
        same = (started.agent_id == agent_id and started.parent_run_id == parent_run_id
                and thread_id in (None, sc.commit.thread_id) and given == recorded)
        return Accepted(sc.commit.thread_id, run_id, sc.seq, duplicate=True) if same else None
    return None


# == a run's input and its cancel: the checks both deployments make ================================


class _RunIO(NamedTuple):
    """Where a dispatcher reads a run (`store`; `loader`: snapshot + tail) and to whom it hands
    a run it loaded to check decisions (`handoff`: the runtime that executes them, if in this
    process), so that the run is not loaded twice."""

    store: EventStore
    loader: RunLoader
    handoff: Handoff | None


class _QueuedInput(NamedTuple):
    """Messages checked for queueing on a running run: as they go on the wire, each with an id
    (chosen here, so that a retry and the wait for the effect know them), and those ids."""

    wire: list[Any]
    ids: frozenset[str]
    mode: QueueMode


class _Executor(Dispatcher, Protocol):
    """A dispatcher as `_submit_inputs` drives it: how it reads runs, and the steps that execute
    input already checked and allowed, the only part where the two deployments differ (the
    runtime in this process, or a command queued for a worker and its effect waited for)."""

    def _run_io(self) -> _RunIO: ...

    async def _queue_checked(self, run_id: str, commits: list[StoredCommit], queued: _QueuedInput) -> Accepted:
        """Record `queued` for the run whose commits are `commits` (`run_finished` once it has finished)."""
        ...

    async def _decide_checked(self, run: LoadedRun, decisions: Sequence[Mapping[str, Any]],
                              new: frozenset[str]) -> Accepted:
        """Record `decisions` (`new`: the ids not recorded yet) for `run`, loaded and checked."""
        ...


async def _submit_inputs(via: _Executor, run_id: str, decisions: Sequence[Mapping[str, Any]], messages: Messages,
                         mode: str | None, access: RunAccess | None) -> Accepted:
    """`Dispatcher.submit_inputs` of both deployments: the routing and every check of the input
    run here, in one order, before `via` executes anything, so a rule added here holds for both
    and a refused input writes nothing. The caller's `access` is checked on the one read of the
    run, before anything else looks at its state: a refused caller learns nothing about it."""
    _check_storable(decisions, "decisions")
    io = via._run_io()
    if mode in QUEUE_MODES:  # for the running run to take (steer / follow_up)
        queued = _queueable(run_id, messages, decisions, mode)
        commits = await _run_commits(io.store, run_id)
        if access is not None:
            await access(commits[0].commit.thread_id, commits[0].seq)
        return await via._queue_checked(run_id, commits, queued)
    if _has_messages(messages):  # a continuation run, interrupting this one if asked
        commits = await _run_commits(io.store, run_id)
        thread_id = commits[0].commit.thread_id
        if access is not None:
            await access(thread_id, commits[0].seq)
        return await via.start_run(_agent_of(commits), messages, thread_id=thread_id, parent_run_id=run_id,
                                   decisions=decisions, interrupt=mode == "interrupt" and not _finished(commits))
    if not decisions:
        raise InvalidInput("give decisions and/or messages")
    run = await io.loader.load(run_id)  # the one read of the run: snapshot + tail
    if access is not None:
        await access(run.thread_id, _first_seq(run))
    new, dups = _check_decisions(run, decisions)
    if not new:  # a retried request: answered from where it was recorded
        return Accepted(run.thread_id, run_id, await _decision_seq(io.store, run, dups[0].decision_id), True)
    if io.handoff is not None:  # before they execute: a worker may take the command at once
        io.handoff.give(run, [d.decision_id for d in (*new, *dups)])
    return await via._decide_checked(run, decisions, frozenset(d.decision_id for d in new))


def _queueable(run_id: str, messages: Messages, decisions: Sequence[Mapping[str, Any]],
               mode: QueueMode) -> _QueuedInput:
    """Messages for a running run, checked as the runtime checks them (`queue_input`) and as
    something the log can store."""
    validate_run_id(run_id)
    if not _has_messages(messages):
        raise InvalidInput("a queued input needs messages")
    if decisions:
        raise InvalidInput("decisions cannot be queued: send them without a mode")
    try:
        wire = _with_ids(messages)
        ids = frozenset(m.id for m in queue_input(wire, mode, PlaceholderIds()))
    except (ValueError, TypeError) as exc:
        raise InvalidInput(str(exc)) from None
    _check_storable(wire, "messages")
    return _QueuedInput(wire, ids, mode)


async def _cancellable(store: EventStore, run_id: str, reason: str | None) -> list[StoredCommit]:
    """Both dispatchers' `cancel`, before anything: the reason storable, the run known and not
    finished (`run_finished`: nothing is appended). Returns the run's commits."""
    _check_storable(reason, "reason")
    commits = await _run_commits(store, run_id)
    if _finished(commits):
        raise RunAlreadyFinished(f"run {run_id!r} has already finished")
    return commits


def _checked_start(via: Dispatcher, agent_id: str, messages: Messages, *, thread_id: str | None,
                   run_id: str | None, parent_run_id: str | None, decisions: Sequence[Mapping[str, Any]],
                   resource_id: str | None, frontend_tools: Sequence[Mapping[str, Any]] | None,
                   run_input: RunInput | Mapping[str, Any] | None,
                   max_payload: int | None) -> tuple[list[dict[str, Any]], RunInput | None]:
    """The runtime's own input checks of a start (`check_start`, the call `Runtime.start` makes),
    for a dispatcher that writes or queues something before the runtime sees the start: the
    frontend tools normalised (their names; a clash with the agent's tools only the runtime can
    see) and the run input converted."""
    try:
        frontend = normalize_frontend_tools(frontend_tools)
        via.check_overrides(agent_id, run_input)
        given = as_run_input(run_input)
        check_start(agent_id, messages, thread_id=thread_id, run_id=run_id, parent_run_id=parent_run_id,
                    decisions=decisions, resource_id=resource_id, frontend_tools=frontend,
                    max_payload=max_payload, run_input=given)
    except (InvalidFrontendTools, InvalidRunInput) as exc:
        raise InvalidInput(str(exc)) from None
    except AgentlogError:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidInput(str(exc)) from None
    return frontend, given


# == in process ====================================================================================


#: How long an in-process interrupt waits for the cancelled run to finish.
INTERRUPT_WAIT = 30.0


class InProcessDispatcher:
    """Runs execute in this process (`serve`): calls the `Runtime` directly. The runtime
    validates before it appends, so its typed errors are the answers."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def agent_catalog(self) -> list[dict[str, Any]]:
        return agent_catalog(self.runtime)

    async def start_run(
        self, agent_id: str, messages: Messages = (), *, thread_id: str | None = None,
        run_id: str | None = None, parent_run_id: str | None = None,
        decisions: Sequence[Mapping[str, Any]] | None = None, resource_id: str | None = None,
        frontend_tools: Sequence[Mapping[str, Any]] | None = None, interrupt: bool = False,
        run_input: RunInput | Mapping[str, Any] | None = None,
    ) -> Accepted:
        check_start_ids(agent_id, thread_id, run_id, parent_run_id)
        with about_run(run_id):
            return await self._start_run(agent_id, messages, thread_id=thread_id, run_id=run_id,
                                         parent_run_id=parent_run_id, decisions=decisions, resource_id=resource_id,
                                         frontend_tools=frontend_tools, interrupt=interrupt, run_input=run_input)

    async def _start_run(
        self, agent_id: str, messages: Messages, *, thread_id: str | None, run_id: str | None,
        parent_run_id: str | None, decisions: Sequence[Mapping[str, Any]] | None, resource_id: str | None,
        frontend_tools: Sequence[Mapping[str, Any]] | None, interrupt: bool,
        run_input: RunInput | Mapping[str, Any] | None,
    ) -> Accepted:
        if agent_id not in self.runtime.agents:
            raise AgentNotFound(f"unknown agent {agent_id!r}")
        if interrupt and parent_run_id is not None:
            # the cancel is a write: a continuation the runtime would refuse must fail before it
            _checked_start(self, agent_id, messages, thread_id=thread_id, run_id=run_id, parent_run_id=parent_run_id,
                           decisions=list(decisions or ()), resource_id=resource_id, frontend_tools=frontend_tools,
                           run_input=run_input, max_payload=getattr(self.runtime.store, "max_payload", None))
            commits = await _run_commits(self.runtime.store, parent_run_id)
            if not _finished(commits):
                await self._interrupt(parent_run_id, commits[0].commit.thread_id)
        try:
            handle = await self.runtime.start(
                agent_id, messages, thread_id=thread_id, run_id=run_id, parent_run_id=parent_run_id,
                decisions=list(decisions or ()), resource_id=resource_id, frontend_tools=frontend_tools,
                run_input=run_input,
            )
        except RunConflict:
            same = None if run_id is None else await _started_already(
                self.runtime.store, run_id, agent_id, thread_id, parent_run_id, messages)
            if same is None:
                raise
            return same
        except AgentlogError:
            raise
        except (ValueError, TypeError) as exc:
            raise InvalidInput(str(exc)) from None
        seq = _seq_of(handle.commits, lambda e: type(e) is RunStarted)
        return Accepted(handle.thread_id, handle.run_id, seq)

    def check_overrides(self, agent_id: str, run_input: RunInput | Mapping[str, Any] | None) -> None:
        """Raise what `start_run` would for the request's overrides (`OverrideNotAllowed`,
        `InvalidInput`), for a caller that must check before it writes something else first."""
        try:
            given = as_run_input(run_input)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if given is not None and agent_id in self.runtime.agents:
            spec = self.runtime.agents.get(agent_id)
            check_overrides(given.overrides, spec.overrides, spec.model_name, spec.tools)

    async def submit_inputs(
        self, run_id: str, *, decisions: Sequence[Mapping[str, Any]] = (), messages: Messages = (),
        mode: str | None = None, access: RunAccess | None = None,
    ) -> Accepted:
        with about_run(run_id):
            return await _submit_inputs(self, run_id, decisions, messages, mode, access)

    def _run_io(self) -> _RunIO:
        rt = self.runtime
        return _RunIO(rt.store, rt.loader(), rt.handoff)

    async def _queue_checked(self, run_id: str, commits: list[StoredCommit], queued: _QueuedInput) -> Accepted:
        try:
            res = await self.runtime.queue_messages(run_id, queued.wire, mode=queued.mode,
                                                    thread_id=commits[0].commit.thread_id)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(str(exc)) from None
        return Accepted(res.thread_id, run_id, res.seq, res.duplicate)

    async def _decide_checked(self, run: LoadedRun, decisions: Sequence[Mapping[str, Any]],
                              new: frozenset[str]) -> Accepted:
        # the runtime's `decide` takes the run handed on (`_submit_inputs`): no second load
        res = await self.runtime.decide(run.ctx.run_id, list(decisions))
        return Accepted(res.thread_id, run.ctx.run_id, res.seq, res.duplicate)

    async def _interrupt(self, run_id: str, thread_id: str) -> None:
        """Cancel the run and wait (bounded by the caller) until it has finished, so the
        continuation never runs beside it."""
        store = self.runtime.store
        version = await store.thread_version(thread_id)
        await self.runtime.cancel(run_id, reason=INTERRUPTED)
        if _finished(await _run_commits(store, run_id)):
            return
        try:
            async with asyncio.timeout(INTERRUPT_WAIT):
                await _first(store.follow(thread_id, after=version),
                             lambda sc: sc.commit.run_id == run_id and _has(sc, RunFinished))
        except TimeoutError:
            raise RunConflict(f"run {run_id!r} did not stop within {INTERRUPT_WAIT:g}s of its cancel") from None

    async def resume_run(self, run_id: str, thread_id: str, after: int) -> Accepted:
        handle = await self.runtime.resume(run_id, thread_id=thread_id)
        if handle is None:
            return Accepted(thread_id, run_id, after)
        seq = await _first(as_generator(self.runtime.store.follow(thread_id, after=after)),
                           lambda sc: sc.commit.run_id == run_id)
        return Accepted(thread_id, run_id, seq)

    async def cancel(self, run_id: str, reason: str | None = None) -> Accepted:
        with about_run(run_id):
            return await self._cancel(run_id, reason)

    async def _cancel(self, run_id: str, reason: str | None) -> Accepted:
        commits = await _cancellable(self.runtime.store, run_id, reason)
        if not await self.runtime.cancel(run_id, reason=reason):  # it finished meanwhile
            raise RunAlreadyFinished(f"run {run_id!r} has already finished")
        after = [sc async for sc in self.runtime.store.read_run(run_id, after=commits[-1].seq)]
        seq = _seq_of(after, lambda e: type(e) is RunCancelRequested, last=True)
        return Accepted(commits[0].commit.thread_id, run_id, seq)


# == via the work queue ============================================================================


class QueueDispatcher:
    """Runs execute on workers (`gateway`): validate against the log, queue the command, wait
    (bounded) until its effect is in the log.

    The checks here are the runtime's own (the pure functions of `agentlog.runtime.loop.hitl` over the run
    folded with `agentlog.runtime.loop.run_context.fold_context`), so a bad request gets the error the runtime would
    raise and NOTHING is queued or written. The remaining race (the run changes between our
    check and the worker's) is the worker's to settle; it then terminates the command and the
    wait here ends in `DispatchTimeout`.

    `agents`: ids a worker can run; when given, unknown agents are refused here (404).
    `descriptions`: their `AgentSpec.description`s (agent id -> text), for `GET /v1/agents`.
    `snapshots`: the workers' run-context snapshots (read only): the run a decision is checked
    against is then loaded from its snapshot and the log after it (`RunLoader`), not folded
    from the thread's first commit.
    `app_name`: the app whose workers get new runs; a run's later commands (continue, decide,
    cancel) go to the app recorded in its `RunStarted` (`_app_of`), this one if none is.
    `override_policies`: agent id -> (its model name, its `OverridePolicy`), when the gateway
    knows the app: a request's overrides are then checked here, else by the worker (which
    refuses the command with the same code).
    `handoff`: the `Runtime.handoff` of a worker in this process (`agentlog serve`): a run
    loaded here to check a decision is handed to it, so that its `decide` does not load the run
    again (`agentlog.runtime.loading.Handoff`).
    """

    def __init__(self, nc: NATS, store: EventStore, *, agents: Collection[str] | None = None,
                 descriptions: Mapping[str, str] | None = None, timeout: float = 10.0,
                 snapshots: SnapshotStore | None = None, app_name: str | None = None,
                 override_policies: Mapping[str, tuple[str, OverridePolicy]] | None = None,
                 handoff: Handoff | None = None) -> None:
        self.store = store
        self.handoff = handoff
        self.override_policies = dict(override_policies or {})
        self.client = CommandClient(nc, app_name=app_name)
        self.agents = set(agents) if agents is not None else None
        self.descriptions = dict(descriptions or {})
        self.timeout = timeout
        self.loader = RunLoader(store, snapshots=snapshots)
        #: The offers of the starts queued here, which a start not taken in time is withdrawn from.
        self.claims = StartClaims(self.client.js)
        #: Command id -> the future of a wait for its effect, set if a worker dead-letters it.
        self._dead: dict[str, asyncio.Future[Any]] = {}
        self._dead_sub: asyncio.Future[None] | None = None

    @property
    def runtime(self) -> Runtime | None:
        return None  # the runs execute on workers

    def agent_catalog(self) -> list[dict[str, Any]]:
        """Ids and descriptions only: the tools are the workers' to know (`null`)."""
        if self.agents is None:
            return []
        return [{"id": a, "description": self.descriptions.get(a, ""), "tools": None} for a in sorted(self.agents)]

    # -- start ---------------------------------------------------------------------------------

    async def start_run(
        self, agent_id: str, messages: Messages = (), *, thread_id: str | None = None,
        run_id: str | None = None, parent_run_id: str | None = None,
        decisions: Sequence[Mapping[str, Any]] | None = None, resource_id: str | None = None,
        frontend_tools: Sequence[Mapping[str, Any]] | None = None, interrupt: bool = False,
        run_input: RunInput | Mapping[str, Any] | None = None,
    ) -> Accepted:
        """`interrupt` (a continuation of a running parent): ONE command (`ContinueRun.interrupt`)
        that the worker executes as "cancel the parent, then start once it has finished", so the
        thread never has two active runs and a crash between the two leaves the command queued.

        The start is offered (`agentlog.runtime.workers.claims`): if no worker has started it
        within the timeout it is withdrawn, and the answer is `DispatchTimeout` (it will not run;
        a retry is safe); if a worker took it meanwhile, the answer waits for its `RunStarted`
        once more, and is `queued` (it will run) if that has not shown either. A start whose run
        id is in the log already is answered as the `duplicate` of the original (or refused,
        `RunConflict`, if the id names another start)."""
        check_start_ids(agent_id, thread_id, run_id, parent_run_id)
        with about_run(run_id):
            return await self._start_run(agent_id, messages, thread_id=thread_id, run_id=run_id,
                                         parent_run_id=parent_run_id, decisions=decisions, resource_id=resource_id,
                                         frontend_tools=frontend_tools, interrupt=interrupt, run_input=run_input)

    async def _start_run(
        self, agent_id: str, messages: Messages, *, thread_id: str | None, run_id: str | None,
        parent_run_id: str | None, decisions: Sequence[Mapping[str, Any]] | None, resource_id: str | None,
        frontend_tools: Sequence[Mapping[str, Any]] | None, interrupt: bool,
        run_input: RunInput | Mapping[str, Any] | None,
    ) -> Accepted:
        if self.agents is not None and agent_id not in self.agents:
            raise AgentNotFound(f"unknown agent {agent_id!r}")
        decisions = list(decisions or ())
        frontend, given = _checked_start(self, agent_id, messages, thread_id=thread_id, run_id=run_id,
                                         parent_run_id=parent_run_id, decisions=decisions, resource_id=resource_id,
                                         frontend_tools=frontend_tools, run_input=run_input,
                                         max_payload=getattr(self.store, "max_payload", None))
        app_name = None
        if parent_run_id is not None:
            parent = await _run_commits(self.store, parent_run_id)
            app_name = _app_of(parent)
            parent_thread = parent[0].commit.thread_id
            if thread_id is not None and thread_id != parent_thread:
                raise RunNotFound(f"parent run {parent_run_id!r} is not on thread {thread_id!r}")
            thread_id = parent_thread
            if decisions:
                _check_decisions(await self.loader.load(parent_run_id, thread_id), decisions)
        given_thread = thread_id
        thread_id = thread_id or new_id()
        try:
            version = await self._check_start(thread_id, run_id, parent_run_id, interrupting=parent_run_id
                                              if interrupt else None)
        except RunConflict:
            same = None if run_id is None else await _started_already(
                self.store, run_id, agent_id, given_thread, parent_run_id, messages)
            if same is None:
                raise
            return same
        run_id = run_id or new_id()
        with about_run(run_id):
            cls = ContinueRun if parent_run_id is not None else StartRun
            # resource_id rides in the command: the worker's run-start commit creates the thread, so
            # the gateway writes nothing itself (a ThreadCreated written here would be left an
            # orphan thread by a start that then fails)
            cmd = cls(thread_id=thread_id, run_id=run_id, agent_id=agent_id, messages=_wire_messages(messages),
                      parent_run_id=parent_run_id, decisions=[dict(d) for d in decisions], frontend_tools=frontend,
                      resource_id=resource_id, run_input=run_input_wire(given), offered=True)
            if interrupt:
                cmd = ContinueRun(**{**msgspec.structs.asdict(cmd), "interrupt": True})
            self.client.check(cmd)  # a command that cannot be queued is refused before the offer
            return await self._offer_and_wait(cmd, thread_id, version, app_name)

    async def _offer_and_wait(self, cmd: StartRun, thread_id: str, version: int, app_name: str | None) -> Accepted:
        """Offer the start `cmd`, queue it, and answer from what became of it (see `start_run`)."""
        run_id = cmd.run_id

        def started(sc: StoredCommit) -> bool:
            return sc.commit.run_id == run_id and _has(sc, RunStarted)

        offer = await self.claims.offer(run_id, cmd.command_id)
        if offer.taken:  # an earlier attempt's command is taken: it starts this run; nothing new is queued
            seq = await self._submit_and_wait(None, thread_id, version, started, app_name, settle=_wait_once_more)
            return Accepted(thread_id, run_id, version if seq is None else seq, duplicate=True, queued=seq is None)
        outcome: Withdrawal | None = None

        async def settle() -> bool:
            nonlocal outcome
            outcome = await self.claims.withdraw(run_id, cmd.command_id, offer.revision)
            return outcome is Withdrawal.TAKEN

        seq = await self._submit_and_wait(cmd, thread_id, version, started, app_name, settle=settle)
        if seq is not None:
            return Accepted(thread_id, run_id, seq)
        if outcome is Withdrawal.TAKEN:  # a worker has it: it runs, it is just not in the log yet
            return Accepted(thread_id, run_id, version, queued=True)
        if outcome is Withdrawal.SUPERSEDED:
            raise RunConflict(f"a later start of run {run_id!r} (the same run id) replaced this one, which will not run")
        raise DispatchTimeout(
            f"no worker started run {run_id!r} within {self.timeout:g}s (is a worker running, or are all busy?): "
            "the start is withdrawn and will not run; retrying it is safe (with the same run_id a retry "
            "never runs twice)", run_id)

    def check_overrides(self, agent_id: str, run_input: RunInput | Mapping[str, Any] | None) -> None:
        """Raise what `start_run` would here for the request's overrides (`OverrideNotAllowed`,
        `InvalidInput`); without the agent's policy only the worker can tell."""
        try:
            given = as_run_input(run_input)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        policy = self.override_policies.get(agent_id)
        if given is not None and policy is not None:
            check_overrides(given.overrides, policy[1], policy[0])

    async def _check_start(self, thread_id: str, run_id: str | None, parent_run_id: str | None,
                           interrupting: str | None = None) -> int:
        """The start admission `Runtime.start` applies (`agentlog.runtime.inputs.admission.admit_thread`),
        from the log, before anything is queued. Returns the thread's version (where the wait
        for the effect starts). `interrupting`: the running run the command cancels first (its
        being active is then no conflict; the worker starts only once it has finished)."""
        try:
            history, _thread = await admit_thread(self.store, thread_id, run_id=run_id, parent_run_id=parent_run_id)
        except RunConflict:
            if interrupting is None:
                raise
            history = [sc async for sc in self.store.read_thread(thread_id)]
            thread = fold_commits(history).threads.get(thread_id)
            if thread is None or thread.active_run_id != interrupting or (run_id is not None and run_id in thread.run_ids):
                raise
        return history[-1].seq if history else 0

    # -- inputs --------------------------------------------------------------------------------

    async def submit_inputs(
        self, run_id: str, *, decisions: Sequence[Mapping[str, Any]] = (), messages: Messages = (),
        mode: str | None = None, access: RunAccess | None = None,
    ) -> Accepted:
        with about_run(run_id):
            return await _submit_inputs(self, run_id, decisions, messages, mode, access)

    def _run_io(self) -> _RunIO:
        return _RunIO(self.store, self.loader, self.handoff)

    async def _queue_checked(self, run_id: str, commits: list[StoredCommit], queued: _QueuedInput) -> Accepted:
        """`QueueMessages`, decided here as the worker's runtime would (a retry is answered from
        where it was recorded; a finished run is `run_finished`, nothing queued); the effect
        waited for is the `MessageQueued` of these message ids."""
        thread_id = commits[0].commit.thread_id
        seen = recorded_ids(commits)
        if queued.ids <= seen.keys():
            return Accepted(thread_id, run_id, min(seen[i] for i in queued.ids), True)
        if _finished(commits):
            raise RunAlreadyFinished(f"run {run_id!r} has already finished: nothing can be queued for it "
                                     "(continue the thread with a new run instead)")
        version = await self.store.thread_version(thread_id)
        cmd = QueueMessages(thread_id=thread_id, run_id=run_id, messages=queued.wire, mode=queued.mode)
        seq = await self._submit_and_wait(
            cmd, thread_id, version,
            lambda sc: sc.commit.run_id == run_id and any(
                type(e) is MessageQueued and e.message.id in queued.ids for e in sc.commit.events),
            _app_of(commits))
        return Accepted(thread_id, run_id, seq)

    async def _decide_checked(self, run: LoadedRun, decisions: Sequence[Mapping[str, Any]],
                              new: frozenset[str]) -> Accepted:
        thread_id, run_id = run.thread_id, run.ctx.run_id
        cmd = Decide(thread_id=thread_id, run_id=run_id, decisions=[dict(d) for d in decisions])
        seq = await self._submit_and_wait(
            cmd, thread_id, run.version,
            lambda sc: any(type(e) is ToolCallDecided and e.decision.decision_id in new for e in sc.commit.events),
            _app_of_loaded(run))
        return Accepted(thread_id, run_id, seq)

    # -- cancel --------------------------------------------------------------------------------

    async def resume_run(self, run_id: str, thread_id: str, after: int) -> Accepted:
        """A start command for the run already in the log: the worker that takes it resumes it."""
        commits = await _run_commits(self.store, run_id)
        cmd = StartRun(thread_id=thread_id, run_id=run_id, agent_id=_agent_of(commits))
        seq = await self._submit_and_wait(cmd, thread_id, after, lambda sc: sc.commit.run_id == run_id,
                                          _app_of(commits))
        return Accepted(thread_id, run_id, seq)

    async def cancel(self, run_id: str, reason: str | None = None) -> Accepted:
        with about_run(run_id):
            return await self._cancel(run_id, reason)

    async def _cancel(self, run_id: str, reason: str | None) -> Accepted:
        commits = await _cancellable(self.store, run_id, reason)
        thread_id = commits[0].commit.thread_id
        version = await self.store.thread_version(thread_id)
        seq = await self._submit_and_wait(
            Cancel(thread_id=thread_id, run_id=run_id, reason=reason), thread_id, version,
            lambda sc: sc.commit.run_id == run_id and (_has(sc, RunCancelRequested) or _has(sc, RunFinished)),
            _app_of(commits))
        return Accepted(thread_id, run_id, seq)

    # -- waiting for the effect ----------------------------------------------------------------

    async def _queue(self, cmd: Any, app_name: str | None) -> None:
        """Queue `cmd` for `app_name`'s workers; its outcome is a write of this process
        (`/health`'s `log writes failing`)."""
        writes = getattr(self.store, "writes", None)
        try:
            await self.client.submit(cmd, app_name=app_name)
        except Exception as exc:
            if writes is not None and is_transient(exc):
                writes.failed("queue command", exc)
            raise
        if writes is not None:
            writes.succeeded()

    @overload
    async def _submit_and_wait(self, cmd: Any, thread_id: str, after: int, done: Callable[[StoredCommit], bool],
                               app_name: str | None = None, settle: None = None) -> int: ...

    @overload
    async def _submit_and_wait(self, cmd: Any, thread_id: str, after: int, done: Callable[[StoredCommit], bool],
                               app_name: str | None = None, *,
                               settle: Callable[[], Awaitable[bool]]) -> int | None: ...

    async def _submit_and_wait(self, cmd: Any, thread_id: str, after: int,
                               done: Callable[[StoredCommit], bool], app_name: str | None = None,
                               settle: Callable[[], Awaitable[bool]] | None = None) -> int | None:
        """Follow the thread from `after` (opened BEFORE the submit, so the effect cannot slip
        by), submit `cmd` (None: nothing, only wait), and return the seq of the first commit
        `done` accepts. If a worker dead-letters the command first (also watched from before the
        submit), raise `CommandFailed` with the worker's error code. If nothing shows within the
        timeout: without `settle`, `DispatchTimeout` (the command stays queued); with it,
        `settle()` runs while the watch is still open: True waits once more, and None is
        returned if the effect still has not shown (the caller answers)."""
        follower = as_generator(self.store.follow(thread_id, after=after))
        dead: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if cmd is not None:
            await self._hear_dead_letters()
            self._dead[cmd.command_id] = dead
        try:
            first = asyncio.ensure_future(_first(follower, done))
            try:
                if cmd is not None:
                    await self._queue(cmd, app_name)
                finished, _ = await asyncio.wait({first, dead}, timeout=self.timeout,
                                                 return_when=asyncio.FIRST_COMPLETED)
                if not finished and settle is not None and await settle():
                    finished, _ = await asyncio.wait({first, dead}, timeout=self.timeout,
                                                     return_when=asyncio.FIRST_COMPLETED)
                if first in finished:
                    return first.result()
                if dead in finished:
                    headers = dead.result()
                    raise CommandFailed(headers.get(DLQ_ERROR) or "a worker gave up on the command",
                                        headers.get(DLQ_CODE))
                if settle is not None:
                    return None
                raise DispatchTimeout(
                    f"{type(cmd).__name__} for run {cmd.run_id!r} is queued, but no worker committed it "
                    f"within {self.timeout:g}s (is a worker running?); it stays queued and is applied when a "
                    "worker takes it (decisions sent again with the same decision ids are recorded once)",
                    cmd.run_id)
            finally:
                first.cancel()
                with contextlib.suppress(BaseException):
                    await first
        finally:
            if cmd is not None and self._dead.get(cmd.command_id) is dead:
                del self._dead[cmd.command_id]
            with contextlib.suppress(Exception):
                await follower.aclose()

    async def _hear_dead_letters(self) -> None:
        """Subscribe once (on the first wait) to every dead letter: each wait registers its
        command id in `_dead`, so no wait pays a subscription and its round trip of its own."""
        if self._dead_sub is None:
            self._dead_sub = asyncio.ensure_future(self._subscribe_dead_letters())
        try:
            await asyncio.shield(self._dead_sub)
        except Exception:
            if self._dead_sub.done():
                self._dead_sub = None  # the next wait tries again
            raise

    async def _subscribe_dead_letters(self) -> None:
        async def on_dead_letter(msg: Any) -> None:
            headers = msg.headers or {}
            dead = self._dead.get(headers.get(DLQ_COMMAND_ID, ""))
            if dead is not None and not dead.done():
                dead.set_result(headers)

        await self.client.nc.subscribe(DLQ_SUBJECTS, cb=on_dead_letter)
        await self.client.nc.flush()  # on the server before the first command is queued


async def _wait_once_more() -> bool:
    return True


async def _first(commits: AsyncIterator[StoredCommit], done: Callable[[StoredCommit], bool]) -> int:
    async for sc in commits:
        if done(sc):
            return sc.seq
    raise DispatchTimeout("the log follow ended before the effect was seen")


def _has(sc: StoredCommit, kind: type) -> bool:
    return any(type(e) is kind for e in sc.commit.events)


def _with_ids(messages: Messages) -> list[Any]:
    """The messages as they go on the wire, each with an id (given ones kept): the queued
    message's id is the caller's handle on it, and what a redelivery is recognised by."""
    out: list[Any] = []
    for m in _wire_messages(messages):
        if isinstance(m, str):
            out.append({"id": new_id(), "role": "user", "content": m})
        elif isinstance(m, Mapping) and not m.get("id"):
            out.append({**m, "id": new_id()})
        else:
            out.append(m)
    return out


def _wire_messages(messages: Messages) -> list[Any]:
    return [messages] if isinstance(messages, str) else [dict(m) if isinstance(m, Mapping) else m for m in messages]


__all__ = [
    "Accepted", "AgentNotFound", "CommandFailed", "DispatchTimeout", "Dispatcher", "InProcessDispatcher", "InvalidInput",
    "QueueDispatcher", "RunAccess", "RunAlreadyFinished", "ThreadNotFound",
]
