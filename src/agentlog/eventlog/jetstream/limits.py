"""Stream limits that would silently drop commits, refused before anything runs.

JetStream enforces an operator's limits on the events stream (`nats stream edit`) by deleting
messages: `max_age` expires old commits whatever else is set, and `max_bytes` / `max_msgs` /
`max_msgs_per_subject` with `discard: old` delete the oldest commits to make room. Either way a
commit that was never archived is gone, and with it every run that needs it for resume or replay.
So a process refuses such a stream at start (`LossyStreamLimits`) instead of running on it. Size
limits with `discard: new` are fine: the stream then refuses new commits (appends fail with 503
`store_unavailable`) and keeps every old one; `agentlog retention` makes room by archiving.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentlog.eventlog.errors import AgentlogError

__all__ = ["LossyStreamLimits", "check_limits", "lossy_limits"]

_SIZE_LIMITS = ("max_bytes", "max_msgs", "max_msgs_per_subject")


class LossyStreamLimits(AgentlogError):
    code = "lossy_stream_limits"


def _set(value: Any) -> bool:
    return isinstance(value, int) and value > 0


def lossy_limits(config: Mapping[str, Any]) -> list[str]:
    """The limits of a stream config that make JetStream delete commits by itself."""
    found = []
    if _set(config.get("max_age")):
        found.append(f"max_age={config['max_age']}ns")
    if config.get("discard", "old") != "new":
        found.extend(f"{key}={config[key]}" for key in _SIZE_LIMITS if _set(config.get(key)))
    return found


def check_limits(stream: str, config: Mapping[str, Any]) -> None:
    """Raise `LossyStreamLimits` when the stream would drop commits on its own."""
    found = lossy_limits(config)
    if found:
        raise LossyStreamLimits(
            f"stream {stream} has limits that silently delete commits ({', '.join(found)}, discard "
            f"{config.get('discard', 'old')!r}): a deleted commit breaks resume and replay of its runs. "
            "Remove max_age and use discard=new for size limits (`nats stream edit "
            f"{stream} --discard new --max-age 0`), and archive old threads with `agentlog retention`")
