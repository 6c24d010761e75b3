"""Human-in-the-loop scenarios on a real nats-server + JetStreamEventStore.

Each scenario (see `tests.support.hitl.SCENARIOS`) starts a run that suspends, then applies its
phases (decisions, cancel, continuation), each with a *freshly built* Runtime: nothing of the
suspended run is held in memory. Asserted: the exact commits/events, key fields, final views.

Cold resume: the same scenarios with every phase applied by a new Runtime in a subprocess
(new process, new NATS connection) must write exactly the log the in-process resume wrote.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections.fold import fold_commits
from agentlog.runtime import CallNotSuspended, InvalidDecision, RunNotFound, RunNotWaiting, UnknownCall

from tests.support import hitl as S
from tests.support.runtime import events_of, shape, store, thread_log  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[2]

START = ["ThreadCreated", "RunStarted", "MessageAppended"]
INFER = ["StepStarted", "MessageAppended", "InferenceCompleted"]
FINAL = ["StepStarted", "MessageAppended", "InferenceCompleted", "StepFinished", "RunFinished"]
ASK1 = [*INFER, "ToolCallGated", "ToolCallSuspended", "StepFinished", "RunSuspended"]
ASK2 = [*INFER, "ToolCallGated", "ToolCallSuspended", "ToolCallGated", "ToolCallSuspended", "StepFinished", "RunSuspended"]
PENDING = [[*INFER, "ToolCallStarted"], ["ToolCallSuspended", "StepFinished", "RunSuspended"]]
DECIDED = ["ToolCallDecided", "RunResumed", "ToolCallResuming"]
DONE = ["ToolCallCompleted", "MessageAppended"]

#: Exact commits of each scenario after all its phases.
EXPECTED: dict[str, list[list[str]]] = {
    "ask_approve": [START, ASK1, DECIDED, ["ToolCallGated", "ToolCallStarted"], DONE, FINAL],
    "ask_deny": [START, ASK1, DECIDED, ["ToolCallGated", *DONE], FINAL],
    "cancel_decision": [START, ASK1, [*DECIDED, *DONE], FINAL],
    "pending_replay": [START, *PENDING, DECIDED, ["ToolCallStarted"], DONE, FINAL],
    "pending_use_decision": [START, *PENDING, [*DECIDED, *DONE], FINAL],
    "pending_pass_decision": [START, *PENDING, DECIDED, ["ToolCallStarted"], DONE, FINAL],
    "two_sequential": [
        START, ASK1, DECIDED, ["ToolCallGated", "ToolCallStarted"],
        [*DONE, "ToolCallGated", "ToolCallSuspended", "RunSuspended"],  # b gated only once a is done
        DECIDED, ["ToolCallGated", "ToolCallStarted"], DONE, FINAL,
    ],
    "two_batch": [
        START, ASK2, ["ToolCallDecided"],  # first decision recorded; the run keeps waiting
        ["ToolCallDecided", "RunResumed", "ToolCallResuming", "ToolCallResuming"],
        ["ToolCallGated", "ToolCallStarted", "ToolCallGated", *DONE],  # b denied, a runs
        DONE, FINAL,
    ],
    "two_streaming": [
        START, ASK2, DECIDED, ["ToolCallGated", "ToolCallStarted"], [*DONE, "RunSuspended"],
        DECIDED, ["ToolCallGated", "ToolCallStarted"], DONE, FINAL,
    ],
    "cancel_waiting": [START, ASK2, ["RunCancelRequested", *DONE, *DONE, "RunFinished"]],
    "continuation": [
        START, ASK2, DECIDED, ["ToolCallGated", "ToolCallStarted"], [*DONE, "RunSuspended"],
        ["RunCancelRequested", *DONE, "RunFinished"],  # the parent closed: b cancelled
        ["RunStarted", "MessageAppended"], FINAL,
    ],
}

#: Final (termination, {call: (status, result)}) of run r1.
FINAL_CALLS: dict[str, tuple[str, dict[str, tuple[str, Any]]]] = {
    "ask_approve": ("natural_end", {"call_0_0": ("succeeded", "deployed prod")}),
    "ask_deny": ("natural_end", {"call_0_0": ("failed", None)}),
    "cancel_decision": ("natural_end", {"call_0_0": ("cancelled", {"error": "cancelled by a human: changed my mind"})}),
    "pending_replay": ("natural_end", {"call_0_0": ("succeeded", "paid 5")}),
    "pending_use_decision": ("natural_end", {"call_0_0": ("succeeded", {"color": "blue"})}),
    "pending_pass_decision": ("natural_end", {"call_0_0": ("succeeded", {"doc": "nda", "signed_by": "ann", "decision": "d1"})}),
    "two_sequential": ("natural_end", {"call_0_0": ("succeeded", "deployed a"), "call_0_1": ("succeeded", "deployed b")}),
    "two_batch": ("natural_end", {"call_0_0": ("succeeded", "deployed a"), "call_0_1": ("failed", None)}),
    "two_streaming": ("natural_end", {"call_0_0": ("succeeded", "deployed a"), "call_0_1": ("succeeded", "deployed b")}),
    "cancel_waiting": ("cancelled", {"call_0_0": ("cancelled", None), "call_0_1": ("cancelled", None)}),
    "continuation": ("cancelled", {"call_0_0": ("succeeded", "deployed a"), "call_0_1": ("cancelled", None)}),
}


async def start_waiting(store: Any, name: str) -> None:
    async with asyncio.timeout(20):
        result = await S.start(S.build(store, name, 0), name)
    assert result.status == "waiting" and result.termination is None
    assert result.run.status == "waiting"


async def resume_in_process(store: Any, name: str) -> list[dict[str, Any]]:
    outs = []
    for i in range(1, len(S.SCENARIOS[name].phases) + 1):
        async with asyncio.timeout(20):
            outs.append(await S.apply_phase(S.build(store, name, i), name, i))
    return outs


async def resume_in_subprocess(url: str, name: str) -> list[dict[str, Any]]:
    outs = []
    for i in range(1, len(S.SCENARIOS[name].phases) + 1):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.hitl", url, name, str(i), cwd=str(REPO),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.communicate()
            raise
        assert proc.returncode == 0, err.decode()[-3000:]
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return outs


def check(name: str, log: list[StoredCommit]) -> None:
    """The scenario's exact commits and final views (projections' fold of the log)."""
    assert shape(log) == EXPECTED[name]
    views = fold_commits(log)
    run = views.runs[S.RUN]
    termination, calls = FINAL_CALLS[name]
    assert run.status == "done" and run.termination.type == termination
    for call_id, (status, result) in calls.items():
        assert run.calls[call_id].status == status, call_id
        if result is not None:
            assert run.calls[call_id].result == result, call_id
    thread = views.threads[S.THREAD]
    assert thread.active_run_id is None
    # every tool call the model made got exactly one answer in the conversation
    msgs = [e.message for e in events_of(log, "MessageAppended")]
    asked = [c.id for m in msgs if m.role == "assistant" for c in m.tool_calls or ()]
    answered = [m.tool_call_id for m in msgs if m.role == "tool"]
    assert sorted(asked) == sorted(answered)
    assert thread.message_count == len(msgs)


@pytest.mark.parametrize("name", list(S.SCENARIOS))
async def test_scenario(store: Any, name: str) -> None:
    await start_waiting(store, name)
    await resume_in_process(store, name)
    log = await thread_log(store, S.THREAD)
    check(name, log)


async def test_ask_approve_details(store: Any) -> None:
    await start_waiting(store, "ask_approve")
    log = await thread_log(store, S.THREAD)
    (susp,) = events_of(log, "ToolCallSuspended")
    assert susp.ticket.resume_mode == "replay_tool_call" and susp.ticket.parameters == {
        "tool": "deploy", "arguments": {"env": "prod"},
    }
    assert susp.ticket.response_schema["required"] == ["approved"]
    (out,) = await resume_in_process(store, "ask_approve")
    assert out["resumed"] == ["call_0_0"] and out["status"] == "done" and out["duplicate"] is False
    log = await thread_log(store, S.THREAD)
    assert out["seq"] == log[2].seq
    gated = [(g.verdict, g.rule) for g in events_of(log, "ToolCallGated")]
    assert gated == [("ask", "ask:deploy"), ("allow", "ask:deploy")]  # the replay passes the same rule
    (decided,) = events_of(log, "ToolCallDecided")
    assert decided.decision.result == {"approved": True} and decided.decision.updated_at == 1_700_000_000_000
    assert events_of(log, "ToolCallResuming")[0].mode == "replay_tool_call"
    assert events_of(log, "RunResumed")[0].call_ids == ["call_0_0"]
    run = fold_commits(log).runs[S.RUN]
    assert run.calls["call_0_0"].decision.decision_id == "d1"


async def test_ask_deny_tells_the_model(store: Any) -> None:
    await start_waiting(store, "ask_deny")
    await resume_in_process(store, "ask_deny")
    log = await thread_log(store, S.THREAD)
    (done,) = events_of(log, "ToolCallCompleted")
    assert done.outcome == "failed"
    assert done.result["error"] == "permission denied by a human: tool 'deploy' was not approved (not on a friday)"
    assert [g.verdict for g in events_of(log, "ToolCallGated")] == ["ask", "deny"]
    assert not events_of(log, "ToolCallStarted")  # never ran


async def test_batch_first_decision_only_recorded(store: Any) -> None:
    await start_waiting(store, "two_batch")
    rt = S.build(store, "two_batch", 1)
    async with asyncio.timeout(20):
        res = await rt.decide(S.RUN, [S.d("call_0_0", "d1", result=S.YES)])
        assert res.resumed == [] and (await res.handle.result()).status == "waiting"
    run = await rt.run_view(S.RUN)
    assert run.status == "waiting"
    assert run.calls["call_0_0"].status == "suspended" and run.calls["call_0_0"].decision.decision_id == "d1"
    # the same call cannot take a second, different decision while it waits for its batch
    version = await store.last_seq()
    with pytest.raises(CallNotSuspended):
        await rt.decide(S.RUN, [S.d("call_0_0", "d9", result=S.NO)])
    assert await store.last_seq() == version


async def test_decision_errors_leave_the_log_unchanged(store: Any) -> None:
    await start_waiting(store, "two_streaming")
    rt = S.build(store, "two_streaming", 1)
    version = await store.last_seq()

    async def rejected(exc: type[Exception], decisions: Any, run_id: str = S.RUN) -> Exception:
        with pytest.raises(exc) as info:
            await rt.decide(run_id, decisions)
        assert await store.last_seq() == version
        return info.value

    assert (await rejected(UnknownCall, [S.d("nope", "d1")])).code == "unknown_call"
    for bad in (
        [{"target_id": "call_0_0", "action": "resume"}],                      # no decision_id
        [S.d("call_0_0", "d1", "approve")],                                   # bad action
        [S.d("call 0", "d1")],                                                # not an id
        [S.d("call_0_0", "d1", bogus=1)],                                     # unknown field
        ["yes"],                                                              # not a decision
        [S.d("call_0_0", "d1"), S.d("call_0_1", "d1")],                      # one id, two decisions
        [],
    ):
        assert (await rejected(InvalidDecision, bad)).code == "invalid_decision"
    with pytest.raises(RunNotFound):
        await rt.decide("r404", [S.d("call_0_0", "d1")])
    # a good decision, then its duplicate: no effect, the original seq
    async with asyncio.timeout(20):
        first = await rt.decide(S.RUN, [S.d("call_0_0", "d1", result=S.YES)])
        assert (await first.handle.result()).status == "waiting"
    after_first = await store.last_seq()
    dup = await rt.decide(S.RUN, [S.d("call_0_0", "d1", result=S.YES)])
    assert dup.duplicate and dup.seq == first.seq and dup.handle is None
    assert await store.last_seq() == after_first
    version = after_first
    # call_0_0 has run: a new decision for it is rejected
    assert (await rejected(CallNotSuspended, [S.d("call_0_0", "d7")])).code == "call_not_suspended"
    async with asyncio.timeout(20):
        last = await rt.decide(S.RUN, [S.d("call_0_1", "d2", result=S.YES)])
        assert (await last.handle.result()).status == "done"
    version = await store.last_seq()
    # the run is finished: not waiting
    assert (await rejected(RunNotWaiting, [S.d("call_0_1", "d3")])).code == "run_not_waiting"
    # ... but a retried (duplicate) decision still answers with its original seq
    assert (await rt.decide(S.RUN, [S.d("call_0_1", "d2", result=S.YES)])).seq == last.seq
    assert await store.last_seq() == version


async def test_cancel_while_waiting_then_cancel_again(store: Any) -> None:
    await start_waiting(store, "cancel_waiting")
    rt = S.build(store, "cancel_waiting", 1)
    assert await rt.cancel(S.RUN, reason="user left") is True
    log = await thread_log(store, S.THREAD)
    check("cancel_waiting", log)
    msgs = [e.message.content for e in events_of(log, "MessageAppended") if e.message.role == "tool"]
    assert msgs == ["Error: the call was cancelled: the run was cancelled while it waited for a decision"] * 2
    assert await rt.cancel(S.RUN) is False
    assert len(await thread_log(store, S.THREAD)) == len(log)


async def test_continuation_carries_decisions(store: Any) -> None:
    await start_waiting(store, "continuation")
    (out,) = await resume_in_process(store, "continuation")
    log = await thread_log(store, S.THREAD)
    check("continuation", log)
    views = fold_commits(log)
    child = views.runs["r2"]
    assert child.parent_run_id == S.RUN and child.status == "done" and out == {"status": "done", "run_id": "r2"}
    assert views.runs[S.RUN].termination.detail == "superseded by a continuation run"
    assert views.threads[S.THREAD].run_ids == [S.RUN, "r2"]


def _normalised(log: list[StoredCommit]) -> list[bytes]:
    """Commits as bytes. Nothing needs normalising: the decision's wall clock comes from the
    phase's seeded entropy, identical in both processes."""
    return [msgspec.json.encode(sc) for sc in log]


@pytest.mark.parametrize("name", list(S.SCENARIOS))
async def test_cold_resume_in_another_process_matches_in_process(
    nats_server: EmbeddedNatsServer, tmp_path: Path, name: str
) -> None:
    local = await JetStreamEventStore.connect(nats_server.url)
    try:
        await start_waiting(local, name)
        local_outs = await resume_in_process(local, name)
        local_log = await thread_log(local, S.THREAD)
    finally:
        await local.close()
    other = EmbeddedNatsServer(tmp_path / "nats-cold")
    other.start()
    try:
        remote = await JetStreamEventStore.connect(other.url)
        try:
            await start_waiting(remote, name)
            remote_outs = await resume_in_subprocess(other.url, name)
            remote_log = await thread_log(remote, S.THREAD)
        finally:
            await remote.close()
    finally:
        other.stop()
    check(name, remote_log)
    assert remote_outs == local_outs
    assert _normalised(remote_log) == _normalised(local_log)
    assert [m for m in fold_commits(remote_log)] == [m for m in fold_commits(local_log)]
