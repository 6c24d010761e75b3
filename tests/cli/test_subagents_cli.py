"""`agentlog replay RUN --verify` across a parent run and its sub-agent child runs."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.toolkits.subagents import child_ids

from tests.apps import subagents_app

runner = CliRunner()


def _record(url: str) -> None:
    async def main() -> None:
        store = await JetStreamEventStore.connect(url)
        try:
            rt = subagents_app.app(store)
            async with asyncio.timeout(20):
                result = await rt.run("boss", "go", thread_id="t", run_id="boss-run")
            assert result.termination.type == "natural_end"
        finally:
            await store.close()

    asyncio.run(main())


def test_replay_verify_covers_parent_and_children(nats_server: EmbeddedNatsServer) -> None:
    _record(nats_server.url)
    child = child_ids("boss-run", "c-run")[1]
    # re-executing tools (not the default): a changed child tool must show as a divergence
    args = ["replay", "boss-run", "--verify", "--reexecute-tools", "*", "--json", "--nats", nats_server.url,
            "--timeout", "5"]
    ok = runner.invoke(cli_app, [*args, "--app", "tests.apps.subagents_app:app"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout.strip().splitlines()[-1])
    assert doc["ok"] is True and doc["run_id"] == "boss-run"
    assert [(c["run_id"], c["ok"], c["tools_executed"]) for c in doc["children"]] == [(child, True, 1)]
    # a tool of the child that now answers differently: the parent still verifies (its
    # agent_run answers from the log), the child diverges, the command exits 1
    bad = runner.invoke(cli_app, [*args, "--app", "tests.apps.subagents_app:tampered"])
    assert bad.exit_code == 1, bad.output
    doc = json.loads(bad.stdout.strip().splitlines()[-1])
    assert doc["ok"] is False and doc["children"][0]["run_id"] == child
    assert doc["children"][0]["divergence"]["expected"]["type"] == "ToolCallCompleted"
