"""Workers (DESIGN 4.5): take commands from the `AGENTLOG_COMMANDS` work queue and have their
`Runtime` carry them out (`Runtime.execute`).

    worker = Worker(store, app=my_app, concurrency=64)  # app(store) -> Runtime (sync or async)
    await worker.start(); ...; await worker.stop()
    # or, as a process:  agentlog worker --nats nats://127.0.0.1:4222 --app pkg.mod:app

The worker owns the queue (which command, when, ack or not); the runtime owns the runs.

Guarantees, and how:

- **Ack after effects.** A command is acked only once what it asked for is committed to the log:
  a start/continue/decide when its run finished or waits, a cancel once it is recorded. While a
  run is active the worker sends `in_progress()` heartbeats, so `ack_wait` only expires for a
  worker that died (or froze); the command is then redelivered and the next worker **resumes the
  run from the log** (`Runtime.resume`).
- **At-least-once tools.** A call that started but did not complete before a crash runs again
  with the same `call_id` (its idempotency key); a completed call (its `ToolCallCompleted` is
  committed) never runs again.
- **Per app.** A worker takes only the commands of the app it serves (`app_name`): they are
  queued on `agentlog.cmd.<app>.<thread_id>` (`agentlog.cmd.<thread_id>` for the default app) and
  each app's workers share one durable consumer filtered to their app's subjects, so a process
  with another app never drives a run.
- **Per-thread order.** Commands of a thread share the subject `agentlog.cmd.<app>.<thread_id>`. Before
  a start/continue/decide runs, the worker checks that no earlier command of that thread is still
  in the queue (work-queue retention deletes acked commands; acks are synchronous), unless the
  command proves it (`PREDECESSOR` in `agentlog.runtime.workers.commands`): stored alone (the
  server took it only while no other command of its thread was queued), or stored right after
  the command this worker carried out last for the thread, in its turn, and acked (all before
  that one were gone when it ran; it is gone; none came between). If an earlier one is queued (usually
  being carried out by another worker, and done within milliseconds), the worker keeps the
  command and asks again after 2 ms, then 4, 8, ... (up to 32 ms) for at most `order_hold`
  seconds; after that it naks it for a redelivery 5 ms later, then 10, 20, ... (up to
  `max_nak_delay`), freeing its slot. Kept, not nak'ed at once: a nak and its redelivery cost
  more than a question, and the redelivery may go to a third worker that finds the same.
  Inside one worker, commands of a thread also queue on a per-thread lock, held while one runs
  and until it is acked: the next one there finds it gone. A command that waits for an earlier
  one waits outside that lock, and asks again at once when this worker carries a command of the
  thread out: the earlier one may reach this worker after it (a redelivery: handed back, or a
  dead worker's lease ended), and must not wait behind it (`agentlog.runtime.workers.order`).
  Cancels and queued messages skip the order (they must reach a running run).
- **Withdrawn starts.** A start a gateway queued and then withdrew (no worker took it in time;
  `agentlog.runtime.workers.claims`) is acked without running: the gateway answered that it
  will not run. A worker starts an offered run only once it has taken the offer.
- **Races.** Per-thread OCC keeps two workers from interleaving. A command that loses a race is
  re-evaluated from the log by the runtime (the run exists -> resume it; it finished or waits ->
  ack; the thread is busy with another run -> nak with delay) instead of failing.
- **Live control.** Decisions and cancels are also published on core NATS
  `agentlog.ctl.<run_id>` (`CommandClient`); the worker driving that run applies them at once.
  Each worker holds one subscription to every run's control subject for its whole life (not one
  per command: a subscription and its removal per command cost the server, and in a cluster
  every route, two more protocol messages per command); what is not for a run driven here is
  dropped. The messages of one run are applied in the order they came.
- **Dead letters.** A command that can never succeed (unreadable, rejected by the runtime, a
  commit over the server's max payload) or that failed on its `max_deliver`-th delivery is
  published to `agentlog.dlq.<thread_id>` (stream `AGENTLOG_DLQ`; headers carry the error code
  and message) and acked: it neither loops forever nor blocks its thread's later commands. A run
  it started and did not finish is finished `error` with its code (`Runtime.record_failure`).
  The limit is counted here from the message's deliveries, not by the consumer's `max_deliver`:
  a work-queue message the server stops delivering is never removed, and would block its thread.
- **Graceful stop.** `stop(timeout)` stops fetching and lets in-flight commands finish for up
  to `timeout` seconds (`hand_back_now()` cuts that short). What is left is handed back: its
  runs are fenced (nothing more is written for them here, even by a tool that ignores
  cancellation), and each command is nak'ed for an immediate redelivery the server persists, so
  the next worker takes it within a second or two, also after a nats-server restart. It logs
  `handing N runs back (run ...)`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from agentlog.eventlog.errors import (
    CodecError,
    CommitTooLarge,
    InvalidCommit,
    StoreUnavailable,
)
from agentlog.eventlog.events import RunStarted
from agentlog.eventlog.ids import is_valid_id
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.store import first_commit
from agentlog.eventlog.subjects import DEFAULT_APP, command_subject, commands_filter
from agentlog.runtime.errors import CommandRejected
from agentlog.runtime.facade import Runtime
from agentlog.runtime.inputs.commands import (
    Cancel,
    Command,
    ContinueRun,
    InvalidCommand,
    QueueMessages,
    StartRun,
    decode_command,
    encode_command,
)
from agentlog.runtime.logs import get_logger
from agentlog.runtime.workers.claims import StartClaims
from agentlog.runtime.workers.commands import (
    COMMANDS_STREAM,
    DLQ_CODE,
    DLQ_COMMAND_ID,
    DLQ_DELIVERIES,
    DLQ_ERROR,
    DLQ_QUEUE_SEQ,
    DLQ_RUN_ID,
    control_subject,
    dlq_subject,
    ensure_commands_stream,
    ensure_dlq_stream,
    validate_app_name,
    worker_consumer,
)
from agentlog.runtime.workers.order import ThreadOrder

_log = get_logger("agentlog.worker")

App = Callable[[Any], "Runtime | Awaitable[Runtime]"]

#: What to do with a command's message once handled.
ACK, NAK, TERM = "ack", "nak", "term"

#: Runs a worker drives at once (`agentlog worker --concurrency`, and `agentlog serve`): a run
#: spends most of its time waiting on a model or a tool, not on this process's CPU.
DEFAULT_CONCURRENCY = 64
#: The most commands one fetch takes: a burst is shared by the workers, not taken whole by the
#: first one whose slots are free.
FETCH_BATCH = 8

#: Failed deliveries of one command before it is dead-lettered (see the module doc).
DEFAULT_MAX_DELIVER = 25

#: Tries to settle one command while NATS is away (backing off up to 1 s between them).
SETTLE_ATTEMPTS = 50

#: Errors no retry can fix: the command is dead-lettered at once, with the error's code.
PERMANENT = (CommitTooLarge, InvalidCommit, CodecError, InvalidCommand)

#: How a stopping worker hands a command back: a nak with a (tiny) delay. JetStream keeps a bare
#: nak's redelivery in memory only, and a nats-server restarting in between (the embedded one
#: stops with its last process) then leaves the command leased for `ack_wait`; a delayed nak
#: moves the message's redelivery time, which the server persists with the consumer's state.
HAND_BACK = b'-NAK {"delay": 1000000}'
#: Seconds a stopping worker waits for the server to confirm one hand-back.
HAND_BACK_TIMEOUT = 2.0
#: Seconds a stopping worker waits for its abandoned runs' tasks to end (a tool may ignore the
#: cancellation; its run is fenced and handed back, so the process goes on without it).
ABANDON_GRACE = 2.0


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# == the worker ===================================================================================


class Worker:
    """Executes commands from the work queue with a `Runtime` (see the module doc)."""

    def __init__(
        self,
        store: JetStreamEventStore,
        *,
        app: App | None = None,
        runtime: Runtime | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        ack_wait: float = 30.0,
        max_deliver: int = DEFAULT_MAX_DELIVER,
        heartbeat: float | None = None,
        nak_delay: float = 0.05,
        order_nak_delay: float = 0.005,
        max_nak_delay: float = 0.25,
        order_hold: float = 1.0,
        shutdown_timeout: float = 10.0,
        consumer: str | None = None,
        fetch_timeout: float = 0.5,
        app_name: str | None = None,
    ) -> None:
        if (app is None) == (runtime is None):
            raise ValueError("give exactly one of app= (store -> Runtime) or runtime=")
        self.store = store
        self.nc = store.nc
        self.js = self.nc.jetstream(timeout=5.0)
        self._app = app
        self._runtime: Runtime | None = runtime
        self.concurrency = max(1, concurrency)
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.heartbeat = heartbeat or max(0.05, ack_wait / 4)
        self.nak_delay = nak_delay
        #: The first redelivery delay of a command behind an earlier one of its thread (which
        #: another worker is carrying out, usually for a few milliseconds), doubling from there.
        self.order_nak_delay = order_nak_delay
        self.max_nak_delay = max_nak_delay
        #: How long a command behind an earlier one of its thread is kept, asking again, before
        #: it is nak'ed ("Per-thread order" above).
        self.order_hold = order_hold
        self.shutdown_timeout = shutdown_timeout
        #: The app whose commands this worker takes (see "Per app" above).
        self.app_name = validate_app_name(app_name) if app_name is not None else DEFAULT_APP
        self.consumer = consumer or worker_consumer(self.app_name)
        self.fetch_timeout = fetch_timeout
        self._sub: Any = None
        #: The subscription to every run's control subject (see "Live control" above).
        self._control: Any = None
        #: The last control message being applied, by run (the next one of the run waits for it).
        self._controls: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(self.concurrency)
        self._tasks: dict[asyncio.Task[None], Any] = {}
        self._stopping = asyncio.Event()
        #: Which of a thread's commands may run now ("Per-thread order" above).
        self.order = ThreadOrder(lambda thread_id, seq: self._earlier_pending(thread_id, seq), hold=order_hold,
                                 stopping=self._stopping)
        self._hurry = asyncio.Event()
        #: Messages (by id) whose hand-back `stop` does itself, after their handlers ended.
        self._handing_back: set[int] = set()
        #: Messages (by id) whose ack a handler has begun to send: never handed back.
        self._acking: set[int] = set()
        #: The run each in-flight command drives (for what a stop says it hands back).
        self._runs: dict[asyncio.Task[None], str] = {}
        self._fetcher: asyncio.Task[None] | None = None
        self.log = _log.bind(consumer=self.consumer, app=self.app_name, pid=os.getpid())
        #: Counters (for tests and `bench_workers`).
        self.stats = {"acked": 0, "naked": 0, "termed": 0, "dead_lettered": 0,
                      "withdrawn": 0}
        #: The gateways' offers of the starts they queued (`agentlog.runtime.workers.claims`).
        self.claims = StartClaims(self.js)

    @property
    def runtime(self) -> Runtime:
        """The `Runtime` that carries the commands out (made by `start` from `app=`)."""
        if self._runtime is None:
            raise RuntimeError("the worker has no Runtime before start(): it is made from its app there")
        return self._runtime

    # -- setup ---------------------------------------------------------------------------------

    async def start(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import BadRequestError

        if self._runtime is None and self._app is not None:
            made = self._app(self.store)
            self._runtime = await made if inspect.isawaitable(made) else made
        await ensure_commands_stream(self.js)
        await ensure_dlq_stream(self.js)
        config = ConsumerConfig(  # max_deliver unlimited on the server: see "Dead letters" above
            durable_name=self.consumer, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.ack_wait, max_deliver=-1, max_ack_pending=10_000,
            filter_subject=commands_filter(self.app_name),
        )
        try:
            await self.js.add_consumer(COMMANDS_STREAM, config)
        except BadRequestError:
            pass  # exists with another config (another worker's settings win); bind to it
        self._control = await self.nc.subscribe(control_subject("*"), cb=self._on_control)
        self._sub = await self.js.pull_subscribe_bind(self.consumer, COMMANDS_STREAM)
        self._fetcher = asyncio.get_running_loop().create_task(self._fetch_loop(), name="agentlog-worker-fetch")
        self.log.info("worker.started", concurrency=self.concurrency, ack_wait=self.ack_wait)

    async def stop(self, timeout: float | None = None) -> None:
        """Stop fetching; let in-flight commands finish within `timeout` (or until
        `hand_back_now()`), then fence their runs and hand the commands back (module doc)."""
        timeout = self.shutdown_timeout if timeout is None else timeout
        self._stopping.set()
        if self._fetcher is not None:
            await asyncio.gather(self._fetcher, return_exceptions=True)
        pending = list(self._tasks)
        if pending and timeout > 0 and not self._hurry.is_set():
            count, which = self._describe(pending)
            self.log.warning(f"stopping: waiting up to {timeout:g} s for {count} to finish {which}; Ctrl-C again "
                             f"hands {'it' if count == '1 run' else 'them'} back now", runs=self._run_ids(pending))
            finished = asyncio.ensure_future(asyncio.wait(pending))
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait((finished, hurry), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            hurry.cancel()
        late = {task: msg for task, msg in self._tasks.items() if not task.done()}
        rt = self._runtime
        if late:
            if rt is not None:
                rt.fence_runs()  # nothing more is written for them here, before anyone else may take them
            runs = {task: self._runs.get(task, "?") for task in late}
            count, which = self._describe(late)
            self.log.warning(f"handing {count} back {which}", runs=self._run_ids(late))
            self._handing_back.update(id(msg) for msg in late.values())
            acking = {id(msg) for msg in late.values()} & self._acking  # before they end (`_done`)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            # a command whose ack was sent is done (or redelivered after its lease if the ack was lost)
            await asyncio.gather(*(self._hand_back(msg, runs[task], self.log) for task, msg in late.items()
                                   if id(msg) not in acking))
        if rt is not None:  # runs nobody holds a command for any more: stop them uncommitted
            await self._await_abandoned(rt.abandon_runs())
        for sub in (self._sub, self._control):
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except Exception:  # noqa: BLE001
                    pass
        controls = list(self._controls.values())
        for task in controls:
            task.cancel()
        await asyncio.gather(*controls, return_exceptions=True)
        self.log.info("worker.stopped", **self.stats)

    def hand_back_now(self) -> None:
        """Cut a stop's wait short: what runs now is handed back at once (a second Ctrl-C)."""
        self._hurry.set()

    def _run_ids(self, tasks: Any) -> list[str]:
        return sorted({run for task in tasks if (run := self._runs.get(task))})

    def _describe(self, tasks: Any) -> tuple[str, str]:
        """(`1 run`, `(run X)`) / (`2 runs`, `(runs X, Y)`) for the log lines of a stop."""
        runs = self._run_ids(tasks)
        n = max(len(runs), 1 if tasks else 0)
        return plural(n, "run"), f"({'run' if len(runs) == 1 else 'runs'} {', '.join(runs) or '?'})"

    async def _await_abandoned(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Wait (bounded) for abandoned runs to stop; say which did not (a tool that ignores
        cancellation): they are fenced, so whatever they do later is never written."""
        if not tasks:
            return
        _done, stuck = await asyncio.wait(tasks, timeout=ABANDON_GRACE)
        for task in stuck:
            self.log.warning("a tool ignores cancellation: its run was handed back and nothing it does is "
                             "written; the process goes on without it", task=task.get_name())

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- fetching ------------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        import nats.errors

        backoff = 0.05
        while not self._stopping.is_set():
            if not await self._take_slot():
                break
            free = 1
            while free < min(self.concurrency, FETCH_BATCH) and not self._slots.locked():
                await self._slots.acquire()
                free += 1
            try:
                msgs = await self._sub.fetch(free, timeout=self.fetch_timeout)
                backoff = 0.05
            except (TimeoutError, nats.errors.TimeoutError):
                msgs = []
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - disconnected: back off, the client reconnects
                self.log.warning("worker.fetch_failed", error=f"{type(exc).__name__}: {exc}")
                msgs = []
                await asyncio.sleep(backoff)  # retry pacing while NATS is away, not synchronisation
                backoff = min(1.0, backoff * 2)
            for _ in range(free - len(msgs)):
                self._slots.release()
            for msg in msgs:
                task = asyncio.get_running_loop().create_task(self._handle(msg))
                self._tasks[task] = msg
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        msg = self._tasks.pop(task, None)
        self._acking.discard(id(msg))
        self._runs.pop(task, None)
        self._slots.release()

    async def _take_slot(self) -> bool:
        """Wait for a free slot; False if the worker stops first (a full worker must not hold
        its stop up until one of its runs ends)."""
        if not self._slots.locked():
            await self._slots.acquire()
            return True
        acquire = asyncio.ensure_future(self._slots.acquire())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((acquire, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not acquire.done():
                acquire.cancel()
                await asyncio.gather(acquire, return_exceptions=True)
        if acquire.done() and not acquire.cancelled():
            if self._stopping.is_set():
                self._slots.release()
                return False
            return True
        return False

    # -- one command ---------------------------------------------------------------------------

    async def _handle(self, msg: Any) -> None:
        try:
            cmd = decode_command(msg.data)
        except InvalidCommand as exc:
            self.log.error("command.invalid", error=str(exc), subject=msg.subject)
            await self._dead_letter(msg, None, exc.code, str(exc), self.log)
            return
        task = asyncio.current_task()
        if task is not None:
            self._runs[task] = cmd.run_id
        meta = msg.metadata
        log = self.log.bind(
            command_id=cmd.command_id, command=type(cmd).__name__, thread_id=cmd.thread_id,
            run_id=cmd.run_id, delivery=meta.num_delivered, queue_seq=meta.sequence.stream,
        )
        beat = asyncio.get_running_loop().create_task(self._heartbeat(msg))
        outcome, delay, first_delay = NAK, 0.0, self.nak_delay
        settled = False
        try:
            if isinstance(cmd, StartRun) and cmd.offered and not await self._may_start(cmd, log):
                outcome = ACK  # withdrawn by its gateway (or replaced): acked unexecuted
            elif isinstance(cmd, (Cancel, QueueMessages)):  # outside the thread's order: for a running run
                outcome = await self._execute(cmd, meta.sequence.stream)
                if isinstance(cmd, QueueMessages) and outcome == ACK:
                    await self._publish_control(cmd)  # recorded: the worker driving the run reads it now
            else:
                stop = cmd.interruption() if isinstance(cmd, ContinueRun) else None
                if stop is not None:
                    # the parent's own command holds the thread until it finishes: stop it first,
                    # outside the order; the start below then waits for it
                    await self._execute(stop, meta.sequence.stream)
                    await self._publish_control(stop)  # a loop blocked in a tool meets it at once
                    cmd = msgspec.structs.replace(cmd, interrupt=False)
                seq = meta.sequence.stream
                ordered = cmd

                async def carry_out() -> str:
                    nonlocal settled
                    done = await self._execute(ordered, seq, meta.num_delivered == 1)
                    if done == ACK:  # acked under the thread's lock: its next command here finds it gone
                        beat.cancel()
                        settled = True
                        self._acking.add(id(msg))
                        if await self._settle(msg, ACK, 0.0, log):
                            self.order.took(ordered.thread_id, seq)
                    return done

                outcome = ""
                async with self.order.lock(cmd.thread_id):
                    if self.order.proven(msg, cmd.thread_id):
                        outcome = await carry_out()
                if not outcome:
                    # waits outside the lock: the earlier command it waits for may be waiting for it here
                    if await self.order.wait(msg, cmd.thread_id, seq):
                        async with self.order.lock(cmd.thread_id):
                            outcome = await carry_out()
                    else:
                        outcome, first_delay = NAK, self.order_nak_delay
                        log.debug("command.behind_earlier")
            if outcome == NAK:
                delay = min(self.max_nak_delay, first_delay * (2 ** min(meta.num_delivered - 1, 6)))
        except asyncio.CancelledError:
            log.info("command.interrupted")
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)  # no in-progress signal after the hand-back
            if id(msg) not in self._handing_back and not settled:  # else `stop` hands it back once this handler ended
                await self._hand_back(msg, cmd.run_id, log)
            raise
        except StoreUnavailable as exc:
            log.warning("command.store_unavailable", error=str(exc))
            outcome, delay = NAK, self.max_nak_delay
        except (CommandRejected, *PERMANENT) as exc:
            beat.cancel()
            give_up = exc if isinstance(exc, CommandRejected) else CommandRejected.of(exc)
            log.error("command.rejected", code=give_up.code, error=give_up.detail)
            await self._dead_letter(msg, cmd, give_up.code, give_up.detail, log)
            return
        except Exception as exc:  # noqa: BLE001 - never lose a command to a bug: retry later
            log.exception("command.failed", error=f"{type(exc).__name__}: {exc}")
            outcome, delay = NAK, self.max_nak_delay
            if 0 < self.max_deliver <= meta.num_delivered:
                beat.cancel()
                await self._dead_letter(msg, cmd, "max_deliveries",
                                        f"failed on delivery {meta.num_delivered} of at most {self.max_deliver}: "
                                        f"{type(exc).__name__}: {exc}", log)
                return
        finally:
            beat.cancel()
        if not settled:
            await self._settle(msg, outcome, delay, log)

    async def _dead_letter(self, msg: Any, cmd: Any, code: str, detail: str, log: Any) -> None:
        """Give up on `msg` (see "Dead letters" in the module doc): record the failure on its run,
        publish it to the DLQ, then ack it. If NATS fails meanwhile it is nak'ed and retried."""
        meta = msg.metadata
        thread_id = cmd.thread_id if cmd is not None else msg.subject.rpartition(".")[2]
        detail = " ".join(detail.split())[:1000]
        headers = {DLQ_CODE: code, DLQ_ERROR: detail or code, DLQ_DELIVERIES: str(meta.num_delivered),
                   DLQ_QUEUE_SEQ: str(meta.sequence.stream), "Nats-Msg-Id": f"dlq-{meta.sequence.stream}"}
        if cmd is not None:
            headers.update({DLQ_COMMAND_ID: cmd.command_id, DLQ_RUN_ID: cmd.run_id})
        payload = msg.data if len(msg.data) + 2048 < self.nc.max_payload else b""  # the headers must fit too
        try:
            if isinstance(cmd, StartRun) and self._runtime is not None:
                await self._runtime.record_failure(cmd.run_id, cmd.thread_id, code, detail)
            await self.js.publish(dlq_subject(thread_id if is_valid_id(thread_id) else None), payload, headers=headers)
        except Exception as exc:  # noqa: BLE001 - not given up yet: retry the whole command later
            log.warning("command.dead_letter_failed", error=f"{type(exc).__name__}: {exc}")
            await self._settle(msg, NAK, self.max_nak_delay, log)
            return
        log.warning("command.dead_lettered", code=code, error=detail)
        self.stats["dead_lettered"] += 1
        await self._settle(msg, ACK, 0.0, log)

    async def _settle(self, msg: Any, outcome: str, delay: float = 0.0, log: Any = None) -> bool:
        """Ack, nak or term `msg`; whether the server took it. An ack is confirmed, and retried
        while NATS reconnects (a lost one would run the command again); a lost nak or term is
        redelivered after `ack_wait`."""
        taken = False
        for attempt in range(SETTLE_ATTEMPTS):
            try:
                if outcome == ACK:
                    await msg.ack_sync(timeout=2.0)  # synchronous: the next command of the thread sees it gone
                elif outcome == TERM:
                    await msg.term()
                else:
                    await msg.nak(delay=delay or None)
                taken = True
                break
            except Exception as exc:  # noqa: BLE001
                if "already acknowledged" in str(exc).lower():
                    taken = True
                    break
                (log or self.log).warning("command.settle_failed", outcome=outcome, error=str(exc))
                if outcome != ACK or (self._stopping.is_set() and attempt > 3):
                    break  # a lost nak/term is redelivered after ack_wait anyway
                await asyncio.sleep(min(1.0, 0.05 * 2 ** attempt))  # retry pacing while reconnecting
        self.stats[{"ack": "acked", "nak": "naked", "term": "termed"}[outcome]] += 1
        if log is not None:
            log.debug("command.settled", outcome=outcome)
        return taken

    async def _hand_back(self, msg: Any, run_id: str, log: Any) -> None:
        """Give an unfinished command back to the queue for immediate redelivery (`HAND_BACK`),
        waiting for the server's confirmation; if it does not come, the command is redelivered
        after its lease (`ack_wait`) instead, and the log says so."""
        try:
            await self.nc.request(msg.reply, HAND_BACK, timeout=HAND_BACK_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - NATS away: the lease hands it back later
            log.warning(f"could not hand run {run_id} back ({type(exc).__name__}); another worker takes it "
                        f"once its lease ends (ack_wait {self.ack_wait:g} s)", error=str(exc))
            return
        self.stats["naked"] += 1
        log.info("command.handed_back")

    async def _heartbeat(self, msg: Any) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)  # pacing of in-progress signals
            try:
                await msg.in_progress()
            except Exception:  # noqa: BLE001 - disconnected: the next beat retries
                pass

    async def _earlier_pending(self, thread_id: str, seq: int) -> bool:
        """Is an earlier command of this thread still in the queue (not yet acked)?"""
        first = await self._next_pending(thread_id, 1)
        return first is not None and first < seq

    async def _next_pending(self, thread_id: str, from_seq: int) -> int | None:
        """Queue seq of the first command of this thread at or after `from_seq` still in the
        queue (work-queue retention: acked commands are gone), or None."""
        req = msgspec.json.encode({"seq": from_seq, "next_by_subj": command_subject(thread_id, self.app_name)})
        resp = await self.nc.request(f"$JS.API.STREAM.MSG.GET.{COMMANDS_STREAM}", req, timeout=5.0)
        message = msgspec.json.decode(resp.data).get("message")
        return int(message["seq"]) if message else None

    # -- carrying a command out ---------------------------------------------------------------

    async def _may_start(self, cmd: StartRun, log: Any) -> bool:
        """May this offered start (`StartRun.offered`) run? Yes when its run is in the log
        already (a redelivery: it is resumed) or this command takes the gateway's offer
        (`StartClaims.take`); no when the offer was withdrawn (the gateway answered that the
        start will not run), replaced by another attempt, taken by another command, or is gone."""
        if await self.claims.take(cmd.run_id, cmd.command_id) or await self._run_started(cmd.run_id):
            return True
        log.warning("command.start_withdrawn")
        self.stats["withdrawn"] += 1
        return False

    async def _run_started(self, run_id: str) -> bool:
        first = await first_commit(self.store.read_run(run_id))
        return first is not None and any(type(e) is RunStarted for e in first.commit.events)

    async def _execute(self, cmd: Command, queue_seq: int, first_delivery: bool = False) -> str:
        """`Runtime.execute(cmd)` (meanwhile, a decision or a cancel for its run that arrives on
        the control subject ahead of its place in the queue is applied at once: "Live control").
        A cancel's run is resumed here when no command of its thread is left in the queue:
        nobody holds it."""
        done = await self.runtime.execute(cmd, unheld=lambda: self._unheld(cmd.thread_id, queue_seq),
                                          first_delivery=first_delivery)
        return ACK if done == "done" else NAK

    async def _on_control(self, msg: Any) -> None:
        """A message on some run's control subject: applied in a task of its own (a decision
        appends a commit, and must not hold up the other runs' messages), after the run's
        previous one."""
        try:
            cmd = decode_command(msg.data)
        except InvalidCommand:
            return
        before = self._controls.get(cmd.run_id)
        task = asyncio.get_running_loop().create_task(self._apply_control(cmd, before))
        self._controls[cmd.run_id] = task
        task.add_done_callback(lambda done: self._control_done(cmd.run_id, done))

    async def _apply_control(self, cmd: Command, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await asyncio.wait((before,))
        await self.runtime.control(cmd)

    def _control_done(self, run_id: str, task: asyncio.Task[None]) -> None:
        if self._controls.get(run_id) is task:
            del self._controls[run_id]

    async def _publish_control(self, cmd: Command) -> None:
        """Tell the worker driving `cmd`'s run (maybe another one) at once; the queue stays the
        truth, so a lost message only delays it to the run's next append."""
        try:
            await self.nc.publish(control_subject(cmd.run_id), encode_command(cmd))
        except Exception:  # noqa: BLE001 - live delivery is a shortcut
            pass

    async def _unheld(self, thread_id: str, queue_seq: int) -> bool:
        """No other command of the thread is in the queue: a run being driven always has its
        (unacked) command there, the lease of the worker driving it. A run started outside the
        queue, or whose command was given up on, has none."""
        first = await self._next_pending(thread_id, 1)
        if first == queue_seq:
            first = await self._next_pending(thread_id, queue_seq + 1)
        return first is None
