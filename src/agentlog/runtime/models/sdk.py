"""What the provider classes on official SDKs share: importing an optional SDK, mapping its
errors onto the `Model` contract's typed errors, and parsing streamed tool arguments.

The SDKs are optional extras (`anthropic`, `openai`, `gemini`), imported when a model first makes
a client, so `import agentlog` works without them. `SdkSetup` says what a model still lacks (the
SDK, a key) before that: the servers check it at start (`agentlog.runtime.models.setup`). A
missing SDK is named with the command that installs it (`agentlog.runtime.models.extras.install_hint`).

Error mapping (the run loop's retry policy reads `retryable` and `retry_after`): 429 ->
`ModelRateLimited` (retryable, with the provider's `retry-after`), 5xx / 529 / connection errors /
timeouts -> `ModelUnavailable` (retryable), 401/403 -> `ModelAuthError`, a 400 saying the prompt
is too long -> `ContextOverflow`, any other 4xx -> `ModelRequestRejected`. The SDKs' own retries
are switched off (`max_retries=0`): the loop owns retries, so they never multiply.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentlog.eventlog.events import Message
from agentlog.runtime.models.base import (
    ContextOverflow,
    ModelAuthError,
    ModelChunk,
    ModelError,
    ModelProtocolError,
    ModelRateLimited,
    ModelRequestRejected,
    ModelUnavailable,
    looks_like_overflow,
)
from agentlog.runtime.models.extras import install_hint
from agentlog.runtime.models.openai import retry_after_from

__all__ = [
    "ClientPerLoop", "SdkSetup", "call_names", "installed", "sdk_setup", "client_options", "derived_call_id", "guarded", "import_sdk", "map_sdk_error", "map_status_error",
    "parse_arguments", "system_text",
]

_EXCERPT = 300


def import_sdk(module: str, extra: str) -> Any:
    """Import an optional provider SDK, or fail with a message naming the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModelRequestRejected(f"this model needs the {module!r} package: {install_hint(extra)} ({exc})") from None


def installed(module: str) -> bool:
    """Is `module` importable (looked up, not imported)?"""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


@dataclass(frozen=True)
class SdkSetup:
    """What a model on a provider's SDK needs before its first request: the SDK (`module`, from
    agentlog's `extra`) and a key (from the argument or `key_env`), unless a `base_url` points it
    at another server (a proxy, a local one), which may take none."""

    module: str
    extra: str
    key_env: str
    has_key: bool
    base_url: str | None

    def problems(self) -> list[str]:
        """What is missing, each as one sentence that says how to fix it (empty: set up)."""
        found = []
        if not installed(self.module):
            found.append(f"the {self.module!r} package is not installed: {install_hint(self.extra)}")
        if not self.has_key and not self.base_url:
            found.append(f"{self.key_env} is not set")
        return found


def client_options(*, api_key: str | None, key_env: str, base_url: str | None, base_url_env: str,
                   timeout: float, headers: Mapping[str, str] | None) -> dict[str, Any]:
    """An Anthropic / OpenAI SDK client's keyword arguments: the key and base URL given, else from
    the provider's environment variables; the SDK's own retries off (the run loop owns retries)."""
    key = api_key if api_key is not None else os.environ.get(key_env)
    options: dict[str, Any] = {"api_key": key or "unset", "max_retries": 0, "timeout": timeout,
                               "default_headers": dict(headers or {})}
    if base_url := base_url or os.environ.get(base_url_env):
        options["base_url"] = base_url
    return options


def sdk_setup(options: Mapping[str, Any], module: str, extra: str, key_env: str) -> SdkSetup:
    """The `SdkSetup` of a client made with `options` (from `client_options`)."""
    return SdkSetup(module, extra, key_env, has_key=options.get("api_key") not in (None, "", "unset"),
                    base_url=options.get("base_url"))


