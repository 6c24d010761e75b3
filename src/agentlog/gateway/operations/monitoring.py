"""What an operator watches besides the runs: the durable command queue the workers consume, and
the dead letters they gave up on. Read-only, from JetStream's own bookkeeping (stream and
consumer info, the last few dead-letter messages), so it is exact and costs a few requests.

Workers are not registered anywhere: they are pull consumers of one shared durable consumer
(`agentlog-workers`). What JetStream knows of them is what is reported: the pull requests they
have open (an idle worker keeps one waiting per free slot), the commands delivered and not yet
acked (in progress), and when a command was last handed out.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

import nats.js.errors

from agentlog.runtime.workers import (
    COMMANDS_STREAM,
    DLQ_CODE,
    DLQ_COMMAND_ID,
    DLQ_DELIVERIES,
    DLQ_ERROR,
    DLQ_RUN_ID,
    DLQ_STREAM,
    WORKER_CONSUMER,
)

#: Dead letters shown by default (the newest first).
RECENT_DEAD_LETTERS = 20


def _ms(value: datetime | str | None) -> int | None:
    """Epoch milliseconds of a time nats-py hands over as a datetime or an RFC 3339 string (with
    nanoseconds, which Python's parser cuts to microseconds)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else None


async def queue_report(js: Any, *, recent: int = RECENT_DEAD_LETTERS) -> dict[str, Any]:
    """The command queue, its workers' consumer and the newest `recent` dead letters. A stream or
    consumer that does not exist yet (no run was ever queued, no worker ever started) is reported
    as such, not as an error."""
    report: dict[str, Any] = {"commands": None, "workers": None, "dead_letters": None}
    with contextlib.suppress(nats.js.errors.NotFoundError):
        info = await js.stream_info(COMMANDS_STREAM)
        report["commands"] = {"stream": COMMANDS_STREAM, "queued": info.state.messages,
                              "first_seq": info.state.first_seq, "last_seq": info.state.last_seq}
    with contextlib.suppress(nats.js.errors.NotFoundError):
        consumer = await js.consumer_info(COMMANDS_STREAM, WORKER_CONSUMER)
        delivered = consumer.delivered
        report["workers"] = {
            "consumer": WORKER_CONSUMER,
            "open_pull_requests": consumer.num_waiting or 0,
            "in_progress": consumer.num_ack_pending or 0,
            "pending": consumer.num_pending or 0,
            "redelivered": consumer.num_redelivered or 0,
            "last_delivered": _ms(getattr(delivered, "last_active", None)) if delivered else None,
        }
    with contextlib.suppress(nats.js.errors.NotFoundError):
        dlq = await js.stream_info(DLQ_STREAM)
        letters: list[dict[str, Any]] = []
        seq = dlq.state.last_seq
        while seq and seq >= dlq.state.first_seq and len(letters) < recent:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                letters.append(_dead_letter(await js.get_msg(DLQ_STREAM, seq)))
            seq -= 1
        report["dead_letters"] = {"stream": DLQ_STREAM, "count": dlq.state.messages, "recent": letters}
    return report


def _dead_letter(msg: Any) -> dict[str, Any]:
    headers = msg.headers or {}
    thread = msg.subject.rsplit(".", 1)[-1]
    return {
        "seq": msg.seq, "thread_id": None if thread == "_" else thread,
        "run_id": headers.get(DLQ_RUN_ID), "command_id": headers.get(DLQ_COMMAND_ID),
        "code": headers.get(DLQ_CODE), "error": headers.get(DLQ_ERROR),
        "deliveries": int(headers[DLQ_DELIVERIES]) if str(headers.get(DLQ_DELIVERIES, "")).isdigit() else None,
        "time": _ms(msg.time),
    }


__all__ = ["RECENT_DEAD_LETTERS", "queue_report"]
