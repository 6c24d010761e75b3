"""What every protocol session shares: the thread as the log holds it (`load_thread`), and
`drive`, which starts, decides or replays a run through the `Dispatcher` and yields the
protocol's events of it. The protocols' own sessions (`agui.session`, `aisdk.session`) decide
what a request is; HTTP (`routes`) and NATS (`nats_routes`) only encode and deliver what they
yield, so both transports behave identically.

The order of every session, and why:
1. parse the body (`AdapterInputError` before anything else: the transport answers 400 / one
   error event);
2. fold the thread from the log (exact, not the lagging views) and decide what the request is:
   a new run (continuation of the thread's last run), decisions for the thread's waiting run,
   or a retried resume whose decisions are already recorded (idempotent: replay, write nothing);
3. check resume entries / approvals against the open interrupts BEFORE writing; a mismatch ends
   the stream with an error and nothing is written;
4. subscribe to the run's live subject, note the thread's last seq, then start/decide through
   the `Dispatcher`, then follow the log from that seq (`source.RunSource`) until the run
   finishes or suspends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from nats.aio.client import Client as NATS

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    Position,
    RunResumed,
    RunSuspended,
    StoredCommit,
    ToolCallDecided,
)
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.store import EventStore
from agentlog.gateway.adapters.common import Decision
from agentlog.gateway.adapters.source import RunSource
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.projections.fold import fold_commits
from agentlog.projections.timetravel import messages_at, state_at
from agentlog.projections.views import RunView, ThreadView
from agentlog.runtime import CommittedEvent, RunRequest
from agentlog.runtime.inputs import OverrideNotAllowed, as_run_input


class NotVisible(AgentlogError, LookupError):
    """The thread exists but belongs to another tenant (answered like an unknown thread)."""

    code = "thread_not_found"


@dataclass
class Backend:
    """What a session needs: the log (`store`), a `agentlog.gateway.operations.dispatch.Dispatcher`, and the NATS
    connection for live deltas (None: no live deltas, text comes from the commits)."""

    store: JetStreamEventStore
    dispatcher: Dispatcher
    nc: NATS | None = None


def backend_of(store: JetStreamEventStore, dispatcher: Dispatcher | None) -> Backend:
    """A Backend from what the HTTP app holds in `services(request).dispatcher`; an error on a
    read-only gateway (no dispatcher)."""
    if dispatcher is None:
        raise AgentlogError("this gateway has no runtime (read-only): adapter runs are not available")
    return Backend(store=store, dispatcher=dispatcher, nc=store.nc)


# -- the thread, from the log --------------------------------------------------------------------


@dataclass
class ThreadLog:
    thread_id: str
    commits: list[StoredCommit]
    view: ThreadView | None
    runs: dict[str, RunView]

    @property
    def version(self) -> int:
        return self.commits[-1].seq if self.commits else 0

    @property
    def messages(self) -> list[Message]:
        return [e.message for sc in self.commits for e in sc.commit.events if type(e) is MessageAppended]

    @property
    def state(self) -> dict[str, Any]:
        return dict(self.view.state) if self.view is not None else {}

    @property
    def last_run(self) -> RunView | None:
        if self.view is None or not self.view.run_ids:
            return None
        return self.runs.get(self.view.run_ids[-1])

    @property
    def waiting(self) -> RunView | None:
        run = self.last_run
        return run if run is not None and run.status == "waiting" else None

    def as_of(self, seq: int) -> tuple[dict[str, Any], list[Message]]:
        """The thread's state and messages as of seq `seq` (a fold of the commits up to it):
        what a replay from `seq` must start from, not the state after everything since."""
        end = Position(seq, 2**31)  # all events of the commit at `seq`, none after
        return dict(state_at(self.commits, self.thread_id, end)), messages_at(self.commits, self.thread_id, end)

    def decision_ids(self) -> set[str]:
        """Every decision id recorded on the thread (retried answers are recognised by these)."""
        return {e.decision.decision_id for sc in self.commits for e in sc.commit.events
                if type(e) is ToolCallDecided}

    def decision_commit(self, ids: set[str]) -> tuple[str, int] | None:
        """(run, seq) of the commit that recorded all of `ids` (a retried answer), else None."""
        found: dict[str, tuple[str, int]] = {}
        for sc in self.commits:
            for e in sc.commit.events:
                if type(e) is ToolCallDecided and e.decision.decision_id in ids:
                    found.setdefault(e.decision.decision_id, (sc.commit.run_id or "", sc.seq))
        if not ids or set(found) != ids:
            return None
        runs = {r for r, _ in found.values()}
        return (runs.pop(), min(s for _, s in found.values())) if len(runs) == 1 else None


async def load_thread(store: EventStore, thread_id: str, who: Principal | None = None) -> ThreadLog:
    commits = [sc async for sc in store.read_thread(thread_id)]
    views = fold_commits(commits) if commits else None
    view = views.threads.get(thread_id) if views else None
    if view is not None and view.deleted:
        raise NotVisible(f"thread {thread_id!r} not found")
    if view is not None and who is not None and not who.can_see(view.resource_id):
        raise NotVisible(f"thread {thread_id!r} not found")
    runs = {r: v for r, v in views.runs.items() if v.thread_id == thread_id} if views else {}
    return ThreadLog(thread_id, commits, view, runs)


async def run_commits(store: EventStore, run_id: str) -> list[StoredCommit]:
    return [sc async for sc in store.read_run(run_id)]


def resumed_now(commits: Sequence[StoredCommit], seq: int) -> bool:
    """Did the decision commit at `seq` resume calls (`RunResumed`), or only record decisions
    (a partial answer in parallel_batch_approval: the run keeps waiting)?"""
    return any(type(e) is RunResumed for sc in commits if sc.seq == seq for e in sc.commit.events)


class Translator(Protocol):
    """What `drive` needs of a protocol's translator (`agui.translator.AguiTranslator`,
    `aisdk.translator.AiSdkTranslator`)."""

    done: bool

    def feed(self, item: Any) -> list[Any]: ...

    def finish(self, error: BaseException | str | None = None) -> list[Any]: ...

    def rewind(self, state: dict[str, Any], messages: list[Message]) -> None: ...

    def with_position(self, out: list[Any], seq: int) -> list[Any]: ...


#: What `drive` does: record decisions, nothing (replay a recorded answer's run from the log), or
#: start a run (with this parent run, if any).
Action = (
    tuple[Literal["decide"], list[Decision]]
    | tuple[Literal["replay"], None]
    | tuple[Literal["start"], str | None]
    | tuple[Literal["queue"], str]
)


async def drive(backend: Backend, tr: Translator, thread: ThreadLog, agent_id: str, messages: list[Any],
                 run_id: str, after: int, action: Action, who: Any,
                 frontend_tools: list[dict[str, Any]] | None = None,
                 run_input: dict[str, Any] | None = None) -> AsyncIterator[Any]:
    """Subscribe live, act (start / decide / nothing for a replay), follow, translate.
    `frontend_tools`, `run_input`: recorded with a started run (AG-UI `tools`; overrides,
    context, forwarded props, state). An override the agent does not allow is raised before
    the first event, so the transport answers it as a refused request (HTTP 400), not a stream."""
    src = RunSource(backend.store, backend.nc, thread.thread_id, run_id)
    try:
        await src.subscribe()
        try:
            if action[0] == "start":
                tenant = getattr(who, "tenant", None)
                # a new message while the thread's last run still runs: "stop, then send" (the
                # client stopped its stream; the run went on): one interrupting command
                last = thread.last_run
                interrupt = last is not None and last.run_id == action[1] and last.status == "running"
                await backend.dispatcher.start_run(RunRequest(
                    agent_id=agent_id, messages=messages, thread_id=thread.thread_id, run_id=run_id,
                    parent_run_id=action[1], resource_id=tenant if thread.view is None else None,
                    frontend_tools=frontend_tools or [], run_input=as_run_input(run_input), interrupt=interrupt))
            elif action[0] == "queue":  # steer / follow_up: the running run takes the messages
                await backend.dispatcher.submit_inputs(run_id, messages=messages, mode=action[1])
            elif action[0] == "decide":
                accepted = await backend.dispatcher.submit_inputs(run_id, decisions=action[1])
                if accepted.duplicate:  # a retried answer: replay from where it was recorded,
                    after = accepted.seq - 1  # from the state as of then (see `agui.session.events`)
                    tr.rewind(*thread.as_of(after))
                commits = await run_commits(backend.store, run_id)
                if not resumed_now(commits, accepted.seq):
                    # recorded, but the run still waits for the rest (a partial answer)
                    run = fold_commits(commits).runs[run_id]
                    still = [c.call_id for c in run.calls.values() if c.status == "suspended"]
                    for ev in tr.with_position(tr.feed(RunSuspended(call_ids=still)), commits[-1].seq):
                        yield ev
                    return
        except AgentlogError as exc:
            if exc.code == OverrideNotAllowed.code:
                raise
            for ev in tr.finish(exc):
                yield ev
            return
        src.follow(after)
        try:
            async for item in src.items():
                out = tr.feed(item)
                if tr.done and isinstance(item, CommittedEvent):
                    out = tr.with_position(out, item.position.seq)
                for ev in out:
                    yield ev
                if tr.done:
                    return
        except AgentlogError as exc:
            for ev in tr.finish(exc):
                yield ev
            return
        for ev in tr.finish():
            yield ev
    finally:
        await src.close()


__all__ = ["Action", "Backend", "NotVisible", "ThreadLog", "backend_of", "drive", "load_thread", "resumed_now",
           "Translator", "run_commits"]
