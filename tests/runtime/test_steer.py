"""Steering a running run: messages queued in the log (`MessageQueued`, mode steer or follow_up)
and taken by the run loop at its next step boundary, or when it would otherwise end.

Pure tests of the fold's decision, then runs driven in process on a real JetStream store (each
verified with `verify_run`, the engine of `agentlog replay --verify`). Synchronisation: asyncio
events set by the tool and the model; no test waits for a timeout to expire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    MessageQueued,
    RunFinished,
    RunStarted,
    StepFinished,
    StoredCommit,
    ToolCallCompleted,
)
from agentlog.runtime import DeterministicEntropy, Runtime, ToolContext, tool
from agentlog.runtime.errors import RunEnded
from agentlog.runtime.loop.run_context import RunContext, apply_event, due_messages
from agentlog.runtime.models.base import ModelRequest
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.queued import queue_messages
from agentlog.runtime.replay.verify import verify_run

from tests.apps import steer_app
from tests.support.runtime import store, thread_log  # noqa: F401  (fixture)

LIMIT = 30


# == the fold's decision (pure) =====================================================================


def _fold(*events: tuple[Any, str]) -> RunContext:
    ctx = RunContext(thread_id="t", run_id="r")
    for ev, run_id in events:
        apply_event(ctx, ev, 0, run_id)
    return ctx


def _user(id: str, text: str) -> Message:
    return Message(id=id, role="user", content=text)


def test_steer_fold_takes_steering_messages_at_a_boundary_and_every_message_at_the_end() -> None:
    ctx = _fold(
        (RunStarted(run_id="r", agent_id="a"), "r"),
        (MessageQueued(message=_user("m1", "steer me"), mode="steer"), "r"),
        (MessageQueued(message=_user("m2", "afterwards"), mode="follow_up"), "r"),
        (MessageQueued(message=_user("m3", "not mine"), mode="steer"), "other"),
        (MessageQueued(message=_user("m1", "steer me"), mode="steer"), "r"),  # recorded twice: once
    )
    assert [m.id for m in due_messages(ctx, ending=False)] == ["m1"]
    assert [m.id for m in due_messages(ctx, ending=True)] == ["m1", "m2"]
    apply_event(ctx, MessageAppended(message=_user("m1", "steer me")), 0, "r")  # taken
    assert [m.id for m in due_messages(ctx, ending=False)] == []
    assert [m.id for m in due_messages(ctx, ending=True)] == ["m2"]
    apply_event(ctx, RunStarted(run_id="r", agent_id="a"), 0, "r")  # a run's queue is its own
    assert due_messages(ctx, ending=True) == []


def test_steer_fold_is_the_same_from_a_snapshot_tail() -> None:
    """A cold resume folds the run's commits run-scoped only (`thread_scope=False`): the queue
    and what was taken are run-scoped, so it holds the same pending messages."""
    events = [RunStarted(run_id="r", agent_id="a"), MessageQueued(message=_user("m1", "x"), mode="steer"),
              MessageQueued(message=_user("m2", "y"), mode="follow_up"), MessageAppended(message=_user("m1", "x"))]
    full, tail = RunContext(thread_id="t", run_id="r"), RunContext(thread_id="t", run_id="r")
    for ev in events:
        apply_event(full, ev, 0, "r")
        apply_event(tail, ev, 0, "r", thread_scope=False)
    assert full.queued == tail.queued and [q.message.id for q in full.queued] == ["m2"]


# == runs in process ===============================================================================


class Gate:
    """The in-process `wait` tool: tells when a thread's call started, returns once released."""

    def __init__(self) -> None:
        self.started: dict[str, asyncio.Event] = {}
        self.released: dict[str, asyncio.Event] = {}

    def of(self, table: dict[str, asyncio.Event], thread_id: str) -> asyncio.Event:
        return table.setdefault(thread_id, asyncio.Event())

    def tool(self) -> Any:
        gate = self

        @tool(name="wait")
        async def wait(ctx: ToolContext) -> str:
            """Block until the test releases this thread."""
            gate.of(gate.started, ctx.thread_id).set()
            await gate.of(gate.released, ctx.thread_id).wait()
            return "released"

        return wait


def runtime(store: Any, gate: Gate, model: ScriptedModel | None = None) -> Runtime:
    rt = steer_app.build(store, gate.tool())
    if model is not None:
        rt.models = Runtime(store, models={"steered": model}).models
    rt.entropy = DeterministicEntropy()
    return rt


