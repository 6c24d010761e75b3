"""The run inspector shows a call in doubt and resolves it with its Mark done button, in a real
headless Chromium against a real stack (as tests/gateway/test_inspector_browser.py; skips without
/usr/bin/chromium)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.gateway.test_inspector_browser import CHROMIUM, TOKEN, chromium_page
from tests.support.http_stack import TIMEOUT, body
from tests.support.in_doubt import Payments, interrupted
from tests.support.inspector import open_stack, until_status

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed")


async def test_in_doubt_call_is_marked_done_from_the_inspector(nats_server: Any) -> None:
    from playwright.async_api import expect

    app = Payments()
    async with asyncio.timeout(TIMEOUT * 2), open_stack(
            nats_server, tokens=TOKEN, make_app=lambda store: app.runtime(store, process="ui-"),
            agents=("payer",)) as s, chromium_page() as page:
        s.client.session.headers.update({"Authorization": f"Bearer {TOKEN}"})
        await interrupted(s.store, thread="t-ui", run="r-ui")  # another process, stopped mid-call
        handle = await s.runtime.resume("r-ui")
        assert handle is not None and (await handle.result()).status == "waiting"
        await until_status(s, "r-ui", {"waiting"})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        await page.goto(str(s.client.make_url("/ui")))
        await page.fill("#token", TOKEN)
        await page.click("#token-form button")
        await page.click("[data-thread='t-ui']")
        await page.click("[data-run='r-ui']")
        item = page.locator("#approvals li[data-call='c-pay']")
        await expect(item.locator(".badge.in-doubt")).to_have_text("in doubt")
        await expect(item.locator("button")).to_have_text(["Mark done", "Retry", "Cancel"])
        await item.locator("textarea[name=result]").fill('{"paid": 5, "ref": "checked"}')
        await item.locator("button.approve").click()
        await expect(page.locator("#run-status")).to_have_text("done")
        view = await body(await s.client.get("/v1/runs/r-ui"), 200)
        call = view["calls"]["c-pay"]
        assert call["status"] == "succeeded" and call["result"] == {"paid": 5, "ref": "checked"}
        assert app.executions == [] and errors == []
