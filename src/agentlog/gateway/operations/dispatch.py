"""The one seam every way in (HTTP, the NATS micro service, protocol adapters) uses to change a run.

    dispatcher = QueueDispatcher(store.nc, store)           # runs execute on workers
    accepted = await dispatcher.start_run(RunRequest(agent_id="calc", messages=["hi"]))
    accepted = await dispatcher.submit_inputs(run_id, decisions=[...])          # or messages=[...]
    accepted = await dispatcher.submit_inputs(run_id, messages="...", mode="steer")  # or follow_up
    accepted = await dispatcher.cancel(run_id)

A request is checked against the log with the runtime's own checks, so bad input gets the typed
error the runtime would raise, and nothing is queued or written. What passed is queued as a
command (`agentlog.runtime.inputs.commands`) for the workers of the run's app; the answer waits
(bounded) until its effect is in the log. `agentlog serve` runs its worker in the same process,
through the same queue.

Every answer carries `seq`: the log seq of the commit that made the request visible (the run's
`RunStarted`, the `ToolCallDecided`, the `RunCancelRequested`, the `MessageQueued`), which a
client passes as `min_seq` to read its own write from the views.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, overload

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
)
from agentlog.eventlog.ids import new_id, validate_run_id
from agentlog.eventlog.store import EventStore, as_generator
from agentlog.gateway.operations.errors import about_run
from agentlog.runtime import (
    CheckedDecisions,
    DecisionIntake,
    Handoff,
    RunConflict,
    RunNotFound,
    SnapshotStore,
    ThreadNotFound,
    is_transient,
    recorded_ids,
)
from agentlog.runtime.inputs import (
    QUEUE_MODES,
    Cancel,
    Command,
    Decide,
    InvalidFrontendTools,
    InvalidRunInput,
    OverrideScope,
    PlaceholderIds,
    QueueMessages,
    RunRequest,
    StartRun,
    ThreadFolds,
    ThreadViews,
    admit_thread,
    check_ids,
    check_messages,
    check_request,
    check_storable,
    queue_input,
)
from agentlog.runtime.workers import (
    DLQ_CODE,
    DLQ_COMMAND_ID,
    DLQ_ERROR,
    DLQ_SUBJECTS,
    CommandClient,
    StartClaims,
    Withdrawal,
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
    """How a request reaches a run (see the module docstring)."""

    async def start_run(self, request: RunRequest) -> Accepted:
        """Start `request`'s run; `Accepted` once its `RunStarted` is in the log."""
        ...

    async def submit_inputs(
        self, run_id: str, *, decisions: Sequence[Mapping[str, Any]] = (), messages: Messages = (),
        mode: str | None = None, access: RunAccess | None = None,
    ) -> Accepted:
        """Decisions for the run's suspended calls, and/or messages: a continuation run, or with
        `mode` messages the running run takes itself (`steer`, `follow_up`; `interrupt` cancels it
        and goes on with a new run)."""
        ...

    async def cancel(self, run_id: str, reason: str | None = None) -> Accepted:
        """Cancel the run (`run_finished` if it has finished)."""
        ...

    async def resume_run(self, run_id: str, thread_id: str, after: int) -> Accepted:
        """Have an unfinished run that nobody drives (its log written whole, e.g. a counterfactual
        branch's copy) go on from the log, like a run whose worker died; answers once the run's
        first commit after seq `after` is in the log."""
        ...

    def check(self, request: RunRequest) -> RunRequest:
        """The request as `start_run` would queue it, or what it would refuse it for without
        reading the log (its input, the agent's override policy): for a caller that writes
        something else first."""
        ...

    def agent_catalog(self) -> list[dict[str, Any]]:
        """The agents this dispatcher can start (`agentlog.runtime.agent_catalog`)."""
        ...


def _check_storable(value: Any, what: str) -> None:
    """Input that can never be written is `InvalidInput`."""
    try:
        check_storable(value if not isinstance(value, Sequence) or isinstance(value, str) else list(value), what)
    except InvalidRunInput as exc:
        raise InvalidInput(str(exc)) from None


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


