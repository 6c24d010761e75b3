"""The run inspector as an operator keeps it open, in a real headless Chromium (Debian `chromium`
through playwright) against real subprocesses: the shared `protocol_deployment` (`agentlog
serve`, and `agentlog gateway` + `agentlog worker`; tests/apps/protocol_app.py).

The page is loaded once and never reloaded: runs started elsewhere appear in the list, newest
first, and change status there as they run and end (`GET /v1/changes`); a failed run is red in
the list and on its page, whose error panel shows the model's error whole (`LONG_ERROR`, far
longer than a line) and whose tokens read 0, not "undefined"; the status filter has `failed`; a
run's page draws its steps, inferences and tool calls as a waterfall (the timeline's `spans`);
a priced run shows its cost in the list.

Skips when /usr/bin/chromium is absent (scripts/test installs it on CI)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.client import AsyncClient

from tests.apps.protocol_app import HOLD_DIR, LONG_ERROR
from tests.gateway.test_inspector_browser import CHROMIUM, chromium_page
from tests.support.topology import Deployment

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing: "
                                                     "apt-get install chromium)"),
]
WAIT = 90
#: `--bad` of style.css: what a failed run's badge is written in.
RED = "rgb(185, 28, 28)"


async def test_the_live_list_a_failed_run_and_the_waterfall(protocol_deployment: Deployment) -> None:
    from playwright.async_api import expect

    url = protocol_deployment.http_url
    async with asyncio.timeout(240), AsyncClient(url) as client, chromium_page() as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # console errors too (a CSP violation is one), except a 404 of a thread: the failed filter
        # reads the threads of the failed runs, and the shared log may hold one on a deleted thread
        page.on("console", lambda m: errors.append(f"{m.text} {m.location}")
                if m.type == "error" and not ("404" in m.text and "/v1/threads/" in str(m.location)) else None)
        await page.goto(f"{url}/ui")
        await expect(page.locator("#count")).not_to_be_empty()  # the lists are loaded

        # a run started elsewhere appears, and changes status, with no reload
        held = await client.runs.create("open", "hold: until released")
        thread = page.locator(f"li.thread[data-thread-item='{held['thread_id']}']")
        held_run = thread.locator(f"[data-run='{held['run_id']}']")
        await expect(held_run.locator(".badge")).to_have_text("running")
        HOLD_DIR.mkdir(parents=True, exist_ok=True)
        (HOLD_DIR / held["thread_id"]).write_text("go")
        await expect(held_run.locator(".badge")).to_have_text("done")

        # a priced run: its cost in the list; newest first: above the older thread
        priced = await client.runs.create("priced", "add: a priced one")
        view = await client.runs.wait(priced["run_id"], timeout=WAIT)
        assert view["status"] == "done" and view["cost"] > 0, view
        priced_run = page.locator(f"[data-run='{priced['run_id']}']")
        await expect(priced_run).to_contain_text(f"${view['cost']:.6f}")
        order = await page.locator("li.thread").evaluate_all("items => items.map(i => i.dataset.threadItem)")
        assert order.index(priced["thread_id"]) < order.index(held["thread_id"]), order

        # a failed run: red in the list, red on its page, the error whole, tokens 0
        failing = await client.runs.create("open", "longfail: please")
        failed_badge = page.locator(f"[data-run='{failing['run_id']}'] .badge")
        await expect(failed_badge).to_have_text("failed")
        await expect(failed_badge).to_have_css("color", RED)
        await failed_badge.click()
        await expect(page.locator("#run-status")).to_have_text("failed")
        await expect(page.locator("#run-status")).to_have_css("color", RED)
        await expect(page.locator("#failure-box")).to_be_visible()
        await expect(page.locator("#failure")).to_have_text(LONG_ERROR)
        await expect(page.locator("#failure-kind")).to_have_text("error · model_request_rejected")
        await expect(page.locator("#run-meta")).to_contain_text("tokens in 0 / out 0")
        assert "undefined" not in await page.locator("#run-meta").inner_text()
        await expect(page.locator("#waterfall li.run.error")).to_have_count(1)

        # the failed filter: the failed run's thread, not the others
        await page.select_option("#f-status", "failed")
        await expect(page.locator(f"li.thread[data-thread-item='{failing['thread_id']}']")).to_be_visible()
        await expect(thread).to_have_count(0)
        await expect(page.locator(f"li.thread[data-thread-item='{priced['thread_id']}']")).to_have_count(0)
        await page.select_option("#f-status", "")
        await expect(thread).to_have_count(1)

        # the waterfall of the priced run: one row per span of its timeline, nested, with durations
        await priced_run.click()
        await expect(page.locator("#run-id")).to_have_text(priced["run_id"])
        await expect(page.locator("#failure-box")).to_be_hidden()
        timeline = await client.request("GET", f"/v1/runs/{priced['run_id']}/timeline")
        spans: list[dict[str, Any]] = timeline["spans"]
        rows = page.locator("#waterfall li")
        await expect(rows).to_have_count(len(spans))
        assert await rows.evaluate_all("rows => rows.map(r => r.dataset.span)") == [s["key"] for s in spans]
        tool = next(s for s in spans if s["key"].startswith("tool:"))
        row = page.locator(f"#waterfall li[data-span='{tool['key']}']")
        await expect(row.locator(".name")).to_have_text("execute_tool add")
        await expect(row.locator(".took")).to_contain_text("ms")
        bars = await rows.locator(".bar").evaluate_all(
            "bars => bars.map(b => [b.getBoundingClientRect().left, b.getBoundingClientRect().width])")
        run_left, run_width = bars[0]
        # every span within the run's bar (the 2 px a bar is at least, and rounding)
        assert all(run_left - 1 <= left and left + width <= run_left + run_width + 3 for left, width in bars), bars
        assert errors == [], errors
