"""Profiles (DESIGN 3): the long-term state shared by the threads of one `resource_id`, folded
from the profile's own stream of `ProfileCommit`s, pure.

A profile's view is the fold of its commits, like a thread's state; as of a sequence (`at`) it is
the fold up to it (time travel). The fold applies each commit's `StateWritten` ops
(`agentlog.projections.state.apply_ops`); a write whose ops do not apply, or leave its key, is
skipped and counted the same way by every fold (the runtime validates before it appends, so only
a foreign writer makes one).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from agentlog.eventlog.events import StoredProfileCommit
from agentlog.projections.errors import InvalidPatch
from agentlog.projections.fold import key_ops_valid
from agentlog.projections.state import apply_ops


class ProfileView(msgspec.Struct, frozen=True, kw_only=True):
    """One profile as of `version` (the stream sequence of its last commit folded, 0: none).
    `writes`: the `StateWritten` events folded; `keys`: per key, the sequence that last wrote it."""

    profile_id: str
    version: int = 0
    state: dict[str, object] = {}
    keys: dict[str, int] = {}
    writes: int = 0
    rejected_writes: int = 0
    created: int = 0
    updated: int = 0


def fold_profile(profile_id: str, commits: Iterable[StoredProfileCommit], at: int | None = None) -> ProfileView:
    """The profile's view after its commits in order (only those with seq <= `at` when given)."""
    state: dict[str, object] = {}
    keys: dict[str, int] = {}
    version = writes = rejected = created = updated = 0
    for stored in commits:
        if at is not None and stored.seq > at:
            break
        commit = stored.commit
        if commit.profile_id != profile_id:
            continue
        version = stored.seq
        created = created or commit.ts
        updated = commit.ts
        for event in commit.events:
            if event.scope != "profile" or not key_ops_valid(event.ops, event.key):
                rejected += 1
                continue
            try:
                state = apply_ops(state, event.ops)
            except InvalidPatch:
                rejected += 1
                continue
            writes += 1
            if event.key in state:
                keys[event.key] = stored.seq
            else:
                keys.pop(event.key, None)
    return ProfileView(profile_id=profile_id, version=version, state=state, keys=keys, writes=writes,
                       rejected_writes=rejected, created=created, updated=updated)


__all__ = ["ProfileView", "fold_profile"]
