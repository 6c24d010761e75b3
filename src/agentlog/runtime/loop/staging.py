"""Staging and committing for the run loop, and the state the loop's parts share.

Every event the loop writes goes through `_emit` (folded into the context at once, so decisions
see it and an invalid patch raises before anything is appended) and reaches the log at a commit
point (`_flush`; `_append_once` for the commits that must not absorb a conflict). A conflict is
absorbed here when it is only a cancel request or a live decision, else it is a `RunConflict`.
Its own module so the driver (`agentlog.runtime.loop.driver`) reads as the phase sequence, and this, the only
code that appends, can be read on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import (
    AnyEvent,
    Commit,
    Message,
    MessageAppended,
    MessageQueued,
    RunCancelRequested,
    StoredCommit,
    Termination,
    ThreadMetadataUpdated,
    ToolCallDecided,
    ToolCallDecision,
)
from agentlog.eventlog.store import EventStore
from agentlog.runtime.agent import AgentSpec, ModelRegistry
from agentlog.runtime.context_policy import Summarizer
from agentlog.runtime.errors import RunConflict
from agentlog.runtime.live import LiveSink
from agentlog.runtime.logs import SafeLog
from agentlog.runtime.loop.decisions import CallPlan
from agentlog.runtime.loop.entropy import Entropy
from agentlog.runtime.loop.run_context import RunContext, apply_event, due_messages
from agentlog.runtime.models.base import ToolSpec
from agentlog.runtime.outage import OutagePolicy, through_outage
from agentlog.runtime.plugins import Action, Plugin
from agentlog.runtime.tools import Tool, ToolContext


class _Cancelled(Exception):
    """Internal: the run was cancelled (signal or a RunCancelRequested found in the log)."""


class Requeue(Exception):
    """Internal: the commit ending the run naturally conflicted with a message queued for the
    run (`agentlog.runtime.loop.driver.RunLoop._natural_end` undoes the end). `commit`: the refused one
    (its id is reused), `absorbed`: the commits read meanwhile."""

    def __init__(self, commit: Commit, absorbed: list[StoredCommit]) -> None:
        super().__init__("a message was queued for the run as it ended")
        self.commit = commit
        self.absorbed = absorbed


@dataclass(slots=True)
class _Running:
    plan: CallPlan
    cancel: asyncio.Event
    ctx: ToolContext | None = None
    #: Set when the call runs again after a human decision (replay / pass_decision_to_tool).
    decision: ToolCallDecision | None = None


@dataclass(frozen=True, slots=True)
class _Replay:
    """A decided call to run again: its plan, the decision, and the ticket's resume mode."""

    plan: CallPlan
    decision: ToolCallDecision
    mode: str


