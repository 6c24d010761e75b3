"""Sub-agents as child runs: the `agent_run`, `agent_output` and `agent_stop` tools.

A child is a real run of another agent on its own child thread: `ThreadCreated.parent_thread_id`
and `RunStarted.parent_run_id/parent_thread_id` record the lineage, the child thread's metadata
names the parent's tool call (`parent_call_id`). Everything about a child is in the log, so:

- Ids are derived from (parent run, call id) (`child_ids`): a parent call run again after a crash
  (at-least-once, same call_id) finds its child instead of starting a second one, and goes on
  waiting for it (resuming it from the log if nobody drives it).
- Foreground (`agent_run`, default): the parent's call waits for the child, forwarding each child
  commit to the call's live progress, and completes with the child's answer. A child that stops
  to wait for a human makes the parent's call suspend too (ticket = the child's run id, resume
  mode `use_decision_as_tool_result`); when the child later finishes, whichever process writes
  its `RunFinished` records the decision for the parent's call (`SubAgents.__call__`, an
  observer), so the parent resumes from the log like any HITL run.
- Background (`background=true`): the call returns the child's handle at once; `agent_output`
  reads (or waits for) its result from the log; `agent_stop` cancels it.
- Cancelling a run cancels its children (and so on down: each child's cancelled finish cascades
  in the process that writes it).
- Launching: in-process (`Runtime.start`) by default; with a `CommandClient` the child's start is
  a work-queue command, so any worker runs it and a crashed worker's child is redelivered.
- Verified replay: these tools carry `replay_from_log`, so replay answers them from the recorded
  results and never starts a run; `verify_tree` verifies a run and all its descendants.
- Allowed / excluded agents per agent: `AgentSpec.allowed_agents` / `excluded_agents`.
- Tenancy: a child thread gets its parent thread's `resource_id`, so whoever may read the parent
  (a tenant-scoped token) reads its children too, and nobody else does.

Note for worker pools: a foreground parent holds a worker slot while its child runs, so a pool
needs more slots than the deepest chain of foreground sub-agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentlog.eventlog.events import (
    MessageAppended,
    RunFinished,
    RunStarted,
    StoredCommit,
    ThreadCreated,
    ToolCallStarted,
)
from agentlog.eventlog.store import as_generator, first_commit
from agentlog.projections.fold import RunFolder, fold_commits
from agentlog.projections.views import RunView
from agentlog.runtime.agents.spec import AgentRegistry, AgentSpec
from agentlog.runtime.errors import RunConflict
from agentlog.runtime.inputs.request import RunRequest
from agentlog.runtime.logs import get_logger
from agentlog.runtime.loop.hitl import HitlError, parse_decision
from agentlog.runtime.tools import Tool, ToolContext, ToolError, ToolResult

if TYPE_CHECKING:
    from agentlog.runtime.facade import Runtime

AGENT_RUN, AGENT_OUTPUT, AGENT_STOP = "agent_run", "agent_output", "agent_stop"
#: `RunStarted.origin` of a child run.
ORIGIN = "subagent"

_log = get_logger("agentlog.subagents")


def child_ids(parent_run_id: str, call_id: str) -> tuple[str, str]:
    """(thread_id, run_id) of the child started by `call_id` of `parent_run_id`: a pure function,
    so a re-run call finds the same child. Safe NATS tokens whatever the call id looks like."""
    digest = hashlib.sha256(f"{parent_run_id}\0{call_id}".encode()).hexdigest()[:32]
    return f"sub-{digest}", f"subrun-{digest}"


def check_allowed(spec: AgentSpec, agent_id: str, agents: AgentRegistry) -> None:
    """Raise `ToolError` (the model sees why) unless `spec` may start `agent_id`."""
    allowed = [a for a in (spec.allowed_agents if spec.allowed_agents is not None else [a.id for a in agents])
               if a not in spec.excluded_agents and a in agents]
    if agent_id not in allowed:
        why = "unknown agent" if agent_id not in agents else f"agent {spec.id!r} may not start it"
        raise ToolError(f"{why}: {agent_id!r}; allowed agents: {', '.join(sorted(allowed)) or 'none'}")


def child_result(view: RunView, commits: Sequence[StoredCommit]) -> dict[str, Any]:
    """What a parent learns about a child: ids, status, termination and its last answer."""
    output = ""
    for sc in commits:
        for ev in sc.commit.events:
            if type(ev) is MessageAppended and ev.message.role == "assistant" and sc.commit.run_id == view.run_id:
                output = ev.message.content
    term = view.termination
    return {
        "run_id": view.run_id, "thread_id": view.thread_id, "agent_id": view.agent_id, "status": view.status,
        "termination": None if term is None else term.type, "output": output,
        "usage": {"input_tokens": view.usage.input_tokens, "output_tokens": view.usage.output_tokens},
    }


def children_of(run_id: str, commits: Sequence[StoredCommit]) -> list[tuple[str, str]]:
    """(thread_id, run_id) of every child `run_id`'s `agent_run` calls started (pure)."""
    return [child_ids(run_id, ev.call_id) for sc in commits if sc.commit.run_id == run_id
            for ev in sc.commit.events if type(ev) is ToolCallStarted and ev.name == AGENT_RUN]


