"""Live, unpersisted output of a run: token deltas and tool progress on core NATS.

Subject `agentlog.live.<thread>.<run>` (`agentlog.eventlog.subjects.live_subject`). Nothing here is a source
of truth: a listener that misses a delta still gets the finished message from the log. So
`publish` is synchronous and fire-and-forget, and the loop skips building payloads entirely when
the sink is not `enabled`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgspec
from nats.aio.client import Client as NATS

from agentlog.eventlog.subjects import live_subject

_encode = msgspec.json.Encoder().encode



@runtime_checkable
class LiveSink(Protocol):
    #: False means nobody can listen: the loop does not even build the payloads.
    enabled: bool

    def publish(self, thread_id: str, run_id: str, payload: dict[str, Any]) -> None:
        """Send one live item (`{"type": "text_delta" | "tool_call_delta" | "tool_progress", ...}`).
        Deltas carry `seq`, the thread seq their inference followed: a listener that merges them
        with the log (`agentlog.gateway.adapters.source.Merge`) places them after that commit."""
        ...


class NullLiveSink:
    enabled = False

    def publish(self, thread_id: str, run_id: str, payload: dict[str, Any]) -> None:
        pass


class MemoryLiveSink:
    """Keeps every item (for tests); `on_publish` is called with each, if given."""

    enabled = True

    def __init__(self, on_publish: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self._on_publish = on_publish

    def publish(self, thread_id: str, run_id: str, payload: dict[str, Any]) -> None:
        subject = live_subject(thread_id, run_id)
        self.items.append((subject, payload))
        if self._on_publish is not None:
            self._on_publish(subject, payload)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [p for _, p in self.items if p.get("type") == kind]


class NatsLiveSink:
    """Publishes on core NATS through a queue drained by one task, so items stay in order and the
    loop never awaits the network. Use as `async with NatsLiveSink(nc) as live:` (or start/close)."""

    enabled = True

    def __init__(self, nc: NATS, *, max_queue: int = 10_000) -> None:
        self._nc = nc
        self._queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(max_queue)
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.failed = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def close(self) -> None:
        if self._task is not None:
            await self._queue.put(None)
            await self._task
            self._task = None

    async def __aenter__(self) -> NatsLiveSink:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def publish(self, thread_id: str, run_id: str, payload: dict[str, Any]) -> None:
        if self._task is None:
            self.start()
        try:
            self._queue.put_nowait((live_subject(thread_id, run_id), _encode(payload)))
        except asyncio.QueueFull:
            self.dropped += 1  # live data is best effort: a slow link must not stall the run

    async def _drain(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                try:
                    await self._nc.flush()
                except Exception:  # noqa: BLE001
                    pass
                return
            try:
                await self._nc.publish(item[0], item[1])
            except Exception:  # noqa: BLE001 - never let live output break a run
                self.failed += 1
