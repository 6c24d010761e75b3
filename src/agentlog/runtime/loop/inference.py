"""Inference for the run loop: the model call with retries and fallbacks, streamed live.

`_infer` owns the retry policy (a self-retrying model is asked for single attempts, so retries
never multiply), `_stream` publishes text / tool-call deltas to the live sink under the message
id the commit will carry. Separate so the loop's retry policy has one home (the context
summarizer, called from the driver's `_compact`, does not retry).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from agentlog.runtime.loop.staging import StagingBase
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
)
from agentlog.runtime.models.pricing import prices_of


class Inference(StagingBase):
    """RunLoop's model calls (a part of `agentlog.runtime.loop.driver.RunLoop`)."""

    async def _infer(self, request: ModelRequest) -> ModelResponse:
        """Primary model with retries of retryable errors, then each fallback model in turn."""
        retry = self.spec.retry
        spec = self.spec
        names: list[Any] = [request.model if request.model != spec.model_name else spec.model]
        if spec.pool is not None:  # the run's model (recorded at its start), then the rest of the pool
            names += [m for m in spec.pool.order(self.ctx.model) if m != names[0]]
        else:
            names += spec.fallback_models
        last: ModelError | None = None
        for name in names:
            resolved = self.models.resolve(name)
            model = resolved.single_attempt() if isinstance(resolved, SelfRetrying) else resolved  # one retry policy
            req = request if name is names[0] else msgspec.structs.replace(request, model=str(name))
            for attempt in range(retry.max_attempts):
                try:
                    response = await self._stream(model, req)
                    if response.cost is None and (prices := prices_of(resolved)) is not None:
                        response = msgspec.structs.replace(response, cost=prices.cost(response.usage))
                    return response
                except ContextOverflow:
                    raise  # the loop compacts and asks again: another model or attempt won't help
                except ModelError as exc:
                    last = exc
                    self.log.warning("model.failed", model=req.model, attempt=attempt + 1, error=str(exc))
                    if not exc.retryable:
                        break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a broken model is a model error, not a crash
                    last = ModelError(f"model {req.model!r} failed: {type(exc).__name__}: {exc}")
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
        mid = self._streaming_message_id or self.entropy.new_id()
        self._streaming_message_id = None if take else mid
        return mid

    async def _stream(self, model: Any, request: ModelRequest) -> ModelResponse:
        live_on = self._live_on
        step = self.ctx.step
        for_live = (self.ctx.thread_id, self.ctx.run_id)
        # the thread seq every delta of this inference follows: a listener merging deltas with
        # the log holds them until its log follow has reached it (see agentlog.gateway.adapters.source)
        seq = self.version
        async for chunk in model.stream(request):
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
