"""Workers (DESIGN 4.5): take commands from the `AGENTLOG_COMMANDS` work queue and run them.

    worker = Worker(store, app=my_app, concurrency=4)   # app(store) -> Runtime (sync or async)
    await worker.start(); ...; await worker.stop()
    # or, as a process:  agentlog worker --nats nats://127.0.0.1:4222 --app pkg.mod:app

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
  in the queue (work-queue retention deletes acked commands; acks are synchronous); if one is, the
  command is nak'ed with a short delay. Inside one worker, commands of a thread also queue on a
  per-thread lock. Cancels and queued messages skip the order (they must reach a running run).
- **Withdrawn starts.** A start a gateway queued and then withdrew (no worker took it in time;
  `agentlog.runtime.workers.claims`) is acked without running: the gateway answered that it
  will not run. A worker starts an offered run only once it has taken the offer.
- **Races.** Per-thread OCC keeps two workers from interleaving. A worker that loses a race
  (`VersionConflict`/`RunConflict`) re-reads the log and re-evaluates its command (the run
  exists -> resume it; it finished or waits -> ack; the thread is busy with another run -> nak
  with delay) instead of failing it.
- **Live control.** Decisions and cancels are also published on core NATS
  `agentlog.ctl.<run_id>` (`CommandClient`); the worker driving that run applies them at once.
- **Dead letters.** A command that can never succeed (unreadable, rejected by the runtime, a
  commit over the server's max payload) or that failed on its `max_deliver`-th delivery is
  published to `agentlog.dlq.<thread_id>` (stream `AGENTLOG_DLQ`; headers carry the error code
  and message) and acked, so it neither loops forever nor blocks its thread's later commands. If
  its run started and did not finish, a `RunFinished{error, code}` records the failure in the
  log, so the run does not stay `running` forever. The limit is enforced here from the delivery
  count in the message metadata, not by the consumer's own `max_deliver`: in a work-queue stream
  a message the server stops delivering is never removed, and would block its thread forever.
- **Graceful stop.** `stop(timeout)` stops fetching, lets in-flight commands finish for up to
  `timeout` seconds (`hand_back_now()` cuts that short), then hands back what is left: the runs
  are fenced (`Runtime.abandon_runs`: nothing more is written for them here, even by a tool that
  ignores cancellation) and each command is nak'ed with a confirmed, persisted immediate
  redelivery, so the next worker, or the next process after a restart of the nats-server, takes
  it within a second or two instead of after `ack_wait`. It logs `handing N runs back (run ...)`.
  The resuming worker re-runs a tool call that started and did not complete (at-least-once).
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from agentlog.eventlog.errors import (
    AgentlogError,
    CodecError,
    CommitTooLarge,
    InvalidCommit,
    StoreUnavailable,
    VersionConflict,
)
from agentlog.eventlog.events import Commit, RunFinished, RunStarted, Termination
from agentlog.eventlog.ids import is_valid_id, new_id, now_ms
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import DEFAULT_APP, command_subject, commands_filter
from agentlog.runtime.errors import RunConflict, RunEnded, RunNotFound
from agentlog.runtime.facade import RunHandle, Runtime
from agentlog.runtime.logs import get_logger
from agentlog.runtime.loop.hitl import HitlError, RunNotWaiting
from agentlog.runtime.workers.claims import StartClaims
from agentlog.runtime.workers.commands import (
    COMMANDS_STREAM,
    DLQ_CODE,
    DLQ_COMMAND_ID,
    DLQ_DELIVERIES,
    DLQ_ERROR,
    DLQ_QUEUE_SEQ,
    DLQ_RUN_ID,
    INTERRUPTED,
    Cancel,
    ContinueRun,
    Decide,
    InvalidCommand,
    QueueMessages,
    StartRun,
    control_subject,
    decode_command,
    dlq_subject,
    encode_command,
    ensure_commands_stream,
    ensure_dlq_stream,
    validate_app_name,
    worker_consumer,
)

_log = get_logger("agentlog.worker")

App = Callable[[Any], "Runtime | Awaitable[Runtime]"]

#: What to do with a command's message once handled.
ACK, NAK, TERM = "ack", "nak", "term"

#: Failed deliveries of one command before it is dead-lettered (see the module doc).
DEFAULT_MAX_DELIVER = 25

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


class GiveUp(Exception):
    """Raised by a command handler: this command can never succeed; dead-letter it."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _give_up(exc: BaseException, default: str = "command_rejected") -> GiveUp:
    return GiveUp(getattr(exc, "code", None) or default, f"{type(exc).__name__}: {exc}")


