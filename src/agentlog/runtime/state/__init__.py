"""Typed state: keys, scopes, merge strategies, lattices, batches (DESIGN 4.6).

    from agentlog import StateKey
    from agentlog.runtime.state import ops

    counter = StateKey("counter", int, merge="commutative")   # thread scope by default

    @tool(state_keys=[counter])
    def bump(ctx: ToolContext) -> int:
        ctx.update(counter, ops.increment())
        return ctx.read(counter)

Every write is recorded as a `StateWritten` event whose ops any fold applies without the app;
scoped state ends with a `StateCleared`; a conflict of parallel writers with a
`StateConflicted`. See docs/guides/state.md.
"""

from agentlog.runtime.state import ops
from agentlog.runtime.state.access import ProfileAccess, ProfileUnavailable, TypedState
from agentlog.runtime.state.batch import (
    MergePlan,
    MutationBatch,
    StateWrite,
    Touch,
    diff_ops,
    find_conflict,
    plan_merge,
)
from agentlog.runtime.state.keys import (
    StateError,
    StateKey,
    StateKeyConflict,
    StateKeys,
    StateValidationError,
    StateWriteRefused,
    collect_keys,
)
from agentlog.runtime.state.lattice import Flag, GCounter, GSet, MaxRegister, MinRegister, ORSet

__all__ = [
    "Flag", "GCounter", "GSet", "MaxRegister", "MergePlan", "MinRegister", "MutationBatch", "ORSet", "ProfileAccess",
    "ProfileUnavailable", "StateError", "StateKey", "StateKeyConflict", "StateKeys", "StateValidationError",
    "StateWrite", "StateWriteRefused", "Touch", "TypedState", "collect_keys", "diff_ops", "find_conflict", "ops",
    "plan_merge",
]
