"""Logging that can never end a run: the `SafeLog` wrapper and the lazy `get_logger`.

Its own module because every part of the runtime logs (the loop's driver, staging, inference,
the runtime facade, the worker) and none of them should import the loop for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog


class SafeLog:
    """A structlog logger whose failures (a closed stream, a broken processor) are swallowed:
    logging is a side channel and must never end a run."""

    __slots__ = ("_log",)

    def __init__(self, log: Any) -> None:
        self._log = log

    def bind(self, **kw: Any) -> SafeLog:
        return SafeLog(self._log.bind(**kw))

    def __getattr__(self, level: str) -> Callable[..., None]:
        method = getattr(self._log, level)

        def call(*args: Any, **kw: Any) -> None:
            try:
                method(*args, **kw)
            except Exception:  # noqa: BLE001
                pass

        return call


def get_logger(name: str = "agentlog.runtime", **bind: Any) -> SafeLog:
    """A lazy logger: `structlog.get_logger` with initial values resolves the configuration at
    the first log call, so a module-level logger created at import still honours the logging
    set up later by the CLI or the server (calling `.bind()` here would freeze it at import)."""
    return SafeLog(structlog.get_logger(name, **bind))

