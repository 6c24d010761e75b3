"""Logging hygiene (`agentlog.cli.logging`): logs go to stderr at the configured level whatever the
import order, so `--json` stdout stays one clean document even when `runtime` (whose loggers are
bound at import) is imported before the CLI configures logging. Fresh interpreters (subprocess):
the point is what happens at import time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.runtime.test_hitl_scenarios import resume_in_process, start_waiting
from tests.support import hitl as S

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(["timeout", "60", sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def test_loggers_bound_before_configuration_log_to_stderr_at_the_level() -> None:
    proc = _python(
        "import agentlog.runtime.facade as rr\n"  # binds its module-level logger under the default config
        "from agentlog.cli import logging as L\n"
        "L.configure('info')\n"
        "rr._log.info('early.info')\n"
        "rr._log.debug('early.debug')\n"
        "import structlog; structlog.get_logger('late').info('late.info')\n",
        env={"AGENTLOG_LOG_FORMAT": "json"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    events = [json.loads(line)["event"] for line in proc.stderr.splitlines()]
    assert events == ["early.info", "late.info"]


def test_console_format_on_request() -> None:
    proc = _python("from agentlog.cli import logging as L\nL.configure('warning')\n"
                   "import structlog; structlog.get_logger('x').warning('hello.console')\n",
                   env={"AGENTLOG_LOG_FORMAT": "console"})
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    line = proc.stderr.strip()
    assert "hello.console" in line and not line.startswith("{")


def test_json_cli_output_is_clean_when_runtime_is_imported_first(nats_server: EmbeddedNatsServer) -> None:
    """`replay --verify --json` of a run cancelled while waiting (the runtime logs at info while
    re-executing it), in a process that imported `runtime` before the CLI configured logging."""

    async def record() -> None:
        store = await JetStreamEventStore.connect(nats_server.url)
        try:
            await start_waiting(store, "cancel_waiting")
            await resume_in_process(store, "cancel_waiting")
        finally:
            await store.close()

    asyncio.run(record())
    for level in ("info", "debug"):
        proc = _python(
            "import sys, agentlog.runtime, agentlog.runtime.facade\n"
            "from agentlog.cli import main\n"
            "sys.argv[0] = 'agentlog'\n"
            "main()\n",
            "--log-level", level, "replay", S.RUN, "--verify", "--app", "tests.apps.replay_app:hitl_cancel_waiting",
            "--json", "--nats", nats_server.url,
        )
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)  # one JSON document, nothing else
        assert doc["ok"] is True and doc["termination"]["type"] == "cancelled"
