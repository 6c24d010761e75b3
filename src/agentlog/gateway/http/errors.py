"""One place that turns failures into `{"error": message, "code": machine_code}` HTTP answers.

Handlers raise; they never build error responses. The middleware maps (`agentlog.gateway.operations.errors.answer`
for everything but aiohttp's own exceptions, the same answer the NATS service gives):
* `ApiError` (raised by the gateway itself: auth, not found, bad body) as it says;
* pydantic `ValidationError` -> 400 `invalid_input` with per-field `detail`;
* agentlog errors by their `.code` (the log, projections and runtime all use it), so a new
  error class only needs a code, never a change here, unless its status is not the default;
* nats-py errors from KV reads (the views) -> 503 `store_unavailable`, like the store's own;
* aiohttp's own `HTTPException`s (unknown route, 405, body over `client_max_size`) -> JSON too;
* anything else -> 500 `internal`, with the traceback logged and the request's ids bound, so a
  bug is visible in logs but the client never sees internals.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agentlog.gateway.operations.errors import (
    STATUS_BY_CODE,
    ApiError,
    answer,
    error_body,
    not_found,
    status_of,
    validation_detail,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_ID = web.RequestKey("agentlog.request_id", str)

_HTTP_CODES: dict[int, str] = {
    400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large",
    415: "unsupported_media_type",
}


def _json_error(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def to_response(exc: BaseException, request: web.Request) -> web.Response:
    """The JSON answer for `exc` (logged when it is our fault)."""
    if isinstance(exc, web.HTTPException):
        code = _HTTP_CODES.get(exc.status, "http_error")
        return _json_error(exc.status, error_body(exc.reason or code, code))
    status, body, headers = answer(exc, _ids(request))
    return _json_error(status, body, headers)


def _ids(request: web.Request) -> dict[str, Any]:
    ids: dict[str, Any] = {"method": request.method, "path": request.path,
                           "request_id": request.get(REQUEST_ID)}
    ids.update(request.match_info)
    return ids


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request[REQUEST_ID] = request.headers.get("X-Request-ID") or uuid.uuid4().hex
    try:
        response = await handler(request)
    except asyncio.CancelledError:
        raise
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like are answers, not errors
            raise
        response = to_response(exc, request)
    except Exception as exc:  # noqa: BLE001 - the one place every failure becomes an answer
        response = to_response(exc, request)
    if not response.prepared:
        response.headers["X-Request-ID"] = request[REQUEST_ID]
    return response


__all__ = ["ApiError", "answer", "STATUS_BY_CODE", "error_middleware", "error_body", "not_found", "status_of", "to_response",
           "validation_detail"]
