"""Reading the API's server-sent events: frames from lines, and the event each frame carries.

A frame of `GET /v1/runs/{id}/events` (and the thread's) is `id: <seq>:<index>`, `event: <type>`
and one `data:` line of JSON `{"thread_id", "run_id", "event"}`; `: heartbeat` comment lines keep
the connection alive and an `event: error` frame carries `{"error", "code"}` when the server's
read of the log failed. Pure: the transport hands lines in (`agentlog.client.aio`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

#: Events after which a followed run stream ends: the run waits for a human, or is over.
PAUSES = frozenset({"RunSuspended", "RunFinished"})


@dataclass(frozen=True)
class Frame:
    """One dispatched SSE frame (the fields of the spec agentlog uses)."""

    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass(frozen=True)
class StreamEvent:
    """One event of the log: `id` (`"<seq>:<index>"`, the `Last-Event-ID` to resume after it),
    `type` (the event class, e.g. `ToolCallSuspended`), its thread and run, and `event`: the event
    as JSON (`agentlog.eventlog.events`' fields)."""

    id: str
    type: str
    thread_id: str | None
    run_id: str | None
    event: dict[str, Any] = field(default_factory=dict)

    @property
    def seq(self) -> int:
        """The log sequence of the commit that holds this event."""
        return int(self.id.split(":", 1)[0])

    @property
    def pauses(self) -> bool:
        """True for `RunSuspended` (waits for a human) and `RunFinished`."""
        return self.type in PAUSES

    @classmethod
    def of(cls, frame: Frame) -> StreamEvent:
        doc = json.loads(frame.data) if frame.data else {}
        return cls(id=frame.id or "", type=frame.event, thread_id=doc.get("thread_id"),
                   run_id=doc.get("run_id"), event=doc.get("event") or {})

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "thread_id": self.thread_id, "run_id": self.run_id,
                "event": self.event}


async def frames(lines: AsyncIterable[bytes]) -> AsyncIterator[Frame]:
    """SSE frames from the body's lines (`\\n` or `\\r\\n` ended): a blank line dispatches the frame
    if it has data; comments (`:`) and unknown fields are skipped; `data` lines join with `\\n`."""
    event, ident = "message", None
    data: list[str] = []
    async for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield Frame(event=event, data="\n".join(data), id=ident)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            ident = value


__all__ = ["PAUSES", "Frame", "StreamEvent", "frames"]
