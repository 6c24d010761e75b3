"""Stop conditions: declarative specs and one pure evaluator.

Each condition is a typed pydantic model (JSON `{"type": "max_rounds", "rounds": 10}`), so agent
configs can carry them as data. `evaluate_stop` is a pure function of the specs and a `StopInput`
built from the run context: the same log always stops at the same step, which replay relies on.

When: at the end of every step that would otherwise continue (the model asked for tools). A step
whose answer has no tool calls ends the run `natural_end`; stop conditions never override that.
Every condition ends the run with termination `stopped` and its own code (the spec's `type`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import pydantic

from agentlog.log.events import Termination


class _Spec(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class MaxRounds(_Spec):
    """Stop after `rounds` completed inference+tool rounds."""

    type: Literal["max_rounds"] = "max_rounds"
    rounds: int = pydantic.Field(ge=1)


class Timeout(_Spec):
    """Stop once `seconds` have elapsed since the run started (by the injected clock)."""

    type: Literal["timeout"] = "timeout"
    seconds: float = pydantic.Field(gt=0)


class TokenBudget(_Spec):
    """Stop once cumulative input+output tokens of the run reach `max_tokens`."""

    type: Literal["token_budget"] = "token_budget"
    max_tokens: int = pydantic.Field(ge=1)


class ConsecutiveErrors(_Spec):
    """Stop after `max_errors` back-to-back rounds in which every tool call failed."""

    type: Literal["consecutive_errors"] = "consecutive_errors"
    max_errors: int = pydantic.Field(default=3, ge=1)


class StopOnTool(_Spec):
    """Stop after a round in which the model called `tool_name` (the call still runs)."""

    type: Literal["stop_on_tool"] = "stop_on_tool"
    tool_name: str


class ContentMatch(_Spec):
    """Stop when the model's text in a round contains `pattern` (a literal, or a regex)."""

    type: Literal["content_match"] = "content_match"
    pattern: str = pydantic.Field(min_length=1)
    regex: bool = False


class LoopDetection(_Spec):
    """Stop when the last `window` rounds called the same tool names (the model is looping)."""

    type: Literal["loop_detection"] = "loop_detection"
    window: int = pydantic.Field(default=3, ge=2)


StopCondition = Annotated[
    MaxRounds | Timeout | TokenBudget | ConsecutiveErrors | StopOnTool | ContentMatch | LoopDetection,
    pydantic.Field(discriminator="type"),
]


@dataclass(frozen=True, slots=True)
class StopInput:
    """What the conditions may look at, taken from the run context at the end of a round."""

    rounds: int
    elapsed_ms: int
    total_tokens: int
    consecutive_errors: int
    #: Tool names called in each round so far, oldest first (the last entry is this round).
    round_tools: Sequence[tuple[str, ...]]
    #: The model's text in this round.
    text: str


def evaluate_stop(conditions: Sequence[StopCondition], inp: StopInput) -> Termination | None:
    """The first condition (in spec order) that fires, as a `stopped` termination; else None."""
    for cond in conditions:
        detail = _check(cond, inp)
        if detail is not None:
            return Termination(type="stopped", code=cond.type, detail=detail)
    return None


def _check(cond: _Spec, inp: StopInput) -> str | None:
    if isinstance(cond, MaxRounds):
        if inp.rounds >= cond.rounds:
            return f"reached the maximum of {cond.rounds} rounds"
    elif isinstance(cond, Timeout):
        if inp.elapsed_ms >= cond.seconds * 1000:
            return f"run exceeded {cond.seconds:g}s ({inp.elapsed_ms} ms elapsed)"
    elif isinstance(cond, TokenBudget):
        if inp.total_tokens >= cond.max_tokens:
            return f"used {inp.total_tokens} tokens, budget {cond.max_tokens}"
    elif isinstance(cond, ConsecutiveErrors):
        if inp.consecutive_errors >= cond.max_errors:
            return f"{inp.consecutive_errors} consecutive rounds with only failed tool calls"
    elif isinstance(cond, StopOnTool):
        if inp.round_tools and cond.tool_name in inp.round_tools[-1]:
            return f"the model called {cond.tool_name!r}"
    elif isinstance(cond, ContentMatch):
        found = re.search(cond.pattern, inp.text) if cond.regex else cond.pattern in inp.text
        if found:
            return f"the model's text matched {cond.pattern!r}"
    elif isinstance(cond, LoopDetection):
        recent = inp.round_tools[-cond.window :]
        if len(recent) == cond.window and recent[0] and all(r == recent[0] for r in recent):
            return f"the last {cond.window} rounds all called {', '.join(recent[0])}"
    else:  # pragma: no cover - the union is closed
        raise TypeError(f"unknown stop condition {cond!r}")
    return None
