"""The inspector shows a thread's standing permission rules ("always allow / always deny") and
revokes them, in a real headless Chromium (Debian `chromium` through playwright) against real
subprocesses: the shared `protocol_deployment` (`agentlog serve`, and `agentlog gateway` +
`agentlog worker`; tests/apps/protocol_app.py, where agent `sequential` asks a human before `echo` and
`append_log`). The rules shown are the thread's now, whatever event the page travelled to; Revoke
calls `DELETE /v1/threads/{id}/permissions`, which is refused while a run is active on the thread
(the page says so, and the rule stays), and the server's state agrees with what the page shows.

Skips when /usr/bin/chromium is absent (scripts/test installs it on CI)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.client import AsyncClient
from agentlog.runtime.permission import STANDING_KEY

from tests.gateway.test_inspector_browser import CHROMIUM, chromium_page
from tests.support.topology import Deployment

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing: "
                                                     "apt-get install chromium)"),
]
WAIT = 90


async def answer(client: AsyncClient, run_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """Answer the run's pending approval with `result` and wait for the run to finish."""
    waiting = await client.runs.wait(run_id, timeout=WAIT)
    assert waiting["status"] == "waiting", waiting
    decided = await client.runs.approve(run_id, result=result)
    return await client.runs.wait(run_id, min_seq=decided["seq"], timeout=WAIT)


async def test_inspector_shows_and_revokes_standing_rules(protocol_deployment: Deployment) -> None:
    from playwright.async_api import expect

    url = protocol_deployment.http_url
    async with asyncio.timeout(240), AsyncClient(url) as client, chromium_page() as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # console errors too (a CSP violation is one), except the 409 of the refused revoke below
        page.on("console", lambda m: errors.append(f"{m.text} {m.location}")
                if m.type == "error" and "409" not in m.text else None)
        first = await client.runs.create("sequential", "approval: one")
        done = await answer(client, first["run_id"], {"approved": True, "always": True})
        assert done["status"] == "done", done
        thread = first["thread_id"]
        # a continuation on the thread that waits (append_log asks; no rule covers it)
        waiting = await client.runs.inputs(first["run_id"], messages="log: x")
        assert (await client.runs.wait(waiting["run_id"], timeout=WAIT))["status"] == "waiting"

        await page.goto(f"{url}/ui#/runs/{waiting['run_id']}")
        await expect(page.locator("#run-status")).to_have_text("waiting")
        echo = page.locator("#standing li[data-tool='echo'][data-verdict='allow']")
        await expect(echo).to_contain_text("always allow")
        await expect(page.locator("#standing li")).to_have_count(1)
        # the waiting run owns the thread's writes: the page shows the API's refusal, the rule stays
        await echo.locator("button.revoke").click()
        await expect(page.locator("#error")).to_contain_text("run_active")
        await expect(echo).to_be_visible()

        # "always deny" on the waiting call: the page follows the run and shows the new rule
        await answer(client, waiting["run_id"], {"approved": False, "always": True})
        await expect(page.locator("#run-status")).to_have_text("done")
        denied = page.locator("#standing li[data-tool='append_log'][data-verdict='deny']")
        await expect(denied).to_contain_text("always deny")
        # time travel to the first event: the rules shown are still the thread's now
        first_event = await page.locator("#timeline .ev").first.get_attribute("data-event")
        await page.locator("#timeline .ev").first.click()
        await expect(page.locator("#state-at")).to_have_text(f"as of event {first_event}")
        await expect(page.locator("#standing li")).to_have_count(2)

        await denied.locator("button.revoke").click()
        await expect(denied).to_have_count(0)
        await expect(page.locator("#error")).to_be_hidden()
        state = (await client.threads.state(thread))["state"][STANDING_KEY]
        assert state == {"allow": [{"tool": "echo"}], "deny": []}, state
        await echo.locator("button.revoke").click()
        await expect(page.locator("#standing-box")).to_be_hidden()
        state = (await client.threads.state(thread))["state"][STANDING_KEY]
        assert state == {"allow": [], "deny": []}, state
        assert errors == []
