"""Profiles over the API (DESIGN 5.1): the long-term state shared by the threads of one
`resource_id`, read from the profile's own stream, now or as of a sequence of it (`at`).

A profile is visible to whoever may see threads of its resource_id: an unscoped caller, or a
tenant whose prefix the id starts with; any other profile answers 404, as an unknown thread does.
A profile nobody wrote is empty (version 0), not missing: profiles are made by their first write.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentlog.eventlog.store import ProfileStore
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.errors import ApiError, not_found
from agentlog.gateway.operations.models import ProfileStateQuery
from agentlog.gateway.operations.services import Services
from agentlog.projections.profile import fold_profile


async def profile_state(svc: Services, who: Principal, profile_id: str, q: ProfileStateQuery) -> dict[str, Any]:
    """`{"profile_id", "at", "version", "state", "keys", "writes", "updated"}`: the profile's
    fold, as of stream sequence `at` when given (its state then; `version` is the last write
    folded)."""
    if not who.can_see(profile_id):
        raise not_found("profile", profile_id)
    store = svc.store
    if not isinstance(store, ProfileStore):
        raise ApiError(501, "profiles_unavailable", "this server's event store keeps no profiles")
    commits = [sc async for sc in store.read_profile(profile_id)]
    view = fold_profile(profile_id, commits, at=q.at)
    out = msgspec.to_builtins(view)
    out["at"] = q.at
    if q.history:
        out["history"] = [
            {"seq": sc.seq, "ts": sc.commit.ts, "thread_id": sc.commit.thread_id, "run_id": sc.commit.run_id,
             "call_id": sc.commit.call_id, "writes": [msgspec.to_builtins(e) for e in sc.commit.events]}
            for sc in commits if q.at is None or sc.seq <= q.at
        ]
    return out


__all__ = ["profile_state"]