class SubAgents:
    """The sub-agent tools and their observer, for one `Runtime`: either
    `SubAgents(commands=None).install(runtime)`, or pass `sub.tools` with the runtime's tools
    (e.g. in an `App`): a `Runtime` binds tools that carry `bind_runtime` when it is built, the
    first one wins. List `agent_run` (and `agent_output`, `agent_stop`) in an agent's tools."""

    def __init__(self, *, commands: Any = None) -> None:
        self.commands = commands
        self._bound: Runtime | None = None
        #: Lineage effects in flight, by the run whose commit caused them.
        self._tasks: dict[str, set[asyncio.Task[None]]] = {}
        self.tools = [self._tool(self._agent_run, AGENT_RUN), self._tool(self._agent_output, AGENT_OUTPUT),
                      self._tool(self._agent_stop, AGENT_STOP)]

    def _tool(self, fn: Any, name: str) -> Tool:
        t = Tool.from_function(fn, name=name)
        t.replay_from_log = True  # see agentlog.runtime.replay.verify.verify_run
        t.bind_runtime = self.bind  # see Runtime.__init__
        return t

    @property
    def runtime(self) -> Runtime:
        """The Runtime the tools act with (the first one bound)."""
        if self._bound is None:
            raise RuntimeError("SubAgents is not bound to a Runtime: install(runtime), or build the Runtime "
                               "with its tools")
        return self._bound

    def bind(self, runtime: Runtime) -> None:
        """Use `runtime` (its store, agents, start/resume/cancel) and observe its commits. Only
        the first runtime binds: a verified replay's runtime (built from the same tools) must not
        take the live one's place."""
        if self._bound is None:
            self._bound = runtime
            runtime.observers.append(self)

    def install(self, runtime: Runtime) -> SubAgents:
        for t in self.tools:
            if t.name not in runtime.tools:
                runtime.tools.register(t)
        self.bind(runtime)
        return self

    # -- the tools -----------------------------------------------------------------------------

    async def _agent_run(self, agent_id: str, prompt: str, ctx: ToolContext, background: bool = False) -> Any:
        """Run another agent as a sub-agent (a child run on its own thread) with `prompt`.
        Foreground (default): wait for its answer. background=true: return its run_id at once
        (read it later with agent_output, stop it with agent_stop)."""
        rt = self.runtime
        check_allowed(rt.agents.get(ctx.agent_id), agent_id, rt.agents)
        thread_id, run_id = child_ids(ctx.run_id, ctx.call_id)
        await self._launch(ctx, agent_id, prompt, thread_id, run_id)
        if background:
            return {"run_id": run_id, "thread_id": thread_id, "agent_id": agent_id, "status": "running"}
        view, commits = await self._wait(thread_id, run_id, ctx)
        return self._answer(view, commits)

    async def _agent_output(self, run_id: str, ctx: ToolContext, wait: bool = False) -> Any:
        """The status and answer of a sub-agent run started from this thread; wait=true waits
        until it finishes (or stops to wait for a human)."""
        thread_id = await self._own_child(run_id, ctx)
        if wait:
            view, commits = await self._wait(thread_id, run_id, ctx)
        else:
            commits = [sc async for sc in self.runtime.store.read_run(run_id)]
            view = fold_commits(commits).runs[run_id]
        return child_result(view, commits)

    async def _agent_stop(self, run_id: str, ctx: ToolContext) -> Any:
        """Cancel a sub-agent run started from this thread (and its own sub-agents)."""
        await self._own_child(run_id, ctx)
        stopped = await self.runtime.cancel(run_id, reason=f"stopped by run {ctx.run_id}")
        return {"run_id": run_id, "stopped": stopped}

    @staticmethod
    def _answer(view: RunView, commits: Sequence[StoredCommit]) -> ToolResult:
        result = child_result(view, commits)
        if view.status == "waiting":
            return ToolResult.pending(
                view.run_id, action="subagent", resume_mode="use_decision_as_tool_result",
                message=f"sub-agent {view.agent_id} (run {view.run_id}) waits for a decision",
                parameters={"run_id": view.run_id, "thread_id": view.thread_id},
            )
        if result["termination"] != "natural_end":
            return ToolResult.failure(f"sub-agent {view.agent_id} ended {result['termination']}", result)
        return ToolResult.success(result)

    async def _own_child(self, run_id: str, ctx: ToolContext) -> str:
        """The thread of `run_id` if it is a child of a run on the caller's thread; ToolError else."""
        first = await first_commit(self.runtime.store.read_run(run_id))
        if first is not None:
            for ev in first.commit.events:
                if type(ev) is RunStarted and ev.parent_thread_id == ctx.thread_id and ev.origin == ORIGIN:
                    return first.commit.thread_id
        raise ToolError(f"{run_id!r} is not a sub-agent run of this thread")

    # -- launching and waiting -----------------------------------------------------------------

    async def _launch(self, ctx: ToolContext, agent_id: str, prompt: str, thread_id: str, run_id: str) -> None:
        """Start the child unless it exists (a re-run call); resume it if nobody drives it."""
        rt = self.runtime
        request = RunRequest(
            agent_id=agent_id, messages=[prompt], thread_id=thread_id, run_id=run_id, parent_run_id=ctx.run_id,
            parent_thread_id=ctx.thread_id, origin=ORIGIN, resource_id=await self._resource_of(ctx.thread_id),
            thread_metadata={"parent_call_id": ctx.call_id, "parent_agent_id": ctx.agent_id})
        if self.commands is not None:
            from agentlog.runtime.inputs.commands import StartRun

            # the queue dedups this id; a worker resumes a started run from the log
            await self.commands.submit(StartRun.of(request, thread_id, run_id, command_id=f"start-{run_id}"),
                                       app_name=rt.app.name if rt.app is not None else None)  # this app's workers
            return
        if await first_commit(rt.store.read_run(run_id)) is None:
            try:
                await rt.start(request)
                return
            except RunConflict:
                pass  # started meanwhile: drive or follow it below
        try:
            await rt.resume(run_id, thread_id=thread_id)  # None (finished / waiting) or its handle
        except RunConflict:
            pass  # driven elsewhere

    async def _resource_of(self, thread_id: str) -> str | None:
        """The `resource_id` (tenant) of a thread: set by its `ThreadCreated`, in its first commit."""
        first = await first_commit(self.runtime.store.read_thread(thread_id))
        if first is None:
            return None
        return next((e.resource_id for e in first.commit.events if type(e) is ThreadCreated), None)

    async def _wait(self, thread_id: str, run_id: str, ctx: ToolContext) -> tuple[RunView, list[StoredCommit]]:
        """Follow the child's thread from the log until the run finishes or waits, forwarding
        each of its commits to the parent call's live progress."""
        commits: list[StoredCommit] = []
        folder = RunFolder(RunView(run_id=run_id, thread_id=thread_id))  # each commit folded once
        async with contextlib.aclosing(as_generator(self.runtime.store.follow(thread_id))) as follow:
            async for sc in follow:
                if sc.commit.run_id != run_id:
                    continue  # only the run's own commits change its view
                commits.append(sc)
                ctx.progress(_progress(sc))
                folder.apply(sc)
                view = folder.view()
                if view.finished or view.status == "waiting":
                    return view, commits
        raise ToolError(f"the log ended while following sub-agent run {run_id!r}")

    # -- the observer: lineage effects of commits this process writes -----------------------------

    def __call__(self, sc: StoredCommit) -> None:
        for ev in sc.commit.events:
            if type(ev) is RunFinished:
                run_id = sc.commit.run_id or ""
                if ev.termination.type == "cancelled":
                    self._spawn(run_id, self._cancel_children(run_id))
                if run_id.startswith("subrun-"):
                    self._spawn(run_id, self._notify_parent(sc.commit.thread_id, run_id))

    def _spawn(self, run_id: str, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks = self._tasks.setdefault(run_id, set())
        tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            tasks.discard(t)
            if not tasks and self._tasks.get(run_id) is tasks:
                del self._tasks[run_id]

        task.add_done_callback(done)

    async def drain(self, run_id: str | None = None) -> None:
        """Wait for the lineage effects of `run_id`'s commits (all runs' when None): a worker
        acks a command only after them (`Runtime.settled`)."""
        while True:
            pending = [t for r, ts in list(self._tasks.items()) if run_id is None or r == run_id for t in ts]
            if not pending:
                return
            await asyncio.gather(*pending, return_exceptions=True)

    async def recover(self, run_id: str) -> None:
        """Schedule again the lineage effects of a run that finished in a process that died
        before they ran (idempotent: a recorded decision is not recorded twice, a finished run
        is not cancelled). For a worker handling a redelivered command of a finished run."""
        commits = [sc async for sc in self.runtime.store.read_run(run_id)]
        for sc in commits:
            if any(type(e) is RunFinished for e in sc.commit.events):
                self(sc)

    async def _cancel_children(self, run_id: str) -> None:
        rt = self.runtime
        commits = [sc async for sc in rt.store.read_run(run_id)]
        for _thread_id, child in children_of(run_id, commits):
            try:
                if await rt.cancel(child, reason=f"parent run {run_id} cancelled"):
                    _log.info("subagent.cancelled_with_parent", run_id=child, parent_run_id=run_id)
            except LookupError:
                pass  # its start never made it to the log
            except Exception:  # noqa: BLE001 - best effort; logged
                _log.exception("subagent.cancel_failed", run_id=child, parent_run_id=run_id)

    async def _notify_parent(self, thread_id: str, run_id: str) -> None:
        """A child finished: if its parent's call suspended on it, record the child's result as
        that call's decision (idempotent: the decision id is derived from the child run)."""
        rt = self.runtime
        history = [sc async for sc in rt.store.read_thread(thread_id)]
        created = next((e for sc in history[:1] for e in sc.commit.events if type(e) is ThreadCreated), None)
        started = next((e for sc in history for e in sc.commit.events
                        if type(e) is RunStarted and e.run_id == run_id), None)
        if created is None or started is None or started.parent_run_id is None:
            return
        call_id = created.metadata.get("parent_call_id")
        parent = [sc async for sc in rt.store.read_run(started.parent_run_id)]
        call = fold_commits(parent).runs[started.parent_run_id].calls.get(str(call_id)) if parent else None
        if call is None or call.status != "suspended":
            return  # the parent's call waited in the foreground (or is gone): nothing to resume
        view = fold_commits(history).runs[run_id]
        decision = {"target_id": call_id, "decision_id": f"d-{run_id}", "action": "resume",
                    "result": child_result(view, [c for c in history if c.commit.run_id == run_id])}
        try:
            if self.commands is not None:
                from agentlog.runtime.inputs.commands import Decide

                await self.commands.submit(Decide(
                    command_id=f"d-{run_id}", thread_id=started.parent_thread_id or "", run_id=started.parent_run_id,
                    decisions=[parse_decision(decision, rt.entropy.now_ms())],
                ), app_name=rt.app.name if rt.app is not None else None)
            else:
                await rt.decide(started.parent_run_id, [decision])
            _log.info("subagent.parent_resumed", run_id=run_id, parent_run_id=started.parent_run_id)
        except HitlError as exc:
            _log.info("subagent.parent_not_waiting", run_id=run_id, reason=str(exc))


def _progress(sc: StoredCommit) -> dict[str, Any]:
    """A child commit as the parent call's live progress: its event types and any answer text."""
    text = [ev.message.content for ev in sc.commit.events
            if type(ev) is MessageAppended and ev.message.role == "assistant" and ev.message.content]
    return {"subagent_run_id": sc.commit.run_id, "seq": sc.seq,
            "events": [type(ev).__name__ for ev in sc.commit.events], **({"text": text[-1]} if text else {})}


async def verify_tree(log: Any, run_id: str, app: Any, **options: Any) -> list[Any]:
    """Verified replay of `run_id` and every sub-agent run below it (children found from the
    log's `agent_run` calls), parents first. Returns the reports, ending at the first one that
    diverged (with `raise_on_divergence=False`; by default the divergence is raised)."""
    from agentlog.runtime.replay.verify import verify_run

    reports = [await verify_run(log, run_id, app, **options)]
    if not reports[0].ok:
        return reports
    commits = [sc async for sc in log.read_run(run_id)]
    for _thread_id, child in children_of(run_id, commits):
        started = False
        async for _sc in log.read_run(child):
            started = True
            break
        if started:
            reports += await verify_tree(log, child, app, **options)
            if not reports[-1].ok:
                break
    return reports


__all__ = ["AGENT_OUTPUT", "AGENT_RUN", "AGENT_STOP", "SubAgents", "check_allowed", "child_ids", "children_of",
           "child_result", "verify_tree"]
