"""What the shared live tail keeps (`ThreadTails`, pure: no server): a join is handed exactly
the kept messages of its thread above its position, in order, however the ring was trimmed (by
count or by bytes), as a scan of the whole ring would find them."""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.jetstream.tails import ThreadTails

THREADS = ("a", "b", "c", "d")


class _Msg:
    def __init__(self, thread: str, size: int) -> None:
        self.subject = f"agentlog.ev.{thread}.r1"
        self.data = b"x" * size


def _ring(tails: ThreadTails) -> list[tuple[int, str]]:
    return [(seen.seq, seen.thread) for seen in tails._ring]


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(st.tuples(st.sampled_from(THREADS), st.integers(1, 64)), max_size=60),
    ring_size=st.integers(1, 12),
    ring_bytes=st.integers(1, 400),
    joins=st.lists(st.tuples(st.sampled_from((*THREADS, None)), st.integers(0, 70)), min_size=1, max_size=8),
)
def test_a_join_gets_the_kept_messages_of_its_thread_above_its_position(
    writes: list[tuple[str, int]], ring_size: int, ring_bytes: int, joins: list[tuple[str | None, int]],
) -> None:
    tails = ThreadTails(cast(Any, None), ring_size=ring_size, ring_bytes=ring_bytes)
    for seq, (thread, size) in enumerate(writes, start=1):
        tails._see(seq, cast(Any, _Msg(thread, size)))
        ring = _ring(tails)
        assert all(seq > tails.floor for seq, _ in ring)
        assert sorted(ring) == ring
        by_thread = {thread: [(s.seq, s.thread) for s in kept] for thread, kept in tails._kept.items()}
        assert by_thread == {t: [e for e in ring if e[1] == t] for t in {t for _, t in ring}}
    for joining, after in joins:
        member, kept, floor = tails._join(joining, after)
        assert floor == tails.floor
        assert [(s.seq, s.thread) for s in kept] == [
            (seq, t) for seq, t in _ring(tails) if seq > after and (joining is None or t == joining)]
        tails._members[joining].discard(member)  # leave without the event loop's idle timer
        tails._count -= 1
