"""One way to load a run from the log: its context as of the thread's head, read once.

    loader = RunLoader(store, snapshots=KVSnapshotStore, views=KVViewStore)
    loaded = await loader.load(run_id)       # LoadedRun: ctx, version, run_commits, snapshot
    check_decisions(loaded.ctx, ...)          # what the runtime, a gateway or a worker decides on

Why one loader: every caller that acts on a run (the `Runtime` deciding, resuming or cancelling,
a gateway checking a decision before it queues it, `agentlog.runtime.runs.intake`) needs the same thing,
the run's `RunContext` folded up to the thread's head. Folding it from seq 1 grows with the
thread's history; the cheapest exact answer is a snapshot plus the log after it, and that is the
one path here, in order:

- the run-context snapshot (`agentlog.runtime.snapshots.store`, a KV entry and its chunks) plus the
  thread's commits after its seq: flat in history;
- else the thread view snapshot (`views`): the run's commits and the view's state, plus the
  thread's tail; the messages the view covers load lazily (`older_messages`);
- else the whole thread from seq 1.

A snapshot is a cache: a miss, a stale entry, another thread's entry, or a store that does not
answer only lengthens the tail. The loader never writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Container, Iterable, Sequence
from typing import NamedTuple

from agentlog.eventlog.events import (
    ContextCompacted,
    Message,
    MessageAppended,
    RunStarted,
    StoredCommit,
    ToolCallDecision,
)
from agentlog.eventlog.ids import validate_id
from agentlog.eventlog.store import EventStore, as_generator, first_commit
from agentlog.projections.store import ViewStore
from agentlog.runtime.errors import RunNotFound
from agentlog.runtime.loop.run_context import RunContext, fold_context
from agentlog.runtime.snapshots.format import LoadedSnapshot
from agentlog.runtime.snapshots.store import SnapshotStore, load_chunks, read_entry


class LoadedRun(NamedTuple):
    """A run folded from the log as of `version` (the thread's last commit read). `run_commits`:
    the run's commits that were read (all of them, or only those after `snapshot.seq` when the
    context came from a run-context snapshot). `older_messages` is set when the context came from
    a thread-view snapshot: it loads the messages the view covers."""

    thread_id: str
    agent_id: str
    ctx: RunContext
    version: int
    run_commits: list[StoredCommit]
    older_messages: Callable[[], Awaitable[list[Message]]] | None = None
    snapshot: LoadedSnapshot | None = None


def call_ids(commits: Iterable[StoredCommit]) -> set[str]:
    """Every tool call id a run's commits mention (assistant messages and call events)."""
    out: set[str] = set()
    for sc in commits:
        for ev in sc.commit.events:
            if type(ev) is MessageAppended:
                out.update(c.id for c in ev.message.tool_calls or ())
            elif (call_id := getattr(ev, "call_id", None)) is not None:
                out.add(call_id)
    return out


def known_calls(ctx: RunContext, run_commits: Iterable[StoredCommit], snapshot: LoadedSnapshot | None,
                decisions: Sequence[ToolCallDecision]) -> set[str]:
    """Every call id the run's log mentions (what tells `UnknownCall` from a call that is not
    suspended, for `agentlog.runtime.loop.hitl.check_decisions`). From a snapshot: the calls it names
    and the tail's. Empty when every decision targets a suspended call: `check_decisions` then
    never reads it (a long run's call ids are read from its call chunks, a cost a cold resume
    pays only for a decision that fails)."""
    if all(d.target_id in ctx.suspended for d in decisions):
        return set()
    known = call_ids(run_commits)
    if snapshot is not None:
        known.update(snapshot.call_ids)
    return known


def agent_of(commits: list[StoredCommit]) -> str:
    """The agent id of the run whose first commit is `commits[0]` (its `RunStarted`)."""
    return next(e.agent_id for e in commits[0].commit.events if type(e) is RunStarted)


