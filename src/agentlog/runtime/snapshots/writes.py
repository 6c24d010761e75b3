"""The snapshots a runtime writes of the runs its own loops stop (waiting or finished).

A loop that stops holds its run's context folded exactly up to its last commit: that becomes the
run's snapshot, encoded and written in the background, so the run's result (already in the log)
never waits for a cache. The seq written is remembered per run, so the projection runner's
`SnapshotWriter` over the same runtime does not write it a second time.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping

from agentlog.projections.views import RunView
from agentlog.runtime.loop.driver import RunLoop
from agentlog.runtime.snapshots.format import make_snapshot
from agentlog.runtime.snapshots.store import SnapshotStore, save_snapshot

#: Runs whose last snapshot seq is remembered (the oldest are forgotten first).
SEQS_KEPT = 10_000


class SnapshotWrites:
    """Background snapshot writes to `store` of stopped loops, and the seq each run was last
    written at."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self._tasks: set[asyncio.Task[None]] = set()
        self._seqs: OrderedDict[str, int] = OrderedDict()

    def after_stop(self, loop: RunLoop, view_of: Callable[[], RunView], known: Mapping[str, str]) -> None:
        """Write the snapshot of `loop`'s run as of its last commit, in the background.
        `view_of` builds the run view as of the same commit; `known`: the chunks already stored
        (digest -> key), not written again, and purged once this snapshot no longer names them.
        Nothing is written for a loop that is not ready (`RunLoop.snapshot_ready`)."""
        if not loop.snapshot_ready:
            return
        run_id = loop.ctx.run_id
        self._seqs[run_id] = loop.version
        self._seqs.move_to_end(run_id)
        while len(self._seqs) > SEQS_KEPT:
            self._seqs.popitem(last=False)
        task = asyncio.get_running_loop().create_task(self._write(loop, view_of, known))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, loop: RunLoop, view_of: Callable[[], RunView], known: Mapping[str, str]) -> None:
        # Yield first, so whoever awaits the run's result runs before the encoding (CPU work
        # that grows with the run's length); this only orders work, nothing waits on time.
        for _ in range(3):
            await asyncio.sleep(0)
        snap, chunks = make_snapshot(seq=loop.version, agent_id=loop.spec.id, ctx=loop.ctx, run=view_of(),
                                     known=known)
        await save_snapshot(self.store, snap, chunks, replaced=known)

    def seq(self, run_id: str) -> int:
        """The seq of `run_id`'s last snapshot written (or being written) here; 0 if none."""
        return self._seqs.get(run_id, 0)

    async def flush(self) -> None:
        """Wait for the writes in flight."""
        while self._tasks:
            await asyncio.gather(*self._tasks)


__all__ = ["SEQS_KEPT", "SnapshotWrites"]
