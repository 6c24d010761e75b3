"""Where the views live: the `ViewStore` protocol and an in-memory implementation.

Every view carries the seq of the last commit applied to it (`ThreadView.version`,
`RunView.last_seq`); that is what makes the runner's apply-once check possible after a restart,
with no separate checkpoint to keep consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from agentlog.projections.index import Changes
from agentlog.projections.listing import DictBlobs, IndexedListings, ListingIndex
from agentlog.projections.views import RunView, ThreadView


@runtime_checkable
class ViewStore(Protocol):
    async def get_thread(self, thread_id: str) -> ThreadView | None: ...

    async def get_run(self, run_id: str) -> RunView | None: ...

    async def put_views(self, threads: Iterable[ThreadView], runs: Iterable[RunView]) -> None:
        """Write many views (one write per view); each carries its last applied seq."""
        ...

    async def list_threads(self) -> list[ThreadView]:
        """Every thread view (a full scan: tools and tests; listings use `thread_page`)."""
        ...

    async def list_runs(self) -> list[RunView]:
        """Every run view (a full scan: tools and tests; listings use `run_page`)."""
        ...

    async def update_index(self, changes: Changes) -> None:
        """Apply the runner's listing-index changes; called before the `put_views` they go with."""
        ...

    async def run_page(self, filters: Mapping[str, str], limit: int, offset: int, *, tenant: str | None = None,
                       descending: bool = False) -> tuple[list[RunView], int]:
        """One page of runs (oldest first, by creation; `descending`: newest first) matching `filters` (on
        threads whose resource_id starts with `tenant`, if given), and how many match."""
        ...

    async def thread_page(self, filters: Mapping[str, str], limit: int, offset: int, *, tenant: str | None = None,
                          descending: bool = False) -> tuple[list[ThreadView], int]:
        """One page of live threads (oldest first, by creation; `descending`: newest first) matching
        `filters` (and whose resource_id starts with `tenant`, if given), and how many match."""
        ...


class MemoryViewStore(IndexedListings):
    """Dict-backed `ViewStore`, for pure unit tests (never a default)."""

    def __init__(self) -> None:
        self.threads: dict[str, ThreadView] = {}
        self.runs: dict[str, RunView] = {}
        self.puts = 0
        self.index = ListingIndex(DictBlobs())
        self.position: int | None = None
        self.batch_end: int | None = None

    async def read_position(self) -> int | None:
        """The runner's position (see `KVViewStore.read_position`)."""
        return self.position

    async def write_position(self, seq: int) -> None:
        self.position = seq

    async def read_batch_end(self) -> int | None:
        """The end of the runner's latest batch (see `KVViewStore.read_batch_end`)."""
        return self.batch_end

    async def write_batch_end(self, seq: int) -> None:
        self.batch_end = seq

    async def get_thread(self, thread_id: str) -> ThreadView | None:
        return self.threads.get(thread_id)

    async def get_run(self, run_id: str) -> RunView | None:
        return self.runs.get(run_id)

    async def put_views(self, threads: Iterable[ThreadView], runs: Iterable[RunView]) -> None:
        for t in threads:
            self.threads[t.thread_id] = t
            self.puts += 1
        for r in runs:
            self.runs[r.run_id] = r
            self.puts += 1

    async def list_threads(self) -> list[ThreadView]:
        return sorted(self.threads.values(), key=lambda t: t.thread_id)

    async def list_runs(self) -> list[RunView]:
        return sorted(self.runs.values(), key=lambda r: r.run_id)
