"""`WriterLease`: which process writes a view set's projections, elected through one JetStream KV key.

Every gateway (`agentlog serve`, `agentlog gateway`) runs a `ProjectionRunner`, but only the one
holding this lease writes the views, the listing index and the position; the others follow the
position its writes store (`agentlog.projections.runner`) and serve reads from the same KV.

- The lease is the key `projections` in bucket `<prefix>_leases`, whose max age is the TTL: the
  server removes a value `ttl` seconds after it was written.
- `try_acquire` creates the key (a create succeeds only if it has no value: one winner).
- The holder renews it every `ttl / 3` s by updating it at the revision it last wrote (a CAS:
  refused once the key expired, or expired and was taken by another process: lost).
- A holder that stops renewing (SIGKILL, a stalled event loop, a lost connection) loses the key
  `ttl` s after its last renewal; standbys try to create it every `acquire_interval`.
  An orderly stop deletes it (`release`), so a standby takes over at its next try.
- `valid()` is the holder's own, conservative view: held, and less than `2/3 ttl` since the
  last renewal that succeeded was sent (the server's `ttl` starts when it stores it, later).
  The runner starts a batch only while valid; its writes are also fenced
  (`agentlog.projections.kv`), so a holder stalled past the TTL after that check is refused
  instead of writing over the next holder.

Why one elected writer, not partitions: the listing index is global (one sorted list of all
runs, pages shared by every thread), so partitions would need a merge on every listing; and a
single writer is what makes the writer's cache (its views and index pages) exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StorageType
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from agentlog.projections.kv import ensure_bucket, jetstream_of

log = logging.getLogger("agentlog.projections")

#: Seconds a holder's lease outlives its last renewal: a killed writer is replaced after at most
#: this (plus a standby's next try). A held-up event loop longer than 2/3 of it loses the lease.
LEASE_TTL = 3.0
LEASE_KEY = "projections"


def lease_bucket(prefix: str) -> str:
    return f"{prefix}_leases"


def holder_id() -> str:
    """This process, as the lease's value names it (for operators: who writes the views)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class WriterLease:
    """The writer lease of one view set. Build with `await WriterLease.open(nc)`."""

    def __init__(self, kv: KeyValue, *, ttl: float, holder: str | None = None, key: str = LEASE_KEY) -> None:
        self.kv = kv
        self.key = key
        self.ttl = ttl
        self.holder = holder or holder_id()
        self.renew_interval = ttl / 3
        #: How often a standby tries to take the lease.
        self.acquire_interval = min(0.25, ttl / 10)
        self._revision = 0  # of this holder's last write of the key; 0 while not held
        self._renewed_at = 0.0  # loop time the last successful write was sent
        self._renewer: asyncio.Task[None] | None = None
        #: Times this process took the lease (health, tests).
        self.acquired = 0

    @classmethod
    async def open(cls, nc: NATS | JetStreamContext, *, prefix: str = "agentlog", replicas: int | None = None,
                   ttl: float = LEASE_TTL, holder: str | None = None) -> WriterLease:
        """The lease on its bucket, created if missing (in memory: a lease has nothing to keep
        across a restart of the servers). An existing bucket's TTL wins over `ttl`."""
        kv = await ensure_bucket(jetstream_of(nc), lease_bucket(prefix), replicas=replicas, ttl=ttl,
                                 storage=StorageType.MEMORY, description="agentlog projections: writer lease")
        status = await kv.status()
        return cls(kv, ttl=status.ttl or ttl, holder=holder)

    @property
    def held(self) -> bool:
        """This process holds the lease, as far as it knows (see `valid`)."""
        return self._revision != 0

    def valid(self) -> bool:
        """Held, and certainly not yet expired on the server: a writer may start a write."""
        return self.held and self._now() - self._renewed_at < self.ttl * 2 / 3

    async def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True if this process holds it now. Never raises
        for a NATS failure (False: try again later)."""
        if self.held:
            return True
        sent = self._now()
        try:
            revision = await self.kv.create(self.key, self.holder.encode())
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:  # noqa: BLE001 - NATS unreachable, a timeout: the next try
            log.debug("writer lease: could not try to acquire: %s", exc)
            return False
        self._revision, self._renewed_at = revision, sent
        self.acquired += 1
        self._renewer = asyncio.get_running_loop().create_task(self._renew_loop(), name="writer-lease")
        log.info("writer lease: %s holds the projections' writer lease", self.holder)
        return True

    async def renew(self) -> bool:
        """Renew now; False once the lease is lost (it then stays lost: `try_acquire` again).
        A renewal that fails for another reason (NATS unreachable) keeps the lease held but lets
        `valid()` run out."""
        if not self.held:
            return False
        sent = self._now()
        try:
            self._revision = await self.kv.update(self.key, self.holder.encode(), last=self._revision)
        except KeyWrongLastSequenceError:
            log.warning("writer lease: %s lost the projections' writer lease", self.holder)
            self._revision = 0
            return False
        except Exception as exc:  # noqa: BLE001 - unknown: the next renewal tells
            log.warning("writer lease: renewal failed: %s", exc)
            return True
        self._renewed_at = sent
        return True

    async def _renew_loop(self) -> None:
        while self.held:
            await asyncio.sleep(self.renew_interval)
            if not await self.renew():
                return

    async def release(self) -> None:
        """Give the lease up (an orderly stop): stop renewing, then delete the key if this
        process still holds it, so a standby takes over at its next try."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
        revision, self._revision = self._revision, 0
        if revision:
            with contextlib.suppress(KeyWrongLastSequenceError, KeyNotFoundError, Exception):
                await self.kv.delete(self.key, last=revision)

    async def current_holder(self) -> str | None:
        """Who holds the lease now, as the key says (None: nobody)."""
        try:
            entry = await self.kv.get(self.key)
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


__all__ = ["LEASE_KEY", "LEASE_TTL", "WriterLease", "holder_id", "lease_bucket"]
