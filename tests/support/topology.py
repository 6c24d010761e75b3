"""Real deployments for tests: what users run, as subprocesses on a real nats-server.

Two topologies, the ones the docs tell users to run:

- `serve`: one `agentlog serve` process (gateway + worker);
- `split`: one `agentlog gateway` process plus `agentlog worker` process(es).

    with deploy("split", tmp_path, app="tests.apps.serve_app:app") as d:
        ...  # d.http_url, d.nats_url; d.kill("gateway"); d.start()

or, in a test module, the `deployment` fixture (tests/conftest.py), parametrized over both
topologies; a module sets what its processes run by overriding the `deployment_options` fixture
(`app`, `tokens`, `env`, `workers`, `args`).

Why the test owns the nats-server (and the processes get `--nats URL`): killing or restarting an
agentlog process must not take the log with it, so crash tests can kill any process and start it
again on the same log. Why synchronous: the processes outlive any one event loop, so one
deployment can serve a whole module (a module-scoped fixture) while each test runs in its own
loop; a test that starts or kills processes from async code blocks its loop for that moment only.

Each process binds HTTP port 0 and prints the port it got in its banner (never pick-then-bind);
its output goes to `<tmp>/<name>.log` (`output(name)`), so a failing test can show it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from agentlog.eventlog.embedded.server import EmbeddedNatsServer

from tests.support import forkserver
from tests.support.serve import HTTP_ROW

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
#: $PYTHONPATH of the processes tests start: the repo root, so that an app spec such as
#: `tests.apps.serve_app:app` imports there as it does in the tests.
PYTHONPATH = str(REPO)

Kind = Literal["serve", "split"]
TOPOLOGIES: tuple[Kind, ...] = ("serve", "split")
#: A deployment's process: a child of this process, or of the fork server (tests/support/forkserver.py).
Process = subprocess.Popen[bytes] | forkserver.ForkedProcess
# Generous: a process imports agentlog and its app on a loaded 2-core machine. A bound, not a sync.
START_TIMEOUT = 60.0
#: What a stopping worker logs while it waits (up to its shutdown timeout, 10 s by default) for
#: the runs it drives: a second Ctrl-C then hands them back at once.
WAITING_FOR_RUNS = "Ctrl-C again hands"


class _Banner:
    """Copies a child's stdout to its log file and tells when its banner (through the NATS row)
    has been printed. A thread, so the pipe is always drained (a full pipe would stall the child)."""

    def __init__(self, stdout: IO[bytes], log: IO[bytes]) -> None:
        self.ready = threading.Event()
        self.text = ""
        self._thread = threading.Thread(target=self._copy, args=(stdout, log), daemon=True)
        self._thread.start()

    def _copy(self, stdout: IO[bytes], log: IO[bytes]) -> None:
        with log:
            for raw in iter(stdout.readline, b""):
                log.write(raw)
                log.flush()
                if not self.ready.is_set():
                    self.text += raw.decode(errors="replace")
                    if "parts" in self.text and "NATS" in self.text:
                        self.ready.set()
        self.ready.set()  # the child ended: `wait` then reports what it printed

    def wait(self, proc: Process, name: str, output: str) -> str:
        if not self.ready.wait(START_TIMEOUT) or "parts" not in self.text:
            raise RuntimeError(f"{name} did not start (exit {proc.poll()}):\n{output}")
        return self.text


class _Stderr:
    """Copies a child's stderr (its logs) to its log file and keeps what it printed, so a test
    can wait for a line (`Deployment.wait_output`) instead of polling the file."""

    def __init__(self, stderr: IO[bytes], log: IO[bytes]) -> None:
        self.text = ""
        self.closed = False
        self.changed = threading.Condition()
        self._thread = threading.Thread(target=self._copy, args=(stderr, log), daemon=True)
        self._thread.start()

    def _copy(self, stderr: IO[bytes], log: IO[bytes]) -> None:
        with stderr, log:
            for raw in iter(stderr.readline, b""):
                log.write(raw)
                log.flush()
                with self.changed:
                    self.text += raw.decode(errors="replace")
                    self.changed.notify_all()
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def wait(self, text: str, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: text in self.text, timeout)

    def wait_closed(self, timeout: float) -> bool:
        """Until the stream has ended and all of it is copied, at most `timeout` s."""
        with self.changed:
            return self.changed.wait_for(lambda: self.closed, timeout)

    def wait_or_closed(self, text: str, timeout: float) -> bool:
        """Until `text` is printed (True) or the stream ends (everything holding it closed it), at
        most `timeout` s (False for both of those)."""
        with self.changed:
            self.changed.wait_for(lambda: text in self.text or self.closed, timeout)
            return text in self.text


@dataclass
class Deployment:
    """One deployment's processes on one nats-server. `start()` starts whatever is not running."""

    kind: Kind
    nats: EmbeddedNatsServer
    tmp: Path
    app: str = "tests.apps.serve_app:app"
    tokens: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    workers: int = 1
    args: Sequence[str] = ()
    http_url: str = ""
    procs: dict[str, Process] = field(default_factory=dict)
    _starts: dict[str, int] = field(default_factory=dict)
    _stderr: dict[str, _Stderr] = field(default_factory=dict)

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def names(self) -> list[str]:
        """The processes of this topology: `serve`, or `gateway` and `worker-0`, `worker-1`, ..."""
        if self.kind == "serve":
            return ["serve"]
        return ["gateway", *(f"worker-{i}" for i in range(self.workers))]

    def _command(self, name: str) -> list[str]:
        role = name.split("-")[0]
        cmd = [sys.executable, "-m", "agentlog", role, "--nats", self.nats_url]
        if role in ("serve", "gateway"):
            cmd += ["--host", "127.0.0.1", "--port", "0", "--tokens", self.tokens]
        if self.app:
            cmd += ["--app", self.app]
        return cmd + list(self.args)

    def start(self, *names: str) -> None:
        """Start the named processes (default: every one not running) at once, as a user's
        compose file or service manager does, then wait for their banners."""
        chosen = names or [n for n in self.names if not self.running(n)]
        banners = {name: self._spawn(name) for name in chosen}
        for name, banner in banners.items():
            self._ready(name, banner)

    def _spawn(self, name: str) -> _Banner:
        self._starts[name] = self._starts.get(name, 0) + 1
        log_path = self.tmp / f"{name}.log"
        log = open(log_path, "ab")  # handed to the copying thread, which closes it
        log.write(f"--- start {self._starts[name]} of {name} ---\n".encode())
        env = {**os.environ, "PYTHONPATH": PYTHONPATH, **self.env}
        command = self._command(name)
        proc: Process
        read_end, write_end = os.pipe()
        with os.fdopen(write_end, "wb") as stderr:  # the child holds its own copy
            if forkserver.enabled():  # the same command, forked from a process that imported it (see there)
                proc = forkserver.SERVER.spawn(command[3:], cwd=str(REPO), env=env, stderr=stderr)
            else:
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                        cwd=str(REPO), env=env)
        assert proc.stdout is not None
        self.procs[name] = proc
        self._stderr[name] = _Stderr(os.fdopen(read_end, "rb"), open(log_path, "ab"))
        return _Banner(proc.stdout, log)

    def _ready(self, name: str, banner: _Banner) -> None:
        text = banner.wait(self.procs[name], name, self.output(name))
        if name in ("serve", "gateway"):
            found = HTTP_ROW.search(text)
            assert found, text
            self.http_url = found.group(1)

    def running(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def kill(self, *names: str) -> None:
        """SIGKILL the named processes (default: all) and reap them: a crash, nothing drains."""
        self._signal(signal.SIGKILL, names)

    def stop(self, *names: str) -> None:
        """SIGTERM the named processes (default: all): the orderly stop a user's Ctrl-C gives."""
        self._signal(signal.SIGTERM, names)

    def stop_now(self) -> None:
        """SIGTERM every process, and a worker that then waits for the runs it drives (a tool a
        test left blocked) gets the second Ctrl-C a user gives to hurry: it hands them back at
        once instead of waiting out its shutdown timeout. The end of a deployment."""
        self._signal(signal.SIGTERM, (), hurry=True)

    def _hurry(self, name: str, proc: Process, deadline: float) -> None:
        """Until the process has ended (or `deadline`: then `_signal` kills it), hurry it with a
        SIGINT once it says it waits for its runs."""
        stderr = self._stderr.get(name)
        while stderr is not None and proc.poll() is None and time.monotonic() < deadline:
            # the stream ends with the process (or its last child): then nothing more is awaited
            if stderr.wait_or_closed(WAITING_FOR_RUNS, 0.5):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
                return
            if stderr.closed:
                return

    def restart(self, *names: str, kill: bool = True) -> None:
        """Kill (or stop) the named processes (default: all) and start them again on the same log."""
        (self.kill if kill else self.stop)(*names)
        self.start(*(names or self.names))

    def _signal(self, sig: signal.Signals, names: Sequence[str], hurry: bool = False) -> None:
        """Send `sig` to the chosen processes, then wait for them all within one 30 s deadline
        (not 30 s each, one after the other); any still there then is SIGKILLed, and named on
        stderr: a process that does not stop on SIGTERM is a bug to look into."""
        chosen = {n: self.procs[n] for n in (names or list(self.procs)) if n in self.procs}
        for proc in chosen.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
        deadline = time.monotonic() + 30
        for name, proc in chosen.items():
            if hurry:
                self._hurry(name, proc, deadline)
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for name, proc in chosen.items():
            if proc.poll() is None:
                print(f"deployment: {name} (pid {proc.pid}) did not end within 30 s of {sig.name}: killed",
                      file=sys.stderr)
                proc.kill()
                proc.wait(timeout=10)

    def wait_output(self, name: str, text: str, timeout: float = START_TIMEOUT) -> None:
        """Wait until the named process (this start of it) has logged `text` on stderr."""
        if not self._stderr[name].wait(text, timeout):
            raise AssertionError(f"{name} did not log {text!r} in {timeout} s:\n{self.output(name)}")

    def output(self, name: str) -> str:
        """What the process printed (all its starts), for assertions. Once the process has ended,
        everything it printed: its last lines may still be on their way through the pipe to the
        copying thread, so this waits (bounded) for the stream to end."""
        proc, stderr = self.procs.get(name), self._stderr.get(name)
        if proc is not None and stderr is not None and proc.poll() is not None:
            stderr.wait_closed(30)
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def outputs(self) -> str:
        return "\n".join(f"===== {name} =====\n{self.output(name)}" for name in self.procs)


@contextlib.contextmanager
def deploy(kind: Kind, tmp_path: Path, *, app: str = "tests.apps.serve_app:app", tokens: str = "",
           env: Mapping[str, str] | None = None, workers: int = 1, args: Sequence[str] = (),
           nats: EmbeddedNatsServer | None = None) -> Iterator[Deployment]:
    """A running deployment of `kind` on its own nats-server (or `nats`, which the caller owns),
    stopped (SIGTERM, then SIGKILL) on exit. `app` is a `module:attr` importable from the repo root
    (`tests.apps.serve_app:app`), or a config file path; `env` is added to every process's environment (e.g.
    `SERVE_APP_HOLD_DIR` for serve_app)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    own = nats is None
    server = nats or EmbeddedNatsServer(tmp_path / "nats")
    if own:
        server.start()
    deployment = Deployment(kind, server, tmp_path, app=app, tokens=tokens, env=dict(env or {}),
                            workers=workers, args=tuple(args))
    try:
        deployment.start()
        yield deployment
    finally:
        try:
            deployment.stop_now()
        finally:
            if own:
                server.stop()


__all__ = ["TOPOLOGIES", "Deployment", "Kind", "deploy"]
