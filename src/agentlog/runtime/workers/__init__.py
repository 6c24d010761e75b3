"""Workers take commands from the durable work queue and have their runtime carry them out
(`worker`). What a gateway needs to queue commands and follow them is here too, and is a room of
the runtime's public face: the queue and its dead letters (`commands`), the offers of the starts
it queued (`claims`)."""

from agentlog.runtime.workers.claims import StartClaims, Withdrawal
from agentlog.runtime.workers.commands import (
    COMMANDS_STREAM,
    DLQ_CODE,
    DLQ_COMMAND_ID,
    DLQ_DELIVERIES,
    DLQ_ERROR,
    DLQ_QUEUE_SEQ,
    DLQ_RUN_ID,
    DLQ_STREAM,
    DLQ_SUBJECTS,
    WORKER_CONSUMER,
    CommandClient,
    CommandTooLarge,
    control_subject,
    dlq_subject,
    ensure_runtime_streams,
    validate_app_name,
    worker_consumer,
)

__all__ = [
    "COMMANDS_STREAM", "DLQ_CODE", "DLQ_COMMAND_ID", "DLQ_DELIVERIES", "DLQ_ERROR", "DLQ_QUEUE_SEQ", "DLQ_RUN_ID",
    "DLQ_STREAM", "DLQ_SUBJECTS", "WORKER_CONSUMER", "CommandClient", "CommandTooLarge", "StartClaims", "Withdrawal", "control_subject", "dlq_subject",
    "ensure_runtime_streams", "validate_app_name", "worker_consumer",
]
