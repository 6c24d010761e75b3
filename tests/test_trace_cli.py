"""`agentlog trace RUN_ID`: a recorded run's spans from the log, as JSON and over real OTLP/HTTP
(to a local receiver on 127.0.0.1 decoding the protobuf the exporter sends)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.log.jetstream import JetStreamEventStore
from agentlog.log.server import EmbeddedNatsServer
from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn

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


def test_trace_exports_over_otlp_http(nats_server: EmbeddedNatsServer) -> None:
    run_id = _record(nats_server.url)
    received: list[Any] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            req = ExportTraceServiceRequest()
            req.ParseFromString(data)
            received.append((self.path, req))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *_a: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/traces"
        result = runner.invoke(app, ["trace", run_id, "--otlp", url, "--nats", nats_server.url, "--timeout", "5"])
        assert result.exit_code == 0, result.output
    finally:
        server.shutdown()
        server.server_close()
    spans = [s for _path, req in received for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert {p for p, _ in received} == {"/v1/traces"}
    assert sorted(s.name for s in spans) == ["chat m", "chat m", "execute_tool add", "invoke_agent calc", "step 1", "step 2"]
    by_id = {s.span_id: s.name for s in spans}
    assert {s.name: by_id.get(s.parent_span_id) for s in spans}["execute_tool add"] == "step 1"
