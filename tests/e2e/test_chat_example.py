"""`examples/chat/`, the browser chat on the official `@ag-ui/client`, as a user builds and runs
it: `npm ci` from its package lock and `npm run build` (esbuild) in a copy, the page served from
another origin than the API (so through CORS, `AGENTLOG_CORS_ORIGINS`), driven in headless
Chromium against a real `agentlog serve` running the demo app. The approval shows inside the chat;
Approve resumes the run through AG-UI's `resume` and the deploy happens; Deny, on the next
request, resumes it with `approved: false` and nothing is deployed.

Skips when npm or /usr/bin/chromium is absent."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.gateway.test_inspector_browser import CHROMIUM, chromium_page
from tests.support.topology import deploy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat"
NPM = shutil.which("npm")
pytestmark = [
    pytest.mark.early,
    pytest.mark.asyncio,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing)"),
    pytest.mark.skipif(NPM is None, reason="npm not installed"),
]


def build(into: Path) -> Path:
    """Copy the example (not its node_modules or dist), install from the lock, bundle."""
    site = into / "chat"
    shutil.copytree(EXAMPLE, site, ignore=shutil.ignore_patterns("node_modules", "dist"))
    for step in (["ci", "--no-audit", "--no-fund"], ["run", "build"]):
        done = subprocess.run([str(NPM), *step], cwd=site, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, f"npm {' '.join(step)}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert (site / "dist" / "chat.js").is_file()
    return site


@asynccontextmanager
async def static_site(root: Path) -> AsyncIterator[str]:
    """The built page on 127.0.0.1, a port of its own (the OS picks it)."""
    app = web.Application()
    app.router.add_static("/", root)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_the_chat_example_approves_and_denies_in_the_chat(tmp_path: Path) -> None:
    from playwright.async_api import expect

    root = await asyncio.to_thread(build, tmp_path)
    async with static_site(root) as origin:
        with deploy("serve", tmp_path / "serve", app="agentlog.cli.demo:app",
                    env={"AGENTLOG_CORS_ORIGINS": origin}) as d:
            async with asyncio.timeout(180), chromium_page() as page, aiohttp.ClientSession() as http:
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                await page.goto(f"{origin}/index.html?api={d.http_url}")

                await page.fill("#prompt", "Ship release 1.4.2 to staging.")
                await page.click("#composer button")
                card = page.locator("#log li.approval")
                await expect(card).to_contain_text("Allow tool 'deploy' to run?")
                await expect(page.locator("#status")).to_have_text("waiting for your approval")
                await expect(page.locator("#log li[data-role=assistant]").last).to_contain_text("calls deploy(")
                if os.environ.get("INSPECTOR_SCREENSHOTS"):  # the docs' picture of the example
                    await page.screenshot(path=str(Path(os.environ["INSPECTOR_SCREENSHOTS"]) / "chat.png"))
                await card.locator("button.approve").click()
                await expect(page.locator("#status")).to_have_text("done")
                await expect(card).to_have_count(0)
                await expect(page.locator("#log li[data-role=assistant]").last).to_contain_text(
                    "Done: release 1.4.2 is live on staging.")

                # the next request asks again; Deny this time
                await page.fill("#prompt", "And once more, please.")
                await page.click("#composer button")
                await expect(card).to_have_count(1)
                await card.locator("button.deny").click()
                await expect(page.locator("#status")).to_have_text("done")
                await expect(page.locator("#log li[data-role=assistant]").last).to_contain_text("Not deployed")

                # the server agrees: the chat's runs, approved then denied, both finished. A thread's
                # listing is as of its last commit; one by agent alone may lag the views (docs: pass
                # min_seq there), so it only finds the chat's thread.
                async with http.get(f"{d.http_url}/v1/runs", params={"agent_id": "deployer"}) as resp:
                    chat = {r["thread_id"] for r in (await resp.json())["runs"]}
                assert len(chat) == 1, chat
                async with http.get(f"{d.http_url}/v1/runs", params={"thread_id": chat.pop()}) as resp:
                    runs = (await resp.json())["runs"]
                assert len(runs) == 2, runs
                decisions = [c["decision"]["result"] for r in runs for c in r["calls"].values() if c["decision"]]
                assert {"approved": True} in decisions and {"approved": False} in decisions, runs
                assert all(r["status"] == "done" for r in runs), runs
                assert errors == [], errors
