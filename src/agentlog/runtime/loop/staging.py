"""Staging and committing for the run loop: the run's state and the one way it reaches the log.

Every event the loop writes goes through `Staging.emit` (folded into the context at once, so
decisions see it and an invalid patch raises before anything is appended) and reaches the log at
a commit point (`flush`; `append_once` for the commits that must not absorb a conflict). A
conflict is absorbed here when it is only a cancel request or a live decision, else it is a
`RunConflict`. The run's cancel signal lives here too, because a commit can find a cancel request
in the log. One object, held by the driver (`agentlog.runtime.loop.driver.RunLoop`) and handed to
the parts (rounds, resume, inference), so the only code that appends can be read on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import (
    AnyEvent,
    Commit,
    Message,
    MessageAppended,
    MessageQueued,
    ProfileCommit,
    RunCancelRequested,
    StoredCommit,
    ThreadMetadataUpdated,
    ToolCallDecided,
)
from agentlog.eventlog.store import EventStore, ProfileStore
from agentlog.projections.profile import fold_profile
from agentlog.projections.state import apply_ops
from agentlog.runtime.errors import RunConflict
from agentlog.runtime.logs import SafeLog
from agentlog.runtime.loop.entropy import Entropy
from agentlog.runtime.loop.run_context import RunContext, apply_event, due_messages
from agentlog.runtime.outage import OutagePolicy, through_outage
from agentlog.runtime.state.access import ProfileLoader, ProfileUnavailable
from agentlog.runtime.state.batch import StateWrite
from agentlog.runtime.state.keys import StateError

#: How often a profile write is validated again and retried when other writers got there first.
PROFILE_RETRIES = 8


class Cancelled(Exception):
    """The run was cancelled (signal or a RunCancelRequested found in the log); the driver
    finishes it `cancelled`."""


class Fenced(asyncio.CancelledError):
    """The run was handed back (`Staging.fence`): this process writes nothing more for it. A
    cancellation, so the loop stops as an abandoned run does, without a finishing commit."""


class Requeue(Exception):
    """The commit ending the run naturally conflicted with a message queued for the run
    (`agentlog.runtime.loop.driver.RunLoop` undoes the end). `commit`: the refused one (its id is
    reused), `absorbed`: the commits read meanwhile."""

    def __init__(self, commit: Commit, absorbed: list[StoredCommit]) -> None:
        super().__init__("a message was queued for the run as it ended")
        self.commit = commit
        self.absorbed = absorbed


class Staging:
    """The run's folded context and the thread version it holds, the staged events, the cancel
    signal, and the messages from before a snapshot. Stage (`emit`, folded at once), commit
    (`flush`, `append_once`), absorb what others appended meanwhile (`absorb_conflict`)."""

    def __init__(
        self,
        *,
        ctx: RunContext,
        version: int,
        store: EventStore,
        entropy: Entropy,
        on_commit: Callable[[StoredCommit], None],
        log: SafeLog,
        outage: OutagePolicy,
        older_messages: Callable[[], Awaitable[list[Message]]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.version = version
        self.store = store
        self.entropy = entropy
        self.on_commit = on_commit
        self.log = log
        #: How long a store operation waits through a NATS outage (see `agentlog.runtime.outage`).
        self.outage = outage
        self.pending: list[AnyEvent] = []
        self.pending_ts = 0
        self.inflight: asyncio.Future[None] | None = None
        #: Set while the natural end's commit is appended (a queued message then undoes it).
        self.finishing = False
        self.cancel = asyncio.Event()
        self.poked = asyncio.Event()
        self.cancel_waiter: asyncio.Future[Any] | None = None
        #: A context folded from a snapshot lacks the messages before it: they are loaded by
        #: this (started early by `prefetch_messages`, awaited before anything reads them).
        self.older_factory = older_messages
        self.older: asyncio.Future[list[Message]] | None = None
        #: Set by `fence`: every later append raises `Fenced` before it reaches the store.
        self.fenced = False

    @property
    def settled(self) -> bool:
        """True when `ctx` is exactly the fold of the thread up to `version` (nothing staged or
        in flight, every message loaded)."""
        return not self.pending and self.inflight is None and self.older_factory is None

    def fence(self) -> None:
        """Write nothing more for this run from here: the process hands it back and another one
        resumes it from the log. An append sent before the fence may still land; the resuming
        process then meets it as a conflict (per-thread OCC) and re-reads."""
        self.fenced = True

    def _check_fence(self) -> None:
        if self.fenced:
            raise Fenced(f"run {self.ctx.run_id!r} was handed back: nothing more is written for it here")

    # -- staging and committing ----------------------------------------------------------------

    def emit(self, event: AnyEvent) -> None:
        """Stage an event: fold it into the context now (so decisions see it; raises
        InvalidPatch before anything is appended), commit it at the next flush."""
        if not self.pending:
            self.pending_ts = self.entropy.now_ms()
        apply_event(self.ctx, event, self.pending_ts, self.ctx.run_id)
        self.pending.append(event)

    async def flush(self, wait: bool = True) -> None:
        """Append the staged events as one commit at the thread version we hold.

        `wait=False` pipelines: the append is sent now and its ack awaited at the next flush, so
        a step-end commit's round trip overlaps the next inference. Safe because nothing outside
        the process depends on that ack before then: the next commit (and any tool run) waits
        for it, and a failed append surfaces there and ends the run as it would have here.
        """
        await self.drain()
        if not self.pending:
            return
        commit = self.commit_now()
        if wait:
            await self.append(commit)
        else:
            self.inflight = asyncio.ensure_future(self.append(commit))

    async def drain(self) -> None:
        task = self.inflight
        if task is not None:
            self.inflight = None
            await task

    async def append(self, commit: Commit) -> None:
        cancelled = False
        while True:
            try:
                res = await self._store_append(commit)
                break
            except VersionConflict:
                absorbed: list[StoredCommit] = []
                cancelled = await self.absorb_conflict(absorbed) or cancelled
                if self.finishing and any(type(ev) is MessageQueued and sc.commit.run_id == self.ctx.run_id
                                          for sc in absorbed for ev in sc.commit.events):
                    raise Requeue(commit, absorbed) from None
        self.version = res.seq
        self.on_commit(StoredCommit(res.seq, commit))
        if cancelled and self.ctx.finished is None:
            raise Cancelled()

    async def _store_append(self, commit: Commit) -> Any:
        """Append at the version we hold, waiting through a store outage (bounded by
        `self.outage`); the retried commit is the same one, so it lands at most once."""
        version = self.version

        async def append() -> Any:
            self._check_fence()  # each retry too: a run handed back during an outage stays quiet
            return await self.store.append(commit, version)

        return await through_outage(append, self.outage, self.log)

    async def absorb_conflict(self, absorbed: list[StoredCommit] | None = None) -> bool:
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
            self.cancel.set()
        return cancel

    def take_queued(self, *, ending: bool) -> None:
        """Stage the queued messages due now (`due_messages`) as the run's user messages, with
        their own ids (taking one is appending it)."""
        for message in due_messages(self.ctx, ending=ending):
            self.emit(MessageAppended(message=message))

    def commit_now(self) -> Commit:
        """The staged events as one commit (a new commit id), leaving nothing staged."""
        commit = Commit(
            commit_id=self.entropy.new_id(), thread_id=self.ctx.thread_id, run_id=self.ctx.run_id,
            ts=self.pending_ts, events=self.pending,
        )
        self.pending = []
        return commit

    async def append_once(self) -> int:
        """Append what is staged at the version the context was folded at, without absorbing a
        conflict: a `VersionConflict` propagates so the caller re-folds and re-validates (what it
        decided may no longer hold). Used by the commits that start a run, open a resume or
        cancel a wait."""
        self._check_fence()
        commit = self.commit_now()
        res = await self.store.append(commit, self.version)
        self.version = res.seq
        self.on_commit(StoredCommit(res.seq, commit))
        return res.seq

    # -- profiles ------------------------------------------------------------------------------

    def profile_loader(self) -> ProfileLoader | None:
        """Reads a profile's document (its stream folded now), or None when the store keeps no
        profiles."""
        store = self.store
        if not isinstance(store, ProfileStore):
            return None

        async def load(profile_id: str) -> dict[str, Any]:
            async def read() -> list[Any]:
                return [sc async for sc in store.read_profile(profile_id)]

            return fold_profile(profile_id, await through_outage(read, self.outage, self.log, "read")).state

        return load

    async def append_profile(self, writes: Sequence[StateWrite], call_id: str) -> int:
        """Append a call's profile writes as one `ProfileCommit` to the profile's stream, before
        the commit that records the call (so a run never records a profile write that is not
        there). Optimistic per profile: read the profile, check every write still applies and
        validates, append at that version; another writer first: read again. The commit id is
        the run's and the call's, so a call run again after a crash writes it once.
        `ProfileUnavailable` / `StateError` / `InvalidPatch` when it cannot be written."""
        self._check_fence()
        store = self.store
        ctx = self.ctx
        profile_id = writes[0].owner
        if profile_id is None or not isinstance(store, ProfileStore):
            raise ProfileUnavailable("this run has no profile (its thread has no resource_id, or the store "
                                     "keeps no profiles)")
        commit = ProfileCommit(
            commit_id=hashlib.sha256(f"{ctx.run_id}\n{call_id}".encode()).hexdigest()[:32], profile_id=profile_id,
            ts=self.entropy.now_ms(), thread_id=ctx.thread_id, run_id=ctx.run_id, call_id=call_id,
            events=[w.event(source=f"tool:{call_id}", call_id=call_id) for w in writes],
        )
        if getattr(store, "replaying", False):  # verified replay: the recording holds the write
            return (await store.append_profile(commit, None)).seq
        for _ in range(PROFILE_RETRIES):
            async def read() -> list[Any]:
                return [sc async for sc in store.read_profile(profile_id)]

            commits = await through_outage(read, self.outage, self.log, "read")
            version = commits[-1].seq if commits else 0
            state = fold_profile(profile_id, commits).state
            for write in writes:
                state = apply_ops(state, list(write.ops))
                if write.key.name in state:
                    write.key.check(state[write.key.name])

            async def append(version: int = version) -> Any:
                self._check_fence()
                return await store.append_profile(commit, version)

            try:
                return (await through_outage(append, self.outage, self.log)).seq
            except VersionConflict:
                continue
        raise StateError(f"profile {profile_id!r} kept changing under this call's write ({PROFILE_RETRIES} tries)")

    # -- cancellation --------------------------------------------------------------------------

    async def absorb_poke(self) -> None:
        """Read the commits a poke announced (a decision or message recorded for this run)."""
        if self.poked.is_set():
            self.poked.clear()
            await self.drain()
            if await self.absorb_conflict() and self.ctx.finished is None:
                raise Cancelled()

    def waiter(self) -> asyncio.Future[Any]:
        """A future done when the run is cancelled (one per run, cancelled at its end)."""
        if self.cancel_waiter is None:
            self.cancel_waiter = asyncio.ensure_future(self.cancel.wait())
        return self.cancel_waiter

    async def race(self, coro: Any, on_cancel: asyncio.Event | None = None) -> Any:
        """Await `coro` unless the run is cancelled first (then set `on_cancel` so a cooperative
        tool sees it, cancel the task, raise Cancelled)."""
        if self.cancel.is_set():
            coro.close()
            raise Cancelled()
        task = asyncio.ensure_future(coro)
        waiter = self.waiter()
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if on_cancel is not None:
            on_cancel.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise Cancelled()

    # -- messages from before a snapshot ---------------------------------------------------------

    def prefetch_messages(self) -> None:
        """Start loading the messages older than the snapshot, concurrently with the first tool
        run (a replayed tool does not need them; the next inference does)."""
        if self.older_factory is not None and self.older is None:
            self.older = asyncio.ensure_future(self.older_factory())

    async def messages_ready(self) -> None:
        """Make `ctx.messages` the whole conversation (older + folded tail) before it is read."""
        if self.older_factory is None:
            return
        self.prefetch_messages()
        older = await self.older  # type: ignore[misc]
        self.older_factory = None
        self.older = None
        self.ctx.messages[:0] = older

    async def close(self) -> None:
        """At the run's end: stop what is left in flight (only when an exception escaped)."""
        if self.inflight is not None:
            self.inflight.cancel()
            await asyncio.gather(self.inflight, return_exceptions=True)
        if self.cancel_waiter is not None:
            self.cancel_waiter.cancel()
        task, self.older = self.older, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
