"""One place that turns failures into `{"error": message, "code": machine_code}` answers.

Handlers raise; they never build error responses. The middleware maps:
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

import nats.errors
import structlog
from aiohttp import web
from pydantic import ValidationError

from agentlog.log.errors import AgentlogError, InvalidId

log = structlog.get_logger("agentlog.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_ID = web.RequestKey("agentlog.request_id", str)

#: Status of every agentlog error code the API knows; unknown codes fall back by class.
STATUS_BY_CODE: dict[str, int] = {
    "invalid_id": 400,
    "invalid_commit": 400,
    "invalid_patch": 400,
    "invalid_tool_arguments": 400,
    "version_conflict": 409,
    "run_conflict": 409,
    "commit_too_large": 413,
    "command_too_large": 413,
    "run_not_found": 404,
    "store_unavailable": 503,
    "projection_timeout": 503,
    "listing_busy": 503,
    # write side (agentlog.runtime.hitl, agentlog.api.dispatch)
    "invalid_decision": 400,
    "unknown_call": 400,
    "invalid_input": 400,
    "invalid_command": 400,
    "invalid_json": 400,
    "run_not_waiting": 409,
    "call_not_suspended": 409,
    "run_finished": 409,
    "agent_not_found": 404,
    "thread_not_found": 404,
    "dispatch_timeout": 503,
    # a worker dead-lettered the command (agentlog.runtime.worker): its code, or these
    "command_rejected": 400,
    "command_failed": 500,
    "max_deliveries": 503,
}

_HTTP_CODES: dict[int, str] = {
    400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """An error answer decided by the gateway: status, machine code, message, optional detail."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.headers = headers or {}


def not_found(kind: str, ident: str) -> ApiError:
    """Unknown, deleted and other-tenant resources all look the same: nothing leaks."""
    return ApiError(404, f"{kind}_not_found", f"{kind} {ident!r} not found")


def error_body(message: str, code: str, detail: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": message, "code": code}
    if detail is not None:
        body["detail"] = detail
    return body


def validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    """Field-level detail that is always JSON (pydantic's `ctx` may hold exception objects)."""
    return [
        {"field": ".".join(str(p) for p in err["loc"]) or None, "message": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False)
    ]


def status_of(exc: AgentlogError) -> int:
    status = STATUS_BY_CODE.get(exc.code)
    if status is not None:
        return status
    if isinstance(exc, ValueError):
        return 400
    if isinstance(exc, LookupError):
        return 404
    return 500


def _json_error(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def answer(exc: BaseException, ids: dict[str, Any] | None = None) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """(status, JSON body, extra headers) for `exc`, for any transport (HTTP here, the NATS
    micro service too); logged when it is our fault, with `ids` bound."""
    ids = ids or {}
    if isinstance(exc, ApiError):
        return exc.status, error_body(exc.message, exc.code, exc.detail), exc.headers
    if isinstance(exc, ValidationError):
        return 400, error_body("invalid input", "invalid_input", validation_detail(exc)), None
    if isinstance(exc, InvalidId):
        detail = [{"field": exc.kind, "message": str(exc), "type": "invalid_id"}]
        return 400, error_body(str(exc), exc.code, detail), None
    if isinstance(exc, AgentlogError):
        status = status_of(exc)
        if status >= 500:
            log.warning("request failed", status=status, code=exc.code, error=str(exc), **ids)
        headers = {"Retry-After": "1"} if status == 503 else None
        return status, error_body(str(exc), exc.code), headers
    if isinstance(exc, nats.errors.Error):  # a KV/JetStream call outside the store's own mapping
        log.warning("NATS unavailable", error=str(exc) or type(exc).__name__, **ids)
        return (503, error_body(f"NATS unavailable: {exc or type(exc).__name__}", "store_unavailable"),
                {"Retry-After": "1"})
    if isinstance(exc, web.HTTPException):
        code = _HTTP_CODES.get(exc.status, "http_error")
        return exc.status, error_body(exc.reason or code, code), None
    log.error("unhandled error", exc_info=exc, **ids)
    return 500, error_body("internal error", "internal"), None


def to_response(exc: BaseException, request: web.Request) -> web.Response:
    """The JSON answer for `exc` (logged when it is our fault)."""
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


__all__ = ["ApiError", "answer", "STATUS_BY_CODE", "error_middleware", "error_body", "not_found", "to_response"]
