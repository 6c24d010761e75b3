"""Request digests from one encoding of the conversation keep their values.

`InferenceCompleted.request_digest(s)` are in logs and verified replay recomputes them, so the
spliced computation must give exactly the digests of encoding the request and each part whole
(`_digests_plain`, the definition) for any request: system messages first, elsewhere or absent,
awkward model names, and the same request asked twice (the reuse of the last one) or changed in
place between two asks.
"""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from agentlog.eventlog.events import Message, ToolCall
from agentlog.runtime.digest import _digests_plain, request_digest, request_part_digests
from agentlog.runtime.models.base import ModelRequest, ToolSpec

_text = st.text(max_size=6)
_message = st.builds(
    lambda role, text, calls: Message(
        id=f"m-{text}", role=role, content=text,
        tool_calls=[ToolCall(id=c, name="t", arguments={"z": 1, "a": [c]}) for c in calls] if calls else None,
    ),
    st.sampled_from(["system", "user", "assistant", "tool"]), _text, st.lists(_text, max_size=2),
)
_request = st.builds(
    lambda model, messages, tools, options: ModelRequest(model=model, messages=messages, tools=tools, options=options),
    st.one_of(_text, st.just('x","messages":[]'), st.just('"messages":[]')),
    st.lists(_message, max_size=8),
    st.lists(st.builds(lambda n: ToolSpec(name=n), _text), max_size=2),
    st.dictionaries(_text, st.integers(), max_size=2),
)


@given(_request)
def test_spliced_digests_equal_the_digests_by_definition(request: ModelRequest) -> None:
    full, parts = _digests_plain(request)
    assert request_digest(request) == full
    assert request_part_digests(request) == parts
    assert request_digest(request) == full  # asked again: the reused answer is the same


@given(_request, _message)
def test_a_request_changed_in_place_is_digested_again(request: ModelRequest, extra: Message) -> None:
    request_digest(request)
    request.messages.append(extra)
    request.options["changed"] = 1
    full, parts = _digests_plain(request)
    assert request_digest(request) == full
    assert request_part_digests(request) == parts


def test_the_digest_is_of_the_canonical_json() -> None:
    request = ModelRequest(model="m", messages=[Message(id="s", role="system", content="be"),
                                                Message(id="u", role="user", content="hi")],
                           options={"b": 1, "a": 2})
    import hashlib
    encoded = msgspec.json.Encoder(order="deterministic").encode(request)
    assert encoded.startswith(b'{"model":"m","messages":[{"id":"s"')
    assert request_digest(request) == hashlib.sha256(encoded).hexdigest()


_step = st.one_of(
    st.tuples(st.just("append"), st.lists(_message.filter(lambda m: m.role != "system"), min_size=1, max_size=20)),
    st.tuples(st.just("copy"), st.integers(0, 60)),  # an equal message, another object
    st.tuples(st.just("change"), st.integers(0, 60), _message.filter(lambda m: m.role != "system")),
    st.tuples(st.just("system"), st.lists(_message.filter(lambda m: m.role == "system"), max_size=2)),
    st.tuples(st.just("model"), _text),
)


@given(st.lists(_step, min_size=1, max_size=12))
def test_a_growing_conversation_digests_as_if_encoded_whole(steps: list[tuple]) -> None:
    """A run asks again and again with the same message objects plus new ones; some come back
    as equal but other objects (a resume), some change, the system prompt or the model change.
    Each request's digests are those of encoding it whole, whatever was hashed before."""
    system: list[Message] = []
    conversation: list[Message] = []
    model = "m"
    for step in steps:
        kind = step[0]
        if kind == "append":
            conversation += step[1]
        elif kind == "copy" and conversation:
            i = step[1] % len(conversation)
            conversation[i] = msgspec.structs.replace(conversation[i])
        elif kind == "change" and conversation:
            conversation[step[1] % len(conversation)] = step[2]
        elif kind == "system":
            system = step[1]
        elif kind == "model":
            model = step[1]
        request = ModelRequest(model=model, messages=[*system, *conversation])
        full, parts = _digests_plain(request)
        assert request_digest(request) == full
        assert request_part_digests(request) == parts
