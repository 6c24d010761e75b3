"""Circuit breakers per model: stop sending requests to a model that keeps failing.

    breakers = CircuitBreakers(CircuitBreakerPolicy(failure_threshold=5, cooldown_s=30))
    Runtime(store, agents=[...], breakers=breakers)     # or `circuit_breaker:` in a config file

Each model (by registry name) has a breaker, kept by the process that calls it:

- `closed`: requests go through; `failure_threshold` failures in a row open it;
- `open`: the model is skipped (the run goes on with its fallback models, or ends `error` with
  code `circuit_open` when none is left) until `cooldown_s` have passed;
- `half_open`: after the cooldown, `half_open_max` probe requests go through; a success closes
  the breaker, a failure opens it again for another cooldown.

What counts as a failure: a retryable model error (unavailable, rate limited, timeouts) and a
broken model (an exception that is not a model error); a request the provider refused (a bad
request, a context overflow) says nothing of the model's health.

Determinism: the breaker depends on time and on other runs, so the loop records every change it
sees as a `CircuitBreakerChanged` event in the run that saw it, with the inference (before its
message) or the run's error end. The loop asks its breakers through `settle` for the changes of
each inference; verified replay's breakers (`agentlog.runtime.replay.answer.ReplayBreakers`)
answer that from the log instead of deciding again, so a replay takes the recorded path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pydantic

from agentlog.eventlog.events import BreakerState, CircuitBreakerChanged
from agentlog.runtime.models.base import ModelError


class CircuitBreakerPolicy(pydantic.BaseModel):
    """When a model's breaker opens and for how long (the same for every model)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: Failures in a row that open the breaker.
    failure_threshold: int = pydantic.Field(default=5, ge=1)
    #: Seconds an open breaker skips the model before it lets a probe through.
    cooldown_s: float = pydantic.Field(default=30.0, gt=0)
    #: Probe requests let through at once while half open.
    half_open_max: int = pydantic.Field(default=1, ge=1)


class CircuitOpen(ModelError):
    """The model's circuit breaker is open: it was not asked."""

    code = "circuit_open"


def counts_as_failure(exc: BaseException) -> bool:
    """Does this error say something about the model's health (see the module docstring)?"""
    return not isinstance(exc, ModelError) or exc.retryable


class Breakers(Protocol):
    """What the loop asks before and after each model request. `admit` and `report` return the
    changes they caused; `settle` is given all the changes of one inference and returns what to
    record (the live breakers: those; replay's: the recorded ones)."""

    def admit(self, model: str) -> tuple[bool, list[CircuitBreakerChanged]]: ...

    def report(self, model: str, ok: bool) -> list[CircuitBreakerChanged]: ...

    def settle(self, changes: list[CircuitBreakerChanged]) -> list[CircuitBreakerChanged]: ...


class NoBreakers:
    """No circuit breaking: every request goes through, nothing is recorded."""

    def admit(self, model: str) -> tuple[bool, list[CircuitBreakerChanged]]:
        return True, []

    def report(self, model: str, ok: bool) -> list[CircuitBreakerChanged]:
        return []

    def settle(self, changes: list[CircuitBreakerChanged]) -> list[CircuitBreakerChanged]:
        return changes


@dataclass(slots=True)
class _Breaker:
    state: BreakerState = "closed"
    failures: int = 0
    opened_at: float = 0.0
    probes: int = 0


class CircuitBreakers:
    """The breakers of one process's models (thread-safe: sync tools and several loops share
    them). `clock`: monotonic seconds (injectable for tests)."""

    def __init__(self, policy: CircuitBreakerPolicy | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy or CircuitBreakerPolicy()
        self._clock = clock
        self._breakers: dict[str, _Breaker] = {}
        self._lock = threading.Lock()

    def state(self, model: str) -> BreakerState:
        with self._lock:
            b = self._breakers.get(model)
            return b.state if b is not None else "closed"

    def admit(self, model: str) -> tuple[bool, list[CircuitBreakerChanged]]:
        with self._lock:
            b = self._breakers.setdefault(model, _Breaker())
            if b.state == "closed":
                return True, []
            if b.state == "open":
                if self._clock() - b.opened_at < self.policy.cooldown_s:
                    return False, []
                b.state, b.probes = "half_open", 1
                return True, [CircuitBreakerChanged(model=model, state="half_open", failures=b.failures,
                                                    detail=f"cooldown of {self.policy.cooldown_s:g}s over: a probe")]
            if b.probes < self.policy.half_open_max:
                b.probes += 1
                return True, []
            return False, []

    def report(self, model: str, ok: bool) -> list[CircuitBreakerChanged]:
        with self._lock:
            b = self._breakers.setdefault(model, _Breaker())
            if ok:
                was = b.state
                b.state, b.failures, b.probes = "closed", 0, 0
                if was != "closed":
                    return [CircuitBreakerChanged(model=model, state="closed", detail="a request succeeded")]
                return []
            b.failures += 1
            if b.state == "half_open" or (b.state == "closed" and b.failures >= self.policy.failure_threshold):
                why = "the probe failed" if b.state == "half_open" else f"{b.failures} failures in a row"
                b.state, b.opened_at, b.probes = "open", self._clock(), 0
                return [CircuitBreakerChanged(model=model, state="open", failures=b.failures, detail=why)]
            return []

    def settle(self, changes: list[CircuitBreakerChanged]) -> list[CircuitBreakerChanged]:
        return changes


__all__ = ["Breakers", "CircuitBreakerPolicy", "CircuitBreakers", "CircuitOpen", "NoBreakers", "counts_as_failure"]
