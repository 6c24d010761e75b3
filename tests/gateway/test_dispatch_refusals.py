"""The dispatcher refuses bad input to a run (queued messages, a continuation, decisions, a cancel)
with the typed error the runtime would raise, in one order of checks, and writes nothing: the
Python API (the adapters and the A2A server call it directly, without the HTTP body's checks)
answers as the HTTP API does. A caller the access check refuses learns nothing about the run: the
refusal comes before any other answer about its state.

Against a real nats-server, on the `serve` assembly in this process (tests/support/input.py): its
own `QueueDispatcher`, what `agentlog serve` and `agentlog gateway` answer with."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunFinished
from agentlog.gateway.operations.dispatch import Dispatcher, QueueDispatcher
from agentlog.runtime.errors import RunNotFound

from tests.support.input import TIMEOUT, Stack, codes_of, commands_queued, open_stack, waiting_run

UNKNOWN_RUN = "r" * 26


class Refuse:
    """An access check that refuses every caller (as a tenant's check of another's run does),
    counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, _thread_id: str, _seq: int) -> None:
        self.calls += 1
        raise RunNotFound("unknown run")


async def _finished(s: Stack, thread_id: str) -> None:
    async with contextlib.aclosing(s.store.follow(thread_id, 0)) as commits:
        async for sc in commits:
            if any(type(e) is RunFinished for e in sc.commit.events):
                return


async def test_the_dispatcher_refuses_bad_input_to_a_run_with_typed_errors_and_writes_nothing(
        nats_server: EmbeddedNatsServer) -> None:
    async with asyncio.timeout(TIMEOUT * 3), open_stack(nats_server.url, "serve") as s:
        assert s.front is not None and s.front.dispatcher is not None
        d: Dispatcher = s.front.dispatcher
        assert isinstance(d, QueueDispatcher)
        t, r, c = await waiting_run(s)
        refuse = Refuse()
        ok = {"target_id": c, "decision_id": "d-ok", "action": "resume"}
        steer = {"role": "user", "content": "look at staging too"}
        cases: list[tuple[str, Callable[[], Awaitable[Any]], str]] = [
            # queued messages
            ("queued with decisions", lambda: d.submit_inputs(r, messages=[steer], decisions=[ok], mode="steer"),
             "invalid_input"),
            ("queued without messages", lambda: d.submit_inputs(r, mode="follow_up"), "invalid_input"),
            ("queued assistant message", lambda: d.submit_inputs(
                r, messages=[{"role": "assistant", "content": "x"}], mode="steer"), "invalid_input"),
            ("queued lone surrogate", lambda: d.submit_inputs(r, messages="a\ud800", mode="steer"), "invalid_input"),
            ("queued to a malformed run id", lambda: d.submit_inputs("a b", messages=[42], mode="steer"),
             "invalid_id"),
            ("queued to an unknown run", lambda: d.submit_inputs(UNKNOWN_RUN, messages=[steer], mode="steer"),
             "run_not_found"),
            ("queued, access refused", lambda: d.submit_inputs(r, messages=[steer], mode="steer", access=refuse),
             "run_not_found"),
            # a continuation run
            ("continuation with a bad role", lambda: d.submit_inputs(r, messages=[{"role": "robot", "content": "x"}]),
             "invalid_input"),
            ("interrupting continuation with a bad message", lambda: d.submit_inputs(
                r, messages=[{"role": "robot", "content": "x"}], mode="interrupt"), "invalid_input"),
            ("continuation of an unknown run", lambda: d.submit_inputs(UNKNOWN_RUN, messages="go on"),
             "run_not_found"),
            ("continuation to a malformed run id", lambda: d.submit_inputs("a b", messages="go on"), "invalid_id"),
            ("continuation, access refused", lambda: d.submit_inputs(r, messages="go on", mode="interrupt",
                                                                     access=refuse), "run_not_found"),
            # decisions
            ("nothing given", lambda: d.submit_inputs(r), "invalid_input"),
            ("decision for an unknown call", lambda: d.submit_inputs(r, decisions=[{**ok, "target_id": "c-none"}]),
             "unknown_call"),
            ("malformed decision", lambda: d.submit_inputs(r, decisions=[{"target_id": c, "decision_id": "d-2"}]),
             "invalid_decision"),
            ("decision for an unknown run", lambda: d.submit_inputs(UNKNOWN_RUN, decisions=[ok]), "run_not_found"),
            ("decision to a malformed run id", lambda: d.submit_inputs("a b", decisions=[ok]), "invalid_id"),
            ("decision for an unknown call, access refused", lambda: d.submit_inputs(
                r, decisions=[{**ok, "target_id": "c-none"}], access=refuse), "run_not_found"),
            ("cancel of an unknown run", lambda: d.cancel(UNKNOWN_RUN), "run_not_found"),
        ]
        head, queued = await s.store.last_seq(), await commands_queued(s)
        got = await codes_of([call for _name, call, _code in cases])
        wrong = [f"{name}: {code!r}, expected {want!r}" for (name, _call, want), code in zip(cases, got, strict=True)
                 if code != want]
        assert not wrong, "\n".join(wrong)
        assert refuse.calls == 3
        assert await s.store.last_seq() == head, "a refused input wrote to the log"
        assert await commands_queued(s) == queued, "a refused input queued a command"

        # the same run once it has finished
        await d.cancel(r)
        await _finished(s, t)
        head, queued = await s.store.last_seq(), await commands_queued(s)
        refuse = Refuse()
        finished = [
            ("queued to a finished run", lambda: d.submit_inputs(r, messages=[steer], mode="steer"), "run_finished"),
            ("queued to a finished run, access refused",
             lambda: d.submit_inputs(r, messages=[steer], mode="steer", access=refuse), "run_not_found"),
            ("decision for a finished run", lambda: d.submit_inputs(r, decisions=[ok]), "run_not_waiting"),
            ("decision for a finished run, access refused",
             lambda: d.submit_inputs(r, decisions=[ok], access=refuse), "run_not_found"),
            ("cancel of a finished run", lambda: d.cancel(r), "run_finished"),
        ]
        got = await codes_of([call for _name, call, _code in finished])
        wrong = [f"{name}: {code!r}, expected {want!r}"
                 for (name, _call, want), code in zip(finished, got, strict=True) if code != want]
        assert not wrong, "\n".join(wrong)
        assert refuse.calls == 2
        assert await s.store.last_seq() == head and await commands_queued(s) == queued
