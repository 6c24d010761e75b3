"""Errors every transport answers the same way: `ApiError` (decided by the API itself) and
`answer`, which turns any failure into `(status, {"error": message, "code": machine_code}, headers)`.

* `ApiError` as it says;
* pydantic `ValidationError` -> 400 `invalid_input` with per-field `detail`;
* agentlog errors by their `.code` (the log, projections and runtime all use it), so a new
  error class only needs a code, never a change here, unless its status is not the default;
* nats-py errors from KV reads (the views) -> 503 `store_unavailable`, like the store's own;
* anything else -> 500 `internal`, with the traceback logged and the request's ids bound, so a
  bug is visible in logs but the client never sees internals.

The HTTP middleware (`agentlog.gateway.http.errors`) and the NATS service (`agentlog.gateway.nats.service`) both
use `answer`; HTTP adds aiohttp's own exceptions (unknown route, 405, body too large).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import nats.errors
import structlog
from pydantic import ValidationError

from agentlog.eventlog.errors import AgentlogError, InvalidId
from agentlog.eventlog.ids import is_valid_id

log = structlog.get_logger("agentlog.api")

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
    # write side (agentlog.runtime.loop.hitl, agentlog.gateway.operations.dispatch)
    "invalid_decision": 400,
    "unknown_call": 400,
    "invalid_input": 400,
    "override_not_allowed": 400,
    "invalid_command": 400,
    "invalid_json": 400,
    "run_not_waiting": 409,
    "call_not_suspended": 409,
    "run_finished": 409,
    "agent_not_found": 404,
    "thread_not_found": 404,
    "dispatch_timeout": 503,
    # a worker dead-lettered the command (agentlog.runtime.workers.worker): its code, or these
    "command_rejected": 400,
    "command_failed": 500,
    "max_deliveries": 503,
}

class ApiError(Exception):
    """An error answer decided by the gateway: status, machine code, message, optional detail,
    and the run it concerns (`run_id`), if any."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None,
                 headers: dict[str, str] | None = None, run_id: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.headers = headers or {}
        self.run_id = run_id


def not_found(kind: str, ident: str) -> ApiError:
    """Unknown, deleted and other-tenant resources all look the same: nothing leaks."""
    return ApiError(404, f"{kind}_not_found", f"{kind} {ident!r} not found",
                    run_id=ident if kind == "run" and is_valid_id(ident) else None)


@contextmanager
def about_run(run_id: str | None) -> Iterator[None]:
    """Errors raised inside say they concern run `run_id` (`AgentlogError.about_run`,
    `ApiError.run_id`), unless they already name a run; a malformed id is not one."""
    try:
        yield
    except AgentlogError as exc:
        if is_valid_id(run_id):
            exc.about_run(run_id)
        raise
    except ApiError as exc:
        if exc.run_id is None and is_valid_id(run_id):
            exc.run_id = run_id
        raise


def error_body(message: str, code: str, detail: Any = None, run_id: str | None = None) -> dict[str, Any]:
    """`{"error", "code"[, "detail"][, "run_id"]}`: `run_id` names the run the error concerns."""
    body: dict[str, Any] = {"error": message, "code": code}
    if detail is not None:
        body["detail"] = detail
    if run_id is not None:
        body["run_id"] = run_id
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


def answer(exc: BaseException, ids: dict[str, Any] | None = None) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """(status, JSON body, extra headers) for `exc`, for any transport (HTTP here, the NATS
    micro service too); logged when it is our fault, with `ids` bound."""
    ids = ids or {}
    if isinstance(exc, ApiError):
        return exc.status, error_body(exc.message, exc.code, exc.detail, exc.run_id), exc.headers
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
        fields = getattr(exc, "detail", None)  # e.g. `InvalidDecision`'s failing fields
        return status, error_body(str(exc), exc.code, fields if isinstance(fields, list) else None, exc.run_id), headers
    if isinstance(exc, nats.errors.Error):  # a KV/JetStream call outside the store's own mapping
        log.warning("NATS unavailable", error=str(exc) or type(exc).__name__, **ids)
        return (503, error_body(f"NATS unavailable: {exc or type(exc).__name__}", "store_unavailable"),
                {"Retry-After": "1"})
    log.error("unhandled error", exc_info=exc, **ids)
    return 500, error_body("internal error", "internal"), None


__all__ = ["ApiError", "STATUS_BY_CODE", "about_run", "answer", "error_body", "not_found", "status_of", "validation_detail"]
