"""The run inspector in a real headless Chromium (Debian `chromium`, driven by playwright's python
API over CDP) against a real stack: nats-server, runtime, aiohttp app on 127.0.0.1 with bearer
auth. The page lists threads and runs, shows a waiting run's timeline, time-travels to an earlier
event, approves the pending call with its button, follows the run live until it is done (and the
server agrees), verifies it by replay; `/docs` (Swagger UI) lists every operation.

Skips when /usr/bin/chromium is absent (scripts/test installs it on CI)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_stack import TIMEOUT, body
from tests.support.http_write import suspended_call
from tests.support.inspector import AGENT, REASONING, inspect_app, open_stack, until_status, waiting_run

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing: "
                                                     "apt-get install chromium)"),
]
#: Nothing but the page under test: no first-run, sync, update or background traffic, no QUIC.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "inspector-secret"
WAIT_MS = 15_000


@contextlib.asynccontextmanager
async def chromium_page() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright, expect

    # expect()'s own bound (5 s) is not the page's default timeout: on a loaded machine a page
    # that follows the log can take longer than that to show what it will show
    expect.set_options(timeout=WAIT_MS)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            await browser.close()


async def test_inspector_approves_a_run_in_the_browser(nats_server: Any) -> None:
    from playwright.async_api import expect

    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with asyncio.timeout(TIMEOUT * 2), open_stack(nats_server, tokens=TOKEN, make_app=inspect_app,
                                                        agents=(AGENT,)) as s, chromium_page() as page:
        s.client.session.headers.update(auth)
        run = await waiting_run(s)
        rid, tid, call = run["run_id"], run["thread_id"], suspended_call(run)
        tl = await body(await s.client.get(f"/v1/runs/{rid}/timeline"), 200)
        note_at = next(e["id"] for g in tl["steps"] for e in g["events"] if e["state_diff"])
        base = str(s.client.make_url("")).rstrip("/")
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # console errors too (a CSP violation is one), except the 401s asked for below
        page.on("console", lambda m: errors.append(f"{m.text} {m.location}")
                if m.type == "error" and "401" not in m.text else None)

        await page.goto(f"{base}/ui")
        await expect(page.locator("#error")).to_contain_text("401")  # no token yet: the API says so
        await page.fill("#token", TOKEN)
        await page.click("#token-form button")
        await page.click(f"[data-thread='{tid}']")
        await page.click(f"[data-run='{rid}']")
        await expect(page.locator("#run-status")).to_have_text("waiting")
        await expect(page.locator("#messages")).to_contain_text("ship it")
        # what the model asked for (the gate suspended it before it started: not in the call's view)
        await expect(page.locator(f"#approvals li[data-call='{call}'] strong")).to_have_text("deploy")
        await expect(page.locator(f"#approvals li[data-call='{call}']")).to_contain_text('{"env":"prod"}')
        # time travel: the state as of the earlier `note` event, before anything was deployed
        await page.click(f".ev[data-event='{note_at}']")
        await expect(page.locator("#state-at")).to_have_text(f"as of event {note_at}")
        await expect(page.locator("#state")).to_contain_text('"note": "first"')
        assert "deployed" not in await page.locator("#state").inner_text()

        await page.click(f"#approvals li[data-call='{call}'] button.approve")
        # the page follows the run live (SSE) until it shows it finished ...
        await expect(page.locator("#run-status")).to_have_text("done")
        await expect(page.locator("#approvals-box")).to_be_hidden()
        await expect(page.locator("#timeline")).to_contain_text("RunFinished")
        await expect(page.locator(".diff").filter(has_text="/thread/deployed")).to_have_count(1)
        # ... and the server agrees
        view = await body(await s.client.get(f"/v1/runs/{rid}"), 200)
        assert view["status"] == "done" and view["termination"]["type"] == "natural_end"
        assert view["calls"][call]["decision"]["result"] == {"approved": True}

        # live follow: a run started elsewhere on the thread shows up without a reload
        cont = await body(await s.client.post(f"/v1/runs/{rid}/inputs", json={"messages": ["again"]}), 202)
        await expect(page.locator(f"[data-run='{cont['run_id']}']")).to_be_visible()
        await page.click("#verify")
        await expect(page.locator("#verify-ok")).to_contain_text("verified")

        # Deny, on the continuation (it asks for `deploy` again): the call is refused, the run ends
        await page.click(f"[data-run='{cont['run_id']}']")
        await expect(page.locator("#run-id")).to_have_text(cont["run_id"])
        denied = page.locator("#approvals li button.deny")
        await denied.click()
        await expect(page.locator("#run-status")).to_have_text("done")
        view = await body(await s.client.get(f"/v1/runs/{cont['run_id']}"), 200)
        (call2,) = [c for c in view["calls"].values() if c["decision"] is not None]
        assert view["status"] == "done" and call2["decision"]["result"] == {"approved": False}
        assert call2["status"] != "succeeded"

        # /docs is Swagger UI (tests/gateway/test_inspector_operator.py drives it): every operation listed
        await page.goto(f"{base}/docs")
        spec = await body(await s.client.get("/openapi.json"), 200)
        await expect(page.locator(".opblock")).to_have_count(sum(len(methods) for methods in spec["paths"].values()))
        assert errors == []


async def test_inspector_shows_the_models_reasoning_collapsed(nats_server: Any) -> None:
    """The messages panel shows an assistant message's reasoning folded away under "reasoning";
    a click opens it."""
    from playwright.async_api import expect

    async with asyncio.timeout(TIMEOUT * 2), open_stack(nats_server, tokens=TOKEN, make_app=inspect_app,
                                                        agents=(AGENT,)) as s, chromium_page() as page:
        s.client.session.headers.update({"Authorization": f"Bearer {TOKEN}"})
        run = await waiting_run(s)
        base = str(s.client.make_url("")).rstrip("/")
        await page.goto(f"{base}/ui")
        await page.fill("#token", TOKEN)
        await page.click("#token-form button")
        await page.click(f"[data-thread='{run['thread_id']}']")
        await page.click(f"[data-run='{run['run_id']}']")
        folded = page.locator("#messages details.reasoning")
        await expect(folded).to_have_count(1)  # only the message that had some
        assert await folded.get_attribute("open") is None
        await expect(folded.locator("div")).to_be_hidden()
        await folded.locator("summary").click()
        await expect(folded.locator("div")).to_be_visible()
        await expect(folded.locator("div")).to_have_text(REASONING)


async def test_inspector_names_a_messages_images_and_files(nats_server: Any) -> None:
    """A user message sent with an image and a file shows its text and names its attachments."""
    from playwright.async_api import expect

    png = base64.b64encode(bytes(range(256)) * 8).decode()  # 2 KiB
    content = [{"type": "text", "text": "ship this picture"},
               {"type": "image", "media_type": "image/png", "data": png},
               {"type": "file", "url": "https://example.test/notes.pdf", "media_type": "application/pdf",
                "filename": "notes.pdf"}]
    async with asyncio.timeout(TIMEOUT * 2), open_stack(nats_server, tokens=TOKEN, make_app=inspect_app,
                                                        agents=(AGENT,)) as s, chromium_page() as page:
        s.client.session.headers.update({"Authorization": f"Bearer {TOKEN}"})
        resp = await s.client.post("/v1/runs", json={"agent_id": AGENT, "messages": [{"role": "user", "content": content}]})
        assert resp.status == 202, await resp.text()
        run = await until_status(s, (await resp.json())["run_id"], {"waiting"})
        base = str(s.client.make_url("")).rstrip("/")
        await page.goto(f"{base}/ui")
        await page.fill("#token", TOKEN)
        await page.click("#token-form button")
        await page.click(f"[data-thread='{run['thread_id']}']")
        await page.click(f"[data-run='{run['run_id']}']")
        await expect(page.locator("#messages")).to_contain_text("ship this picture")
        await expect(page.locator("#messages .attachments")).to_have_text(
            "attached: image image/png (2 KiB), file notes.pdf")