def _finished(commits: Sequence[StoredCommit]) -> bool:
    return any(type(e) is RunFinished for sc in commits for e in sc.commit.events)


async def _started_already(store: EventStore, request: RunRequest) -> Accepted | None:
    """The answer to a start whose run id is taken: the original start's (`duplicate`, the seq
    of its `RunStarted`) when the log's start of that run is this one (the same agent, parent,
    thread if given, and input messages: a client's retry), else None (a `RunConflict`: the id
    names another start)."""
    assert request.run_id is not None
    commits = [sc async for sc in store.read_run(request.run_id)]
    for sc in commits:
        started = next((e for e in sc.commit.events if type(e) is RunStarted), None)
        if started is None:
            continue
        given = [(m.role, m.content, m.parts) for m in check_messages(request.messages)]
        recorded = [(e.message.role, e.message.content, e.message.parts)
                    for e in sc.commit.events if type(e) is MessageAppended]
        same = (started.agent_id == request.agent_id and started.parent_run_id == request.parent_run_id
                and request.thread_id in (None, sc.commit.thread_id) and given == recorded)
        return Accepted(sc.commit.thread_id, request.run_id, sc.seq, duplicate=True) if same else None
    return None


class _QueuedInput(NamedTuple):
    """Messages checked for queueing on a running run: as they go on the wire, each with an id
    (chosen here, so that a retry and the wait for the effect know them), and those ids."""

    wire: list[Any]
    ids: frozenset[str]
    mode: QueueMode


def _queueable(run_id: str, messages: Messages, decisions: Sequence[Mapping[str, Any]],
               mode: QueueMode) -> _QueuedInput:
    """Messages for a running run, checked as the runtime checks them (`queue_input`) and as
    something the log can store."""
    validate_run_id(run_id)
    if not messages:
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


def _checked(request: RunRequest, *, max_payload: int | None,
             overrides: OverrideScope | None) -> RunRequest:
    """`check_request` (the runtime's own input checks of a start), its untyped refusals typed."""
    try:
        return check_request(request, max_payload=max_payload, overrides=overrides)
    except (InvalidFrontendTools, InvalidRunInput) as exc:
        raise InvalidInput(str(exc)) from None
    except AgentlogError:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidInput(str(exc)) from None


# == via the work queue ============================================================================


