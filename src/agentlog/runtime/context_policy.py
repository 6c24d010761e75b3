"""Context management per agent: what part of a long conversation the model sees.

An agent's `ContextPolicy` (`AgentSpec.context`) sets a token budget for the messages of a
model request. Three mechanisms, applied in this order by the pure function `fit`:

1. **Compaction by summary** (optional, `summarize=True`): when the conversation no longer fits,
   the loop asks a model to summarise the oldest messages (`plan_summary` picks them,
   `summary_request` builds the request) and records the answer as a `ContextCompacted` event.
   From then on the model sees the summary instead of those messages. Because the summary is in
   the log, a resumed run or a verified replay folds the same event and sends the identical
   context; nothing asks a model for a summary twice.
2. **Oversized tool results shrunk**: a tool message longer than `max_tool_result_tokens` is cut
   to its head and tail with a marker saying how much was left out (the log keeps the full value).
3. **Truncation**: the oldest messages are dropped until the rest fits, in whole *units*: an
   assistant message with tool calls and the tool results answering it are kept or dropped
   together, so the model never sees a tool call without its result or a result without its call.

Token counts are estimates (characters / `chars_per_token`): cheap, deterministic, and the same
in every process, which matters more here than matching one provider's tokenizer.
Everything here is pure except `ModelSummarizer`, the one edge that calls a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import msgspec
import pydantic

from agentlog.eventlog.events import ContextCompacted, Message, Usage
from agentlog.runtime.models.base import ModelDone, ModelProtocolError, ModelRequest, closing_stream

__all__ = [
    "ContextPolicy", "ModelSummarizer", "context_tokens", "overflow_policy", "SummaryResult", "Summarizer", "estimate_tokens", "fit",
    "RecordedSummaries", "plan_summary", "summary_request", "units",
]

_json = msgspec.json.Encoder()
SUMMARY_MESSAGE_ID = "context-summary"
DEFAULT_SUMMARY_PROMPT = (
    "Summarise the conversation below for your own later use: keep every fact, decision, tool "
    "result and open question that may matter; drop pleasantries. Answer with the summary only."
)
#: Per-message overhead in tokens (role, separators), as providers count it roughly.
_MESSAGE_OVERHEAD = 4


class ContextPolicy(pydantic.BaseModel):
    """How much of the conversation the model sees (see the module notes)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: Budget for the conversation's messages in a request (the system prompt is not counted).
    max_tokens: int | None = pydantic.Field(default=None, ge=1)
    chars_per_token: float = pydantic.Field(default=4.0, gt=0)
    #: A tool result longer than this is shrunk to its head and tail for the model.
    max_tool_result_tokens: int | None = pydantic.Field(default=None, ge=8)
    #: Summarise the oldest messages (a recorded `ContextCompacted`) when over `max_tokens`.
    summarize: bool = False
    #: Model registry name for summaries (default: the agent's own model).
    summary_model: str | None = None
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    #: After a summary, the most recent messages kept verbatim fill up to this share of the budget.
    keep_recent: float = pydantic.Field(default=0.5, gt=0, le=1)

    @pydantic.model_validator(mode="after")
    def _summary_needs_budget(self) -> ContextPolicy:
        if self.summarize and self.max_tokens is None:
            raise ValueError("context.summarize needs context.max_tokens (the budget that triggers it)")
        return self


# -- estimates and units ---------------------------------------------------------------------------


def message_tokens(m: Message, chars_per_token: float) -> int:
    chars = len(m.content)
    for call in m.tool_calls or ():
        chars += len(call.name) + len(_json.encode(call.arguments))
    return _MESSAGE_OVERHEAD + int(chars / chars_per_token + 0.999)


def estimate_tokens(messages: Sequence[Message], chars_per_token: float = 4.0) -> int:
    return sum(message_tokens(m, chars_per_token) for m in messages)


def units(messages: Sequence[Message]) -> list[list[Message]]:
    """Split messages into units that are kept or dropped whole: an assistant message with tool
    calls together with every tool message answering it (and anything between them, e.g. when
    a result came after a human decision), every other message alone."""
    out: list[list[Message]] = []
    owner: dict[str, int] = {}  # tool call id -> index of the unit of its assistant message
    for m in messages:
        if m.role == "tool" and m.tool_call_id in owner:
            first = owner[m.tool_call_id]
            if first < len(out) - 1:  # results after other messages: merge them into one unit
                merged = [x for u in out[first:] for x in u]
                del out[first:]
                out.append(merged)
                for k, v in owner.items():
                    if v > first:
                        owner[k] = first
            out[-1].append(m)
            continue
        out.append([m])
        for call in m.tool_calls or ():
            owner[call.id] = len(out) - 1
    return out


