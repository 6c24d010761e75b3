"""Id validation and generation.

Ids become NATS subject tokens (`agentlog.ev.<thread>.<run>`), so anything outside
`[A-Za-z0-9_-]{1,128}` would let a caller address other subjects or break wildcards. They are
checked at every edge, before anything is published.
"""

from __future__ import annotations

import os
import re
import time
from typing import TypeGuard

from agentlog.eventlog.errors import InvalidId

_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")

#: The run-id token of thread-level commits. Reserved: no run may be called that.
THREAD_LEVEL_RUN = "_"


def is_valid_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def validate_id(value: object, kind: str = "id") -> str:
    """Return `value` if it is a safe id, else raise `InvalidId` naming `kind`."""
    if not is_valid_id(value):
        raise InvalidId(kind, value)
    return value


def validate_run_id(value: object) -> str:
    run_id = validate_id(value, "run_id")
    if run_id == THREAD_LEVEL_RUN:
        raise InvalidId("run_id", run_id)
    return run_id


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_id() -> str:
    """A UUIDv7 as 32 hex chars: time-ordered (ms) with 74 random bits, safe as a NATS token."""
    ms = now_ms() & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = (rand >> 62) & 0xFFF
    rand_b = rand & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return f"{value:032x}"
