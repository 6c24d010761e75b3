"""Riding out a store outage: a NATS outage is never a run outcome.

    policy = OutagePolicy.from_env()               # AGENTLOG_STORE_OUTAGE_DEADLINE, default 60 s
    seq = await through_outage(lambda: store.append(commit, version), policy, log)

Why: `JetStreamEventStore` turns every NATS failure into `StoreUnavailable` after its
`request_timeout` (5 s by default). Treated like any other error, it would finish the run
`error/store_unavailable` (with its running calls recorded `cancelled`) as soon as NATS came
back: a short outage would permanently fail runs that did nothing wrong. Instead, a store
operation of the loop is retried (same commit: appends are idempotent on the commit id) with a
capped backoff until the store answers or `deadline` seconds have passed since the first failure.
Past the deadline the `StoreUnavailable` propagates and the loop stops WITHOUT committing
anything (`RunLoop.run`): the run stays resumable from the log, and the worker naks its command,
so it is redelivered and resumed once NATS is back.

Only the retry pacing reads the clock; what gets committed does not depend on it, so the loop
stays a deterministic function of (AgentSpec, log).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentlog.eventlog.errors import StoreUnavailable

T = TypeVar("T")

ENV_DEADLINE = "AGENTLOG_STORE_OUTAGE_DEADLINE"
DEFAULT_DEADLINE = 60.0


@dataclass(frozen=True, slots=True)
class OutagePolicy:
    """How long the loop waits for an unavailable store, and how often it asks again.
    `deadline` counts from the first failure of one operation; 0 disables waiting."""

    deadline: float = DEFAULT_DEADLINE
    first_retry: float = 0.1
    max_retry: float = 2.0

    @classmethod
    def from_env(cls, deadline: float | None = None) -> OutagePolicy:
        """`deadline` if given, else $AGENTLOG_STORE_OUTAGE_DEADLINE (seconds), else 60."""
        if deadline is None:
            raw = os.environ.get(ENV_DEADLINE, "").strip()
            try:
                deadline = float(raw) if raw else DEFAULT_DEADLINE
            except ValueError:
                raise ValueError(f"{ENV_DEADLINE} must be a number of seconds, not {raw!r}") from None
        if deadline < 0:
            raise ValueError(f"the store outage deadline must be >= 0 seconds, not {deadline}")
        return cls(deadline=deadline)


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` says "not now" rather than "not this": NATS unreachable or slow, no responders
    yet, JetStream busy electing leaders (503, "temporarily unavailable", "insufficient resources"
    while peers catch up). Such a failure is worth the same request again later; anything else
    (a refused config, an auth error, a bug) is not."""
    import nats.errors
    import nats.js.errors

    if isinstance(exc, (StoreUnavailable, TimeoutError, ConnectionError, nats.errors.TimeoutError,
                        nats.errors.NoRespondersError, nats.errors.NoServersError,
                        nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError)):
        return True
    if isinstance(exc, nats.js.errors.APIError):
        return (exc.code or 0) >= 500 or exc.err_code in _TRANSIENT_JS_CODES
    return False


#: JetStream API error codes that clear up by themselves: 10008 "JetStream system temporarily
#: unavailable", 10023 "insufficient resources" (answered while a new stream's peers catch up).
_TRANSIENT_JS_CODES = frozenset({10008, 10023})


def _store_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, StoreUnavailable)


async def through_outage(op: Callable[[], Awaitable[T]], policy: OutagePolicy, log: Any,
                         what: str = "append",
                         transient: Callable[[BaseException], bool] = _store_unavailable) -> T:
    """Await `op()`, calling it again while it raises an error `transient` accepts (by default
    `StoreUnavailable`), until it succeeds or `policy.deadline` seconds have passed since its
    first failure (then the last error is raised). `op` must be safe to repeat (an append of the
    same commit is)."""
    first_failure: float | None = None
    delay = policy.first_retry
    attempt = 0
    while True:
        try:
            result = await op()
        except Exception as exc:
            if not transient(exc):
                raise
            now = time.monotonic()
            if first_failure is None:
                first_failure = now
            waited = now - first_failure
            if waited >= policy.deadline:
                log.warning("store.outage_deadline", what=what, waited_s=round(waited, 3),
                            deadline_s=policy.deadline, error=str(exc))
                raise
            attempt += 1
            # once at warning (an outage began), then at debug: a long outage must not flood the log
            (log.warning if attempt == 1 else log.debug)(
                "store.waiting", what=what, attempt=attempt, waited_s=round(waited, 3), error=str(exc))
            await asyncio.sleep(min(delay, max(0.0, policy.deadline - waited)))  # retry pacing, not sync
            delay = min(policy.max_retry, delay * 2)
            continue
        if attempt:
            log.info("store.back", what=what, attempts=attempt + 1,
                     waited_s=round(time.monotonic() - (first_failure or 0.0), 3))
        return result


__all__ = ["DEFAULT_DEADLINE", "ENV_DEADLINE", "OutagePolicy", "is_transient", "through_outage"]
