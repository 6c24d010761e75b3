"""Plausible synthetic thread histories, for property tests and the projections benchmark.

`generate_history(rng, ...)` is a pure function of the `random.Random` it is given (hypothesis
passes a shrinkable one; the benchmark a seeded one). Histories follow the runtime's protocol:
threads are created, runs start with a user message, steps hold inference and tool calls through
their lifecycle (gate, start, suspend, decide, resume, complete), state patches are valid for the
state they apply to (checked with `validate_patch` while generating), and most runs finish.
Several threads are interleaved in the log, the way concurrent agents write it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from agentlog.eventlog.events import (
    AnyEvent,
    Commit,
    DecisionAction,
    InferenceCompleted,
    Message,
    MessageAppended,
    Outcome,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    StatePatched,
    StateReplaced,
    StepFinished,
    StepStarted,
    StoredCommit,
    SuspendTicket,
    Termination,
    TerminationType,
    ThreadCreated,
    ThreadDeleted,
    ThreadMetadataUpdated,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallGated,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
    Usage,
    Verdict,
)
from agentlog.projections.state import validate_patch

_TERMINATIONS: tuple[TerminationType, ...] = ("natural_end", "natural_end", "natural_end", "stopped", "cancelled", "error")


def random_ops(rng: random.Random, state: dict[str, Any]) -> list[dict[str, Any]]:
    """1-3 RFC 6902 ops (every kind) that apply to `state`, chosen by `rng`."""
    ops: list[dict[str, Any]] = []
    doc = state
    for _ in range(rng.randint(1, 3)):
        keys = sorted(doc)
        kinds = ["add", "add"] + (["replace", "remove", "move", "copy", "test"] if keys else [])
        kind = rng.choice(kinds)
        new_key = f"/k{rng.randint(0, 30)}"
        if kind == "add":
            value: Any = rng.choice([rng.randint(0, 100), f"v{rng.randint(0, 9)}", [rng.randint(0, 3)], {"n": 1}])
            op = {"op": "add", "path": new_key, "value": value}
        else:
            key = "/" + rng.choice(keys)
            if kind == "replace":
                op = {"op": "replace", "path": key, "value": rng.randint(0, 1000)}
            elif kind == "remove":
                op = {"op": "remove", "path": key}
            elif kind in ("move", "copy"):
                op = {"op": kind, "from": key, "path": new_key}
                if key == new_key:
                    op = {"op": "test", "path": key, "value": doc[key[1:]]}
            else:
                op = {"op": "test", "path": key, "value": doc[key[1:]]}
        doc = validate_patch(doc, [op])
        ops.append(op)
    return ops


class _ThreadGen:
    def __init__(self, rng: random.Random, index: int, max_runs: int, max_steps: int) -> None:
        self.rng = rng
        self.thread_id = f"t{index}"
        self.max_runs = max_runs
        self.max_steps = max_steps
        self.state: dict[str, Any] = {}
        self.n = 0

    def _id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.thread_id}x{self.n}"

    def _commit(self, run_id: str | None, events: list[AnyEvent]) -> tuple[str | None, list[AnyEvent]]:
        return run_id, events

    def _thread_patch(self) -> StatePatched:
        ops = random_ops(self.rng, self.state)
        self.state = validate_patch(self.state, ops)
        return StatePatched(ops=ops, scope="thread", source="gen")

    def commits(self) -> Iterator[tuple[str | None, list[AnyEvent]]]:
        rng = self.rng
        yield None, [ThreadCreated(resource_id=rng.choice([None, "res1"]), metadata={"title": "t"})]
        if rng.random() < 0.3:
            yield None, [ThreadMetadataUpdated(metadata={"title": None, "tag": rng.randint(0, 5)})]
        parent: str | None = None
        for _ in range(rng.randint(1, self.max_runs)):
            run_id = self._id("r")
            yield from self._run(run_id, parent)
            parent = run_id
        if rng.random() < 0.05:
            yield None, [ThreadDeleted(reason="gen")]

    def _run(self, run_id: str, parent: str | None) -> Iterator[tuple[str | None, list[AnyEvent]]]:
        rng = self.rng
        run_state: dict[str, Any] = {}
        first: list[AnyEvent] = [
            RunStarted(run_id=run_id, agent_id="agent", parent_run_id=parent),
            MessageAppended(message=Message(id=self._id("m"), role="user", content="hi")),
        ]
        if rng.random() < 0.3:
            ops = random_ops(rng, run_state)
            run_state = validate_patch(run_state, ops)
            first.append(StatePatched(ops=ops, scope="run"))
        yield run_id, first
        finished_early = False
        for step in range(1, rng.randint(1, self.max_steps) + 1):
            calls = [self._id("c") for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))]
            msg_id = self._id("m")
            tool_calls = [ToolCall(id=c, name=f"tool{rng.randint(0, 3)}", arguments={"x": rng.randint(0, 9)}) for c in calls]
            yield run_id, [
                StepStarted(step=step),
                MessageAppended(message=Message(id=msg_id, role="assistant", content="ok", tool_calls=tool_calls or None)),
                InferenceCompleted(model="m", usage=Usage(input_tokens=rng.randint(1, 50), output_tokens=rng.randint(1, 50)), message_id=msg_id),
            ]
            suspended: list[str] = []
            for tc in tool_calls:
                verdict: Verdict = rng.choice(["allow", "allow", "ask"])
                start: list[AnyEvent] = [ToolCallGated(call_id=tc.id, verdict=verdict, rule="*")]
                start.append(ToolCallStarted(call_id=tc.id, name=tc.name, arguments=tc.arguments))
                if rng.random() < 0.3:
                    start.append(StatePatched(ops=random_ops(rng, {}), scope="tool_call", call_id=tc.id))
                if rng.random() < 0.15 and self.state:
                    start.append(self._thread_patch())
                yield run_id, start
                if verdict == "ask" or rng.random() < 0.1:
                    yield run_id, [ToolCallSuspended(call_id=tc.id, ticket=SuspendTicket(id=self._id("k")))]
                    suspended.append(tc.id)
                else:
                    yield run_id, [self._completed(tc.id)]
            if suspended:
                yield run_id, [RunSuspended(call_ids=suspended)]
                if rng.random() < 0.15:
                    return  # left waiting
                for call_id in suspended:
                    action: DecisionAction = rng.choice(["resume", "resume", "cancel"])
                    yield run_id, [ToolCallDecided(call_id=call_id, decision=ToolCallDecision(
                        target_id=call_id, decision_id=self._id("d"), action=action, result=True))]
                yield run_id, [RunResumed(call_ids=suspended)]
                for call_id in suspended:
                    yield run_id, [ToolCallResuming(call_id=call_id, mode="replay_tool_call")]
                    yield run_id, [self._completed(call_id)]
            events: list[AnyEvent] = [StepFinished(step=step)]
            if rng.random() < 0.3:
                events.append(self._thread_patch())
            if rng.random() < 0.1:
                events.append(StateReplaced(state={"replaced": step}, scope="run"))
            yield run_id, events
            if rng.random() < 0.05:
                yield run_id, [RunCancelRequested(reason="gen")]
                finished_early = True
                break
        if rng.random() < 0.1 and not finished_early:
            return  # left running (a crashed worker)
        usage = Usage(input_tokens=rng.randint(0, 9), output_tokens=0) if rng.random() < 0.5 else Usage()
        yield run_id, [RunFinished(termination=Termination(type=rng.choice(_TERMINATIONS)), usage=usage)]

    def _completed(self, call_id: str) -> ToolCallCompleted:
        outcome: Outcome = self.rng.choice(["succeeded", "succeeded", "failed", "cancelled"])
        return ToolCallCompleted(call_id=call_id, outcome=outcome, result={"ok": outcome == "succeeded"})


def generate_history(
    rng: random.Random,
    *,
    threads: int = 3,
    max_runs: int = 3,
    max_steps: int = 3,
    start_ts: int = 1_700_000_000_000,
) -> list[Commit]:
    """Interleaved commits of `threads` threads, in log order, with increasing `ts`."""
    gens = [_ThreadGen(rng, i, max_runs, max_steps).commits() for i in range(threads)]
    out: list[Commit] = []
    ts = start_ts
    live = list(range(len(gens)))
    while live:
        pick = rng.choice(live)
        item = next(gens[pick], None)
        if item is None:
            live.remove(pick)
            continue
        run_id, events = item
        ts += rng.randint(0, 5)
        thread_id = f"t{pick}"
        out.append(Commit(commit_id=f"{thread_id}c{len(out)}", thread_id=thread_id, run_id=run_id, ts=ts, events=events))
    return out


def stored(commits: list[Commit], first_seq: int = 1) -> list[StoredCommit]:
    """Give commits the sequences a fresh log would: first_seq, first_seq + 1, ..."""
    return [StoredCommit(first_seq + i, c) for i, c in enumerate(commits)]


def history_of_size(rng: random.Random, events: int, threads_per_chunk: int = 20) -> list[Commit]:
    """At least `events` events (for benchmarks): chunks of interleaved threads, ids unique."""
    out: list[Commit] = []
    count = 0
    chunk = 0
    ts = 1_700_000_000_000
    while count < events:
        part = generate_history(rng, threads=threads_per_chunk, max_runs=3, max_steps=4, start_ts=ts)
        for c in part:
            tid = f"b{chunk}{c.thread_id}"
            run_id = f"b{chunk}{c.run_id}" if c.run_id else None
            evs = [
                RunStarted(run_id=f"b{chunk}{e.run_id}", agent_id=e.agent_id, parent_run_id=(f"b{chunk}{e.parent_run_id}" if e.parent_run_id else None))
                if isinstance(e, RunStarted) else e
                for e in c.events
            ]
            out.append(Commit(commit_id=f"b{chunk}{c.commit_id}", thread_id=tid, run_id=run_id, ts=c.ts, events=evs))
            count += len(evs)
        ts = part[-1].ts + 1
        chunk += 1
    return out
