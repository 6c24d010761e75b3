"""The run inspector shows cost: a run's recorded cost (and the model its pool chose) in the run's
header, the thread's in the thread list. Real headless Chromium against the real gateway stack on
a real nats-server, as tests/gateway/test_inspector_browser.py; skipped without /usr/bin/chromium."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog import ModelPool, ModelPrices
from agentlog.eventlog.events import Usage
from agentlog.runtime import AgentSpec, Runtime
from agentlog.runtime.models import ScriptedModel, Turn

from tests.gateway.test_inspector_browser import CHROMIUM, chromium_page
from tests.support.http_stack import TIMEOUT, body
from tests.support.inspector import open_stack, until_status

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing)"),
]
AGENT = "priced"


def priced_app(store: Any) -> Runtime:
    model = ScriptedModel([Turn.text("ok", usage=Usage(input_tokens=1000, output_tokens=500))], loop=True,
                          name="cheap", prices=ModelPrices(input=2.0, output=4.0))
    spec = AgentSpec(id=AGENT, model="cheap", pool=ModelPool(models=["cheap"]))
    return Runtime(store, agents=[spec], models={"cheap": model})


async def test_inspector_shows_run_and_thread_cost(nats_server: Any) -> None:
    from playwright.async_api import expect

    async with asyncio.timeout(TIMEOUT * 2), open_stack(nats_server, make_app=priced_app, agents=(AGENT,)) as s, \
            chromium_page() as page:
        started = await body(await s.client.post("/v1/runs", json={"agent_id": AGENT, "messages": "hi"}), 202)
        view = await until_status(s, started["run_id"], {"done"})
        assert view["cost"] == pytest.approx(0.004)  # 1000 x $2 + 500 x $4 per 1M tokens
        base = str(s.client.make_url("")).rstrip("/")
        await page.goto(f"{base}/ui")
        await page.click(f"[data-thread='{started['thread_id']}']")
        await expect(page.locator(f"[data-thread='{started['thread_id']}']")).to_contain_text("$0.004000")
        await page.click(f"[data-run='{started['run_id']}']")
        await expect(page.locator("#run-meta")).to_contain_text("$0.004000")
        await expect(page.locator("#run-meta")).to_contain_text("model cheap")
