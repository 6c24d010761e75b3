"""A model's stream is closed by whoever reads it, as soon as it has the final response: the
run's inference, `complete` and the summarizer each end the stream in their own task (its
`finally` runs there, before they go on), not leave it to the garbage collector, which asyncio
closes later in a task of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, Runtime
from agentlog.runtime.models.base import (
    ModelChunk,
    ModelDone,
    ModelRequest,
    ModelResponse,
    TextDelta,
    complete,
)

pytestmark = pytest.mark.asyncio


class ClosingWatcher:
    """A model whose stream records, when it is closed, whether that happened in the task that
    read it and before the reader went on."""

    name = "watcher"

    def __init__(self) -> None:
        self.closed: list[bool] = []  # per stream: closed in the reader's task

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        reader = asyncio.current_task()
        try:
            yield TextDelta(text="hi")
            yield ModelDone(ModelResponse(model=request.model, text="hi"))
            yield TextDelta(text="never read")
        finally:
            self.closed.append(asyncio.current_task() is reader)


async def test_a_runs_inference_closes_the_stream_in_its_own_task() -> None:
    model = ClosingWatcher()
    runtime = Runtime(MemoryEventStore(), agents=[AgentSpec(id="a", model="watcher")], models={"watcher": model})
    async with asyncio.timeout(10):
        result = await runtime.run("a", "hello")
    assert result.status == "done"
    assert model.closed == [True]


async def test_complete_closes_the_stream_before_it_returns() -> None:
    model = ClosingWatcher()
    response = await complete(model, ModelRequest(model="watcher", messages=[]))
    assert response.text == "hi"
    assert model.closed == [True]


async def test_a_stream_without_aclose_is_read_as_before() -> None:
    class Plain:
        def __init__(self, chunks: list[Any]) -> None:
            self.chunks = iter(chunks)

        def __aiter__(self) -> Plain:
            return self

        async def __anext__(self) -> Any:
            try:
                return next(self.chunks)
            except StopIteration:
                raise StopAsyncIteration from None

    class PlainModel:
        name = "plain"

        def stream(self, request: ModelRequest) -> Any:
            return Plain([TextDelta(text="x"), ModelDone(ModelResponse(model="plain", text="x"))])

    assert (await complete(PlainModel(), ModelRequest(model="plain", messages=[]))).text == "x"
