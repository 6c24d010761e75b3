"""`agentlog trace RUN_ID`: a recorded run's spans from the log, as JSON and over real OTLP/HTTP
(to a local receiver on 127.0.0.1 decoding the protobuf the exporter sends); and of a run of
what users run (`protocol_deployment`), approved on the way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.cli.demo import follow_run
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.ids import new_id
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn

from tests.support.deployed_runs import LIMIT, start_and_settle
from tests.support.topology import Deployment

runner = CliRunner()


@tool
async def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers."""
    return a + b


def _record(url: str) -> str:
    async def main() -> str:
        store = await JetStreamEventStore.connect(url)
        try:
            rt = Runtime(store, agents=[AgentSpec(id="calc", model="m", tools=["add"])], tools=[add],
                         models={"m": ScriptedModel([Turn.tool("add", {"a": 1, "b": 2}), Turn.text("3")], name="m")})
            return (await rt.run("calc", "1+2")).run_id
        finally:
            await store.close()

    return asyncio.run(main())


def test_trace_json_is_the_span_tree_of_the_run(nats_server: EmbeddedNatsServer) -> None:
    run_id = _record(nats_server.url)
    result = runner.invoke(app, ["trace", run_id, "--json", "--nats", nats_server.url, "--timeout", "5"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    spans = {s["name"]: s for s in doc["spans"]}
    assert set(spans) == {"invoke_agent calc", "step 1", "step 2", "chat m", "execute_tool add"}
    keys = {s["key"]: s["name"] for s in doc["spans"]}
    assert spans["execute_tool add"]["attributes"]["gen_ai.tool.name"] == "add"
    assert keys[spans["execute_tool add"]["parent"]] == "step 1"
    assert spans["invoke_agent calc"]["parent"] is None
    assert doc["exported"] is False
    text = runner.invoke(app, ["trace", run_id, "--nats", nats_server.url, "--timeout", "5"])
    assert text.exit_code == 0 and "execute_tool add" in text.stdout


def test_trace_unknown_run_exits_2(nats_server: EmbeddedNatsServer) -> None:
    result = runner.invoke(app, ["trace", "nope", "--nats", nats_server.url, "--timeout", "5"])
    assert result.exit_code == 2 and "nope" in result.output


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[Any]]]:
    """A local OTLP/HTTP trace receiver on 127.0.0.1: (its /v1/traces URL, the spans it got)."""
    received: list[Any] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            req = ExportTraceServiceRequest()
            req.ParseFromString(data)
            assert self.path == "/v1/traces", self.path
            received.extend(s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *_a: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()


def test_trace_exports_over_otlp_http(nats_server: EmbeddedNatsServer) -> None:
    run_id = _record(nats_server.url)
    with otlp_receiver() as (url, spans):
        result = runner.invoke(app, ["trace", run_id, "--otlp", url, "--nats", nats_server.url, "--timeout", "5"])
        assert result.exit_code == 0, result.output
    assert sorted(s.name for s in spans) == ["chat m", "chat m", "execute_tool add", "invoke_agent calc", "step 1", "step 2"]
    by_id = {s.span_id: s.name for s in spans}
    assert {s.name: by_id.get(s.parent_span_id) for s in spans}["execute_tool add"] == "step 1"


def test_serve_exports_live_spans_when_otlp_is_configured(nats_server: EmbeddedNatsServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set: the process that executes runs (here `serve`:
    its worker part) exports each run's spans live, as they happen, without `agentlog trace`."""
    from agentlog.cli.assembly import ServerConfig, serve
    from agentlog.gateway.operations.connection import ConnectionOptions

    async def run_one() -> str:
        config = ServerConfig(role="serve", app_spec="tests.apps.worker_app:app", port=0, tokens="",
                              connection=ConnectionOptions(nats_url=nats_server.url))
        async with serve(config) as server, aiohttp.ClientSession(server.http_url) as http:
            async with http.post("/v1/runs", json={"agent_id": "quick", "messages": "go"}) as r:
                assert r.status == 202, await r.text()
                started = await r.json()
            async with asyncio.timeout(30), http.get(f"/v1/runs/{started['run_id']}/events",
                                                     params={"follow": "true"}) as events:
                async for line in events.content:  # the run's SSE stream ends when it finishes
                    assert not line.startswith(b"event: error"), line
            return str(started["run_id"])  # leaving serve shuts the tracer provider down (flush)

    with otlp_receiver() as (url, spans):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
        run_id = asyncio.run(run_one())
    names = sorted(s.name for s in spans)
    assert names == ["chat quick", "chat quick", "execute_tool work", "invoke_agent quick", "step 1", "step 2"], names
    root = next(s for s in spans if s.name == "invoke_agent quick")
    attributes = {a.key: a.value.string_value for a in root.attributes}
    assert run_id in attributes.values(), attributes


async def test_trace_puts_a_call_run_after_its_approval_under_its_step(protocol_deployment: Deployment) -> None:
    """A call that waited for an approval runs after its step ended (the run waited): its span
    is still that step's child, and the step ends with it."""
    d = protocol_deployment
    async with aiohttp.ClientSession(d.http_url) as http:
        started, seq, _ = await start_and_settle(d.nats_url, http, {
            "agent_id": "sequential", "messages": "approval: deploy it", "thread_id": f"trace{new_id()}"})
        run_id, thread_id = started["run_id"], started["thread_id"]
        async with http.get(f"/v1/runs/{run_id}", params={"min_seq": str(seq)}) as r:
            view = await r.json()
        assert view["status"] == "waiting", view
        (call,) = view["calls"]
        decision = {"target_id": call, "decision_id": f"d{new_id()}", "action": "resume", "result": {"approved": True}}
        async with http.post(f"/v1/runs/{run_id}/inputs", json={"decisions": [decision]}) as r:
            assert r.status == 202, await r.text()
    store = await JetStreamEventStore.connect(d.nats_url)
    try:
        async with asyncio.timeout(LIMIT):
            await follow_run(store, thread_id, run_id, seq, lambda _c: None)
    finally:
        await store.close()
    result = await asyncio.to_thread(runner.invoke, app, ["trace", run_id, "--json", "--nats", d.nats_url,
                                                          "--timeout", "5"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    spans = {s["name"]: s for s in doc["spans"]}
    names = {s["key"]: s["name"] for s in doc["spans"]}
    tool = spans["execute_tool echo"]
    assert tool["attributes"]["agentlog.tool.outcome"] == "succeeded"
    assert names[tool["parent"]] == "step 1", doc["spans"]
    assert spans["step 1"]["end_ms"] >= tool["end_ms"]
