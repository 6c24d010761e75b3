"""The branch diff's alignment (`agentlog.projections.branchdiff`), pure: properties over any two
sequences, and the comparison of events that ignores run ids and lineage."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import ForkOrigin, Message, MessageAppended, RunStarted, ThreadCreated
from agentlog.projections.branchdiff import align, comparable

items = st.lists(st.sampled_from("abcde"), max_size=30)


def _sides(alignment, kinds):
    return [r.a for r in alignment.rows if r.kind in kinds], [r.b for r in alignment.rows if r.kind in kinds]


@settings(max_examples=300, deadline=None)
@given(items, items)
def test_counterfactual_diff_alignment_rebuilds_both_sides(a, b):
    got = align(a, b, a, b)
    # the prefix is the longest one both share
    assert a[:got.common] == b[:got.common]
    assert got.common == len(a) or got.common == len(b) or a[got.common] != b[got.common]
    # each side, read back from the rows after the prefix, is exactly that side
    left = [r.a for r in got.rows if r.a is not None]
    right = [r.b for r in got.rows if r.b is not None]
    assert a[:got.common] + left == a
    assert b[:got.common] + right == b
    for row in got.rows:
        assert (row.kind == "same") == (row.a is not None and row.b is not None and row.a == row.b) or row.kind == "changed"
        assert row.kind != "changed" or row.a != row.b
        assert (row.a is None) == (row.kind == "only_b") and (row.b is None) == (row.kind == "only_a")


@settings(max_examples=200, deadline=None)
@given(items, items)
def test_counterfactual_diff_alignment_swapped_mirrors_the_prefix_and_sizes(a, b):
    ab, ba = align(a, b, a, b), align(b, a, b, a)
    assert ab.common == ba.common
    assert len([r for r in ab.rows if r.a is not None]) == len([r for r in ba.rows if r.b is not None])


@given(items)
def test_counterfactual_diff_of_a_branch_with_itself_is_all_prefix(a):
    got = align(a, a, a, a)
    assert got.common == len(a) and got.rows == ()


def test_counterfactual_diff_compares_events_without_run_ids_and_lineage():
    assert comparable(RunStarted(run_id="r1", agent_id="x")) == comparable(RunStarted(run_id="r2", agent_id="x"))
    assert comparable(RunStarted(run_id="r1", agent_id="x")) != comparable(RunStarted(run_id="r1", agent_id="y"))
    assert comparable(ThreadCreated()) == comparable(ThreadCreated(forked_from=ForkOrigin(thread_id="t", position="1:0")))
    one = MessageAppended(message=Message(id="m", role="user", content="hi"))
    other = MessageAppended(message=Message(id="m", role="user", content="ho"))
    assert comparable(one) != comparable(other)