class RunLoader:
    """Loads runs from `store`, starting from `snapshots` / `views` when given (see the module
    docstring). `agents`: the agent ids a run-context snapshot is used for (a snapshot written
    for an agent this process does not know is folded from the log instead); None: any."""

    def __init__(self, store: EventStore, *, snapshots: SnapshotStore | None = None, views: ViewStore | None = None,
                 agents: Container[str] | None = None) -> None:
        self.store = store
        self.snapshots = snapshots
        self.views = views
        self.agents = agents

    async def thread_of(self, run_id: str) -> str:
        first = await first_commit(self.store.read_run(run_id))
        if first is None:
            raise RunNotFound(f"unknown run {run_id!r}")
        return first.commit.thread_id

    async def load(self, run_id: str, thread_id: str | None = None, *, use_snapshot: bool = True) -> LoadedRun:
        """The run's context as of the thread's head. `use_snapshot=False` skips the run-context
        snapshot (the retry after an OCC conflict, so a stale snapshot never loops). Raises
        `RunNotFound`. `thread_id` is checked first: the snapshot read puts it into subject
        wildcards."""
        if thread_id is not None:
            validate_id(thread_id, "thread_id")
        if self.snapshots is not None and use_snapshot:
            loaded = await self._from_run_snapshot(self.snapshots, run_id, thread_id)
            if loaded is not None:
                return loaded
        if self.views is not None:
            loaded = await self._from_thread_view(self.views, run_id, thread_id)
            if loaded is not None:
                return loaded
        return await self.fold(run_id, thread_id)

    async def fold(self, run_id: str, thread_id: str | None = None) -> LoadedRun:
        """The run folded from the whole thread, seq 1 on (what every snapshot must agree with)."""
        if thread_id is None:
            thread_id = await self.thread_of(run_id)
        history = [sc async for sc in self.store.read_thread(thread_id)]
        run_commits = [sc for sc in history if sc.commit.run_id == run_id]
        if not run_commits:
            raise RunNotFound(f"unknown run {run_id!r}")
        ctx = fold_context(RunContext(thread_id=thread_id, run_id=run_id), history)
        return LoadedRun(thread_id, agent_of(run_commits), ctx, history[-1].seq, run_commits)

    async def from_run_snapshot(self, run_id: str, thread_id: str | None = None) -> LoadedRun | None:
        """The run from its run-context snapshot and the thread's tail; None on a miss."""
        if self.snapshots is None:
            return None
        return await self._from_run_snapshot(self.snapshots, run_id, thread_id)

    async def _from_run_snapshot(self, snapshots: SnapshotStore, run_id: str,
                                 thread_id: str | None) -> LoadedRun | None:
        # Twice at most: a snapshot written meanwhile purges the chunks of the one it replaces,
        # so an entry read just before that can miss its chunks; the entry read again names the
        # new ones (else the whole thread would be folded for a cache that was being refreshed).
        for _attempt in range(2):
            read = await read_entry(snapshots, run_id, thread_id)
            if read is None or (self.agents is not None and read[0].agent_id not in self.agents):
                return None
            entry, prefetched = read

            async def read_tail(after: int = entry.seq, thread: str = entry.ctx.thread_id) -> list[StoredCommit]:
                return [sc async for sc in self.store.read_thread(thread, after=after)]

            # the tail after the entry's seq, and meanwhile the chunks: checked and decoded from
            # what a cold read fetched with the entry (CPU work, done while the tail's read is
            # out: so the tail's read is sent first), taken from this process's cache, or (a warm
            # read that misses some) fetched in the same round trip as the tail
            tail, snap = await asyncio.gather(read_tail(), load_chunks(snapshots, entry, prefetched=prefetched))
            if snap is None:
                continue
            ctx = snap.ctx
            fold_context(ctx, tail)
            version = tail[-1].seq if tail else snap.seq
            run_tail = [sc for sc in tail if sc.commit.run_id == run_id]
            return LoadedRun(ctx.thread_id, snap.agent_id, ctx, version, run_tail, snapshot=snap)
        return None

    async def _from_thread_view(self, views: ViewStore, run_id: str, thread_id: str | None) -> LoadedRun | None:
        """The run from the thread view snapshot: the run's own commits (`read_run`) and the view
        (state + the seq it covers) concurrently, then the thread's tail after that seq. The
        run's commits the view covers are folded run-scoped only (`thread_scope=False`: the view
        holds their thread state), the tail in full. The messages the view covers are not in it:
        the loop loads them concurrently and awaits them only before it reads them (next
        inference, plugin hooks), so a replayed tool starts without them. None if there is no
        usable view."""
        store = self.store

        async def run_commits() -> list[StoredCommit]:
            return [sc async for sc in store.read_run(run_id)]

        if thread_id is None:
            commits = await run_commits()
            if not commits:
                raise RunNotFound(f"unknown run {run_id!r}")
            thread_id = commits[0].commit.thread_id
            snap = await views.get_thread(thread_id)
        else:
            commits, snap = await asyncio.gather(run_commits(), views.get_thread(thread_id))
            if not commits:
                raise RunNotFound(f"unknown run {run_id!r}")
        if snap is None or snap.version <= 0 or snap.deleted:
            return None
        base = snap.version
        tail = [sc async for sc in store.read_thread(thread_id, after=base)]
        covered = [sc for sc in commits if sc.seq <= base]
        ctx = RunContext(thread_id=thread_id, run_id=run_id, thread_exists=True, state=dict(snap.state),
                         resource_id=snap.resource_id)
        fold_context(ctx, covered, thread_scope=False)
        fold_context(ctx, tail)
        run_commits_all = covered + [sc for sc in tail if sc.commit.run_id == run_id]
        if not run_commits_all:
            return None
        version = tail[-1].seq if tail else base
        thread = thread_id

        async def older_messages() -> list[Message]:
            out: list[Message] = []
            compaction: ContextCompacted | None = None
            async with contextlib.aclosing(as_generator(store.read_thread(thread))) as commits_:
                async for sc in commits_:
                    if sc.seq > base:
                        break
                    for e in sc.commit.events:
                        if type(e) is MessageAppended:
                            out.append(e.message)
                        elif type(e) is ContextCompacted:
                            compaction = e
            if ctx.compaction is None:  # a compaction in the tail is newer and wins
                ctx.compaction = compaction
            return out

        return LoadedRun(thread_id, agent_of(run_commits_all), ctx, version, run_commits_all, older_messages)


__all__ = ["LoadedRun", "RunLoader", "agent_of", "call_ids", "known_calls"]
