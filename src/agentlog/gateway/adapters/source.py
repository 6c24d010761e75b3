"""One run's stream as the adapters' translators want it: committed events from the log merged
with live deltas from core NATS, in an order the translators can trust.

Why both, and why this order:
* The log is the truth (`store.follow` from a seq read BEFORE the run was started or decided, so
  no commit can slip by); it is also what makes the same code work whether the run executes in
  this process or on a worker elsewhere (`agentlog.gateway.operations.dispatch`).
* Live deltas (`agentlog.live.<thread>.<run>`, see `agentlog.runtime.live`) are best effort and must be
  subscribed BEFORE the run starts, or the first tokens are lost. They travel a different path
  than the commits: on a worker, a whole step's deltas (and the next step's) can arrive before
  the follow has delivered the commits they come after. So every delta carries `seq`, the
  thread seq its inference followed, and `Merge` holds it until the follow has passed that seq:
  the translators then see committed events and deltas in the order the loop produced them,
  however the commits were batched and however far the live link ran ahead.
* A late delta is dropped: text/reasoning/tool-call deltas of a step whose `StepStarted` is committed (the
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

from nats.aio.client import Client as NATS

from agentlog.eventlog.events import RunFinished, RunSuspended, StepStarted, StoredCommit, ToolCallCompleted
from agentlog.eventlog.jetstream.store import flush_subscriptions
from agentlog.eventlog.store import EventStore, as_generator
from agentlog.eventlog.subjects import live_subject
from agentlog.runtime import CommittedEvent

#: Live items buffered per stream; beyond it live items are dropped (the log still has them).
MAX_LIVE = 10_000


class Merge:
    """The pure ordering of one run's stream: feed it the thread's commits in log order
    (`commit`) and live payloads in arrival order (`live`); each call returns the items to
    translate now. Independent of batching: the output depends only on the commits' order and
    on where each delta arrived among them, and a delta is never released before the commit
    it follows (`seq`), so it lands where the loop produced it.

    `after`: the seq the follow starts after (every commit up to it is already known)."""

    def __init__(self, run_id: str, after: int = 0) -> None:
        self.run_id = run_id
        self.seen = after
        self.ended = False
        self._held: list[dict[str, Any]] = []
        self._committed_step = 0
        self._completed: set[str] = set()

    def live(self, payload: dict[str, Any]) -> list[Any]:
        """A live payload: released now if the follow has passed its `seq` (and nothing older
        is held: live order is kept), else held."""
        if self.ended:
            return []
        self._held.append(payload)
        return self._release()

    def commit(self, sc: StoredCommit) -> list[Any]:
        """One commit of the thread (other runs' commits only advance the position)."""
        if self.ended or sc.seq <= self.seen:
            return []
        out: list[Any] = []
        if sc.commit.run_id == self.run_id:
            for position, event in sc.positioned():
                out.append(CommittedEvent(position, event, sc.commit.ts))
                if type(event) is StepStarted:
                    self._committed_step = max(self._committed_step, event.step)
                elif type(event) is ToolCallCompleted:
                    self._completed.add(event.call_id)
                elif type(event) in (RunFinished, RunSuspended):
                    self.ended = True
                    self._held.clear()
                    return out
        self.seen = sc.seq
        return out + self._release()

    def _release(self) -> list[Any]:
        out: list[Any] = []
        while self._held:
            payload = self._held[0]
            seq = payload.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool) and seq > self.seen:
                break
            self._held.pop(0)
            if not self._late(payload):
                out.append(payload)
        return out

    def _late(self, payload: dict[str, Any]) -> bool:
        kind = payload.get("type")
        step = payload.get("step")
        if kind in ("text_delta", "reasoning_delta", "tool_call_delta") and isinstance(step, int) and step <= self._committed_step:
            return True
        return kind == "tool_progress" and payload.get("call_id") in self._completed


class RunSource:
    """Merged committed + live items of one run. Use: `await src.subscribe()` (before starting
    the run), start it, `src.follow(after_seq)`, then `async for item in src.items()`; always
    `await src.close()` (unsubscribes, stops the log follower)."""

    def __init__(self, store: EventStore, nc: NATS | None, thread_id: str, run_id: str, *, live: bool = True) -> None:
        self.store = store
        self.nc = nc
        self.thread_id = thread_id
        self.run_id = run_id
        self.live = live and nc is not None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._live_count = 0
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._after = 0  # where `follow` starts: `Merge` knows every commit up to it

    async def subscribe(self) -> None:
        nc = self.nc
        if not self.live or nc is None or self._sub is not None:
            return

        async def on_msg(msg: Any) -> None:
            try:
                payload = json.loads(msg.data)
            except (ValueError, UnicodeDecodeError):
                return
            if isinstance(payload, dict) and self._live_count < MAX_LIVE:
                self._live_count += 1
                self._queue.put_nowait(payload)

        self._sub = await nc.subscribe(live_subject(self.thread_id, self.run_id), cb=on_msg)
        # the subscription must be on the server before the run publishes anything
        with contextlib.suppress(Exception):
            await flush_subscriptions(nc)

    def follow(self, after: int) -> None:
        """Start reading the run's commits after seq `after` (history first, then live)."""
        if self._task is None:
            self._after = after
            self._task = asyncio.get_running_loop().create_task(self._pump(after), name="adapter-follow")

    async def _pump(self, after: int) -> None:
        follower = as_generator(self.store.follow(self.thread_id, after=after))
        try:
            async for sc in follower:
                self._queue.put_nowait(sc)
                if sc.commit.run_id == self.run_id and any(
                        type(e) in (RunFinished, RunSuspended) for e in sc.commit.events):
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which reports it
            self._queue.put_nowait(exc)
        finally:
            with contextlib.suppress(Exception):
                await follower.aclose()

    async def items(self) -> AsyncIterator[Any]:
        """Committed events and live deltas in the order the run produced them (`Merge`);
        ends after the run's next stop. Raises what the log follower failed with (e.g.
        `StoreUnavailable`)."""
        merge = Merge(self.run_id, self._after)
        while not merge.ended:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            for out in merge.live(item) if isinstance(item, dict) else merge.commit(item):
                yield out

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


__all__ = ["MAX_LIVE", "Merge", "RunSource"]
