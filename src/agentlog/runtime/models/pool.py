"""Model pools: an agent names several models (a primary plus fallbacks) and the pool picks the
one a run uses.

Affinity decides the pick, deterministically (a hash, never a random draw, so a replay or a
second worker picks the same):
- `thread`: every run of a thread gets the same model (its prompt cache keeps paying off);
- `run`: runs spread over the pool one by one, whatever their thread;
- `none`: always the first model (the others are only fallbacks).

The pick is recorded in the run's `RunStarted.model`, and a resumed run (on any worker, after any
restart or pool edit) keeps the recorded one. The other models of the pool are the run's
fallbacks, in pool order, when its model fails.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import pydantic

__all__ = ["ModelPool"]


class ModelPool(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: Model registry names (or `provider:model` ids), the primary first.
    models: list[str] = pydantic.Field(min_length=1)
    affinity: Literal["thread", "run", "none"] = "thread"

    def choose(self, thread_id: str, run_id: str) -> str:
        """The model of a new run."""
        if self.affinity == "none" or len(self.models) == 1:
            return self.models[0]
        key = thread_id if self.affinity == "thread" else run_id
        return self.models[int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % len(self.models)]

    def order(self, chosen: str | None) -> list[str]:
        """The models to try for an inference: the run's, then the rest of the pool in order."""
        if chosen is None:
            return list(self.models)
        return [chosen, *(m for m in self.models if m != chosen)]
