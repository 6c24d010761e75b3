"""Inference for the run loop: the model call with retries and fallbacks, streamed live, and
the context compaction that makes the request fit.

`_infer` owns the retry policy (a self-retrying model is asked for single attempts, so retries
never multiply), `_stream` publishes text / tool-call deltas to the live sink under the message
id the commit will carry. Separate so the loop's retry policy has one home (the context
summarizer, called from `compact`, does not retry).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec

from agentlog.eventlog.events import (
    CircuitBreakerChanged,
    ContextCompacted,
    InferenceCompleted,
    InferenceReplaced,
    Message,
    MessageAppended,
)
from agentlog.runtime.agents.spec import ModelRegistry
from agentlog.runtime.context_policy import (
    Summarizer,
    context_tokens,
    overflow_policy,
    plan_summary,
    summary_request,
)
from agentlog.runtime.live import LiveSink
from agentlog.runtime.loop.active_agent import ActiveAgent
from agentlog.runtime.loop.decisions import build_request, digest_of, part_digests_of
from agentlog.runtime.loop.run_context import replaced_answer
from agentlog.runtime.loop.staging import Staging
from agentlog.runtime.models.base import (
    ContextOverflow,
    ModelDone,
    ModelError,
    ModelProtocolError,
    ModelRequest,
    ModelResponse,
    ReasoningDelta,
    SelfRetrying,
    TextDelta,
    ToolCallDelta,
    closing_stream,
)
from agentlog.runtime.models.breaker import Breakers, CircuitOpen, NoBreakers, counts_as_failure
from agentlog.runtime.models.pricing import prices_of
from agentlog.runtime.plugins import Action

#: The model name and stop reason of a replaced answer's response (`Inference._replaced`).
REPLACED = "replaced"


class Inference:
    """The run loop's model calls, staged through `staging` for the agent `agent` drives now."""

    def __init__(self, staging: Staging, agent: ActiveAgent, models: ModelRegistry, live: LiveSink,
                 summarizer: Summarizer, breakers: Breakers | None = None) -> None:
        self.staging = staging
        self.agent = agent
        self.models = models
        self.live = live
        self._live_on = live.enabled
        self.summarizer = summarizer
        #: The models' circuit breakers (`agentlog.runtime.models.breaker`).
        self.breakers: Breakers = breakers or NoBreakers()
        #: Breaker changes seen by the current inference, staged when it ends (`_stage_breakers`).
        self._breaker_changes: list[CircuitBreakerChanged] = []
        #: The id of the assistant message being streamed live (drawn at its first delta, see
        #: `_message_id`), so live deltas and the committed message share one id.
        self._streaming_message_id: str | None = None

    def drop_stream(self) -> None:
        """Nothing of the current stream gets committed: its message id is not kept."""
        self._streaming_message_id = None

    async def infer(self, specs: list[Any], actions: Sequence[Action]) -> ModelResponse:
        """One inference, staged (assistant message + `InferenceCompleted`). A provider refusing
        the request as too long (`ContextOverflow`) gets the conversation compacted once (a
        recorded `ContextCompacted`, reason "overflow") and the request sent again."""
        staging, spec = self.staging, self.agent.spec
        replaced = replaced_answer(staging.ctx)
        if replaced is not None:
            return self._replaced(replaced)
        entropy = staging.entropy
        request = self.agent.transform(build_request(spec, staging.ctx, specs, actions))
        t0 = entropy.now_ms()
        self._breaker_changes = []
        try:
            try:
                response = await staging.race(self._infer(request))
            except ContextOverflow as exc:
                self._streaming_message_id = None
                if not await self.compact(force=True):
                    raise
                staging.log.warning("inference.overflow_compacted", error=str(exc))
                request = self.agent.transform(build_request(self.agent.spec, staging.ctx, specs, actions))
                t0 = entropy.now_ms()
                response = await staging.race(self._infer(request))
        except ModelError:
            self._stage_breakers()  # with the run's error end
            raise
        self._stage_breakers()
        message = Message(
            id=self._message_id(take=True), role="assistant", content=response.text,
            tool_calls=list(response.tool_calls) or None, reasoning=list(response.reasoning) or None,
        )
        staging.emit(MessageAppended(message=message))
        staging.emit(InferenceCompleted(
            model=response.model, usage=response.usage, duration_ms=entropy.now_ms() - t0,
            stop_reason=response.stop_reason, message_id=message.id,
            request_digest=digest_of(request), request_digests=part_digests_of(request), cost=response.cost,
        ))
        return response

    def _replaced(self, answer: Message) -> ModelResponse:
        """The step's answer given in advance (`RunStarted.answers`), staged as the model's would
        be (the assistant message, under an id drawn like any) but recorded as replaced
        (`InferenceReplaced`): no model is asked, nothing is streamed live."""
        staging = self.staging
        calls = list(answer.tool_calls or ())
        message = Message(id=self._message_id(take=True), role="assistant", content=answer.content,
                          tool_calls=calls or None)
        staging.emit(MessageAppended(message=message))
        staging.emit(InferenceReplaced(message_id=message.id, step=staging.ctx.step))
        return ModelResponse(model=REPLACED, text=answer.content, tool_calls=calls, stop_reason=REPLACED)

    async def compact(self, *, force: bool = False) -> bool:
        """Context compaction (`agentlog.runtime.context_policy`): when the agent's policy asks for a summary
        now, get one and stage it as `ContextCompacted` (it commits with the inference, so a
        resume or replay folds it and sends the same context). A failed summary is logged and
        the step goes on with truncation only."""
        staging, spec = self.staging, self.agent.spec
        ctx = staging.ctx
        policy = spec.context
        if force:
            policy = overflow_policy(policy, ctx.messages, ctx.compaction)
        elif policy is None or not policy.summarize:
            return False
        older = plan_summary(policy, ctx.messages, ctx.compaction)
        if older is None:
            return False
        model = policy.summary_model or spec.model
        name = model if isinstance(model, str) else spec.model_name
        request = summary_request(policy, name, older, ctx.compaction)
        try:
            res = await staging.race(self.summarizer.summarize(model, request))
        except ModelError as exc:
            staging.log.warning("context.summary_failed", error=str(exc))
            return False
        ctx = staging.ctx
        before = context_tokens(policy, ctx.messages, ctx.compaction)
        event = ContextCompacted(summary=res.text, upto_message_id=older[-1].id, model=res.model, usage=res.usage,
                                 tokens_before=before, reason="overflow" if force else None)
        after = context_tokens(policy, ctx.messages, event)
        staging.emit(msgspec.structs.replace(event, tokens_after=after))
        staging.log.info("context.compacted", upto=event.upto_message_id, tokens_before=before, tokens_after=after)
        return True


    def _stage_breakers(self) -> None:
        """Record the circuit-breaker changes of this inference (as the breakers settle them:
        replay's answer from the log)."""
        for change in self.breakers.settle(self._breaker_changes):
            self.staging.emit(change)
            self.staging.log.warning("model.circuit_breaker", model=change.model, state=change.state,
                                     failures=change.failures)
        self._breaker_changes = []

    async def _infer(self, request: ModelRequest) -> ModelResponse:
        """Primary model with retries of retryable errors, then each fallback model in turn; a
        model whose circuit breaker is open is skipped (`CircuitOpen`)."""
        retry = self.agent.spec.retry
        spec = self.agent.spec
        names: list[Any] = [request.model if request.model != spec.model_name else spec.model]
        if spec.pool is not None:  # the run's model (recorded at its start), then the rest of the pool
            names += [m for m in spec.pool.order(self.staging.ctx.model) if m != names[0]]
        else:
            names += spec.fallback_models
        last: ModelError | None = None
        breakers, changes = self.breakers, self._breaker_changes
        for name in names:
            key = name if isinstance(name, str) else spec.model_name
            admitted, seen = breakers.admit(key)
            changes += seen
            if not admitted:
                last = CircuitOpen(f"model {key!r} is not asked: its circuit breaker is open")
                self.staging.log.warning("model.skipped", model=key, reason="circuit_open")
                continue
            resolved = self.models.resolve(name)
            model = resolved.single_attempt() if isinstance(resolved, SelfRetrying) else resolved  # one retry policy
            req = request if name is names[0] else msgspec.structs.replace(request, model=str(name))
            for attempt in range(retry.max_attempts):
                try:
                    response = await self._stream(model, req)
                    changes += breakers.report(key, True)
                    if response.cost is None and (prices := prices_of(resolved)) is not None:
                        response = msgspec.structs.replace(response, cost=prices.cost(response.usage))
                    return response
                except ContextOverflow:
                    raise  # the loop compacts and asks again: another model or attempt won't help
                except ModelError as exc:
                    last = exc
                    self.staging.log.warning("model.failed", model=req.model, attempt=attempt + 1, error=str(exc))
                    opened = breakers.report(key, False) if counts_as_failure(exc) else []
                    changes += opened
                    if not exc.retryable or opened:  # an open breaker: on to the fallbacks
                        break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a broken model is a model error, not a crash
                    last = ModelError(f"model {req.model!r} failed: {type(exc).__name__}: {exc}")
                    changes += breakers.report(key, False)
                    break
                if attempt + 1 < retry.max_attempts:
                    delay = retry.delay_s(attempt + 1, getattr(last, "retry_after", None))
                    await asyncio.sleep(delay)  # backoff between provider attempts, not synchronisation
        assert last is not None
        raise last

    def _message_id(self, *, take: bool = False) -> str:
        """The assistant message id of this inference: drawn once, at the first live delta (so
        the deltas carry the id the commit will have: AG-UI / AI SDK clients then see one
        message, not a provisional one and the committed one) or at the commit. The draw happens
        in the same entropy order as before (nothing else draws ids during inference), so
        recorded logs replay unchanged; `take` hands it to the commit and resets."""
        mid = self._streaming_message_id or self.staging.entropy.new_id()
        self._streaming_message_id = None if take else mid
        return mid

    async def _stream(self, model: Any, request: ModelRequest) -> ModelResponse:
        live_on = self._live_on
        step = self.staging.ctx.step
        for_live = (self.staging.ctx.thread_id, self.staging.ctx.run_id)
        # the thread seq every delta of this inference follows: a listener merging deltas with
        # the log holds them until its log follow has reached it (see agentlog.gateway.adapters.source)
        seq = self.staging.version
        async with closing_stream(model.stream(request)) as chunks:
            async for chunk in chunks:
                t = type(chunk)
                if t is ModelDone:
                    return chunk.response
                if live_on:
                    if t is TextDelta:
                        self.live.publish(*for_live, {"type": "text_delta", "step": step, "text": chunk.text,
                                                      "message_id": self._message_id(), "seq": seq})
                    elif t is ReasoningDelta:
                        self.live.publish(*for_live, {"type": "reasoning_delta", "step": step, "text": chunk.text,
                                                      "message_id": self._message_id(), "seq": seq})
                    elif t is ToolCallDelta:
                        self.live.publish(*for_live, {
                            "type": "tool_call_delta", "step": step, "index": chunk.index,
                            "message_id": self._message_id(), "seq": seq,
                            "call_id": chunk.call_id, "name": chunk.name, "arguments_delta": chunk.arguments_delta,
                        })
        raise ModelProtocolError(f"model {request.model!r} ended its stream without a final response")
