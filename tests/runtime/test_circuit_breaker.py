"""Circuit breakers per model (agentlog.runtime.models.breaker): a model that fails
`failure_threshold` times in a row is skipped for `cooldown_s`, then probed; every change a run
sees is a `CircuitBreakerChanged` in its log, and verified replay takes the recorded path instead
of deciding again. Clocks are injected (no sleeps); runs are on the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.eventlog.events import CircuitBreakerChanged, InferenceCompleted
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, DeterministicEntropy, RetryPolicy, Runtime
from agentlog.runtime.config import build, parse_config
from agentlog.runtime.models import ModelRequestRejected, ModelUnavailable, ScriptedModel, Turn
from agentlog.runtime.models.breaker import CircuitBreakerPolicy, CircuitBreakers
from agentlog.runtime.replay.verify import verify_run


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breakers(clock: Clock, **policy: Any) -> CircuitBreakers:
    return CircuitBreakers(CircuitBreakerPolicy(**{"failure_threshold": 2, "cooldown_s": 30, **policy}), clock=clock)


def states(changes: list[CircuitBreakerChanged]) -> list[str]:
    return [c.state for c in changes]


def test_circuit_breaker_opens_after_the_threshold_then_probes_after_the_cooldown() -> None:
    clock = Clock()
    b = breakers(clock)
    assert b.admit("m") == (True, []) and b.report("m", False) == []
    assert states(b.report("m", False)) == ["open"] and b.state("m") == "open"
    assert b.admit("m") == (False, [])
    clock.now += 29.9
    assert b.admit("m") == (False, [])
    clock.now += 0.1
    allowed, changes = b.admit("m")
    assert allowed and states(changes) == ["half_open"]
    assert b.admit("m") == (False, [])  # one probe at a time (half_open_max 1)
    assert states(b.report("m", False)) == ["open"]  # the probe failed: another cooldown
    assert b.admit("m") == (False, [])
    clock.now += 30
    assert states(b.admit("m")[1]) == ["half_open"]
    assert states(b.report("m", True)) == ["closed"] and b.state("m") == "closed"
    assert b.admit("m") == (True, []) and b.report("m", True) == []


def test_circuit_breaker_success_resets_the_failure_count_and_models_are_apart() -> None:
    b = breakers(Clock(), failure_threshold=3)
    for _ in range(2):
        b.report("m", False)
    b.report("m", True)
    assert b.report("m", False) == [] and b.report("m", False) == []  # 2 in a row again, not 4
    assert states(b.report("m", False)) == ["open"]
    assert b.state("other") == "closed" and b.admit("other") == (True, [])


def test_circuit_breaker_half_open_lets_half_open_max_probes_through() -> None:
    clock = Clock()
    b = breakers(clock, half_open_max=2)
    b.report("m", False)
    b.report("m", False)
    clock.now += 30
    assert [b.admit("m")[0] for _ in range(3)] == [True, True, False]


def flaky_runtime(clock: Clock, primary: ScriptedModel, fallback: ScriptedModel | None) -> Runtime:
    spec = AgentSpec(id="a", model="primary", fallback_models=["fallback"] if fallback else [],
                     retry=RetryPolicy(max_attempts=3, backoff_ms=0))
    models: dict[str, Any] = {"primary": primary, **({"fallback": fallback} if fallback else {})}
    return Runtime(MemoryEventStore(), agents=[spec], models=models, entropy=DeterministicEntropy(),
                   breakers=breakers(clock))


async def log_of(rt: Runtime, thread_id: str) -> list[Any]:
    return [e for sc in [sc async for sc in rt.store.read_thread(thread_id)] for e in sc.commit.events]


async def test_circuit_breaker_opens_in_a_run_which_goes_on_with_the_fallback_and_records_it() -> None:
    clock = Clock()
    primary = ScriptedModel([Turn.fail(ModelUnavailable("503"))] * 2 + ["primary is back"])
    fallback = ScriptedModel(["from the fallback"] * 3)
    rt = flaky_runtime(clock, primary, fallback)
    first = await rt.run("a", "one")
    events = await log_of(rt, first.thread_id)
    changes = [e for e in events if isinstance(e, CircuitBreakerChanged)]
    assert [(c.model, c.state, c.failures) for c in changes] == [("primary", "open", 2)]
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("CircuitBreakerChanged") < kinds.index("InferenceCompleted")  # recorded with the inference
    assert [e.model for e in events if isinstance(e, InferenceCompleted)] == ["fallback"]
    assert len(primary.requests) == 2  # the third attempt was not made: the breaker opened

    second = await rt.run("a", "two")  # within the cooldown: the primary is not asked at all
    assert len(primary.requests) == 2 and first.termination.type == second.termination.type == "natural_end"
    assert not [e for e in await log_of(rt, second.thread_id) if isinstance(e, CircuitBreakerChanged)]

    clock.now += 31  # the probe goes through and succeeds
    third = await rt.run("a", "three")
    changes = [e for e in await log_of(rt, third.thread_id) if isinstance(e, CircuitBreakerChanged)]
    assert states(changes) == ["half_open", "closed"]
    assert third.run.status == "done" and len(primary.requests) == 3

    for run in (first, second, third):  # replay reads the breaker from the log, whatever the clock says now
        report = await verify_run(rt.store, run.run_id, rt)
        assert report.ok and report.commits_verified == report.commits_recorded


async def test_circuit_breaker_open_with_no_fallback_ends_the_run_circuit_open() -> None:
    clock = Clock()
    primary = ScriptedModel([Turn.fail(ModelUnavailable("503"))] * 2)
    rt = flaky_runtime(clock, primary, None)
    first = await rt.run("a", "one")
    assert (first.termination.type, first.termination.code) == ("error", "model_unavailable")
    second = await rt.run("a", "two")
    assert (second.termination.type, second.termination.code) == ("error", "circuit_open")
    assert "circuit breaker is open" in (second.termination.detail or "")
    assert len(primary.requests) == 2
    first_changes = [e for e in await log_of(rt, first.thread_id) if isinstance(e, CircuitBreakerChanged)]
    assert states(first_changes) == ["open"]  # recorded with the run's error end
    for run in (first, second):
        assert (await verify_run(rt.store, run.run_id, rt)).ok


async def test_circuit_breaker_is_not_opened_by_requests_the_provider_refused() -> None:
    clock = Clock()
    primary = ScriptedModel([Turn.fail(ModelRequestRejected("400 bad request"))] * 3)
    rt = flaky_runtime(clock, primary, ScriptedModel(["ok"] * 3))
    for _ in range(3):
        await rt.run("a", "x")
    assert rt.breakers is not None and rt.breakers.state("primary") == "closed"  # type: ignore[attr-defined]
    assert len(primary.requests) == 3


def test_circuit_breaker_from_the_config_file() -> None:
    loaded = build(parse_config("models: {m: {type: scripted, script: [x]}}\n"
                                "circuit_breaker: {failure_threshold: 3, cooldown_s: 5}\n"
                                "agents: [{id: a, model: m}]"))
    assert loaded.breakers is not None and loaded.breakers.policy == CircuitBreakerPolicy(failure_threshold=3,
                                                                                          cooldown_s=5)
    rt = loaded.runtime(MemoryEventStore())
    assert rt.breakers is loaded.breakers
    assert build(parse_config("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m}]")).breakers is None


@pytest.mark.parametrize("bad", ["{failure_threshold: 0}", "{cooldown_s: 0}", "{half_open_max: 0}", "{nope: 1}"])
def test_circuit_breaker_config_mistakes_are_typed_errors(bad: str) -> None:
    from agentlog.runtime.config import ConfigError

    with pytest.raises(ConfigError, match="circuit_breaker"):
        parse_config(f"models: {{m: {{type: scripted, script: [x]}}}}\ncircuit_breaker: {bad}\nagents: [{{id: a, model: m}}]")
