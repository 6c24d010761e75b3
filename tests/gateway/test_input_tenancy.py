"""A 404 for a run or thread another tenant owns is byte-identical (status, code, message, body)
to the 404 for an id that does not exist, on every route that takes a run or thread id: HTTP
(core API and both adapters) and the NATS micro service. Any difference leaks what another tenant
has, e.g. tenant B's `GET /v1/ai-sdk/runs/<A's run>/stream` naming A's thread id in its message.

The probe ids have the same length as the real ones, so even Content-Length cannot tell. Against
what users run: `tokens_deployment` (conftest.py; this module's tenants are C and D), `agentlog
serve` and `agentlog gateway` + `agentlog worker`."""

from __future__ import annotations

import asyncio
import json

from tests.support.input import TIMEOUT, http_call, nats_call, open_deployed, waiting_run
from tests.support.topology import Deployment

A = {"Authorization": "Bearer tc"}
B = {"Authorization": "Bearer td"}


def _ghost(real: str, ch: str) -> str:
    return ch * len(real)


async def test_other_tenants_ids_look_exactly_like_unknown_ids(tokens_deployment: Deployment) -> None:
    async with asyncio.timeout(TIMEOUT * 2), open_deployed(tokens_deployment) as s:
        t, r, _call = await waiting_run(s, A, resource_id="tenantC/u1")
        seq = await s.store.last_seq()
        status, raw = await http_call(s, "GET", f"/v1/runs/{r}?min_seq={seq}", None, A)
        assert status == 200, raw  # the views know A's thread and run
        agent = s.agent
        http = [
            ("GET", "/v1/runs/{r}", None), ("GET", "/v1/runs/{r}/events", None),
            ("POST", "/v1/runs/{r}/inputs", {"messages": "hi"}), ("POST", "/v1/runs/{r}/cancel", {}),
            ("GET", "/v1/ai-sdk/runs/{r}/stream", None),
            ("POST", "/v1/runs", {"agent_id": agent, "parent_run_id": "{r}", "messages": "hi"}),
            ("GET", "/v1/threads/{t}", None), ("GET", "/v1/threads/{t}/messages", None),
            ("GET", "/v1/threads/{t}/state", None), ("GET", "/v1/threads/{t}/events", None),
            ("PATCH", "/v1/threads/{t}", {"metadata": {"k": "v"}}), ("DELETE", "/v1/threads/{t}", None),
            ("GET", "/v1/ag-ui/threads/{t}/messages", None), ("GET", "/v1/ai-sdk/threads/{t}/messages", None),
        ]
        nats = [
            ("runs.get", {"run_id": "{r}"}), ("runs.inputs", {"run_id": "{r}", "messages": "hi"}),
            ("runs.cancel", {"run_id": "{r}"}), ("threads.get", {"thread_id": "{t}"}),
            ("threads.messages", {"thread_id": "{t}"}),
            ("runs.start", {"agent_id": agent, "parent_run_id": "{r}", "messages": "hi"}),
        ]

        def fill(text: str, run: str, thread: str) -> str:
            return text.replace("{r}", run).replace("{t}", thread)

        differences = []
        for method, path, body in http:
            answers = []
            for run, thread in ((r, t), (_ghost(r, "y"), _ghost(t, "z"))):
                data = fill(json.dumps(body), run, thread).encode() if body is not None else None
                status, raw = await http_call(s, method, fill(path, run, thread), data, B)
                answers.append((status, raw.decode().replace(run, "<run>").replace(thread, "<thread>")))
            if answers[0] != answers[1] or answers[0][0] != 404:
                differences.append(f"HTTP {method} {path}: other tenant {answers[0]} vs unknown {answers[1]}")
        for op, body in nats:
            answers = []
            for run, thread in ((r, t), (_ghost(r, "y"), _ghost(t, "z"))):
                code, desc, raw = await nats_call(s, f"agentlog.api.{op}", fill(json.dumps(body), run, thread).encode(), B)
                answers.append((code, *(x.replace(run, "<run>").replace(thread, "<thread>")
                                        for x in (desc or "", raw.decode()))))
            if answers[0] != answers[1] or answers[0][0] != "404":
                differences.append(f"NATS {op}: other tenant {answers[0]} vs unknown {answers[1]}")
        assert not differences, "\n".join(differences)
        # and tenant A still sees its own run (the probes above changed nothing)
        status, raw = await http_call(s, "GET", f"/v1/runs/{r}", None, A)
        assert status == 200 and json.loads(raw)["status"] == "waiting"