class QueueDispatcher:
    """Runs execute on workers: check against the log, queue the command, wait (bounded) until
    its effect is in the log.

    The checks are the runtime's own, so a bad request gets the error the runtime would raise
    and NOTHING is queued or written. The remaining race (the run changes between this check and
    the worker's) is the worker's to settle: it dead-letters the command, and the answer here is
    its error (`CommandFailed`).

    `agents`: ids a worker can run; when given, unknown agents are refused here (404).
    `descriptions`: their `AgentSpec.description`s (agent id -> text), for `GET /v1/agents`.
    `snapshots`: the workers' run-context snapshots (read only): the run a decision is checked
    against is read from its snapshot and the log after it, not folded from the thread's first
    commit. `app_name`: the app whose workers get new runs; a run's later commands (continue,
    decide, cancel) go to the app recorded in its `RunStarted`, this one if none is.
    `override_policies`: agent id -> its `OverrideScope`, when the gateway
    knows the app: a request's overrides are then checked here, else by the worker (which
    refuses the command with the same code). `handoff`: the `Runtime.handoff` of a worker in
    this process (`agentlog serve`): decisions checked here are handed to it with the run they
    were checked against (`agentlog.runtime.DecisionIntake`).
    """

    def __init__(self, nc: NATS, store: EventStore, *, agents: Collection[str] | None = None,
                 descriptions: Mapping[str, str] | None = None, timeout: float = 10.0,
                 snapshots: SnapshotStore | None = None, app_name: str | None = None,
                 override_policies: Mapping[str, OverrideScope] | None = None,
                 handoff: Handoff | None = None) -> None:
        self.store = store
        self.override_policies = dict(override_policies or {})
        self.client = CommandClient(nc, app_name=app_name)
        self.agents = set(agents) if agents is not None else None
        self.descriptions = dict(descriptions or {})
        self.timeout = timeout
        self.decisions = DecisionIntake(store, snapshots=snapshots, handoff=handoff)
        #: The threads started on here, folded (a start's admission reads only their new commits).
        self.thread_folds = ThreadFolds(ThreadViews)
        #: The offers of the starts queued here, which a start not taken in time is withdrawn from.
        self.claims = StartClaims(self.client.js)
        #: Command id -> the future of a wait for its effect, set if a worker dead-letters it.
        self._dead: dict[str, asyncio.Future[Any]] = {}
        self._dead_sub: asyncio.Future[None] | None = None

    def agent_catalog(self) -> list[dict[str, Any]]:
        """Ids and descriptions only: the tools are the workers' to know (`null`)."""
        if self.agents is None:
            return []
        return [{"id": a, "description": self.descriptions.get(a, ""), "tools": None} for a in sorted(self.agents)]

    # -- start ---------------------------------------------------------------------------------

    async def start_run(self, request: RunRequest) -> Accepted:
        """Queue the start of `request`'s run; `Accepted` once its `RunStarted` is in the log.

        A start no worker took within the timeout is withdrawn (`agentlog.runtime.workers.claims`)
        and answered `DispatchTimeout`: it will not run, and a retry is safe. One a worker took
        meanwhile is answered once its `RunStarted` shows, or `queued` (it will run). A start
        whose run id is in the log already is the `duplicate` of the original, or `RunConflict`
        if the id names another start. An interrupting continuation is one command ("cancel the
        parent, then start"), so the thread never has two active runs."""
        with about_run(request.run_id):
            return await self._start_run(request)

    async def _start_run(self, request: RunRequest) -> Accepted:
        check_ids(request)
        if self.agents is not None and request.agent_id not in self.agents:
            raise AgentNotFound(f"unknown agent {request.agent_id!r}")
        request = self.check(request)
        thread_id, parent_run_id = request.thread_id, request.continues
        app_name = None
        if parent_run_id is not None:
            parent = await _run_commits(self.store, parent_run_id)
            app_name = _app_of(parent)
            parent_thread = parent[0].commit.thread_id
            if thread_id is not None and thread_id != parent_thread:
                raise RunNotFound(f"parent run {parent_run_id!r} is not on thread {thread_id!r}")
            thread_id = parent_thread
            if request.decisions:
                await self.decisions.check(parent_run_id, request.decisions, thread_id=thread_id, hand_on=False)
        thread_id = thread_id or new_id()
        try:
            version = await self._check_start(thread_id, request.run_id, parent_run_id,
                                              interrupting=parent_run_id if request.interrupt else None)
        except RunConflict:
            same = None if request.run_id is None else await _started_already(self.store, request)
            if same is None:
                raise
            return same
        run_id = request.run_id or new_id()
        with about_run(run_id):
            # resource_id rides in the command: the worker's run-start commit creates the thread, so
            # the gateway writes nothing itself (a ThreadCreated written here would be left an
            # orphan thread by a start that then fails)
            cmd = StartRun.of(request, thread_id, run_id, offered=True)
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

    def check(self, request: RunRequest) -> RunRequest:
        """The request checked (`check_request`); its overrides too when this gateway knows the
        agent's policy, else the worker checks them (and refuses the command with the same code)."""
        return _checked(request, max_payload=getattr(self.store, "max_payload", None),
                        overrides=self.override_policies.get(request.agent_id))

    async def _check_start(self, thread_id: str, run_id: str | None, parent_run_id: str | None,
                           interrupting: str | None = None) -> int:
        """The start admission `Runtime.start` applies (`agentlog.runtime.inputs.admission.admit_thread`),
        from the log, before anything is queued. Returns the thread's version (where the wait
        for the effect starts). `interrupting`: the running run the command cancels first (its
        being active is then no conflict; the worker starts only once it has finished)."""
        try:
            fold, _thread = await admit_thread(self.store, thread_id, run_id=run_id, parent_run_id=parent_run_id,
                                               folds=self.thread_folds)
        except RunConflict:
            if interrupting is None:
                raise
            fold = await self.thread_folds.read(self.store, thread_id)
            thread = fold.thread
            if thread is None or thread.active_run_id != interrupting or (run_id is not None and run_id in thread.run_ids):
                raise
        return fold.seq

    # -- inputs --------------------------------------------------------------------------------

    async def submit_inputs(
        self, run_id: str, *, decisions: Sequence[Mapping[str, Any]] = (), messages: Messages = (),
        mode: str | None = None, access: RunAccess | None = None,
    ) -> Accepted:
        """Routed and checked in one order before anything is queued, so a refused input writes
        nothing. The caller's `access` is checked on the one read of the run, before anything
        else looks at its state: a refused caller learns nothing about it."""
        with about_run(run_id):
            return await self._submit_inputs(run_id, decisions, messages, mode, access)

    async def _submit_inputs(self, run_id: str, decisions: Sequence[Mapping[str, Any]], messages: Messages,
                             mode: str | None, access: RunAccess | None) -> Accepted:
        _check_storable(decisions, "decisions")
        if mode in QUEUE_MODES:  # for the running run to take (steer / follow_up)
            queued = _queueable(run_id, messages, decisions, mode)
            commits = await _run_commits(self.store, run_id)
            if access is not None:
                await access(commits[0].commit.thread_id, commits[0].seq)
            return await self._queue_messages(run_id, commits, queued)
        if messages:  # a continuation run, interrupting this one if asked
            commits = await _run_commits(self.store, run_id)
            thread_id = commits[0].commit.thread_id
            if access is not None:
                await access(thread_id, commits[0].seq)
            return await self.start_run(RunRequest(
                agent_id=_agent_of(commits), messages=_wire_messages(messages), thread_id=thread_id,
                parent_run_id=run_id, decisions=list(decisions), interrupt=mode == "interrupt" and not _finished(commits)))
        if not decisions:
            raise InvalidInput("give decisions and/or messages")
        checked = await self.decisions.check(run_id, decisions, access=access)  # the one read and check
        if not checked.new:  # a retried request: answered from where it was recorded
            return Accepted(checked.thread_id, run_id, await checked.first_recorded(self.store), True)
        return await self._decide(checked)

    async def _queue_messages(self, run_id: str, commits: list[StoredCommit], queued: _QueuedInput) -> Accepted:
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

    async def _decide(self, checked: CheckedDecisions) -> Accepted:
        thread_id, run_id = checked.thread_id, checked.run_id
        new = frozenset(d.decision_id for d in checked.new)
        cmd = Decide(thread_id=thread_id, run_id=run_id, decisions=[*checked.new, *checked.duplicates])
        seq = await self._submit_and_wait(
            cmd, thread_id, checked.version,
            lambda sc: any(type(e) is ToolCallDecided and e.decision.decision_id in new for e in sc.commit.events),
            checked.app)
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
        _check_storable(reason, "reason")
        commits = await _run_commits(self.store, run_id)
        if _finished(commits):
            raise RunAlreadyFinished(f"run {run_id!r} has already finished")
        thread_id = commits[0].commit.thread_id
        version = await self.store.thread_version(thread_id)
        seq = await self._submit_and_wait(
            Cancel(thread_id=thread_id, run_id=run_id, reason=reason), thread_id, version,
            lambda sc: sc.commit.run_id == run_id and (_has(sc, RunCancelRequested) or _has(sc, RunFinished)),
            _app_of(commits))
        return Accepted(thread_id, run_id, seq)

    # -- waiting for the effect ----------------------------------------------------------------

    async def _queue(self, cmd: Command, app_name: str | None) -> None:
        """Queue `cmd` for `app_name`'s workers (the one place a command leaves this gateway);
        its outcome is a write of this process (`/health`'s `log writes failing`)."""
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
    "Accepted", "AgentNotFound", "CommandFailed", "DispatchTimeout", "Dispatcher", "InvalidInput", "QueueDispatcher",
    "RunAccess", "RunAlreadyFinished", "ThreadNotFound",
]