def texts(commits: list[StoredCommit], role: str) -> list[str]:
    return [e.message.content for sc in commits for e in sc.commit.events
            if type(e) is MessageAppended and e.message.role == role]


def index_of(commits: list[StoredCommit], pred: Callable[[Any], bool]) -> tuple[int, int]:
    return next((sc.seq, i) for sc in commits for i, e in enumerate(sc.commit.events) if pred(e))


@pytest.mark.asyncio
async def test_steer_in_process_is_taken_after_the_tool_round_before_the_next_model_call(store: Any) -> None:
    gate = Gate()
    rt = runtime(store, gate)
    async with asyncio.timeout(LIMIT):
        handle = await rt.start("steered", "hold on", thread_id="t-steer-1")
        await gate.of(gate.started, "t-steer-1").wait()
        queued = await rt.queue_messages(handle.run_id, "change of plan: deploy 1.4.3", mode="steer")
        assert not queued.duplicate
        gate.of(gate.released, "t-steer-1").set()
        result = await handle.result()
    assert result.termination is not None and result.termination.type == "natural_end"
    log = await thread_log(store, "t-steer-1")
    assert texts(log, "user") == ["hold on", "change of plan: deploy 1.4.3"]
    assert texts(log, "assistant")[-1] == "heard: change of plan: deploy 1.4.3"
    completed = index_of(log, lambda e: type(e) is ToolCallCompleted)
    taken = index_of(log, lambda e: type(e) is MessageAppended and e.message.id == queued.message_ids[0])
    closed = index_of(log, lambda e: type(e) is StepFinished)
    assert completed < closed < taken  # after the tool round, at the step boundary
    assert sum(type(e) is RunStarted for sc in log for e in sc.commit.events) == 1  # the same run went on
    assert (await verify_run(store, handle.run_id, rt)).ok


@pytest.mark.asyncio
async def test_steer_follow_up_in_process_continues_the_run_when_it_would_end(store: Any) -> None:
    gate = Gate()
    rt = runtime(store, gate)
    async with asyncio.timeout(LIMIT):
        handle = await rt.start("steered", "hold on", thread_id="t-follow-1")
        await gate.of(gate.started, "t-follow-1").wait()
        await rt.queue_messages(handle.run_id, "and then the changelog", mode="follow_up")
        gate.of(gate.released, "t-follow-1").set()
        result = await handle.result()
    assert result.termination is not None and result.termination.type == "natural_end"
    log = await thread_log(store, "t-follow-1")
    # not at the step boundary: the model answered the first message, then the follow-up
    assert texts(log, "assistant")[-2:] == ["heard: hold on", "heard: and then the changelog"]
    assert sum(type(e) is RunFinished for sc in log for e in sc.commit.events) == 1
    assert (await verify_run(store, handle.run_id, rt)).ok


@pytest.mark.asyncio
async def test_steer_queued_while_the_end_commit_is_written_undoes_the_end(store: Any) -> None:
    """No poke (the message is appended straight to the log, as a process that cannot reach the
    loop would): the commit ending the run conflicts with it, the end is undone and the run goes
    on with the message. The replay meets the same conflict and verifies."""
    answering = asyncio.Event()
    go = asyncio.Event()

    def slow(request: ModelRequest) -> Turn:
        last = request.messages[-1]
        if last.role == "user" and last.content == "slow":
            answering.set()
            return Turn.text("heard: slow", gate=go)
        return steer_app.answer(request)

    gate = Gate()
    rt = runtime(store, gate, ScriptedModel([slow], loop=True, position="conversation"))
    async with asyncio.timeout(LIMIT):
        handle = await rt.start("steered", "slow", thread_id="t-steer-race")
        await answering.wait()
        msg = _user("m-late", "one more thing")
        await queue_messages(store, rt.entropy, handle.run_id, "t-steer-race", [msg], "steer")
        go.set()
        result = await handle.result()
    assert result.termination is not None and result.termination.type == "natural_end"
    log = await thread_log(store, "t-steer-race")
    assert texts(log, "assistant") == ["heard: slow", "heard: one more thing"]
    assert sum(type(e) is RunFinished for sc in log for e in sc.commit.events) == 1
    assert (await verify_run(store, handle.run_id, rt)).ok