class StagingBase:
    """The state the loop's parts share (declared here, set by `RunLoop.__init__`) and the one
    way events reach the log: stage (`_emit`, folded at once), commit (`_flush`, `_append_once`),
    absorb what others appended meanwhile (`_absorb_conflict`)."""

    spec: AgentSpec
    #: How long a store operation waits through a NATS outage (see `agentlog.runtime.outage`).
    outage: OutagePolicy
    ctx: RunContext
    version: int
    store: EventStore
    tools: Mapping[str, Tool]
    models: ModelRegistry
    live: LiveSink
    entropy: Entropy
    on_commit: Callable[[StoredCommit], None]
    log: SafeLog
    summarizer: Summarizer
    #: Calls the last `begin_resume` resumed (empty: decisions recorded, still waiting).
    resumed: list[str]
    _pending: list[AnyEvent]
    _pending_ts: int
    _inflight: asyncio.Future[None] | None
    _cancel: asyncio.Event
    _poked: asyncio.Event
    _cancel_waiter: asyncio.Future[Any] | None
    _running: dict[str, _Running]
    _queued_user: list[str]
    #: Set while the natural end's commit is appended (a queued message then undoes it).
    _finishing: bool
    _stop_conditions: list[Any]
    _hooks: dict[str, list[Plugin]]
    _entry: str
    _start_termination: Termination | None
    _agent_tools: dict[str, Tool]
    _base_tool_specs: list[ToolSpec]
    _live_on: bool
    _streaming_message_id: str | None
    _older_factory: Callable[[], Awaitable[list[Message]]] | None
    _older: asyncio.Future[list[Message]] | None

    # -- staging and committing ----------------------------------------------------------------

    def _emit(self, event: AnyEvent) -> None:
        """Stage an event: fold it into the context now (so decisions see it; raises
        InvalidPatch before anything is appended), commit it at the next flush."""
        if not self._pending:
            self._pending_ts = self.entropy.now_ms()
        apply_event(self.ctx, event, self._pending_ts, self.ctx.run_id)
        self._pending.append(event)

    async def _flush(self, wait: bool = True) -> None:
        """Append the staged events as one commit at the thread version we hold.

        `wait=False` pipelines: the append is sent now and its ack awaited at the next flush, so
        a step-end commit's round trip overlaps the next inference. Safe because nothing outside
        the process depends on that ack before then: the next commit (and any tool run) waits
        for it, and a failed append surfaces there and ends the run as it would have here.
        """
        await self._drain()
        if not self._pending:
            return
        commit = Commit(
            commit_id=self.entropy.new_id(),
            thread_id=self.ctx.thread_id,
            run_id=self.ctx.run_id,
            ts=self._pending_ts,
            events=self._pending,
        )
        self._pending = []
        if wait:
            await self._append(commit)
        else:
            self._inflight = asyncio.ensure_future(self._append(commit))

    async def _drain(self) -> None:
        task = self._inflight
        if task is not None:
            self._inflight = None
            await task

    async def _append(self, commit: Commit) -> None:
        cancelled = False
        while True:
            try:
                res = await self._store_append(commit)
                break
            except VersionConflict:
                absorbed: list[StoredCommit] = []
                cancelled = await self._absorb_conflict(absorbed) or cancelled
                if self._finishing and any(type(ev) is MessageQueued and sc.commit.run_id == self.ctx.run_id
                                           for sc in absorbed for ev in sc.commit.events):
                    raise Requeue(commit, absorbed) from None
        self.version = res.seq
        self.on_commit(StoredCommit(res.seq, commit))
        if cancelled and self.ctx.finished is None:
            raise _Cancelled()

    async def _store_append(self, commit: Commit) -> Any:
        """Append at the version we hold, waiting through a store outage (bounded by
        `self.outage`); the retried commit is the same one, so it lands at most once."""
        version = self.version
        return await through_outage(lambda: self.store.append(commit, version), self.outage, self.log)

    async def _absorb_conflict(self, absorbed: list[StoredCommit] | None = None) -> bool:
        """Read what others appended; fold in what we can live with (a message queued for this
        run is folded and taken at the loop's next step boundary). Returns True if it holds a
        cancel request for this run; raises RunConflict for anything else. `absorbed` gets the
        commits read."""
        async def read() -> list[StoredCommit]:
            return [sc async for sc in self.store.read_thread(self.ctx.thread_id, after=self.version)]

        new = await through_outage(read, self.outage, self.log, "read")
        cancel = False
        for sc in new:
            ours = sc.commit.run_id == self.ctx.run_id
            for ev in sc.commit.events:
                if type(ev) is RunCancelRequested and ours:
                    cancel = True
                elif type(ev) is ToolCallDecided and ours and ev.call_id in self.ctx.suspended:
                    pass  # a live decision (DESIGN 4.3): folded below, applied by the round
                elif type(ev) is MessageQueued and ours:
                    pass  # folded below, taken at the next step boundary
                elif type(ev) is not ThreadMetadataUpdated:
                    raise RunConflict(
                        f"thread {self.ctx.thread_id!r} changed under run {self.ctx.run_id!r}: "
                        f"commit {sc.commit.commit_id!r} (seq {sc.seq}, run {sc.commit.run_id!r}) "
                        f"appended {type(ev).__name__}; re-read the log and re-evaluate"
                    )
        for sc in new:
            for ev in sc.commit.events:
                apply_event(self.ctx, ev, sc.commit.ts, sc.commit.run_id)
            if sc.commit.run_id == self.ctx.run_id:
                self.on_commit(sc)
        if new:
            self.version = new[-1].seq
        if absorbed is not None:
            absorbed.extend(new)
        if cancel:
            self.log.info("run.cancel_seen_in_log")
            self._cancel.set()
        return cancel

    def _take_queued(self, *, ending: bool) -> None:
        """Stage the queued messages due now (`due_messages`) as the run's user messages, with
        their own ids (taking one is appending it)."""
        for message in due_messages(self.ctx, ending=ending):
            self._emit(MessageAppended(message=message))

    def _commit_now(self) -> Commit:
        commit = Commit(
            commit_id=self.entropy.new_id(), thread_id=self.ctx.thread_id, run_id=self.ctx.run_id,
            ts=self._pending_ts, events=self._pending,
        )
        self._pending = []
        return commit

    async def _append_once(self) -> int:
        """Append what is staged at the version the context was folded at, without absorbing a
        conflict: a `VersionConflict` propagates so the caller re-folds and re-validates (what it
        decided may no longer hold). Used by the commits that open a resume or cancel a wait."""
        commit = self._commit_now()
        res = await self.store.append(commit, self.version)
        self.version = res.seq
        self.on_commit(StoredCommit(res.seq, commit))
        return res.seq

    if TYPE_CHECKING:  # the driver's (`agentlog.runtime.loop.driver.RunLoop`) methods the parts call
        async def _hook(self, hook: str, *args: Any, decision: ToolCallDecision | None = None) -> list[Action]: ...
        def _apply_patches(self, actions: Sequence[Action], source: str) -> None: ...
        @staticmethod
        def _terminate(actions: Sequence[Action]) -> Termination | None: ...
        def _waiter(self) -> asyncio.Future[Any]: ...
        async def _race(self, coro: Any, on_cancel: asyncio.Event | None = None) -> Any: ...
        async def _absorb_poke(self) -> None: ...
        def prefetch_messages(self) -> None: ...
        async def _steps(self) -> None: ...
        async def _finish(self, termination: Termination) -> None: ...
        def _emit_cancelled(self, call_id: str, why: str = "cancelled") -> None: ...
