"""The configuration file's default `max_rounds`: an agent that sets no limit of its own stops
after that many rounds (`stopped`, code max_rounds), so a model that keeps calling tools cannot
loop forever. Pure: the built app runs on the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime.config import DEFAULT_MAX_ROUNDS, ConfigError, build, parse_config
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.stop import MaxRounds

LOOPING = """
models:
  looping: {type: scripted, loop: true, script: [{tool_calls: [{name: add, arguments: {a: 1, b: 1}}]}]}
tools: ["tests.apps.config_app:add"]
"""


def app(agents: str, extra: str = "") -> Any:
    return build(parse_config(LOOPING + extra + agents))


def rounds_of(loaded: Any, agent: str) -> list[MaxRounds]:
    (spec,) = [a for a in loaded.agents if a.id == agent]
    return [c for c in spec.effective_stop_conditions() if isinstance(c, MaxRounds)]


async def test_config_default_max_rounds_stops_a_looping_model() -> None:
    loaded = app("agents: [{id: loop, model: looping, tools: [add]}]")
    assert [c.rounds for c in rounds_of(loaded, "loop")] == [DEFAULT_MAX_ROUNDS] == [16]
    rt = loaded.runtime(MemoryEventStore())
    result = await rt.run("loop", "go")
    assert result.termination.type == "stopped" and result.termination.code == "max_rounds"
    assert result.run.steps == DEFAULT_MAX_ROUNDS
    report = await verify_run(rt.store, result.run_id, rt)
    assert report.ok and report.termination == result.termination


async def test_config_max_rounds_default_set_in_the_file() -> None:
    loaded = app("agents: [{id: loop, model: looping, tools: [add]}]", "max_rounds: 3\n")
    result = await loaded.runtime(MemoryEventStore()).run("loop", "go")
    assert (result.termination.code, result.run.steps) == ("max_rounds", 3)


def test_config_max_rounds_of_the_agent_wins_over_the_default() -> None:
    loaded = app("agents: [{id: own, model: looping, tools: [add], max_rounds: 40},\n"
                 "         {id: cond, model: looping, tools: [add], stop_conditions: [{type: max_rounds, rounds: 7}]}]",
                 "max_rounds: 3\n")
    assert [c.rounds for c in rounds_of(loaded, "own")] == [40]
    assert [c.rounds for c in rounds_of(loaded, "cond")] == [7]


def test_config_max_rounds_null_turns_the_default_off() -> None:
    loaded = app("agents: [{id: loop, model: looping, tools: [add]}]", "max_rounds: null\n")
    assert rounds_of(loaded, "loop") == []


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_config_max_rounds_default_must_be_a_positive_integer(value: str) -> None:
    with pytest.raises(ConfigError, match="max_rounds"):
        parse_config(LOOPING + f"max_rounds: {value}\nagents: [{{id: loop, model: looping}}]")
