"""Prometheus metrics of a worker, read from it when scraped (nothing is counted per command
beyond the worker's own `stats`): how full it is, what became of its commands, and how long
commands waited for an earlier one of their thread.

    registry.register(WorkerCollector(worker))

`agentlog worker --metrics-port` serves them with the runs' metrics, and `agentlog serve` on its
`/metrics`. Sizing a worker tier: `agentlog_worker_commands_in_flight` near
`agentlog_worker_concurrency` for long means the workers are full (add workers, or raise
`--concurrency` if their runs mostly wait on models and tools); a growing
`agentlog_worker_order_wait_seconds_total` means commands of the same threads reach different
workers while the one before is still running.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlog.runtime.workers.worker import Worker

#: What became of the commands: the `Worker.stats` keys counted under `outcome`.
OUTCOMES = ("acked", "naked", "termed", "dead_lettered", "withdrawn")


class WorkerCollector:
    """A `prometheus_client` collector of one `Worker` (module doc)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        worker = self.worker
        yield GaugeMetricFamily("agentlog_worker_concurrency", "Commands this worker runs at once, at most",
                                value=worker.concurrency)
        yield GaugeMetricFamily("agentlog_worker_commands_in_flight",
                                "Commands this worker has taken and not yet settled", value=len(worker._tasks))
        yield GaugeMetricFamily("agentlog_worker_commands_waiting_for_turn",
                                "Commands waiting now for an earlier command of their thread to finish",
                                value=worker.order.waiting)
        outcomes = CounterMetricFamily("agentlog_worker_commands", "Commands settled, by outcome (acked: carried "
                                       "out; naked: given back to the queue; dead_lettered: given up; withdrawn: an "
                                       "offered start its gateway withdrew)", labels=["outcome"])
        for outcome in OUTCOMES:
            outcomes.add_metric([outcome], worker.stats[outcome])
        yield outcomes
        yield CounterMetricFamily("agentlog_worker_order_waits", "Commands that waited for an earlier command "
                                  "of their thread", value=worker.order.waits)
        yield CounterMetricFamily("agentlog_worker_order_wait_seconds", "Seconds commands spent waiting for an "
                                  "earlier command of their thread", value=worker.order.wait_seconds)


__all__ = ["OUTCOMES", "WorkerCollector"]
