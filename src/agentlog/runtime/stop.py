"""Stop conditions: declarative specs and one pure evaluator.

Each condition is a typed pydantic model (JSON `{"type": "max_rounds", "rounds": 10}`), so agent
configs can carry them as data. `evaluate_stop` is a pure function of the specs and a `StopInput`
built from the run context: the same log always stops at the same step, which replay relies on.

When: at the end of every step that would otherwise continue (the model asked for tools). A step
whose answer has no tool calls ends the run `natural_end`; stop conditions never override that.
Every condition ends the run with termination `stopped` and its own code (the spec's `type`),
except `budget`, which suspends the run for a human (`agentlog.runtime.loop.hitl`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import pydantic

from agentlog.eventlog.events import Termination

#: Call ids of budget tickets (`Budget`): a suspension that answers no tool call of the model.
BUDGET_CALL_PREFIX = "budget-"


def is_budget_call(call_id: str) -> bool:
    return call_id.startswith(BUDGET_CALL_PREFIX)


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


class Budget(_Spec):
    """A spending limit: once the run's tokens reach `max_tokens` or its recorded cost (USD, from
    the models' prices) reaches `max_cost`, the run is SUSPENDED for a human, not finished: a
    ticket (action "budget") waits like an approval. A `resume` decision grants one more budget
    of the same size (the limits become 2x, 3x...), a `cancel` decision ends the run `stopped`
    with code "budget". At least one limit is required."""

    type: Literal["budget"] = "budget"
    max_tokens: int | None = pydantic.Field(default=None, ge=1)
    max_cost: float | None = pydantic.Field(default=None, gt=0)

    @pydantic.model_validator(mode="after")
    def _a_limit(self) -> Budget:
        if self.max_tokens is None and self.max_cost is None:
            raise ValueError("a budget needs max_tokens or max_cost")
        return self


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
    MaxRounds | Timeout | TokenBudget | Budget | ConsecutiveErrors | StopOnTool | ContentMatch | LoopDetection,
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
    #: The run's recorded cost in USD so far (0 when nothing was priced).
    cost: float = 0.0
    #: How many times a human extended the run's budget.
    budget_extensions: int = 0


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
    elif isinstance(cond, Budget):
        grants = 1 + inp.budget_extensions
        if cond.max_tokens is not None and inp.total_tokens >= cond.max_tokens * grants:
            return f"used {inp.total_tokens} tokens, budget {cond.max_tokens * grants}"
        if cond.max_cost is not None and inp.cost >= cond.max_cost * grants:
            return f"cost ${inp.cost:.6f}, budget ${cond.max_cost * grants:.6f}"
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
