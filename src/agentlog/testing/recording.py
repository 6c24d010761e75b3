"""`RecordingModel`: a model wrapper that keeps every completed inference's request, for tests
and for verifying logs written before `InferenceCompleted.request_digest` existed."""

from __future__ import annotations

from collections.abc import AsyncIterator

from agentlog.runtime.models.base import Model, ModelChunk, ModelDone, ModelRequest, closing_stream


class RecordingModel:
    """Wraps a model and keeps the request of every inference that completed, in order.

    For logs without `InferenceCompleted.request_digest`, and for tests that want the full
    request in the error: pass `requests=recorder.requests` to `verify_run` (a recorded digest
    still decides; the full request only names what differs)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        async with closing_stream(self.inner.stream(request)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, ModelDone):
                    self.requests.append(request)
                yield chunk
