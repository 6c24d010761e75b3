"""The one place agentlog configures logging (every CLI command, `serve`/`gateway`/`worker`).

Rules: logs always go to stderr, so stdout stays clean for data and `--json`; JSON lines when
stderr is not a terminal or `AGENTLOG_LOG_FORMAT=json` (what log collectors want), the console
renderer on a terminal (`AGENTLOG_LOG_FORMAT=console` forces it).

Why the chain is installed into structlog's existing processor list and ends by writing to stderr
itself: a structlog logger that is *bound* before configuration (`structlog.get_logger().bind()`
at import, as `runtime`'s module-level loggers do) keeps the processor list, the wrapped logger
(a `PrintLogger` on stdout) and the level filter that existed at that moment. Replacing the
config would leave such loggers printing info lines on stdout, in the middle of `--json` output,
whenever `runtime` happens to be imported before this runs. Mutating the list they hold makes
them run this chain too; its last step (`_write_stderr`) writes the rendered line to the current
`sys.stderr` and drops the event, so the stale stdout logger is never reached, and `_LevelFilter`
applies the level that their stale wrapper does not. `cache_logger_on_first_use=False` lets later
reconfiguration (tests, `--log-level`) reach lazily created loggers as well.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, Literal

import structlog

FORMAT_ENV = "AGENTLOG_LOG_FORMAT"
Format = Literal["json", "console"]

_LEVELS = logging.getLevelNamesMapping()
_state: dict[str, int] = {"level": logging.WARNING}


def level_number(level: str | int) -> int:
    """`"info"` -> 20; ValueError for a name logging does not know."""
    if isinstance(level, int):
        return level
    number = _LEVELS.get(level.upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}")
    return number


def current_level() -> int:
    return _state["level"]


def choose_format(fmt: str | None = None) -> Format:
    """Explicit argument, else $AGENTLOG_LOG_FORMAT, else json unless stderr is a terminal."""
    chosen = (fmt or os.environ.get(FORMAT_ENV) or "").strip().lower()
    if chosen == "json":
        return "json"
    if chosen == "console":
        return "console"
    if chosen:
        raise ValueError(f"unknown log format {chosen!r} (json or console)")
    return "console" if _isatty(sys.stderr) else "json"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _LevelFilter:
    """Drop events below the configured level (read at call time, see `quiet`)."""

    def __call__(self, _logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        number = _LEVELS.get(method.upper(), logging.INFO) if method != "exception" else logging.ERROR
        if number < _state["level"]:
            raise structlog.DropEvent
        return event


def _write_stderr(_logger: Any, _method: str, rendered: Any) -> Any:
    """Write the rendered line to whatever `sys.stderr` is now (CliRunner swaps it), then stop."""
    try:
        print(rendered, file=sys.stderr, flush=True)
    except (ValueError, OSError):  # a closed stream: logging must never break the caller
        pass
    raise structlog.DropEvent


def configure(level: str | int = "warning", fmt: str | None = None) -> None:
    """Configure structlog for this process (idempotent; later calls win, for every logger)."""
    number = level_number(level)
    chosen = choose_format(fmt)
    renderer: Any
    if chosen == "json":
        renderer = structlog.processors.JSONRenderer()
        stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
        extra: list[Any] = [structlog.processors.format_exc_info]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(sys.stderr))
        stamp = structlog.processors.TimeStamper(fmt="%H:%M:%S")
        extra = []
    chain = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _LevelFilter(),
        stamp,
        *extra,
        renderer,
        _write_stderr,
    ]
    _state["level"] = number
    processors = structlog.get_config()["processors"]
    if isinstance(processors, list):
        processors[:] = chain  # the very list early-bound loggers hold (module docstring)
    else:
        processors = chain
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.ReturnLoggerFactory(),
        cache_logger_on_first_use=False,
    )


@contextmanager
def quiet(level: int = logging.CRITICAL) -> Iterator[None]:
    """Raise the level for a block (e.g. replay's re-executed loop, whose logs are noise beside
    its report); applies to early-bound loggers too."""
    saved_level, saved = _state["level"], structlog.get_config()
    _state["level"] = max(level, saved_level)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(_state["level"]))
    try:
        yield
    finally:
        _state["level"] = saved_level
        structlog.configure(**saved)


__all__ = ["FORMAT_ENV", "choose_format", "configure", "current_level", "level_number", "quiet"]
