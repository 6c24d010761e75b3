"""ScriptedModel: deterministic turns, ids, usage, callable turns, exhaustion."""

from __future__ import annotations

import asyncio

import pytest

from agentlog.eventlog.events import Message, ToolCall, Usage
from agentlog.runtime.models import (
    Model,
    ModelDone,
    ModelRequest,
    ModelUnavailable,
    ScriptedCall,
    ScriptedModel,
    ScriptExhausted,
    TextDelta,
    ToolCallDelta,
    Turn,
    complete,
    last_tool_result,
)


def req(*messages: Message, model: str = "m") -> ModelRequest:
    default = [Message(id="u1", role="user", content="hello there")]
    return ModelRequest(model=model, messages=list(messages) or default)


async def collect(model: Model, request: ModelRequest) -> list:
    async with asyncio.timeout(5):
        return [c async for c in model.stream(request)]


def script() -> list:
    return [
        Turn.text("Let me check the weather for you."),
        Turn.tool("get_weather", {"city": "Paris"}),
        Turn.tools(("a", {"x": 1}), ScriptedCall("b", {}, id="fixed"), text="two"),
        "It is sunny.",
    ]


def test_is_a_model() -> None:
    assert isinstance(ScriptedModel(["hi"]), Model)


async def test_text_streams_in_chunks_then_done() -> None:
    chunks = await collect(ScriptedModel([Turn.text("one two three four five")]), req())
    deltas = [c for c in chunks if isinstance(c, TextDelta)]
    assert len(deltas) == 3
    assert "".join(d.text for d in deltas) == "one two three four five"
    assert isinstance(chunks[-1], ModelDone)
    done = chunks[-1].response
    assert done.text == "one two three four five"
    assert done.tool_calls == []
    assert done.stop_reason == "stop"
    assert done.model == "m"
    assert sum(isinstance(c, ModelDone) for c in chunks) == 1


async def test_tool_calls_ids_deterministic_and_given() -> None:
    model = ScriptedModel(script())
    r1 = await complete(model, req())
    r2 = await complete(model, req())
    r3 = await complete(model, req())
    assert r1.text.startswith("Let me")
    assert r2.tool_calls == [ToolCall(id="call_1_0", name="get_weather", arguments={"city": "Paris"})]
    assert r2.stop_reason == "tool_calls"
    assert [c.id for c in r3.tool_calls] == ["call_2_0", "fixed"]
    assert r3.text == "two"


async def test_tool_call_deltas_emitted() -> None:
    chunks = await collect(ScriptedModel([Turn.tool("f", {"k": "v"}, id="c9")]), req())
    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert deltas == [ToolCallDelta(index=0, call_id="c9", name="f", arguments_delta='{"k": "v"}')]


async def test_same_script_twice_is_identical() -> None:
    async def run() -> list:
        model = ScriptedModel(script())
        out = []
        for _ in range(4):
            out.append(await collect(model, req()))
        return out

    assert await run() == await run()


async def test_exhausted_by_a_second_conversation_names_position_conversation() -> None:
    """One model serving two runs (an app's model in `agentlog serve`): the second run's first
    request finds the script played by the first, and the error names the fix that serves many
    runs, not `loop=True` (which would replay the first run's turns out of place)."""
    model = ScriptedModel(["only"])
    await complete(model, req())
    with pytest.raises(ScriptExhausted) as info:
        await complete(model, req())
    assert info.value.code == "script_exhausted" and info.value.shared
    assert "position='conversation'" in str(info.value) and "loop=True" not in str(info.value)
    # ... and with it, each conversation gets its own turns
    served = ScriptedModel(["only"], position="conversation")
    assert [(await complete(served, req())).text for _ in range(3)] == ["only"] * 3


async def test_exhausted_by_a_long_conversation_says_add_turns_or_loop() -> None:
    model = ScriptedModel(["only"])
    first = await complete(model, req())
    longer = req(Message(id="u1", role="user", content="hi"), Message(id="a1", role="assistant", content=first.text),
                 Message(id="u2", role="user", content="more"))
    with pytest.raises(ScriptExhausted) as info:
        await complete(model, longer)
    assert not info.value.shared and "loop=True" in str(info.value)
    assert "position=" not in str(info.value)


async def test_loop_repeats_with_fresh_ids() -> None:
    model = ScriptedModel([Turn.tool("f")], loop=True)
    ids = [(await complete(model, req())).tool_calls[0].id for _ in range(3)]
    assert ids == ["call_0_0", "call_1_0", "call_2_0"]


async def test_records_requests() -> None:
    model = ScriptedModel(["a", "b"])
    r1, r2 = req(model="x"), req(model="y")
    await complete(model, r1)
    await complete(model, r2)
    assert model.requests == [r1, r2]
    assert model.calls == 2 and model.remaining == 0


async def test_default_usage_counts_words_and_override() -> None:
    fixed = Usage(input_tokens=100, output_tokens=7)
    model = ScriptedModel([Turn.text("a b c"), Turn.text("x", usage=fixed)])
    r1 = await complete(model, req(Message(id="u", role="user", content="one two three four")))
    assert r1.usage == Usage(input_tokens=4, output_tokens=3)
    r2 = await complete(model, req())
    assert r2.usage == Usage(input_tokens=100, output_tokens=7)


async def test_callable_turn_echoes_last_tool_result() -> None:
    async def async_turn(request: ModelRequest) -> Turn:
        return Turn.text("async " + str(len(request.messages)))

    model = ScriptedModel(
        [Turn.tool("lookup", {"q": 1}), lambda r: f"result was {last_tool_result(r)}", async_turn]
    )
    first = await complete(model, req())
    call = first.tool_calls[0]
    history = [
        Message(id="u", role="user", content="go"),
        Message(id="a", role="assistant", tool_calls=[call]),
        Message(id="t", role="tool", content="42", tool_call_id=call.id),
    ]
    second = await complete(model, req(*history))
    assert second.text == "result was 42"
    third = await complete(model, req(*history))
    assert third.text == "async 3"


async def test_conversation_position_survives_new_instance() -> None:
    turns = [Turn.tool("f", {}), "done"]
    history = [
        Message(id="u", role="user", content="go"),
        Message(id="a", role="assistant", tool_calls=[ToolCall(id="call_0_0", name="f")]),
        Message(id="t", role="tool", content="ok", tool_call_id="call_0_0"),
    ]
    fresh = ScriptedModel(turns, position="conversation")
    assert (await complete(fresh, req(*history))).text == "done"
    assert (await complete(fresh, req(history[0]))).tool_calls[0].id == "call_0_0"


async def test_fail_turn_raises_given_error() -> None:
    model = ScriptedModel([Turn.fail(ModelUnavailable("provider down")), "ok"])
    with pytest.raises(ModelUnavailable):
        await complete(model, req())
    assert (await complete(model, req())).text == "ok"


async def test_gate_holds_turn_until_set() -> None:
    gate = asyncio.Event()
    model = ScriptedModel([Turn.text("late", gate=gate)])
    task = asyncio.create_task(complete(model, req()))
    await asyncio.sleep(0)
    assert not task.done()
    gate.set()
    async with asyncio.timeout(5):
        assert (await task).text == "late"


def test_empty_script_rejected() -> None:
    with pytest.raises(ValueError):
        ScriptedModel([])