def _shrink(m: Message, max_tokens: int | None, chars_per_token: float) -> Message:
    if max_tokens is None or m.role != "tool":
        return m
    limit = int(max_tokens * chars_per_token)
    if len(m.content) <= limit:
        return m
    keep = max(limit // 2 - 40, 1)
    omitted = len(m.content) - 2 * keep
    content = f"{m.content[:keep]}\n[... {omitted} characters omitted ...]\n{m.content[-keep:]}"
    return msgspec.structs.replace(m, content=content)


def _after(messages: Sequence[Message], compaction: ContextCompacted | None) -> list[Message]:
    """The messages after the compaction point (all when there is none)."""
    if compaction is None:
        return list(messages)
    for i, m in enumerate(messages):
        if m.id == compaction.upto_message_id:
            return list(messages[i + 1:])
    return list(messages)  # the point is not in this window: nothing to replace


def summary_message(compaction: ContextCompacted) -> Message:
    return Message(id=SUMMARY_MESSAGE_ID, role="system",
                   content=f"Summary of the earlier conversation:\n{compaction.summary}")


def _visible(policy: ContextPolicy, messages: Sequence[Message],
             compaction: ContextCompacted | None) -> tuple[list[Message], list[Message]]:
    """(summary head, later messages with tool results shrunk): the context before truncation."""
    later = [_shrink(m, policy.max_tool_result_tokens, policy.chars_per_token) for m in _after(messages, compaction)]
    return ([summary_message(compaction)] if compaction is not None else []), later


def context_tokens(policy: ContextPolicy, messages: Sequence[Message], compaction: ContextCompacted | None) -> int:
    """Estimated tokens of the context before truncation (summary + shrunk later messages)."""
    head, later = _visible(policy, messages, compaction)
    return estimate_tokens(head + later, policy.chars_per_token)


def fit(policy: ContextPolicy | None, messages: Sequence[Message],
        compaction: ContextCompacted | None = None) -> list[Message]:
    """The messages the model sees under `policy`: summary + later messages, tool results
    shrunk, oldest units dropped until the budget holds (the newest unit always stays)."""
    if policy is None:
        return list(messages) if compaction is None else [summary_message(compaction), *_after(messages, compaction)]
    head, later = _visible(policy, messages, compaction)
    if policy.max_tokens is None:
        return head + later
    cpt = policy.chars_per_token
    budget = policy.max_tokens - estimate_tokens(head, cpt)
    kept: list[list[Message]] = []
    used = 0
    for unit in reversed(units(later)):
        cost = estimate_tokens(unit, cpt)
        if kept and used + cost > budget:
            break
        kept.append(unit)
        used += cost
    return head + [m for unit in reversed(kept) for m in unit]


# -- summaries -------------------------------------------------------------------------------------


def plan_summary(policy: ContextPolicy | None, messages: Sequence[Message],
                 compaction: ContextCompacted | None = None) -> list[Message] | None:
    """The oldest messages to summarise now, or None: only with `summarize` on, when the
    messages after the last compaction exceed the budget; the newest units that fit in
    `keep_recent` of the budget stay verbatim (at least one), the rest is summarised."""
    if policy is None or not policy.summarize or policy.max_tokens is None:
        return None
    if context_tokens(policy, messages, compaction) <= policy.max_tokens:
        return None
    cpt = policy.chars_per_token
    parts = units(_after(messages, compaction))
    room = policy.keep_recent * policy.max_tokens
    keep = 0
    used = 0
    for unit in reversed(parts):
        cost = estimate_tokens([_shrink(m, policy.max_tool_result_tokens, cpt) for m in unit], cpt)
        if keep and used + cost > room:
            break
        keep += 1
        used += cost
    older = [m for unit in parts[: len(parts) - keep] for m in unit]
    return older or None


def overflow_policy(policy: ContextPolicy | None, messages: Sequence[Message],
                    compaction: ContextCompacted | None = None) -> ContextPolicy:
    """The policy a compaction forced by a provider's overflow error uses: the agent's (or the
    defaults), summarising, with a budget of half the current context (or the agent's budget,
    if smaller), so the summary replaces the older half at least."""
    base = policy or ContextPolicy()
    budget = max(1, context_tokens(base, messages, compaction) // 2)
    if base.max_tokens is not None:
        budget = min(budget, base.max_tokens)
    return base.model_copy(update={"summarize": True, "max_tokens": budget})


def _render(m: Message) -> str:
    line = f"{m.role}: {m.content}"
    for call in m.tool_calls or ():
        line += f"\n{m.role} called {call.name}({_json.encode(call.arguments).decode()}) [{call.id}]"
    return line


def summary_request(policy: ContextPolicy, model: str, to_summarize: Sequence[Message],
                    previous: ContextCompacted | None) -> ModelRequest:
    """The model request that asks for a summary (no tools): the previous summary, if any, and
    the messages to fold into it, as a transcript."""
    parts = [f"Earlier summary:\n{previous.summary}"] if previous is not None else []
    parts.append("Conversation:\n" + "\n".join(_render(m) for m in to_summarize))
    return ModelRequest(model=model, messages=[
        Message(id="summary-instructions", role="system", content=policy.summary_prompt),
        Message(id="summary-input", role="user", content="\n\n".join(parts)),
    ])


class SummaryResult(NamedTuple):
    text: str
    model: str
    usage: Usage


class Summarizer(Protocol):
    """Answers a summary request. The loop's edge to a model for compaction (verified replay
    passes one that answers from the recorded `ContextCompacted` events)."""

    async def summarize(self, model: Any, request: ModelRequest) -> SummaryResult: ...


class ModelSummarizer:
    """A `Summarizer` that streams the request through a model from the registry."""

    def __init__(self, models: Any) -> None:
        self.models = models

    async def summarize(self, model: Any, request: ModelRequest) -> SummaryResult:
        async with closing_stream(self.models.resolve(model).stream(request)) as chunks:
            async for chunk in chunks:
                if type(chunk) is ModelDone:
                    r = chunk.response
                    return SummaryResult(r.text, r.model, r.usage)

        raise ModelProtocolError(f"model {request.model!r} ended its stream without a summary")


class RecordedSummaries:
    """A `Summarizer` answering from recorded `ContextCompacted` events, in order (verified
    replay: the summary is an input from the log, like a model's answer)."""

    def __init__(self, recorded: Sequence[ContextCompacted]) -> None:
        self._recorded = list(recorded)

    async def summarize(self, model: Any, request: ModelRequest) -> SummaryResult:
        if not self._recorded:
            from agentlog.runtime.models.base import ModelError

            raise ModelError("replay: the run asks for a summary the recording does not have")
        ev = self._recorded.pop(0)
        return SummaryResult(ev.summary, ev.model or request.model, ev.usage)
