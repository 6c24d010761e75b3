"""One run's stream as the adapters' translators want it: committed events from the log merged
with live deltas from core NATS, in an order the translators can trust.

Why both, and why this order:
* The log is the truth (`store.follow` from a seq read BEFORE the run was started or decided, so
  no commit can slip by); it is also what makes the same code work whether the run executes in
  this process or on a worker elsewhere (`agentlog.api.dispatch`).
* Live deltas (`agentlog.live.<thread>.<run>`, see `agentlog.runtime.live`) are best effort and must be
  subscribed BEFORE the run starts, or the first tokens are lost. They travel a different path
  than the commit, so one can arrive after the commit that already holds its content. A late
  delta is dropped here: text/tool-call deltas of a step whose `StepStarted` is committed (the
  loop commits `StepStarted` with the inference result), progress of a call already completed.
  The translators then synthesise what a dropped delta would have said from the commit.
* The source ends at the run's next stop: `RunFinished` or `RunSuspended` after `after`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from agentlog.log.events import RunFinished, RunSuspended, StepStarted, StoredCommit, ToolCallCompleted
from agentlog.log.jetstream import flush_subscriptions
from agentlog.log.subjects import live_subject
from agentlog.runtime import CommittedEvent

_END = object()
#: Live items buffered per stream; beyond it live items are dropped (the log still has them).
MAX_LIVE = 10_000


class RunSource:
    """Merged committed + live items of one run. Use: `await src.subscribe()` (before starting
    the run), start it, `src.follow(after_seq)`, then `async for item in src.items()`; always
    `await src.close()` (unsubscribes, stops the log follower)."""

    def __init__(self, store: Any, nc: Any, thread_id: str, run_id: str, *, live: bool = True) -> None:
        self.store = store
        self.nc = nc
        self.thread_id = thread_id
        self.run_id = run_id
        self.live = live and nc is not None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._live_count = 0
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None

    async def subscribe(self) -> None:
        if not self.live or self._sub is not None:
            return

        async def on_msg(msg: Any) -> None:
            try:
                payload = json.loads(msg.data)
            except (ValueError, UnicodeDecodeError):
                return
            if isinstance(payload, dict) and self._live_count < MAX_LIVE:
                self._live_count += 1
                self._queue.put_nowait(payload)

        self._sub = await self.nc.subscribe(live_subject(self.thread_id, self.run_id), cb=on_msg)
        # the subscription must be on the server before the run publishes anything
        with contextlib.suppress(Exception):
            await flush_subscriptions(self.nc)

    def follow(self, after: int) -> None:
        """Start reading the run's commits after seq `after` (history first, then live)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump(after), name="adapter-follow")

    async def _pump(self, after: int) -> None:
        follower = self.store.follow(self.thread_id, after=after)
        try:
            async for sc in follower:
                if self._emit(sc):
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which reports it
            self._queue.put_nowait(exc)
        finally:
            with contextlib.suppress(Exception):
                await follower.aclose()

    def _emit(self, sc: StoredCommit) -> bool:
        if sc.commit.run_id != self.run_id:
            return False
        for position, event in sc.positioned():
            self._queue.put_nowait(CommittedEvent(position, event, sc.commit.ts))
            if type(event) in (RunFinished, RunSuspended):
                self._queue.put_nowait(_END)
                return True
        return False

    async def items(self) -> AsyncIterator[Any]:
        """Items in arrival order, late live deltas dropped; ends after the run's next stop.
        Raises what the log follower failed with (e.g. `StoreUnavailable`)."""
        committed_step = 0
        completed: set[str] = set()
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, dict):
                kind = item.get("type")
                step = item.get("step")
                if kind in ("text_delta", "tool_call_delta") and isinstance(step, int) and step <= committed_step:
                    continue
                if kind == "tool_progress" and item.get("call_id") in completed:
                    continue
                yield item
                continue
            ev = item.event
            if type(ev) is StepStarted:
                committed_step = max(committed_step, ev.step)
            elif type(ev) is ToolCallCompleted:
                completed.add(ev.call_id)
            yield item

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


__all__ = ["MAX_LIVE", "RunSource"]
