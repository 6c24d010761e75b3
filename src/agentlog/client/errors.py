"""Typed errors of the agentlog client: one class per family of the API's error codes.

The API answers every failure with `{"error": message, "code": machine_code[, "detail"][, "run_id"]}`
and an HTTP status (`agentlog.gateway.operations.errors`); the client raises the class of that
status's family, with `.code` (the machine code, e.g. `run_not_found`), `.status`, `.message`,
`.detail` and `.run_id` (the run the error concerns), so callers catch a family (`except
NotFound`) and branch on the code when they need to:

    try:
        run = await client.runs.get(run_id)
    except NotFound:
        ...

`STATUS_BY_CODE` lists the codes the API can answer and their status (a test keeps it equal to the
server's table), so an error that arrives without a status (an SSE `error` frame in the middle of a
stream) still gets its family. Nothing here imports the server: `agentlog.client` stays light.
"""

from __future__ import annotations

import json
from typing import Any

#: The API's error codes and their HTTP status (the server's `agentlog.gateway.operations.errors.STATUS_BY_CODE`,
#: plus the codes the gateway answers itself: auth, tenancy, unknown routes, bodies too large).
STATUS_BY_CODE: dict[str, int] = {
    # 400: the request is wrong
    "invalid_id": 400, "invalid_commit": 400, "invalid_patch": 400, "invalid_tool_arguments": 400,
    "invalid_decision": 400, "unknown_call": 400, "invalid_input": 400, "override_not_allowed": 400,
    "invalid_command": 400,
    "invalid_json": 400, "invalid_event_id": 400, "min_seq_ahead": 400, "command_rejected": 400,
    "bad_request": 400,
    # 401 / 403: who asks
    "unauthorized": 401, "forbidden": 403, "tenant_mismatch": 403, "tenant_scoped_token": 403,
    # 404: nothing by that id (or not visible to this token)
    "run_not_found": 404, "thread_not_found": 404, "agent_not_found": 404, "not_found": 404,
    # 405
    "method_not_allowed": 405,
    # 409: the resource is not in a state that allows it
    "version_conflict": 409, "run_conflict": 409, "run_not_waiting": 409, "call_not_suspended": 409,
    "run_finished": 409, "thread_exists": 409, "app_mismatch": 409, "verify_unavailable": 409,
    # 413
    "commit_too_large": 413, "command_too_large": 413, "too_large": 413,
    # 415
    "unsupported_media_type": 415,
    # 500 / 503: the server (503: retry later, `Retry-After`)
    "internal": 500, "command_failed": 500,
    "store_unavailable": 503, "projection_timeout": 503, "listing_busy": 503, "dispatch_timeout": 503,
    "max_deliveries": 503,
}


class ClientError(Exception):
    """Base of every error the client raises. `code` is a machine code; `status` the HTTP status
    (None when no answer came: `ConnectionFailed`); `run_id` the run the error concerns, when
    there is one (the API's `run_id` field; for a start, the run id the client chose)."""

    code: str = "client_error"
    status: int | None = None

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None,
                 detail: Any = None, run_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.detail = detail
        self.run_id = run_id

    def __str__(self) -> str:
        return self.message


class ApiError(ClientError):
    """The API answered with an error. Subclasses are the families below, by status."""

    status: int | None = 500


class InvalidRequest(ApiError):
    """400: the request is malformed (bad id, body, decision, event id); `detail` names the fields."""

    status = 400


class Unauthorized(ApiError):
    """401: no or unknown bearer token (`get_client(token=...)`)."""

    status = 401


class Forbidden(ApiError):
    """403: the token may not do this (another tenant's resource, a tenant token without a scope)."""

    status = 403


class NotFound(ApiError):
    """404: no run, thread or agent by that id (or not visible to this token); or no such route."""

    status = 404


class MethodNotAllowed(ApiError):
    """405: the route exists but not with this method (an older or newer server)."""

    status = 405


class Conflict(ApiError):
    """409: not possible in the resource's current state (the run is not waiting, the call was
    already decided, another writer went first, ...)."""

    status = 409


class TooLarge(ApiError):
    """413: the body or the commit it would make is over the server's limit."""

    status = 413


class UnsupportedMediaType(ApiError):
    """415: the body is not JSON."""

    status = 415


class ServerError(ApiError):
    """500 (and other 5xx but 503): a failure on the server; its logs have the details."""

    status = 500


class Unavailable(ApiError):
    """503: NATS, the views or the workers did not answer in time (`retry_after`: when to try
    again). A start no worker took in time (`dispatch_timeout`) was withdrawn and will not run,
    so starting it again is safe (`runs.create` does, with the same run id); a decision is
    recorded once per decision id however often it is sent."""

    status = 503
    retry_after: float | None = None


class ConnectionFailed(ClientError):
    """No answer: the server is not reachable at the client's URL, or the connection broke (a
    stream that could not be resumed)."""

    code = "connection_failed"


_FAMILIES: dict[int, type[ApiError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
    409: Conflict, 413: TooLarge, 415: UnsupportedMediaType, 500: ServerError, 503: Unavailable,
}


def family(status: int) -> type[ApiError]:
    """The error class of an HTTP status (other 4xx: `InvalidRequest`; other 5xx: `ServerError`)."""
    found = _FAMILIES.get(status)
    if found is not None:
        return found
    return InvalidRequest if 400 <= status < 500 else ServerError


def api_error(status: int | None, payload: bytes | str | dict[str, Any] | None, *,
              reason: str = "error", retry_after: str | None = None) -> ApiError:
    """The typed error of an API answer (`status`, the JSON error body); `status=None` (an SSE
    error frame) takes the status of the body's code."""
    doc: Any = payload
    if isinstance(payload, (bytes, str)):
        try:
            doc = json.loads(payload) if payload else {}
        except ValueError:
            doc = {}
    doc = doc if isinstance(doc, dict) else {}
    code = str(doc.get("code") or (f"http_{status}" if status else "internal"))
    if status is None:
        status = STATUS_BY_CODE.get(code, 500)
    cls = family(status)
    run_id = doc.get("run_id")
    error = cls(str(doc.get("error") or reason), code=code, status=status, detail=doc.get("detail"),
                run_id=run_id if isinstance(run_id, str) else None)
    if isinstance(error, Unavailable) and retry_after:
        try:
            error.retry_after = float(retry_after)
        except ValueError:
            pass
    return error


__all__ = [
    "STATUS_BY_CODE", "ApiError", "ClientError", "Conflict", "ConnectionFailed", "Forbidden", "InvalidRequest",
    "MethodNotAllowed", "NotFound", "ServerError", "TooLarge", "Unauthorized", "Unavailable",
    "UnsupportedMediaType", "api_error", "family",
]
