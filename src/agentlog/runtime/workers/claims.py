"""Who starts a queued run: the one arbiter between a gateway that stops waiting for a start and
the worker that takes it (DESIGN 4.5).

    claims = StartClaims(js)
    offer = await claims.offer(run_id, command_id)        # gateway, before it queues the start
    ...                                                  # no worker started it in time:
    outcome = await claims.withdraw(run_id, command_id, offer.revision)   # WITHDRAWN / TAKEN / SUPERSEDED
    taken = await claims.take(run_id, command_id)        # worker, before it starts the run

A gateway that queues a start (`StartRun.offered`) first offers it: the key `<run_id>` of KV
bucket `agentlog_starts` holds `offer:<command_id>`. A worker starts the run only once it has
turned that value into `take:<command_id>`; a gateway that waited in vain turns it into
`withdrawn:<command_id>`. Both are compare-and-set on the key's revision, so exactly one wins:
a start the gateway answered as refused never runs (its command is acked unexecuted whenever a
worker gets it), and one a worker took is never answered as refused. A client retrying the
start with the same run id offers it again (a new command replaces a withdrawn or still
queued one; a taken one is answered from the log).

Entries live `CLAIM_TTL`: a queued start older than that is refused by any worker (its key is
gone), so a command left in the queue by a crashed gateway cannot run days later either. A
start whose run is already in the log needs no claim (a redelivery resumes it).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from agentlog.eventlog.jetstream.replicas import placed, raise_replicas

#: The KV bucket of start claims (one key per run id).
CLAIMS_BUCKET = "agentlog_starts"
#: How long an offer (and what became of it) is kept: the longest a queued start can wait.
CLAIM_TTL = 24 * 3600.0
#: Compare-and-set attempts before giving up (another party moved the key each time).
_ATTEMPTS = 20

OFFER, TAKE, WITHDRAWN = "offer", "take", "withdrawn"


class Withdrawal(enum.Enum):
    """What a gateway's withdrawal of its offer found."""

    #: Withdrawn: no worker took the command and none ever will.
    WITHDRAWN = "withdrawn"
    #: A worker took the start (this command or an earlier attempt's): the run starts.
    TAKEN = "taken"
    #: A later attempt of the same start (same run id) replaced this one, which will never run.
    SUPERSEDED = "superseded"


class Offer(NamedTuple):
    """The gateway's offer: its revision (for the withdrawal), or `taken`: an earlier attempt's
    command is already taken, so nothing new is to be queued."""

    revision: int
    taken: bool = False


def _value(state: str, command_id: str) -> bytes:
    return f"{state}:{command_id}".encode()


def _parse(raw: bytes | None) -> tuple[str, str]:
    state, _, command_id = (raw or b"").decode(errors="replace").partition(":")
    return state, command_id


class StartClaims:
    """The claims bucket on a JetStream context `js` (created on first use, `replicas` for a new
    one or raised for an existing one)."""

    def __init__(self, js: Any, *, replicas: int | None = None) -> None:
        self.js = js
        self.replicas = replicas
        self._kv: Any = None

    async def kv(self) -> Any:
        if self._kv is None:
            self._kv = await ensure_claims_bucket(self.js, replicas=self.replicas)
        return self._kv

    async def _read(self, run_id: str) -> tuple[str, str, int] | None:
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await (await self.kv()).get(run_id)
        except KeyNotFoundError:  # never offered, expired, or deleted
            return None
        state, command_id = _parse(entry.value)
        return state, command_id, entry.revision

    async def offer(self, run_id: str, command_id: str) -> Offer:
        """Offer the start of `run_id` by `command_id` (see the module doc)."""
        from nats.js.errors import KeyWrongLastSequenceError

        kv = await self.kv()
        for _ in range(_ATTEMPTS):
            found = await self._read(run_id)
            try:
                if found is None:
                    return Offer(await kv.create(run_id, _value(OFFER, command_id)))
                state, _holder, revision = found
                if state == TAKE:
                    return Offer(revision, taken=True)
                return Offer(await kv.update(run_id, _value(OFFER, command_id), last=revision))
            except KeyWrongLastSequenceError:
                continue  # moved meanwhile: look again
        raise RuntimeError(f"the start claim of run {run_id!r} kept changing")

    async def take(self, run_id: str, command_id: str) -> bool:
        """A worker's claim of the start: True if `command_id` may start `run_id` (it was offered
        by this command, or this command took it already: a redelivery); False if the offer was
        withdrawn, replaced by another attempt, taken by another command, or is gone."""
        from nats.js.errors import KeyWrongLastSequenceError

        kv = await self.kv()
        for _ in range(_ATTEMPTS):
            found = await self._read(run_id)
            if found is None:
                return False
            state, holder, revision = found
            if holder != command_id or state == WITHDRAWN:
                return False
            if state == TAKE:
                return True
            try:
                await kv.update(run_id, _value(TAKE, command_id), last=revision)
                return True
            except KeyWrongLastSequenceError:
                continue
        return False

    async def withdraw(self, run_id: str, command_id: str, revision: int) -> Withdrawal:
        """The gateway's withdrawal of its offer (made at `revision`), see `Withdrawal`."""
        from nats.js.errors import KeyWrongLastSequenceError

        kv = await self.kv()
        try:
            await kv.update(run_id, _value(WITHDRAWN, command_id), last=revision)
            return Withdrawal.WITHDRAWN
        except KeyWrongLastSequenceError:
            pass
        found = await self._read(run_id)
        if found is not None and found[0] == TAKE:
            return Withdrawal.TAKEN
        return Withdrawal.SUPERSEDED


async def ensure_claims_bucket(js: Any, *, replicas: int | None = None) -> Any:
    """Create the claims bucket (history 1, entries expire after `CLAIM_TTL`) with `replicas`, or
    adopt an existing one and raise its replicas (never lowered), as for the other streams."""
    from nats.js.api import KeyValueConfig, StorageType
    from nats.js.errors import BadRequestError, NotFoundError

    try:
        await raise_replicas(js, f"KV_{CLAIMS_BUCKET}", replicas)
    except NotFoundError:
        config = KeyValueConfig(bucket=CLAIMS_BUCKET, history=1, ttl=CLAIM_TTL, storage=StorageType.FILE,
                                replicas=replicas or 1, direct=True,
                                description="agentlog start claims: which queued start a worker may run")
        try:
            return await placed(lambda: js.create_key_value(config=config), f"KV bucket {CLAIMS_BUCKET}")
        except BadRequestError:
            pass  # created by another process in between: adopt it
    return await js.key_value(CLAIMS_BUCKET)


__all__ = ["CLAIMS_BUCKET", "CLAIM_TTL", "Offer", "StartClaims", "Withdrawal", "ensure_claims_bucket"]
