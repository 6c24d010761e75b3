"""What an inference costs: a model's prices per million tokens, applied to its `Usage`.

Prices are configuration (they change, and differ per contract), so they ride on the model (a
`prices` attribute, or the config file's `prices:`), never in code. The loop prices each
inference once and records the figure in `InferenceCompleted.cost`: views, metrics and the CLI
sum recorded figures, so a later price change does not rewrite history.

Cache tokens: `Usage.input_tokens` counts every prompt token; the cached share is billed at the
cache prices instead of the input price (a cache price left unset bills them as input).
"""

from __future__ import annotations

from typing import Any

import pydantic

from agentlog.eventlog.events import Usage

__all__ = ["ModelPrices", "cost_of", "prices_of"]

_PER = 1_000_000


class ModelPrices(pydantic.BaseModel):
    """USD per 1M tokens."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    input: float = pydantic.Field(default=0.0, ge=0)
    output: float = pydantic.Field(default=0.0, ge=0)
    cache_read: float | None = pydantic.Field(default=None, ge=0)
    cache_write: float | None = pydantic.Field(default=None, ge=0)

    def cost(self, usage: Usage) -> float:
        cache_read = usage.cache_read_tokens
        cache_write = usage.cache_write_tokens
        plain = max(0, usage.input_tokens - cache_read - cache_write)
        total = (
            plain * self.input
            + cache_read * (self.input if self.cache_read is None else self.cache_read)
            + cache_write * (self.input if self.cache_write is None else self.cache_write)
            + usage.output_tokens * self.output
        )
        return round(total / _PER, 9)


def prices_of(model: Any) -> ModelPrices | None:
    """The prices a model object carries (`prices` attribute), if any."""
    prices = getattr(model, "prices", None)
    return prices if isinstance(prices, ModelPrices) else None


def cost_of(model: Any, usage: Usage) -> float | None:
    prices = prices_of(model)
    return None if prices is None else prices.cost(usage)
