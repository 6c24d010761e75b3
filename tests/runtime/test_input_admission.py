"""A run start is checked in full BEFORE its first write, with one shared check
(`agentlog.runtime.inputs.admission.check_request`) that serve mode (`Runtime.start`) and gateway mode
(`QueueDispatcher`) both call, so both answer the same typed error and neither leaves anything
behind: no orphan `ThreadCreated`, no queued command.

In gateway mode `ThreadCreated` (for `resource_id`) is the first write, so a start whose command
cannot be encoded (`messages="\\ud800"`) is refused before it, not a 500 plus an orphan thread; and
a start whose commit is over the server's max payload is a 413 in both modes, never queued for a
worker that cannot carry it out (retried forever while the client gets a 503).

The HTTP checks run against what users run (`protocol_deployment`: `agentlog serve`, and `agentlog
gateway` + `agentlog worker`); the ones that call the dispatcher's Python API run on the same
server assembly in this process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.runtime import RunRequest

from tests.support.input import AGENT, TIMEOUT, codes_of, commands_queued, open_deployed, open_stack
from tests.support.topology import Deployment


def _bad_starts(max_payload: int) -> list[tuple[str, Any, dict[str, Any], str]]:
    """(name, messages, other start kwargs, expected code)."""
    return [
        ("lone surrogate", "\ud800", {}, "invalid_input"),
        ("lone surrogate in a message object", [{"role": "user", "content": "a\udc00b"}], {}, "invalid_input"),
        ("bad role", [{"role": "robot", "content": "x"}], {}, "invalid_input"),
        ("bad visibility", [{"role": "user", "content": "x", "visibility": "nope"}], {}, "invalid_input"),
        ("bad message id", [{"role": "user", "content": "x", "id": "a b"}], {}, "invalid_id"),
        ("not a message", [42], {}, "invalid_input"),
        ("decisions without a parent", "x", {"decisions": [{"target_id": "c", "decision_id": "d",
                                                             "action": "resume"}]}, "invalid_input"),
        ("start commit over max payload", "x" * (max_payload - 100), {}, "commit_too_large"),
    ]


@pytest.mark.parametrize("mode", ["serve", "gateway"])
async def test_bad_starts_get_the_same_typed_error_in_both_modes_and_write_nothing(
        mode: str, nats_server: EmbeddedNatsServer) -> None:
    async with asyncio.timeout(TIMEOUT * 2), open_stack(nats_server.url, mode) as s:
        head, queued = await s.store.last_seq(), await commands_queued(s)
        wrong = []
        for name, messages, kwargs, code in _bad_starts(s.nc.max_payload):
            for resource_id in (None, "tenant/1"):
                try:
                    await s.front.dispatcher.start_run(RunRequest(
                        agent_id=AGENT, messages=messages, thread_id="t-new", resource_id=resource_id, **kwargs))
                    got = "accepted"
                except Exception as exc:  # noqa: BLE001 - the code is what is checked
                    got = getattr(exc, "code", type(exc).__name__)
                if got != code:
                    wrong.append(f"{name} (resource_id={resource_id}): {got}, expected {code}")
        assert not wrong, "\n".join(wrong)
        assert await s.store.last_seq() == head  # no orphan ThreadCreated, nothing at all
        assert await commands_queued(s) == queued  # and nothing queued for a worker


async def test_start_over_max_payload_is_413_over_http(protocol_deployment: Deployment) -> None:
    async with asyncio.timeout(TIMEOUT * 2), open_deployed(protocol_deployment) as s:
        head, queued = await s.store.last_seq(), await commands_queued(s)
        text = "x" * (s.nc.max_payload - 200)  # the body fits max_body, the start commit does not
        for extra in ({}, {"resource_id": "tenant/1"}):
            async with s.http.post("/v1/runs", json={"agent_id": s.agent, "messages": text, **extra}) as r:
                assert r.status == 413, await r.text()
                assert (await r.json())["code"] == "commit_too_large"
        assert await s.store.last_seq() == head
        assert await commands_queued(s) == queued


@pytest.mark.parametrize("mode", ["serve", "gateway"])
async def test_unstorable_decisions_and_reasons_are_the_same_400_in_both_modes(
        mode: str, nats_server: EmbeddedNatsServer) -> None:
    """Python callers of the dispatcher (not JSON, so no decoder in front): a lone surrogate in
    a decision result or a cancel reason is the same typed `invalid_input` in both modes, found
    before it reaches the store (serve) or the command encoder (gateway), where it would be a
    UnicodeEncodeError (a 500)."""
    from tests.support.input import waiting_run

    async with asyncio.timeout(TIMEOUT * 2), open_stack(nats_server.url, mode) as s:
        _t, r, c = await waiting_run(s)
        head, queued = await s.store.last_seq(), await commands_queued(s)
        bad = {"target_id": c, "decision_id": "d-1", "action": "resume", "result": {"note": "a\ud800"}}
        calls = [
            lambda: s.front.dispatcher.submit_inputs(r, decisions=[bad]),
            lambda: s.front.dispatcher.submit_inputs(r, decisions=[bad], messages="and more"),
            lambda: s.front.dispatcher.start_run(RunRequest(agent_id=AGENT, messages="more", parent_run_id=r,
                                                            decisions=[bad])),
            lambda: s.front.dispatcher.cancel(r, reason="\udc00"),
        ]
        assert await codes_of(calls) == ["invalid_input"] * len(calls)
        assert await s.store.last_seq() == head and await commands_queued(s) == queued


async def test_a_deleted_thread_is_404_for_a_new_run_and_a_continuation(protocol_deployment: Deployment) -> None:
    """One start-admission rule (`agentlog.runtime.inputs.admission.admit_thread`) answers a
    deleted thread with 404 `thread_not_found` however the run would start, and the waiting run
    on it is left as it was: a continuation is refused before it cancels its parent."""
    from tests.support.input import waiting_run

    async with asyncio.timeout(TIMEOUT * 2), open_deployed(protocol_deployment) as s:
        t, r, _c = await waiting_run(s)
        async with s.http.delete(f"/v1/threads/{t}") as d:
            assert d.status == 200, await d.text()
        head, queued = await s.store.last_seq(), await commands_queued(s)
        for path, body in (("/v1/runs", {"agent_id": s.agent, "messages": "again", "thread_id": t}),
                           ("/v1/runs", {"agent_id": s.agent, "messages": "go on", "parent_run_id": r}),
                           (f"/v1/runs/{r}/inputs", {"messages": "go on"})):
            async with s.http.post(path, json=body) as resp:
                assert resp.status == 404, (path, body, await resp.text())
                assert (await resp.json())["code"] == "thread_not_found"
        assert await s.store.last_seq() == head and await commands_queued(s) == queued