@pytest.mark.asyncio
async def test_steer_is_refused_once_the_run_finished_and_is_idempotent_on_ids(store: Any) -> None:
    gate = Gate()
    rt = runtime(store, gate)
    async with asyncio.timeout(LIMIT):
        handle = await rt.start("steered", "hold on", thread_id="t-steer-ids")
        await gate.of(gate.started, "t-steer-ids").wait()
        msg = {"id": "m-once", "role": "user", "content": "once"}
        first = await rt.queue_messages(handle.run_id, [msg])
        again = await rt.queue_messages(handle.run_id, [msg])
        assert again.duplicate and again.seq == first.seq
        with pytest.raises(ValueError):
            await rt.queue_messages(handle.run_id, [{"role": "assistant", "content": "no"}])
        with pytest.raises(ValueError):
            await rt.queue_messages(handle.run_id, "x", mode="later")  # type: ignore[arg-type]
        gate.of(gate.released, "t-steer-ids").set()
        await handle.result()
        with pytest.raises(RunEnded):
            await rt.queue_messages(handle.run_id, "too late")
        assert (await rt.queue_messages(handle.run_id, [msg])).duplicate  # a retry still gets its answer
    log = await thread_log(store, "t-steer-ids")
    assert texts(log, "user").count("once") == 1


@pytest.mark.asyncio
async def test_steer_through_the_in_process_dispatcher(store: Any) -> None:
    """The dispatcher's `submit_inputs` with a queue mode, carried out by the runtime in this
    process: the answer is the run's (its id, the queueing commit's seq); a finished run is
    `run_finished`; decisions cannot be queued."""
    from agentlog.gateway.operations.dispatch import InvalidInput, RunAlreadyFinished
    from agentlog.projections.timeline import event_summary

    from tests.support.inprocess import InProcessDispatcher

    gate = Gate()
    rt = runtime(store, gate)
    dispatcher = InProcessDispatcher(rt)
    async with asyncio.timeout(LIMIT):
        handle = await rt.start("steered", "hold on", thread_id="t-steer-disp")
        await gate.of(gate.started, "t-steer-disp").wait()
        with pytest.raises(InvalidInput):
            await dispatcher.submit_inputs(handle.run_id, messages="x", mode="steer",
                                           decisions=[{"target_id": "c", "decision_id": "d", "action": "resume"}])
        accepted = await dispatcher.submit_inputs(handle.run_id, messages="later", mode="follow_up")
        assert (accepted.run_id, accepted.thread_id) == (handle.run_id, "t-steer-disp")
        gate.of(gate.released, "t-steer-disp").set()
        await handle.result()
        with pytest.raises(RunAlreadyFinished) as late:
            await dispatcher.submit_inputs(handle.run_id, messages="too late", mode="steer")
        assert late.value.code == "run_finished"
    log = await thread_log(store, "t-steer-disp")
    [queued] = [e for sc in log for e in sc.commit.events if type(e) is MessageQueued]
    assert next(sc.seq for sc in log if queued in sc.commit.events) == accepted.seq
    assert event_summary(queued).startswith("follow_up queued: user: later")
    assert texts(log, "assistant")[-1] == "heard: later"


@pytest.mark.asyncio
async def test_steer_with_a_large_image_is_stored_by_reference(store: Any) -> None:
    """A queued message's large binary parts go to the Object Store like an appended message's
    (the queueing commit would not fit in one NATS message otherwise); the run takes the whole
    image and the replay verifies."""
    import base64

    image = base64.b64encode(bytes(range(256)) * 6000).decode()  # 1.5 MB raw: over any inline limit
    gate = Gate()
    rt = runtime(store, gate)
    async with asyncio.timeout(LIMIT):
        handle = await rt.start("steered", "hold on", thread_id="t-steer-image")
        await gate.of(gate.started, "t-steer-image").wait()
        content = [{"type": "text", "text": "this one"}, {"type": "image", "media_type": "image/png", "data": image}]
        await rt.queue_messages(handle.run_id, [{"role": "user", "content": content}])
        gate.of(gate.released, "t-steer-image").set()
        await handle.result()
    log = await thread_log(store, "t-steer-image")
    taken = [e.message for sc in log for e in sc.commit.events
             if type(e) is MessageAppended and e.message.content == "this one"]
    assert len(taken) == 1 and taken[0].parts is not None and taken[0].parts[1].data == image
    assert texts(log, "assistant")[-1] == "heard: this one"
    assert (await verify_run(store, handle.run_id, rt)).ok
