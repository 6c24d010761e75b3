"""`agentlog nats req|sub` and the NATS section of the HTTP and NATS guide, run as written.

The deployment is what a user of the guide has: `agentlog serve` (and `agentlog gateway` +
`agentlog worker`) with the demo's default app on the embedded nats-server of a data dir
(`.agentlog` in the directory the commands run in), which starts with the data dir's generated
credentials. The test holds that data dir's share of the server (what `serve` would do), so the
server processes can be killed and started on it like in every deployment test; they log in as
`serve`, and the `agentlog nats` commands find the server and their password (`client`,
`readonly`) in the data dir, as the guide says. Every command is a subprocess of the installed
`agentlog`.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.gateway.operations.connection import ConnectionOptions, acquire_embedded

from tests.support import forkserver
from tests.support.docs import all_blocks
from tests.support.topology import TOPOLOGIES, Deployment, deploy

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")

AGENTLOG = str(Path(sys.executable).parent / "agentlog")
#: Bounds a command (a run of the demo takes seconds); not a synchronisation.
LIMIT = 120


def nats_blocks() -> tuple[str, str]:
    """The guide's NATS section: the `agentlog nats sub` block (a second terminal) and the
    script that drives a run with `agentlog nats req`."""
    blocks = [b.code for b in all_blocks("bash")]
    watch = next(b for b in blocks if "agentlog nats sub" in b)
    script = next(b for b in blocks if "agentlog nats req agentlog.api.runs.start" in b)
    return watch, script


def _env() -> dict[str, str]:
    """A user's shell: the installed `agentlog` on PATH, no agentlog variables, no proxies."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTLOG_", "NATS_")) and "proxy" not in k.lower()}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    return env


@pytest.fixture(scope="module", params=TOPOLOGIES)
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The demo's app deployed on the embedded server of `<home>/.agentlog` (`Deployment.tmp.parent`
    is `<home>`, where the commands run)."""
    home = tmp_path_factory.mktemp(f"nats-cli-{request.param}")
    shared = asyncio.run(acquire_embedded(ConnectionOptions(data_dir=home / ".agentlog", timeout=30)))
    try:
        login = shared.url.replace("nats://", f"nats://serve:{shared.credentials.passwords['serve']}@")
        server: Any = SimpleNamespace(url=shared.url)  # deploy() only reads the URL of a server it does not own
        with deploy(request.param, home / "deployment", app="agentlog.cli.demo:app", nats=server,
                    args=["--nats", login]) as running:
            yield running
    finally:
        shared.close()


def agentlog(demo: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    """`agentlog nats ARGS` in its own process (forked from the fork server: tests/support/forkserver.py)."""
    return forkserver.run(["nats", *args], cwd=str(demo.tmp.parent), env=_env(), timeout=LIMIT)


class Watcher:
    """A background command that reports readiness on stderr (`agentlog nats sub`'s "listening
    on ..."): started, then waited for until it says so. Its output is read by threads into
    queues, so every wait is bounded."""

    def __init__(self, demo: Deployment, command: str) -> None:
        self.proc = subprocess.Popen(["bash", "-c", command], cwd=demo.tmp.parent, env=_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=lambda s=stream, q=into: [q.put(line) for line in iter(s.readline, "")],
                             daemon=True).start()
        ready = self.err.get(timeout=LIMIT)  # it has subscribed (or failed)
        assert ready.startswith("listening on"), ready

    def lines(self, count: int) -> list[str]:
        """Its next `count` lines of output, each waited for (bounded)."""
        return [self.out.get(timeout=LIMIT) for _ in range(count)]

    def stop(self) -> int:
        """Ctrl-C, as a user ends it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=LIMIT)


def test_readme_nats_section_runs_as_written(demo: Deployment) -> None:
    """The second-terminal `sub` first, then the script: it starts a run, waits for its approval,
    approves it, and reads the thread, all as `client`; the `sub` (as `readonly`) sees the runs'
    live output. In `serve` only: that is what the section describes (its data dir, its banner),
    and the section is a dozen CLI processes in a row; gateway + worker answer the same
    requests in the tests below."""
    if demo.kind != "serve":
        pytest.skip("the guide's NATS section is written for `agentlog serve`")
    watch, script = nats_blocks()
    (command,) = [line for line in watch.splitlines() if line.startswith("agentlog nats sub")]
    watcher = Watcher(demo, command)
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script + 'echo "RUN=$RUN THREAD=$THREAD"\n'],
                              cwd=demo.tmp.parent, env=_env(), capture_output=True, text=True, timeout=LIMIT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + demo.outputs()
        run_id, thread_id = re.findall(r"RUN=(\S+) THREAD=(\S+)", done.stdout)[-1]
        (live,) = watcher.lines(1)
        assert json.loads(live)["type"] in ("text_delta", "tool_call_delta", "tool_progress", "reasoning_delta")
    finally:
        assert watcher.stop() == 0
    info = json.loads(done.stdout.splitlines()[0])  # `$SRV.INFO.agentlog`
    assert info["name"] == "agentlog" and any(e["subject"] == "agentlog.api.runs.start" for e in info["endpoints"])
    # what the script did is in the log: the approved run finished, and its thread reads back
    view = json.loads(agentlog(demo, "req", "agentlog.api.runs.get", json.dumps({"run_id": run_id})).stdout)
    assert view["status"] == "done" and view["termination"]["type"] == "natural_end", view
    assert view["thread_id"] == thread_id
    decided = [call for call in view["calls"].values() if call.get("decision")]
    assert decided and all(call["decision"]["result"] == {"approved": True} for call in decided), view["calls"]
    assert '"role": "user"' in done.stdout or '"role":"user"' in done.stdout  # threads.messages answered