def map_status_error(status: int, message: str, headers: Mapping[str, str] | None = None,
                     *, code: str | None = None, where: str = "") -> ModelError:
    """A provider's HTTP error status (and message / error code) as a typed model error."""
    text = f"{where}HTTP {status}: {message[:_EXCERPT]}"
    err: ModelError
    if status == 429:
        err = ModelRateLimited(text)
    elif status >= 500:
        err = ModelUnavailable(text)
    elif status in (401, 403):
        return ModelAuthError(text)
    elif (code or "") == "context_length_exceeded" or status == 413 or looks_like_overflow(message):
        return ContextOverflow(text)
    else:
        return ModelRequestRejected(text)
    assert isinstance(err, ModelUnavailable)
    err.status = status
    err.retry_after = retry_after_from(headers or {})
    return err


def map_sdk_error(exc: BaseException, where: str = "") -> ModelError:
    """An exception of the openai or anthropic SDK (same shapes: `APIStatusError` with
    `status_code` and `response`, `APIConnectionError`, `APITimeoutError`) as a model error."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        body = getattr(exc, "body", None)
        code = None
        if isinstance(body, dict):
            inner = body.get("error", body)
            if isinstance(inner, dict):
                code = inner.get("code") or inner.get("type")
        return map_status_error(status, str(getattr(exc, "message", exc)), headers,
                                code=code if isinstance(code, str) else None, where=where)
    name = type(exc).__name__
    if name in ("APIConnectionError", "APITimeoutError") or isinstance(exc, (TimeoutError, ConnectionError)):
        return ModelUnavailable(f"{where}{name}: {exc}")
    if name == "APIResponseValidationError" or isinstance(exc, (ValueError, KeyError, TypeError)):
        return ModelProtocolError(f"{where}unreadable answer ({name}: {exc})")
    return ModelUnavailable(f"{where}{name}: {exc}")


def parse_arguments(raw: str, name: str) -> dict[str, Any]:
    """Streamed tool arguments (JSON text) as an object, or a protocol error naming the tool."""
    try:
        value = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as err:
        raise ModelProtocolError(f"arguments of tool call {name!r} are not valid JSON ({err}): {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise ModelProtocolError(f"arguments of tool call {name!r} are not a JSON object: {raw[:200]!r}")
    return value


class ClientPerLoop:
    """One SDK client per event loop: an SDK's HTTP pool belongs to the loop that opened its
    connections, and a model object may outlive a loop (a test's, a CLI command's)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = self._factory(), loop
        return self._client

    async def aclose(self) -> None:
        client, self._client, self._loop = self._client, None, None
        aio = getattr(client, "aio", None)  # google-genai: the async half has its own close
        close = getattr(aio, "aclose", None) or getattr(client, "close", None) or getattr(client, "aclose", None)
        if close is not None:
            result = close()
            if inspect.isawaitable(result):
                await result


async def guarded(chunks: AsyncIterator[ModelChunk], where: str,
                  mapper: Callable[[BaseException, str], ModelError] | None = None) -> AsyncIterator[ModelChunk]:
    """A provider's chunks with its SDK's exceptions mapped to model errors (by `mapper`, default
    `map_sdk_error`). A failure after output went out live is not retryable: a retry would
    stream it twice."""
    yielded = False
    try:
        async for chunk in chunks:
            yield chunk
            yielded = True
    except ModelError as exc:
        if yielded:
            exc.retryable = False
        raise
    except Exception as exc:  # noqa: BLE001 - the SDK's errors, whatever their class
        err = (mapper or map_sdk_error)(exc, where)
        if yielded:
            err.retryable = False
        raise err from exc


def derived_call_id(*parts: object) -> str:
    """A stable tool call id for providers that send none (the same answer gives the same id)."""
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:24]
    return f"call_{digest}"


def system_text(messages: list[Message]) -> str:
    return "\n\n".join(m.content for m in messages if m.role == "system" and m.content)


def call_names(messages: list[Message]) -> dict[str, str]:
    """Tool call id -> tool name, for providers whose tool results name the tool."""
    return {c.id: c.name for m in messages for c in (m.tool_calls or ())}
