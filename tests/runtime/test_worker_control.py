"""A worker's live control messages (`Worker._on_control`, pure: a stand-in runtime): each is
applied in a task of its own, so a run whose message is slow to apply (a decision appends a
commit) holds up no other run's, while the messages of one run are applied in the order they
came."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from agentlog.runtime.inputs.commands import Cancel, Command, encode_command
from agentlog.runtime.workers.worker import Worker

pytestmark = pytest.mark.asyncio


class _Store:
    nc = cast(Any, type("NC", (), {"jetstream": lambda self, **_: None})())


class _Runtime:
    def __init__(self) -> None:
        self.applied: list[tuple[str, str | None]] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def control(self, command: Command) -> None:
        assert isinstance(command, Cancel)
        gate = self.gates.get(command.run_id)
        if gate is not None:
            await gate.wait()
        self.applied.append((command.run_id, command.reason))


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data


def cancel(run_id: str, reason: str) -> _Msg:
    return _Msg(encode_command(Cancel(thread_id=f"t-{run_id}", run_id=run_id, reason=reason)))


async def test_a_slow_run_holds_up_no_other_run_and_each_run_keeps_its_order() -> None:
    runtime = _Runtime()
    worker = Worker(cast(Any, _Store()), runtime=cast(Any, runtime))
    runtime.gates["slow"] = asyncio.Event()
    async with asyncio.timeout(10):
        await worker._on_control(cancel("slow", "1"))
        await worker._on_control(cancel("slow", "2"))
        await worker._on_control(cancel("fast", "1"))
        await worker._on_control(_Msg(b"not a command"))  # dropped
        await asyncio.wait(list(worker._controls.values()), return_when=asyncio.FIRST_COMPLETED)
        while "fast" in worker._controls:
            await asyncio.wait((worker._controls["fast"],))
        assert runtime.applied == [("fast", "1")]
        runtime.gates["slow"].set()
        while worker._controls:
            await asyncio.wait(list(worker._controls.values()))
    assert runtime.applied == [("fast", "1"), ("slow", "1"), ("slow", "2")]
