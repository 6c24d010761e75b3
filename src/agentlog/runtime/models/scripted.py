"""`ScriptedModel`: a deterministic stand-in for an LLM, for tests, benchmarks and the demo.

A script is a list of assistant turns. Each `stream()` call plays the next turn: its reasoning (if
any) in a few `ReasoningDelta`s, its text in a few `TextDelta`s, one `ToolCallDelta` per tool call, then a `ModelDone` with the whole response. Nothing
random enters: tool call ids come from the turn index and call position (or are given), usage is a
word count unless given, so the same script always yields the same chunks and a log written with it
replays identically.

A turn may also be a callable `(request) -> Turn | str` (sync or async) for answers that depend on
the conversation, e.g. echoing the last tool result.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentlog.eventlog.events import JSON, Message, ReasoningPart, ToolCall, Usage
from agentlog.runtime.models.base import (
    ModelChunk,
    ModelDone,
    ModelError,
    ModelRequest,
    ModelResponse,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from agentlog.runtime.models.pricing import ModelPrices


class ScriptExhausted(ModelError):
    """A `ScriptedModel` was asked for more turns than its script has (and `loop` is off).

    `shared`: the turn counter is past the conversation asking (other conversations, i.e. other
    runs, took turns of the script). The fix is then `position="conversation"`, which picks each
    request's turn from its own conversation, so one model serves every run of an app; otherwise
    the script is too short for this conversation."""

    code = "script_exhausted"

    def __init__(self, turns: int, requested: int, *, shared: bool = False) -> None:
        self.turns = turns
        self.requested = requested
        self.shared = shared
        if shared:
            fix = ("its turns were taken by earlier requests of other runs: the model counts turns across every "
                   "request it answers (position='counter', the default). For a model that serves many runs, "
                   "pass position='conversation' (each run's turn is picked from its own conversation)")
        else:
            fix = "add turns to the script, or pass loop=True to play it again"
        super().__init__(f"scripted model has {turns} turn(s) but turn #{requested + 1} was requested: {fix}")


@dataclass(frozen=True)
class ScriptedCall:
    """A tool call of a scripted turn. `id=None` means: derive it from the turn and position."""

    name: str
    arguments: dict[str, JSON] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Turn:
    """One scripted assistant turn: text and/or tool calls, or an error to raise.

    Build with the constructors: `Turn.text("hi")`, `Turn.tool("get_weather", {"city": "Paris"})`,
    `Turn.tools(("a", {}), ScriptedCall("b", {"x": 1}, id="c1"), text="two calls")`,
    `Turn.fail(ModelUnavailable("down"))`. `reasoning=` (on `text`/`tool`/`tools`) makes the turn
    think first, as a reasoning model does: streamed as `ReasoningDelta`s and recorded in the
    message's `reasoning` (provider "scripted").

    `gate`, if set, is awaited before the first chunk: tests use it to hold a model call open (to
    cancel a run mid-inference, say) without sleeping.
    """

    content: str = ""
    calls: tuple[ScriptedCall, ...] = ()
    usage: Usage | None = None
    stop_reason: str | None = None
    error: BaseException | None = None
    gate: asyncio.Event | None = None
    reasoning: str = ""

    @classmethod
    def text(cls, text: str, *, usage: Usage | None = None, gate: asyncio.Event | None = None,
             reasoning: str = "") -> Turn:
        return cls(content=text, usage=usage, gate=gate, reasoning=reasoning)

    @classmethod
    def tool(
        cls,
        name: str,
        arguments: dict[str, JSON] | None = None,
        *,
        id: str | None = None,
        text: str = "",
        usage: Usage | None = None,
        gate: asyncio.Event | None = None,
        reasoning: str = "",
    ) -> Turn:
        call = ScriptedCall(name, dict(arguments or {}), id)
        return cls(content=text, calls=(call,), usage=usage, gate=gate, reasoning=reasoning)

    @classmethod
    def tools(
        cls,
        *calls: ScriptedCall | tuple[str, dict[str, JSON]] | tuple[str, dict[str, JSON], str],
        text: str = "",
        usage: Usage | None = None,
        gate: asyncio.Event | None = None,
        reasoning: str = "",
    ) -> Turn:
        """Several calls in one turn (parallel tool calls); tuples are `(name, args[, id])`."""
        return cls(content=text, calls=tuple(_as_call(c) for c in calls), usage=usage, gate=gate,
                   reasoning=reasoning)

    @classmethod
    def fail(cls, error: BaseException, *, gate: asyncio.Event | None = None) -> Turn:
        """Raise `error` from `stream()` instead of answering (consumes the turn)."""
        return cls(error=error, gate=gate)


TurnFn = Callable[[ModelRequest], "Turn | str | Awaitable[Turn | str]"]
ScriptItem = Turn | str | TurnFn


class ScriptedModel:
    """Plays a script of turns, one per `stream()` call.

    - `loop=True` starts over at the first turn when the script ends (ids keep counting up, so they
      stay unique); otherwise an exhausted script raises `ScriptExhausted`.
    - `position="conversation"` picks the turn from the number of assistant messages already in the
      request instead of an in-memory counter, so a fresh instance (a resumed run on another worker)
      continues the script where the conversation is, and one instance serves many runs (an app
      served by `agentlog serve`). The default counter plays the script once across every request
      it answers: a second run gets the turns after the first run's.
    - `requests` records every request received, for assertions.
    - `chunk_words`: how many words go in each `TextDelta`.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem],
        *,
        loop: bool = False,
        position: Literal["counter", "conversation"] = "counter",
        name: str = "scripted",
        id_prefix: str = "call",
        chunk_words: int = 2,
        prices: ModelPrices | None = None,
    ) -> None:
        self.script: list[ScriptItem] = list(script)
        if not self.script:
            raise ValueError("a ScriptedModel needs at least one turn")
        if chunk_words < 1:
            raise ValueError("chunk_words must be >= 1")
        self.loop = loop
        self.position = position
        self.name = name
        self.id_prefix = id_prefix
        self.chunk_words = chunk_words
        #: USD per 1M tokens: the loop records each inference's cost from them.
        self.prices = prices
        self.requests: list[ModelRequest] = []
        self._next = 0

    @property
    def calls(self) -> int:
        """How many times `stream()` was started."""
        return len(self.requests)

    @property
    def remaining(self) -> int:
        """Turns left before exhaustion in counter mode (unbounded when looping)."""
        return max(0, len(self.script) - self._next)

    def reset(self) -> None:
        self._next = 0
        self.requests.clear()

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return self._stream(request)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        index = self._turn_index(request)
        turn = await self._resolve(index, request)
        if turn.gate is not None:
            await turn.gate.wait()
        if turn.error is not None:
            raise turn.error
        response = self._response(index, turn, request)
        for piece in _split_words(turn.reasoning, self.chunk_words):
            yield ReasoningDelta(piece)
        for piece in _split_words(response.text, self.chunk_words):
            yield TextDelta(piece)
        for i, call in enumerate(response.tool_calls):
            yield ToolCallDelta(
                index=i, call_id=call.id, name=call.name, arguments_delta=_dumps(call.arguments)
            )
        yield ModelDone(response)

    def _turn_index(self, request: ModelRequest) -> int:
        if self.position == "conversation":
            return _answered(request)
        index = self._next
        self._next += 1
        return index

    async def _resolve(self, index: int, request: ModelRequest) -> Turn:
        if index >= len(self.script) and not self.loop:
            raise ScriptExhausted(len(self.script), index,
                                  shared=self.position == "counter" and _answered(request) < len(self.script))
        entry = self.script[index % len(self.script)]
        item: object = entry
        if callable(entry) and not isinstance(entry, Turn):
            item = entry(request)
            if inspect.isawaitable(item):
                item = await item
        if isinstance(item, str):
            return Turn.text(item)
        if not isinstance(item, Turn):
            raise TypeError(f"script turn #{index + 1} is {type(item).__name__}, expected Turn or str")
        return item

    def _response(self, index: int, turn: Turn, request: ModelRequest) -> ModelResponse:
        calls = [
            ToolCall(
                id=c.id if c.id is not None else f"{self.id_prefix}_{index}_{pos}",
                name=c.name,
                arguments=copy.deepcopy(c.arguments),
            )
            for pos, c in enumerate(turn.calls)
        ]
        usage = turn.usage or Usage(
            input_tokens=sum(_words(m) for m in request.messages),
            output_tokens=len(turn.content.split())
            + sum(1 + len(_dumps(c.arguments).split()) for c in calls),
        )
        return ModelResponse(
            model=request.model or self.name,
            text=turn.content,
            tool_calls=calls,
            usage=usage,
            stop_reason=turn.stop_reason or ("tool_calls" if calls else "stop"),
            reasoning=[ReasoningPart(provider="scripted", text=turn.reasoning)] if turn.reasoning else [],
        )


def _answered(request: ModelRequest) -> int:
    """The assistant turns already in the request's conversation."""
    return sum(1 for m in request.messages if m.role == "assistant")


def _as_call(c: ScriptedCall | Sequence[Any]) -> ScriptedCall:
    if isinstance(c, ScriptedCall):
        return c
    name, args, *rest = c
    return ScriptedCall(name, dict(args), rest[0] if rest else None)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def _words(message: Message) -> int:
    n = len(message.content.split())
    for call in message.tool_calls or ():
        n += 1 + len(_dumps(call.arguments).split())
    return n


_WORD = re.compile(r"\s*\S+\s*|\s+")


def _split_words(text: str, per_chunk: int) -> list[str]:
    """Split into pieces of `per_chunk` words whose concatenation is exactly `text`."""
    words = _WORD.findall(text)
    return ["".join(words[i : i + per_chunk]) for i in range(0, len(words), per_chunk)]


def last_tool_result(request: ModelRequest) -> str | None:
    """Content of the most recent tool message, for callable turns that echo a result."""
    for message in reversed(request.messages):
        if message.role == "tool":
            return message.content
    return None
