"""The server's retention policy (`serve` / `gateway --archive-after DAYS`): run
`agentlog.eventlog.jetstream.retention.archive_due` every `AGENTLOG_ARCHIVE_INTERVAL` seconds (default one hour,
the first pass at start) on a connection of its own, logged in as `archiver` on the embedded
server (the only role allowed to purge). With `--nats URL` the connection uses the process's own
login, which must then be allowed to purge; if it is not, the policy logs why and stops (nothing
is lost: what it had archived stays readable and `agentlog retention` as archiver finishes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import structlog

from agentlog.eventlog.errors import AgentlogError, PermissionDenied
from agentlog.eventlog.jetstream.retention import DAY_MS, archive_due
from agentlog.gateway.operations.connection import ConnectionOptions, connect

log = structlog.get_logger("agentlog.retention")

INTERVAL_ENV = "AGENTLOG_ARCHIVE_INTERVAL"
DEFAULT_INTERVAL = 3600.0


class RetentionLoop:
    """Archive finished threads older than `older_than_days`, again and again, until stopped."""

    def __init__(self, options: ConnectionOptions, older_than_days: float, interval: float | None = None) -> None:
        self.options = options
        self.older_than_ms = int(older_than_days * DAY_MS)
        self.interval = interval if interval is not None else float(os.environ.get(INTERVAL_ENV) or DEFAULT_INTERVAL)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        #: Threads archived (or finished purging) by this process so far.
        self.archived = 0

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="agentlog-retention")

    async def stop(self) -> None:
        """Cancel the loop, and also tell it to stop: a cancel can be lost in a nats-py call
        (`agentlog.eventlog.cancel`), and the loop would then wait out its whole interval."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _run(self) -> None:
        try:
            store, shared = await connect(self.options, "archiver", "agentlog-archiver")
        except AgentlogError as exc:
            log.error("retention.stopped", reason="cannot connect as the archiver (an embedded nats-server "
                      "started before the role existed needs a restart)", error=str(exc), code=exc.code)
            return
        try:
            while True:
                try:
                    outcomes = await archive_due(store, self.older_than_ms, replicas=self.options.replicas)
                except PermissionDenied as exc:
                    log.error("retention.stopped", reason="this login may not purge the events stream; run "
                              "`agentlog retention` with the archiver login instead", error=str(exc))
                    return
                except AgentlogError as exc:  # e.g. NATS unavailable: try again next time
                    log.warning("retention.failed", error=str(exc), code=exc.code)
                else:
                    done = [o for o in outcomes if o.result in ("archived", "purged")]
                    self.archived += len(done)
                    if outcomes:
                        log.info("retention.pass", archived=len(done), threads=[o.as_dict() for o in outcomes])
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):  # the policy's period
                        await self._stopping.wait()
                if self._stopping.is_set():
                    return
        finally:
            await store.close()
            if shared is not None:
                await shared.aclose()
