"""The docs as an operator pastes them. The HTTP guide's curl sequence runs as written against what users run
(`agentlog serve` with its default app, and `gateway` + `worker`): it starts a run, waits for it, approves it, starts a
continuation and cancels that continuation (the run it just started, not the finished one).
The A2A and OTel snippets say which extra they need, in the code a user copies."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import all_blocks
from tests.support.topology import Deployment


@pytest.fixture
def deployment_options() -> dict[str, object]:
    return {"app": "agentlog.cli.demo:app"}


def curl_block() -> str:
    """The first bash block of the docs that starts a run with curl and `$API` (the HTTP guide's)."""
    return next(b.code for b in all_blocks("bash") if "curl -s -XPOST $API/v1/runs " in b.code)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_docs_curl_sequence_cancels_the_run_it_started(deployment: Deployment, tmp_path: Path) -> None:
    script = curl_block() + 'echo "RUN=$RUN NEXT=$NEXT"\n'
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "AGENTLOG_URL": deployment.http_url})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + deployment.outputs()
    first, cont = re.findall(r"RUN=(\S+) NEXT=(\S+)", done.stdout)[-1]
    assert first != cont

    def view(run_id: str, follow: bool = False) -> dict[str, Any]:
        if follow:  # the SSE follow ends when the run pauses or ends
            with urllib.request.urlopen(f"{deployment.http_url}/v1/runs/{run_id}/events?follow=true") as resp:
                resp.read()
        with urllib.request.urlopen(f"{deployment.http_url}/v1/runs/{run_id}") as resp:
            return dict(json.load(resp))

    assert view(first)["status"] == "done" and view(first)["termination"]["type"] == "natural_end"
    for _ in range(100):  # the worker applies the cancel; each follow ends when the run pauses or ends
        if (cancelled := view(cont))["status"] == "done":
            break
        view(cont, follow=True)
    else:
        raise AssertionError(f"the cancelled run never finished: {cancelled}\n{deployment.outputs()}")
    assert cancelled["termination"]["type"] == "cancelled", cancelled


@pytest.mark.parametrize(("module", "extra"), [("a2a", "a2a"), ("opentelemetry", "otel")])
def test_snippets_name_the_extra_they_need(module: str, extra: str) -> None:
    blocks = [b.code for b in all_blocks("python") if re.search(rf"^(from|import) {module}\b", b.code, re.M)]
    assert blocks, f"no docs snippet imports {module}"
    for block in blocks:
        assert f"needs the {extra} extra" in block, block[:300]
