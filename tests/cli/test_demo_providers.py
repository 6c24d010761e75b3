"""`agentlog demo` on a configured provider: with `AGENTLOG_DEMO_MODEL=anthropic:...` its agents
run on the Anthropic SDK (pointed by `ANTHROPIC_BASE_URL` at a local wire-format fake on loopback)
instead of the scripted model, through the same approval flow; without it, the scripted model
(tests/cli/test_demo.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.fake_providers import Answer, FakeProvidersThread, Recorded

AGENTLOG = Path(sys.executable).parent / "agentlog"


def deployer_and_checker(request: Recorded) -> Answer:
    """What a model following the demo's prompts would answer, read from the request."""
    body = request.body
    system = " ".join(b["text"] for b in body.get("system", []))
    blocks = [b for m in body["messages"] for b in m["content"] if isinstance(b, dict)]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    called = {b["id"]: b["name"] for b in blocks if b.get("type") == "tool_use"}
    if "release checks:" in system:  # the checker sub-agent
        return Answer(text="All 42 release checks passed for 1.4.2.") if results else Answer(
            calls=[("run_checks", {"release": "1.4.2"})])
    if any(called.get(r["tool_use_id"]) == "deploy" for r in results):
        return Answer(text="Release 1.4.2 is live on staging.")
    if results:
        return Answer(calls=[("deploy", {"env": "staging", "release": "1.4.2"})])
    return Answer(calls=[("agent_run", {"agent_id": "checker", "prompt": "Run the release checks for 1.4.2."}),
                         ("mcp__notes__release_notes", {"release": "1.4.2"})])


@pytest.mark.timeout(200)
def test_demo_runs_on_anthropic_when_configured(tmp_path: Path) -> None:
    with FakeProvidersThread() as fake:
        fake.responder = deployer_and_checker
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLOG_", "ANTHROPIC_"))}
        env.update(AGENTLOG_DATA_DIR=str(tmp_path / "data"), COLUMNS="300", NO_COLOR="1",
                   AGENTLOG_DEMO_MODEL="anthropic:claude-test", ANTHROPIC_BASE_URL=fake.anthropic_url,
                   ANTHROPIC_API_KEY="fake")
        proc = subprocess.run(["timeout", "150", str(AGENTLOG), "demo", "--auto-approve", "--port", "0"],
                              cwd=tmp_path, env=env, capture_output=True, text=True)
        requests = list(fake.requests)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert re.search(r"--auto-approve: POST \S+/v1/runs/\w+/inputs -> 202", out), out
    assert "deploy succeeded" in out and "natural_end" in out
    assert '"deployed": {"env": "staging", "release": "1.4.2"}' in out
    # both agents asked the model through the Messages API, the model named by the variable
    assert {r.body["model"] for r in requests} == {"claude-test"}
    assert all(r.path == "/v1/messages" for r in requests) and len(requests) == 5