# == the worker ===================================================================================


class Worker:
    """Executes commands from the work queue with a `Runtime` (see the module doc)."""

    def __init__(
        self,
        store: JetStreamEventStore,
        *,
        app: App | None = None,
        runtime: Runtime | None = None,
        concurrency: int = 4,
        ack_wait: float = 30.0,
        max_deliver: int = DEFAULT_MAX_DELIVER,
        heartbeat: float | None = None,
        nak_delay: float = 0.05,
        max_nak_delay: float = 0.25,
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
        self.runtime: Runtime | None = runtime
        self.concurrency = max(1, concurrency)
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.heartbeat = heartbeat or max(0.05, ack_wait / 4)
        self.nak_delay = nak_delay
        self.max_nak_delay = max_nak_delay
        self.shutdown_timeout = shutdown_timeout
        #: The app whose commands this worker takes (see "Per app" above).
        self.app_name = validate_app_name(app_name) if app_name is not None else DEFAULT_APP
        self.consumer = consumer or worker_consumer(self.app_name)
        self.fetch_timeout = fetch_timeout
        self._sub: Any = None
        self._slots = asyncio.Semaphore(self.concurrency)
        self._tasks: dict[asyncio.Task[None], Any] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        #: Messages (by id) whose hand-back `stop` does itself, after their handlers ended.
        self._handing_back: set[int] = set()
        #: The run each in-flight command drives (for what a stop says it hands back).
        self._runs: dict[asyncio.Task[None], str] = {}
        self._fetcher: asyncio.Task[None] | None = None
        self.log = _log.bind(consumer=self.consumer, app=self.app_name, pid=os.getpid())
        #: Counters (for tests and `bench_workers`).
        self.stats = {"acked": 0, "naked": 0, "termed": 0, "resumed": 0, "reevaluated": 0, "dead_lettered": 0,
                      "withdrawn": 0}
        #: The gateways' offers of the starts they queued (`agentlog.runtime.workers.claims`).
        self.claims = StartClaims(self.js)

    # -- setup ---------------------------------------------------------------------------------

    async def start(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import BadRequestError

        if self.runtime is None:
            assert self._app is not None
            rt = self._app(self.store)
            self.runtime = await rt if inspect.isawaitable(rt) else rt
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
        rt = self.runtime
        if late:
            if rt is not None:
                rt.fence_runs()  # nothing more is written for them here, before anyone else may take them
            runs = {task: self._runs.get(task, "?") for task in late}
            count, which = self._describe(late)
            self.log.warning(f"handing {count} back {which}", runs=self._run_ids(late))
            self._handing_back.update(id(msg) for msg in late.values())
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            await asyncio.gather(*(self._hand_back(msg, runs[task], self.log) for task, msg in late.items()))
        if rt is not None:  # runs nobody holds a command for any more: stop them uncommitted
            await self._await_abandoned(rt.abandon_runs())
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # noqa: BLE001
                pass
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
            while free < self.concurrency and not self._slots.locked():
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
        self._tasks.pop(task, None)
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
        outcome, delay = NAK, 0.0
        try:
            if isinstance(cmd, StartRun) and cmd.offered and not await self._may_start(cmd, log):
                outcome = ACK  # withdrawn by its gateway (or replaced): acked unexecuted
            elif isinstance(cmd, Cancel):
                outcome = await self._cancel(cmd, log, meta.sequence.stream)
            elif isinstance(cmd, QueueMessages):
                outcome = await self._queue_messages(cmd, log)
            else:
                if isinstance(cmd, ContinueRun) and cmd.interrupt and cmd.parent_run_id is not None:
                    # stop the parent first (outside the thread's order: its own command holds
                    # the thread until it finishes); the start below then waits for that
                    await self._interrupt_parent(cmd, log, meta.sequence.stream)
                lock = self._locks.setdefault(cmd.thread_id, asyncio.Lock())
                async with lock:
                    if await self._earlier_pending(cmd.thread_id, meta.sequence.stream):
                        outcome = NAK
                        log.debug("command.behind_earlier")
                    elif isinstance(cmd, StartRun):
                        outcome = await self._start(cmd, log)
                    else:
                        outcome = await self._decide(cmd, log)
                if not lock.locked() and not lock._waiters:
                    self._locks.pop(cmd.thread_id, None)
            if outcome == NAK:
                delay = min(self.max_nak_delay, self.nak_delay * (2 ** min(meta.num_delivered - 1, 6)))
        except asyncio.CancelledError:
            log.info("command.interrupted")
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)  # no in-progress signal after the hand-back
            if id(msg) not in self._handing_back:  # else `stop` hands it back once this handler ended
                await self._hand_back(msg, cmd.run_id, log)
            raise
        except StoreUnavailable as exc:
            log.warning("command.store_unavailable", error=str(exc))
            outcome, delay = NAK, self.max_nak_delay
        except (GiveUp, *PERMANENT) as exc:
            beat.cancel()
            give_up = exc if isinstance(exc, GiveUp) else _give_up(exc)
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
            if isinstance(cmd, StartRun):
                await self._record_failure(cmd, code, detail, log)
            await self.js.publish(dlq_subject(thread_id if is_valid_id(thread_id) else None), payload, headers=headers)
        except Exception as exc:  # noqa: BLE001 - not given up yet: retry the whole command later
            log.warning("command.dead_letter_failed", error=f"{type(exc).__name__}: {exc}")
            await self._settle(msg, NAK, self.max_nak_delay, log)
            return
        log.warning("command.dead_lettered", code=code, error=detail)
        self.stats["dead_lettered"] += 1
        await self._settle(msg, ACK, 0.0, log)

    async def _record_failure(self, cmd: StartRun, code: str, detail: str, log: Any) -> None:
        """`RunFinished{error, code}` for the command's run if it started and is not finished
        (nor driven by this worker): a dead-lettered run must not look `running` forever."""
        rt = self.runtime
        for _ in range(10):
            if rt is not None and rt.active(cmd.run_id) is not None:
                return
            commits = [sc async for sc in self.store.read_run(cmd.run_id)]
            started = any(type(e) is RunStarted for sc in commits for e in sc.commit.events)
            if not started or any(type(e) is RunFinished for sc in commits for e in sc.commit.events):
                return
            version = await self.store.thread_version(cmd.thread_id)
            commit = Commit(commit_id=new_id(), thread_id=cmd.thread_id, run_id=cmd.run_id, ts=now_ms(),
                            events=[RunFinished(termination=Termination(type="error", code=code, detail=detail))])
            try:
                await self.store.append(commit, version)
            except VersionConflict:
                continue  # the thread moved: look again
            log.warning("run.failed_by_dead_letter", code=code)
            return

    async def _settle(self, msg: Any, outcome: str, delay: float = 0.0, log: Any = None) -> None:
        for attempt in range(50):
            try:
                if outcome == ACK:
                    await msg.ack_sync(timeout=2.0)  # synchronous: the next command of the thread sees it gone
                elif outcome == TERM:
                    await msg.term()
                else:
                    await msg.nak(delay=delay or None)
                break
            except Exception as exc:  # noqa: BLE001
                if "already acknowledged" in str(exc).lower():
                    break
                (log or self.log).warning("command.settle_failed", outcome=outcome, error=str(exc))
                if outcome != ACK or (self._stopping.is_set() and attempt > 3):
                    break  # a lost nak/term is redelivered after ack_wait anyway
                await asyncio.sleep(min(1.0, 0.05 * 2 ** attempt))  # retry pacing while reconnecting
        self.stats[{"ack": "acked", "nak": "naked", "term": "termed"}[outcome]] += 1
        if log is not None:
            log.debug("command.settled", outcome=outcome)

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

    # -- start / continue ------------------------------------------------------------------------

    async def _may_start(self, cmd: StartRun, log: Any) -> bool:
        """May this offered start (`StartRun.offered`) run? Yes when its run is in the log
        already (a redelivery: it is resumed) or this command takes the gateway's offer
        (`StartClaims.take`); no when the offer was withdrawn (the gateway answered that the
        start will not run), replaced by another attempt, taken by another command, or is gone."""
        if await self._run_started(cmd.run_id) or await self.claims.take(cmd.run_id, cmd.command_id):
            return True
        log.warning("command.start_withdrawn")
        self.stats["withdrawn"] += 1
        return False

    async def _run_started(self, run_id: str) -> bool:
        async for sc in self.store.read_run(run_id):
            return any(type(e) is RunStarted for e in sc.commit.events)
        return False

    async def _start(self, cmd: StartRun, log: Any) -> str:
        rt = self.runtime
        assert rt is not None
        for _ in range(20):
            handle = rt.active(cmd.run_id)  # not None: redelivered to the worker that runs it
            if handle is None and await self._run_started(cmd.run_id):
                try:
                    handle = await self._resume(cmd.run_id, cmd.thread_id, log)
                except RunConflict as exc:
                    log.info("command.reevaluate", reason=str(exc))
                    self.stats["reevaluated"] += 1
                    continue
            elif handle is None:
                try:
                    handle = await rt.start(cmd)
                    log.info("run.started_by_worker")
                except RunConflict as exc:
                    self.stats["reevaluated"] += 1
                    if await self._run_started(cmd.run_id):
                        continue  # someone else (or an earlier delivery) started it: resume
                    log.info("command.thread_busy", reason=str(exc))
                    return NAK  # another run is active on the thread
                except (HitlError, RunNotFound, LookupError, ValueError, TypeError) as exc:
                    raise _give_up(exc) from None
            if handle is None:
                await rt.settled(cmd.run_id, recover=True)  # effects its dead worker may have missed
                return ACK  # finished or waiting: nothing left to do
            try:
                await self._follow(handle, log)
                return ACK
            except RunConflict as exc:
                log.info("command.reevaluate", reason=str(exc))
                self.stats["reevaluated"] += 1
                continue
        return NAK

    async def _resume(self, run_id: str, thread_id: str | None, log: Any) -> RunHandle | None:
        rt = self.runtime
        assert rt is not None
        handle = await rt.resume(run_id, thread_id=thread_id)
        if handle is not None:
            self.stats["resumed"] += 1
            log.info("run.resumed_from_log")
        return handle

    async def _follow(self, handle: RunHandle, log: Any) -> None:
        """Wait until the run finishes or waits, applying live control messages meanwhile. If a
        live decision resumed it again in this process, follow that continuation too."""
        rt = self.runtime
        assert rt is not None
        sub = await self.nc.subscribe(control_subject(handle.run_id), cb=self._on_control)
        try:
            while True:
                result = await handle.result()
                nxt = rt.active(handle.run_id)
                if nxt is not None and nxt is not handle:
                    handle = nxt
                    continue
                await rt.settled(handle.run_id)  # observers' effects (sub-agent lineage) before the ack
                log.info("run.settled", status=result.status,
                         termination=None if result.termination is None else result.termination.type)
                return
        finally:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001
                pass

    async def _on_control(self, msg: Any) -> None:
        rt = self.runtime
        assert rt is not None
        try:
            cmd = decode_command(msg.data)
        except InvalidCommand:
            return
        try:
            if isinstance(cmd, Cancel):
                if rt.active(cmd.run_id) is not None:
                    # Record the request, then signal the loop (`Runtime.cancel` does both, in that
                    # order): a loop stopped by the signal alone finishes `cancelled` before the
                    # queued command can record why, and its log then shows no cancel request for
                    # resume and `replay --verify` to follow. The queued command then finds the
                    # run finished or its request recorded.
                    await rt.cancel(cmd.run_id, reason=cmd.reason)
            elif isinstance(cmd, QueueMessages):
                rt.poke(cmd.run_id)  # recorded already: the loop reads it at its next step boundary
            elif isinstance(cmd, Decide):
                if rt.active(cmd.run_id) is not None:
                    # only takes effect if the runtime delivers decisions into a running loop;
                    # otherwise RunNotWaiting and the queued command applies it once the run waits
                    await rt.decide(cmd.run_id, cmd.decisions, thread_id=cmd.thread_id)
        except (HitlError, AgentlogError) as exc:
            _log.debug("control.not_applied", run_id=cmd.run_id, error=str(exc))
        except Exception as exc:  # noqa: BLE001
            _log.warning("control.failed", run_id=cmd.run_id, error=f"{type(exc).__name__}: {exc}")

    # -- decide / cancel -------------------------------------------------------------------------

    async def _decide(self, cmd: Decide, log: Any) -> str:
        rt = self.runtime
        assert rt is not None
        for _ in range(20):
            active = rt.active(cmd.run_id)
            if active is not None:
                await self._follow(active, log)  # runs here: decide once it waits
            try:
                res = await rt.decide(cmd.run_id, cmd.decisions, thread_id=cmd.thread_id)
            except RunNotWaiting as exc:
                view = await rt.run_view(cmd.run_id)
                if view.finished:
                    raise GiveUp("run_not_waiting", f"decision after the run finished: {exc}") from None
                if rt.active(cmd.run_id) is not None:
                    continue
                log.info("command.run_busy_elsewhere", status=view.status)
                return NAK  # running on another worker: apply once it waits
            except RunConflict as exc:
                self.stats["reevaluated"] += 1
                log.info("command.reevaluate", reason=str(exc))
                continue
            except (HitlError, RunNotFound) as exc:
                raise _give_up(exc) from None
            handle = res.handle
            if handle is None:
                # Recorded before: by an earlier delivery of this command whose worker may have
                # died mid-way (the decision moved the run, nobody drives it now): resume it.
                try:
                    handle = await self._resume(cmd.run_id, cmd.thread_id, log)
                except RunConflict as exc:
                    self.stats["reevaluated"] += 1
                    log.info("command.reevaluate", reason=str(exc))
                    continue
                if handle is None:
                    await rt.settled(cmd.run_id, recover=True)  # effects its dead worker may have missed
                    return ACK  # finished or waiting: the decision's effects are committed
            try:
                await self._follow(handle, log)
            except RunConflict as exc:
                self.stats["reevaluated"] += 1
                log.info("command.reevaluate", reason=str(exc))
                continue  # the decision is recorded: the next round resumes the run
            return ACK
        return NAK

    async def _cancel(self, cmd: Cancel, log: Any, queue_seq: int) -> str:
        rt = self.runtime
        assert rt is not None
        try:
            done = await rt.cancel(cmd.run_id, reason=cmd.reason)
        except RunNotFound as exc:
            raise _give_up(exc) from None
        except RunConflict:
            return NAK
        await rt.settled(cmd.run_id)  # e.g. its sub-agents cancelled before the ack
        log.info("run.cancel_command", appended=done)
        if done and await self._orphaned(cmd, queue_seq):
            # Nobody holds the run: its cancel request would never be acted on. Resume it here;
            # the loop meets the recorded request and finishes the run `cancelled`.
            log.info("run.cancel_orphan")
            try:
                handle = await self._resume(cmd.run_id, cmd.thread_id, log)
                if handle is not None:
                    await self._follow(handle, log)
            except RunConflict as exc:  # someone else moved it on: it is not ours to finish
                log.info("command.reevaluate", reason=str(exc))
        return ACK

    async def _queue_messages(self, cmd: QueueMessages, log: Any) -> str:
        """Record the messages on the run (idempotent on their ids), then poke the worker driving
        it through the control subject: it may be another one, and it would otherwise meet them
        only at its next append. A run that has finished cannot take them: dead-lettered with
        `run_finished`, which the gateway answers as a 409."""
        rt = self.runtime
        assert rt is not None
        try:
            res = await rt.queue_messages(cmd.run_id, cmd.messages, mode=cmd.mode, thread_id=cmd.thread_id)
        except (RunEnded, RunNotFound, ValueError, TypeError) as exc:
            raise _give_up(exc) from None
        except RunConflict:
            return NAK
        log.info("run.queue_command", seq=res.seq, duplicate=res.duplicate, mode=cmd.mode)
        try:
            await self.nc.publish(control_subject(cmd.run_id), encode_command(cmd))
        except Exception:  # noqa: BLE001 - live delivery is a shortcut; the recorded message is the truth
            pass
        return ACK

    async def _interrupt_parent(self, cmd: ContinueRun, log: Any, queue_seq: int) -> None:
        """Record the cancel of the parent (`RunCancelRequested`, so resume and replay see why it
        stopped), then signal it live: the worker driving it may be another one, and a loop
        blocked in a tool only meets a recorded request at its next append."""
        assert cmd.parent_run_id is not None
        stop = Cancel(thread_id=cmd.thread_id, run_id=cmd.parent_run_id, reason=INTERRUPTED)
        await self._cancel(stop, log, queue_seq)
        try:
            await self.nc.publish(control_subject(cmd.parent_run_id), encode_command(stop))
        except Exception:  # noqa: BLE001 - live delivery is a shortcut; the recorded request is the truth
            pass

    async def _orphaned(self, cmd: Cancel, queue_seq: int) -> bool:
        """Is the run driven by nobody? Not here, and no other command of its thread is in the
        queue: a run being driven always has its (unacked) command there, the lease of the
        worker driving it. A run started outside the queue, or whose command was given up on,
        has none."""
        rt = self.runtime
        assert rt is not None
        if rt.active(cmd.run_id) is not None:
            return False
        first = await self._next_pending(cmd.thread_id, 1)
        if first == queue_seq:
            first = await self._next_pending(cmd.thread_id, queue_seq + 1)
        return first is None

