"""Schemathesis against the live `/openapi.json`: every documented operation, fed schema-generated
input on a small example budget, never answers with a server error (5xx).

Why a background thread: schemathesis calls the API synchronously (requests), so the server
(real nats-server, JetStream store, KV views, a running ProjectionRunner, an in-process
dispatcher over the small scripted app of `tests.support.http_write`, and the protocol adapters'
routes) runs on its own event loop in a thread and is reached over loopback like any client.

Why `follow=false` on the event streams: a followed stream of a live thread is meant to stay
open (heartbeats) until the client leaves, so a generated `follow=true` would hang the example
instead of testing input handling; with `follow=false` the stream is the history, then the end.
Each request also has a client timeout, so a stream that does not end fails the test rather
than hanging it.

Budget: `max_examples` per operation and generation mode (MAX_EXAMPLES; $AGENTLOG_SCHEMATHESIS_EXAMPLES
for a deeper local run), no deadline; derandomized when $CI is set
(the conftest profile), random exploration locally.

Why shards: the examples are CPU-bound in one process (client and server share it), so the
operations are dealt round-robin into SHARDS tests that the suite's processes take in parallel;
together they test every operation on the whole budget. The shards of one process share its API.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from agentlog.eventlog.embedded.server import EmbeddedNatsServer

from tests.support.http_write import open_stack

pytestmark = pytest.mark.early  # many seconds: started first (tests/conftest.py)

MAX_EXAMPLES = int(os.environ.get("AGENTLOG_SCHEMATHESIS_EXAMPLES", "20"))
#: Valid input (does the happy path hold up?) and schema-violating input (is it a clean 4xx?).
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
REQUEST_TIMEOUT = 20.0
#: Operations whose streams follow the log live when asked to (see the module docstring).
STREAMS = {"/v1/threads/{id}/events", "/v1/runs/{id}/events", "/v1/ai-sdk/runs/{id}/stream", "/v1/changes"}
#: Tests the operations are dealt into (see the module docstring).
SHARDS = 6


class LiveApi:
    """The gateway stack served on 127.0.0.1 from its own event loop in a daemon thread."""

    def __init__(self, server: EmbeddedNatsServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.base_url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="schemathesis-api", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        from agentlog.gateway.adapters.routes import ROUTES as ADAPTER_ROUTES
        from agentlog.gateway.http import Settings
        from agentlog.gateway.http.write import write_routes

        from tests.support.inprocess import InProcessDispatcher

        self._stop = asyncio.Event()
        async with open_stack(self.server) as stack:
            # open_stack's app has the core + write routes; add the adapters' so the whole
            # documented surface of `agentlog serve` is exercised.
            await stack.client.close()
            from aiohttp import web

            from agentlog.gateway.http import create_app

            app = create_app(stack.store, stack.views, stack.runner, auth_tokens="",
                             dispatcher=InProcessDispatcher(stack.runtime),
                             extra_routes=[*write_routes(stack.dispatcher), *ADAPTER_ROUTES],
                             settings=Settings(read_wait=2.0, sse_heartbeat=0.5, max_body=64 * 1024))
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
            self.base_url = f"http://127.0.0.1:{port}"
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

    def __enter__(self) -> LiveApi:
        self._thread.start()
        if not self._ready.wait(60) or self._error is not None:
            raise RuntimeError("the API did not start") from self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def _described(exc: BaseException) -> str:
    """The failure with what it wraps: hypothesis reports a failure that did not repeat as a group
    whose members say what the first call met (a 5xx, a timeout)."""
    inner = getattr(exc, "exceptions", ())
    return f"{exc}" + "".join(f"\n  - {type(e).__name__}: {e}" for e in inner)


@pytest.fixture(scope="module")
def live_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    server = EmbeddedNatsServer(tmp_path_factory.mktemp("schemathesis") / "nats")
    server.start()
    try:
        with LiveApi(server) as api:
            yield api
    finally:
        server.stop()


# Over the suite's 120 s hang guard on a loaded machine. pytest-timeout's exception would land
# inside a hypothesis example and be reported as a flaky example; each request has its own
# timeout (REQUEST_TIMEOUT).
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shard", range(SHARDS))
def test_no_server_errors(live_api: LiveApi, shard: int) -> None:
    schema = schemathesis.openapi.from_url(f"{live_api.base_url}/openapi.json", timeout=REQUEST_TIMEOUT)
    session = requests.Session()
    failures: list[str] = []
    tested: list[str] = []
    operations = sorted((result.ok() for result in schema.get_all_operations()),
                        key=lambda op: (op.path, op.method))
    assert len(operations) >= 20, [f"{op.method.upper()} {op.path}" for op in operations]
    for operation, mode in itertools.product(operations[shard::SHARDS], MODES):
        stream = operation.path in STREAMS

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            if stream:  # noqa: B023  (the test runs within this iteration)
                case.query = {**(case.query or {}), "follow": "false"}
            response = case.call(base_url=live_api.base_url, session=session, timeout=REQUEST_TIMEOUT)
            case.validate_response(response, checks=[not_a_server_error])

        try:
            check()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE, operation.path  # nothing to violate: no inputs
            continue
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure, then report
            failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {_described(exc)}")
        tested.append(f"{operation.method.upper()} {operation.path}")
    print("SHARDOPS", shard, tested)
    assert tested, shard
    assert not failures, "\n\n".join(failures)
