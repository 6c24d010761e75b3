"""`InProcessDispatcher`: the gateway's dispatcher over a `Runtime` in the test's own process.

Every check is the `QueueDispatcher`'s; a command that passed is carried out at once by the
runtime here (`Runtime.execute`) instead of being queued for a worker, and a command the runtime
rejects is answered as a worker's dead letter would be. Tests use it where a worker process (or a
`Worker` and its consumer) would only add moving parts: the answers are the gateway's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.gateway.operations.dispatch import QueueDispatcher
from agentlog.runtime import CommandRejected, Runtime, agent_catalog
from agentlog.runtime.inputs import Command, ContinueRun, OverrideScope
from agentlog.runtime.workers import DLQ_CODE, DLQ_COMMAND_ID, DLQ_ERROR, dlq_subject

#: Seconds between tries of a command the runtime cannot carry out yet (a worker's nak delay).
RETRY_PACING = 0.05


class InProcessDispatcher(QueueDispatcher):
    def __init__(self, runtime: Runtime, *, timeout: float = 30.0) -> None:
        store: Any = runtime.store
        super().__init__(store.nc, store, timeout=timeout, snapshots=runtime.snapshots, handoff=runtime.handoff,
                         override_policies={a.id: OverrideScope(a.model_name, a.overrides, a.tools)
                                            for a in runtime.agents})
        self.agents = runtime.agents  # type: ignore[assignment]  # the runtime's, as it grows
        self.runtime = runtime
        self._running: set[asyncio.Task[None]] = set()

    def agent_catalog(self) -> list[dict[str, Any]]:
        return agent_catalog(self.runtime)

    async def _queue(self, cmd: Command, app_name: str | None) -> None:
        task = asyncio.get_running_loop().create_task(self._carry_out(cmd))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _carry_out(self, cmd: Command) -> None:
        """What a worker does with the command, without the queue."""
        try:
            stop = cmd.interruption() if isinstance(cmd, ContinueRun) else None
            if stop is not None:
                await self.runtime.execute(stop)
                cmd = cmd.replace(interrupt=False)
            while await self.runtime.execute(cmd) == "later":
                await asyncio.sleep(RETRY_PACING)  # retry pacing, as a worker's nak delay
        except CommandRejected as exc:
            await self.client.nc.publish(dlq_subject(cmd.thread_id), b"", headers={
                DLQ_COMMAND_ID: cmd.command_id, DLQ_CODE: exc.code, DLQ_ERROR: exc.detail})


__all__ = ["InProcessDispatcher"]
