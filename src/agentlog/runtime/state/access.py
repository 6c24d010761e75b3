"""Typed state access for tools and hooks: reads of a snapshot, writes staged in a batch.

`TypedState` is what a `ToolContext` offers over its call's `MutationBatch` (the thread, run and
tool_call scopes, read synchronously from the snapshot the call started with); `ProfileAccess`
(`ctx.profile`) adds the profile scope, which is read from its own stream and so is async, as
the seeds' `ProfileAccess` is. The loop records the staged writes when the call completes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from agentlog.eventlog.events import JSON
from agentlog.runtime.state.batch import MutationBatch
from agentlog.runtime.state.keys import StateError, StateKey, StateWriteRefused

T = TypeVar("T")

#: Reads a profile's document (the fold of its stream, as of now).
ProfileLoader = Callable[[str], Awaitable[dict[str, JSON]]]


class ProfileUnavailable(StateError):
    """The run has no profile: its thread has no `resource_id`, or the store keeps no profiles."""

    code = "profile_unavailable"


class TypedState:
    """Typed reads and writes of the thread, run and tool_call scopes over `self.batch`."""

    batch: MutationBatch

    def read(self, key: StateKey[T]) -> T:
        """The key's typed value: the snapshot the call started with, and its own writes."""
        _not_profile(key)
        return self.batch.read(key)

    def write(self, key: StateKey[Any], value: Any) -> None:
        """Set the key's value (validated against its type now: `StateValidationError`)."""
        _not_profile(key)
        self.batch.write(key, value)

    def update(self, key: StateKey[Any], *ops: Mapping[str, Any]) -> None:
        """Apply ops to the key's value (`agentlog.runtime.state.ops`, paths relative to it)."""
        _not_profile(key)
        self.batch.update(key, *ops)

    def reduce(self, key: StateKey[Any], action: Any) -> None:
        """Apply an action through the key's reducer (recorded with the ops it gives)."""
        _not_profile(key)
        self.batch.reduce(key, action)

    def delete(self, key: StateKey[Any]) -> None:
        _not_profile(key)
        self.batch.delete(key)

    @property
    def run_state(self) -> dict[str, JSON]:
        """The run scope's document as this call sees it (a copy)."""
        return _copy(self.batch.document("run"))

    @property
    def call_state(self) -> dict[str, JSON]:
        """This call's tool_call scope document (a copy)."""
        return _copy(self.batch.document("tool_call"))


def _not_profile(key: StateKey[Any]) -> None:
    if key.scope == "profile":
        raise StateWriteRefused(f"state key {key.name!r} is a profile key: use `await ctx.profile.read(key)` "
                                "and the other async methods of `ctx.profile`")


def _copy(doc: dict[str, JSON]) -> dict[str, JSON]:
    from agentlog.projections.state import json_copy

    return json_copy(doc)


class ProfileAccess:
    """The profile scope of one call: the long-term state of the thread's `resource_id`.

    Loaded once per call on first use (`load`), then read like the other scopes; writes are
    staged in the call's batch and appended to the profile's stream when the call completes
    (under optimistic concurrency: a profile changed meanwhile is re-read and the writes are
    validated again; if they no longer hold, the call fails and nothing is written)."""

    def __init__(self, batch: MutationBatch, profile_id: str | None, loader: ProfileLoader | None) -> None:
        self._batch = batch
        self.profile_id = profile_id
        self._loader = loader

    @property
    def available(self) -> bool:
        return self.profile_id is not None and self._loader is not None

    async def load(self) -> None:
        if self._batch.has_scope("profile"):
            return
        if self.profile_id is None or self._loader is None:
            raise ProfileUnavailable("this run has no profile: its thread has no resource_id"
                                     if self.profile_id is None else "the event store keeps no profiles")
        doc = await self._loader(self.profile_id)
        self._batch.add_scope("profile", doc, self.profile_id)

    async def read(self, key: StateKey[T]) -> T:
        _profile(key)
        await self.load()
        return self._batch.read(key)

    async def write(self, key: StateKey[Any], value: Any) -> None:
        _profile(key)
        await self.load()
        self._batch.write(key, value)

    async def update(self, key: StateKey[Any], *ops: Mapping[str, Any]) -> None:
        _profile(key)
        await self.load()
        self._batch.update(key, *ops)

    async def reduce(self, key: StateKey[Any], action: Any) -> None:
        _profile(key)
        await self.load()
        self._batch.reduce(key, action)

    async def delete(self, key: StateKey[Any]) -> None:
        _profile(key)
        await self.load()
        self._batch.delete(key)

    async def document(self) -> dict[str, JSON]:
        """The whole profile document as this call sees it (a copy)."""
        await self.load()
        return _copy(self._batch.document("profile"))


def _profile(key: StateKey[Any]) -> None:
    if key.scope != "profile":
        raise StateWriteRefused(f"state key {key.name!r} is {key.scope}-scoped: read and write it on the context, "
                                "not on `ctx.profile`")


__all__ = ["ProfileAccess", "ProfileLoader", "ProfileUnavailable", "TypedState"]