def test_sub_receives_a_runs_live_output_started_with_req(demo: Deployment) -> None:
    """`sub` on one run's live subject, then `req runs.start` with that run's ids: the sub prints
    the run's live output (JSON lines) and exits after --count."""
    thread_id, run_id = "t-natscli-live", "r-natscli-live"
    watcher = Watcher(demo, f"exec {AGENTLOG} nats sub agentlog.live.{thread_id}.{run_id} --count 2")
    started = agentlog(demo, "req", "agentlog.api.runs.start", json.dumps(
        {"agent_id": "deployer", "messages": "Ship release 1.4.2 to staging.", "thread_id": thread_id,
         "run_id": run_id}))
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["run_id"] == run_id
    assert all(json.loads(line)["type"] for line in watcher.lines(2))
    assert watcher.proc.wait(timeout=LIMIT) == 0


def test_req_streams_an_adapter_run(demo: Deployment) -> None:
    """`--stream` with a header: the AG-UI adapter over NATS answers with many messages; they are
    printed in order up to the end marker (the run pauses for its approval)."""
    body = {"threadId": "t-natscli-agui", "runId": "r-natscli-agui", "tools": [], "context": [], "state": {},
            "forwardedProps": {}, "messages": [{"id": "u1", "role": "user", "content": "Ship release 1.4.2."}]}
    done = agentlog(demo, "req", "--stream", "-H", "Agentlog-Agent: deployer", "agentlog.ag-ui.runs", json.dumps(body))
    assert done.returncode == 0, done.stderr + demo.outputs()
    types = [json.loads(line)["type"] for line in done.stdout.splitlines()]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types


def test_req_and_sub_errors_are_one_line_and_an_exit_code(demo: Deployment) -> None:
    """An API error keeps its code (exit 2 for a 4xx); nothing answering, a refused publish or
    subscription (`client` may not touch the log or watch live output) and a bad option each say
    so in one line. (In process, the command's own code: the subprocess path is covered above.)"""
    data_dir = str(demo.tmp.parent / ".agentlog")

    def cli(*args: str, timeout: str = "5") -> Any:
        result = runner.invoke(app, ["nats", *args, "--data-dir", data_dir, "--timeout", timeout],
                               env={"AGENTLOG_NATS_URL": None, "AGENTLOG_DATA_DIR": None})
        assert "Traceback" not in result.output, result.output
        return result

    unknown = cli("req", "agentlog.api.runs.get", '{"run_id": "r-natscli-nope"}')
    assert unknown.exit_code == 2 and "error [run_not_found]" in unknown.output, unknown.output
    bad = cli("req", "agentlog.api.runs.start", "{not json")
    assert bad.exit_code == 2 and "error [invalid_json]" in bad.output, bad.output
    nobody = cli("req", "agentlog.api.nothing.here", "{}")
    assert nobody.exit_code == 1 and "error [store_unavailable]" in nobody.output, nobody.output
    refused = cli("sub", "agentlog.live.>", "--user", "client")
    assert refused.exit_code == 1 and "error [permission_denied]" in refused.output, refused.output
    # a denied request gets no answer: the command says why as soon as the server refuses the
    # publish, not after its timeout (600 s: the test would time out first)
    for stream in ([], ["--stream"]):
        denied = cli("req", *stream, "agentlog.ev.t1", "{}", timeout="600")
        assert denied.exit_code == 1 and "error [permission_denied]" in denied.output, denied.output
        assert 'Publish to "agentlog.ev.t1"' in denied.output, denied.output
    for args in (["req", "x", "--user", "root"], ["req", "x", "-H", "no-colon"]):
        usage = cli(*args)
        assert usage.exit_code == 2 and "error [usage_error]" in usage.output, usage.output


async def test_req_and_sub_on_a_server_named_by_url_without_a_login(nats_server: Any) -> None:
    """A user's own nats-server without accounts (`--nats URL`, no password, no creds): `req` and
    `sub` connect with no login at all instead of failing on one they were not given."""
    import nats as nats_py

    nc = await nats_py.connect(nats_server.url)
    try:
        async def answer(msg: Any) -> None:
            await msg.respond(b'{"pong": ' + msg.data + b"}")

        await nc.subscribe("probe.echo", cb=answer)
        await nc.flush()
        env = _env()
        req = await asyncio.create_subprocess_exec(AGENTLOG, "nats", "req", "probe.echo", "1", "--nats", nats_server.url,
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(req.communicate(), LIMIT)
        assert req.returncode == 0 and json.loads(out) == {"pong": 1}, err.decode()
        sub = await asyncio.create_subprocess_exec(AGENTLOG, "nats", "sub", "probe.live", "--count", "1", "--nats",
                                                   nats_server.url, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                   env=env)
        assert sub.stderr is not None
        ready = await asyncio.wait_for(sub.stderr.readline(), LIMIT)
        assert ready.decode().startswith("listening on probe.live"), ready
        await nc.publish("probe.live", b'{"n": 1}')
        out, err = await asyncio.wait_for(sub.communicate(), LIMIT)
        assert sub.returncode == 0 and json.loads(out) == {"n": 1}, err.decode()
    finally:
        await nc.close()
