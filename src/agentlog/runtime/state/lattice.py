"""Lattice value types for typed state: fields a `lattice` (or any) key merges by join.

Each type is a pydantic root model whose JSON is the encoding of its kind in
`agentlog.projections.lattice` (the fold's registry), and names that kind (`kind`), so a key's
model declares its lattice fields by their types, as Tirea's `#[tirea(lattice)]` fields do:

    class Stats(pydantic.BaseModel):
        calls: GCounter = GCounter()
        best: MaxRegister = MaxRegister()
        tags: GSet[str] = GSet()

Writes to them are `lattice` ops (`agentlog.runtime.state.ops.count`, `.max`, `.add_to_set`,
`.or_add`, ...), which commute, so parallel calls never conflict on them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

import pydantic

from agentlog.projections.lattice import or_set_members

T = TypeVar("T")


class GCounter(pydantic.RootModel[dict[str, int]]):
    """Grow-only counter: a count per writer (replica); its `value` is their sum."""

    kind: ClassVar[str] = "g_counter"
    root: dict[str, int] = {}

    @property
    def value(self) -> int:
        return sum(self.root.values())


class MaxRegister(pydantic.RootModel[float | int | None]):
    """The largest number written (None: none yet)."""

    kind: ClassVar[str] = "max"
    root: float | int | None = None

    @property
    def value(self) -> float | int | None:
        return self.root


class MinRegister(pydantic.RootModel[float | int | None]):
    """The smallest number written (None: none yet)."""

    kind: ClassVar[str] = "min"
    root: float | int | None = None

    @property
    def value(self) -> float | int | None:
        return self.root


class Flag(pydantic.RootModel[bool]):
    """A boolean that stays set once set (enable wins)."""

    kind: ClassVar[str] = "flag"
    root: bool = False

    @property
    def value(self) -> bool:
        return self.root


class GSet(pydantic.RootModel[list[T]], Generic[T]):
    """Grow-only set: members are only ever added (JSON array, canonical order)."""

    kind: ClassVar[str] = "g_set"
    root: list[T] = []

    @property
    def members(self) -> list[T]:
        return list(self.root)


class ORSet(pydantic.RootModel[dict[str, Any]]):
    """Observed-remove set: a member added concurrently with its removal stays (add wins)."""

    kind: ClassVar[str] = "or_set"
    root: dict[str, Any] = {}

    @property
    def members(self) -> list[Any]:
        return or_set_members(self.root or None)


LATTICE_TYPES: tuple[type[pydantic.RootModel[Any]], ...] = (GCounter, MaxRegister, MinRegister, Flag, GSet, ORSet)


def lattice_kind(annotation: Any) -> str | None:
    """The lattice kind of a type (a `GSet[str]` is a g_set), or None if it is not one."""
    origin = getattr(annotation, "__pydantic_generic_metadata__", None)
    cls = (origin or {}).get("origin") or annotation
    if isinstance(cls, type) and issubclass(cls, LATTICE_TYPES):
        return str(cls.kind)  # type: ignore[attr-defined]
    return None


def lattice_fields(annotation: Any) -> dict[str, str]:
    """The lattice fields of a value type, by their path relative to the key: `{"": kind}` for a
    lattice type itself, `{"/field": kind}` for each lattice field of a pydantic model."""
    kind = lattice_kind(annotation)
    if kind is not None:
        return {"": kind}
    fields = getattr(annotation, "model_fields", None)
    if not isinstance(fields, dict):
        return {}
    out: dict[str, str] = {}
    for name, info in fields.items():
        field_kind = lattice_kind(info.annotation)
        if field_kind is not None:
            out["/" + (info.alias or name)] = field_kind
    return out


__all__ = ["LATTICE_TYPES", "Flag", "GCounter", "GSet", "MaxRegister", "MinRegister", "ORSet", "lattice_fields",
           "lattice_kind"]
