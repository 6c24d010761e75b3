"""The A2A <-> run mapping's message codec (pure): what a client puts in an A2A message's text and
data parts is exactly the text and decisions the run gets."""

from __future__ import annotations

from typing import Any

from a2a.types.a2a_pb2 import Message, Part, Role
from hypothesis import given
from hypothesis import strategies as st

from agentlog.gateway.adapters.a2a.mapping import data_part, message_inputs

_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.text(max_size=8) | st.integers(-1000, 1000).map(float),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_decision = st.fixed_dictionaries({"target_id": _ids, "decision_id": _ids,
                                   "action": st.sampled_from(["resume", "cancel"]), "result": _json})


@given(st.lists(st.text(min_size=1, max_size=20), max_size=3), st.lists(_decision, max_size=3), st.booleans())
def test_message_inputs_round_trip(texts: list[str], decisions: list[dict[str, Any]], one_by_one: bool) -> None:
    parts = [Part(text=t) for t in texts]
    if one_by_one:
        parts += [data_part(d) for d in decisions]
    elif decisions:
        parts.append(data_part({"decisions": decisions}))
    text, got = message_inputs(Message(message_id="m", role=Role.ROLE_USER, parts=parts))
    assert text == "\n".join(texts)
    assert got == decisions
