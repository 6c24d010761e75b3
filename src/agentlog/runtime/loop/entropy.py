"""The one injectable source of nondeterminism the loop itself creates: ids and timestamps.

Everything the loop writes that is not a pure function of (AgentSpec, log, inputs) comes from an
`Entropy`: commit ids, run/thread/message ids and every `ts`/duration. Pinning it (the
`DeterministicEntropy`) makes two runs of the same scripted scenario write byte-identical logs,
which is what verified replay compares against.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentlog.eventlog import ids


@runtime_checkable
class Entropy(Protocol):
    def new_id(self) -> str:
        """A fresh id, safe as a NATS token (`[A-Za-z0-9_-]{1,128}`)."""
        ...

    def now_ms(self) -> int:
        """Current time in unix milliseconds."""
        ...


class SystemEntropy:
    """The default: UUIDv7 hex ids (time-ordered) and the wall clock."""

    def new_id(self) -> str:
        return ids.new_id()

    def now_ms(self) -> int:
        return ids.now_ms()


class DeterministicEntropy:
    """Counter-based ids and a clock that only moves when told to (`advance`). For tests/replay.

    Ids are `<prefix><counter>` zero-padded, so they sort in creation order like UUIDv7s do.
    """

    def __init__(self, *, start_ms: int = 1_700_000_000_000, prefix: str = "id") -> None:
        ids.validate_id(prefix + "0", "entropy prefix")
        self.prefix = prefix
        self._counter = 0
        self._now = start_ms

    def new_id(self) -> str:
        self._counter += 1
        return f"{self.prefix}{self._counter:08d}"

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        """Move the clock forward by `ms` milliseconds (e.g. to trip a timeout in a test)."""
        if ms < 0:
            raise ValueError("the clock only moves forward")
        self._now += ms


SYSTEM_ENTROPY = SystemEntropy()
