"""A worker started before NATS answers waits for it (bounded by the store outage deadline)
instead of exiting: in a compose file or on a node restart the worker often comes up first, and
a fresh cluster answers "temporarily unavailable" while it elects leaders (CI once saw both
workers of the 3-node chaos test exit at start)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.inputs.commands import StartRun
from agentlog.runtime.outage import is_transient
from agentlog.runtime.workers.commands import CommandClient

from tests.support.worker import Watch, kill_all, spawn_worker


async def test_a_worker_started_before_nats_waits_for_it_then_runs(tmp_path: Path) -> None:
    held = socket.socket()  # the port stays bound (refusing connections) until the server takes it
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    url = f"nats://127.0.0.1:{port}"
    # each connect attempt gives up after --timeout (5 s by default): the first failed one is
    # the "store.waiting" line waited for below
    worker = await spawn_worker(url, tmp_path, "w", env={"AGENTLOG_STORE_OUTAGE_DEADLINE": "60"},
                                args=["--timeout", "2"])
    server = EmbeddedNatsServer(tmp_path / "nats", port=port)
    store = None
    try:
        log = tmp_path / "w.log"
        async with asyncio.timeout(60):
            while b"store.waiting" not in (log.read_bytes() if log.exists() else b""):
                assert worker.returncode is None, log.read_text()
                await asyncio.sleep(0.05)  # polling a subprocess's log file; the order is what is checked
        held.close()
        server.start()  # only now is there a NATS to talk to
        store = await JetStreamEventStore.connect(server.url)
        watch = Watch(store, "t1")
        async with asyncio.timeout(60):
            await CommandClient(store.nc).submit(StartRun(thread_id="t1", run_id="r1", agent_id="quick", messages=["hi"]))
            assert await watch.status_in("r1", {"done", "error"}) == "done"
        assert worker.returncode is None
        await watch.close()
    finally:
        held.close()
        await kill_all([worker])
        if store is not None:
            await store.close()
        server.stop()


def test_what_counts_as_transient() -> None:
    import nats.errors
    import nats.js.errors

    from agentlog.eventlog.errors import StoreUnavailable

    assert is_transient(StoreUnavailable("x")) and is_transient(TimeoutError())
    assert is_transient(nats.errors.NoServersError()) and is_transient(nats.errors.NoRespondersError())
    assert is_transient(ConnectionRefusedError())
    assert is_transient(nats.js.errors.ServiceUnavailableError(code=503))
    assert is_transient(nats.js.errors.APIError(code=500, err_code=10008))
    assert is_transient(nats.js.errors.BadRequestError(code=400, err_code=10023))  # insufficient resources
    assert not is_transient(nats.js.errors.BadRequestError(code=400, err_code=10058))  # name in use, other config
    assert not is_transient(ValueError("bad app")) and not is_transient(FileNotFoundError("creds"))
