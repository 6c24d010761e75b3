"""A counterfactual request is safe to retry with the same `new_thread_id`
(`agentlog.gateway.operations.branches`): a branch cut short (NATS away between two of its
commits) is finished by the same request again, a request that succeeded answers the same
branch again, and another request for that thread id is a 409. Over the NATS micro service of
the in-process gateway, on the test's own nats-server, whose store fails one append of the
branch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.events import RunStarted, ThreadCreated

from tests.gateway.test_nats_service import call, nats_stack, until, waiting_call
from tests.support.http_stack import TIMEOUT

pytestmark = pytest.mark.asyncio


async def test_a_branch_cut_short_is_finished_by_the_same_request_again(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), nats_stack(nats_server) as s:
        _, started = await call(s, "runs.start", {"agent_id": "approver", "messages": "go"})
        call_id = waiting_call(await until(s, started["run_id"], {"waiting"}))
        approve = {"target_id": call_id, "decision_id": "d1", "action": "resume", "result": {"approved": True}}
        await call(s, "runs.inputs", {"run_id": started["run_id"], "decisions": [approve]})
        await until(s, started["run_id"], {"done"})

        append, cut = s.store.append, []

        async def cut_short(commit: Any, expected_version: int | None) -> Any:
            if commit.thread_id == "branch-1" and expected_version and not cut:
                cut.append(commit.commit_id)  # the second commit of the branch: NATS goes away
                raise StoreUnavailable("nats-server went away")
            return await append(commit, expected_version)

        s.store.append = cut_short  # type: ignore[method-assign]
        request = {"run_id": started["run_id"], "at": {"decision": call_id}, "new_thread_id": "branch-1",
                   "decision": {"action": "resume", "result": {"approved": False}}}
        status, failed = await call(s, "runs.counterfactual", request)
        assert (status, failed["code"]) == (503, "store_unavailable"), failed
        assert len([sc async for sc in s.store.read_thread("branch-1")]) == 1  # cut short after its first

        status, branch = await call(s, "runs.counterfactual", request)
        assert status == 200, branch
        assert branch["thread_id"] == "branch-1" and branch["forked_from"]["run_id"] == started["run_id"]
        done = await until(s, branch["run_id"], {"done"})
        assert done["calls"][call_id]["status"] != "completed"  # denied there: the tool never ran
        commits = [sc.commit async for sc in s.store.read_thread("branch-1")]
        assert len({c.commit_id for c in commits}) == len(commits)
        events = [ev for c in commits for ev in c.events]
        assert sum(isinstance(ev, ThreadCreated) for ev in events) == 1
        assert sum(isinstance(ev, RunStarted) for ev in events) == 1

        status, again = await call(s, "runs.counterfactual", request)  # a retry of one that succeeded
        assert (status, again) == (200, branch)
        assert [sc.commit async for sc in s.store.read_thread("branch-1")] == commits

        other = {**request, "decision": {"action": "resume", "result": {"approved": False}, "reason": "another"}}
        status, refused = await call(s, "runs.counterfactual", other)
        assert (status, refused["code"]) == (409, "thread_exists"), refused
