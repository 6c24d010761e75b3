"""The writer's batch notices (`agentlog.projections.notices`): what a batch's views changed, as
a listener needs it, through the wire and back unchanged; past `MAX_NOTICE_IDS` ids a reload."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.projections.notices import (
    MAX_NOTICE_IDS,
    BatchChanges,
    ThreadChange,
    decode_changes,
    encode_changes,
)
from agentlog.projections.views import RunView, ThreadView

ids = st.text(min_size=1, max_size=12)
changes = st.builds(
    BatchChanges,
    seq=st.integers(min_value=0, max_value=2**63 - 1),
    after=st.integers(min_value=0, max_value=2**63 - 1),
    generation=st.integers(min_value=0, max_value=1000),
    threads=st.dictionaries(ids, st.builds(ThreadChange, st.none() | st.text(max_size=20), st.booleans()), max_size=5),
    runs=st.dictionaries(ids, ids, max_size=5),
    reload=st.booleans(),
)


@given(changes)
def test_a_notice_decodes_to_what_was_encoded(batch: BatchChanges) -> None:
    assert decode_changes(encode_changes(batch)) == batch


def test_of_views_names_each_threads_scope_and_each_runs_thread_then_past_the_cap_says_reload() -> None:
    threads = {"t1": ThreadView(thread_id="t1", resource_id="acme/a"), "t2": ThreadView(thread_id="t2", deleted=True)}
    runs = {"r1": RunView(run_id="r1", thread_id="t1")}
    made = BatchChanges.of_views(9, threads, runs, after=4, generation=2)
    assert made == BatchChanges(seq=9, after=4, generation=2, runs={"r1": "t1"},
                                threads={"t1": ThreadChange("acme/a", False), "t2": ThreadChange(None, True)})
    many = {f"r{i}": RunView(run_id=f"r{i}", thread_id="t1") for i in range(MAX_NOTICE_IDS)}
    capped = BatchChanges.of_views(10, threads, many, after=9)
    assert capped == BatchChanges(seq=10, after=9, reload=True)
    assert len(encode_changes(capped)) < 100


@pytest.mark.parametrize("data", [b"", b"{}", b'{"seq": "x"}', b"[1, 2]", b'{"seq": 1, "threads": {"t": 3}}'])
def test_what_is_not_a_notice_is_refused(data: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_changes(data)
