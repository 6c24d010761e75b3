"""`DaemonThreads`, the threads sync tools run in: each call has a daemon thread of its own
while it runs (a blocked call holds up no other), a thread idle after its call takes the next
one, an idle thread ends after `idle` seconds, and under many submitters racing threads that
time out every job runs exactly once."""

from __future__ import annotations

import threading
import time

from agentlog.runtime.tools import DaemonThreads

WAIT = 20.0


def test_a_blocked_call_holds_up_no_other_and_each_runs_in_a_daemon_thread() -> None:
    pool = DaemonThreads(idle=WAIT)
    release, second_ran = threading.Event(), threading.Event()
    ran_in: list[threading.Thread] = []

    def blocked() -> None:
        ran_in.append(threading.current_thread())
        release.wait(WAIT)

    def second() -> None:
        ran_in.append(threading.current_thread())
        second_ran.set()

    pool.submit(blocked, name="t-blocked")
    pool.submit(second, name="t-second")
    assert second_ran.wait(WAIT)
    release.set()
    assert len({id(t) for t in ran_in}) == 2 and all(t.daemon for t in ran_in)


def test_an_idle_thread_takes_the_next_call_and_ends_after_idle_seconds() -> None:
    pool = DaemonThreads(idle=WAIT)
    threads: list[threading.Thread] = []
    done = threading.Semaphore(0)

    def job() -> None:
        threads.append(threading.current_thread())
        done.release()

    pool.submit(job, name="t-one")
    assert done.acquire(timeout=WAIT)
    deadline = time.monotonic() + WAIT
    while pool.idle_threads == 0 and time.monotonic() < deadline:  # it counts itself idle after its call
        threads[0].join(0.001)
    assert pool.idle_threads == 1
    pool.submit(job, name="t-two")
    assert done.acquire(timeout=WAIT)
    assert threads[0] is threads[1]

    short = DaemonThreads(idle=0.01)
    short.submit(job, name="t-short")
    assert done.acquire(timeout=WAIT)
    threads[-1].join(WAIT)
    assert not threads[-1].is_alive() and short.idle_threads == 0


def test_racing_submitters_and_timing_out_threads_run_every_job_once() -> None:
    pool = DaemonThreads(idle=0.0005)  # threads time out while jobs arrive
    runs = [0] * 3000
    lock = threading.Lock()
    finished = threading.Semaphore(0)

    def job(i: int) -> None:
        with lock:
            runs[i] += 1
        finished.release()

    def submitter(part: range) -> None:
        for i in part:
            pool.submit(lambda i=i: job(i), name=f"t-{i}")

    submitters = [threading.Thread(target=submitter, args=(range(k, len(runs), 4),)) for k in range(4)]
    for t in submitters:
        t.start()
    for t in submitters:
        t.join(WAIT)
    for _ in runs:
        assert finished.acquire(timeout=WAIT)
    assert runs == [1] * len(runs)
