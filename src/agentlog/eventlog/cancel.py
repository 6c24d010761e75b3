"""`cancel_wins(aw)`: await a library call so that a cancel of the caller is never lost.

nats-py waits for replies and messages with `asyncio.wait_for` (`request`, `Subscription.next_msg`
and so `fetch`, the KV and Object Store reads). On Python 3.11, `wait_for` returns the result when
it completes in the same loop step as a cancel of the caller: the cancel is gone, and a task that
is stopped by cancelling it runs on (a loop fetches again, a follow reads on), so whoever awaits
its end waits forever. Under load that step is not rare: a stop while messages flow lost its cancel
in about one stop in five. Awaiting through `cancel_wins` raises `CancelledError` in the caller
whatever the call does; the call itself is cancelled too, and what it returns after that (a
fetched message, say) is dropped, as a call cancelled in time would have dropped it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

_T = TypeVar("_T")


def _retrieve(task: asyncio.Future[Any]) -> None:
    """The outcome of a call nobody awaits any more: read, so it is not logged as lost."""
    if not task.cancelled():
        task.exception()


async def cancel_wins(aw: Awaitable[_T]) -> _T:
    """`await aw`, except that a cancel of the caller always raises `CancelledError` here."""
    inner = asyncio.ensure_future(aw)
    try:
        # the shield's own future is what a cancel of the caller cancels, whatever `inner` does
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        inner.cancel()
        inner.add_done_callback(_retrieve)
        raise


__all__ = ["cancel_wins"]
