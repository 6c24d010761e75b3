"""The run inspector as an operator keeps it open, in a real headless Chromium (Debian `chromium`
through playwright) against real subprocesses with bearer auth (`tests/support/topology.py`: `agentlog serve`, and
`agentlog gateway` + `agentlog worker`; app `tests.apps.inspector_app:app`):

- the list: one entry per conversation with its first message, agents, times, durations; runs
  grouped under their thread; the `checker` sub-agent's run nested under the `agent_run` call
  that started it (not a thread at the top, no "continues"); search and status/agent filters;
- navigation: every view is a URL hash, so Back and a pasted link work;
- time travel: the State panel stays in view, and Messages show only what the thread had then;
- in both topologies users run (`serve`, and `gateway` + `worker`);
- a structured interrupt answered with the form built from its ticket's `response_schema`, and a
  permission approval (Approve sets `approved`, with the optional `reason` field);
- the operations view (queue, workers, dead letters), a 400 px wide layout without overlaps, and
  `/docs` as Swagger UI (from the `swagger-ui-bundle` package) sending a request, all under the
  page's `default-src 'self'` CSP with no console error.

With `INSPECTOR_SCREENSHOTS=docs` it also writes the docs' screenshots (docs/*.png).
Skips when /usr/bin/chromium is absent (scripts/test installs it on CI)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.test_inspector_browser import CHROMIUM, chromium_page
from tests.support.topology import TOPOLOGIES, Kind, deploy

pytestmark = [
    pytest.mark.early,
    pytest.mark.asyncio,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing: "
                                                     "apt-get install chromium)"),
]
TOKEN = "operator-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHOTS = os.environ.get("INSPECTOR_SCREENSHOTS")


async def start(http: aiohttp.ClientSession, url: str, agent: str, text: str) -> dict[str, Any]:
    async with http.post(f"{url}/v1/runs", json={"agent_id": agent, "messages": text}) as resp:
        assert resp.status == 202, await resp.text()
        return dict(await resp.json())


async def until(http: aiohttp.ClientSession, url: str, run_id: str, status: str, seq: int = 0) -> dict[str, Any]:
    """The run's view once it has `status`: read it, and while it has not, follow its events (the
    follow ends when the run pauses or ends)."""
    while True:
        async with http.get(f"{url}/v1/runs/{run_id}", params={"min_seq": str(seq)}) as resp:
            view = dict(await resp.json())
        if view["status"] == status:
            return view
        async with http.get(f"{url}/v1/runs/{run_id}/events", params={"follow": "true"}) as events:
            await events.read()


async def shot(page: Any, name: str, kind: Kind) -> None:
    if SHOTS and kind == "serve":
        await page.evaluate("document.querySelector('#run') && (document.querySelector('#run').scrollTop = 0)")
        await page.screenshot(path=str(Path(SHOTS) / name))


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


@pytest.mark.parametrize("kind", TOPOLOGIES)
async def test_the_inspector_an_operator_keeps_open(kind: Kind, tmp_path: Path) -> None:
    from playwright.async_api import expect

    with deploy(kind, tmp_path, app="tests.apps.inspector_app:app", tokens=TOKEN) as d:
        async with asyncio.timeout(240), aiohttp.ClientSession(headers=AUTH) as http, chromium_page() as page:
            url = d.http_url
            ship = await start(http, url, "deployer", "Ship release 1.4.2 to staging.")
            plan = await start(http, url, "release", "Plan the 1.4.2 release.")
            waiting = await until(http, url, ship["run_id"], "waiting", ship["seq"])
            await until(http, url, plan["run_id"], "waiting", plan["seq"])
            sub_run = waiting["calls"]["call_0_0"]["result"]["run_id"]
            sub_thread = waiting["calls"]["call_0_0"]["result"]["thread_id"]
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # console errors too (a CSP violation is one), except the 401s of the first load without a token
            page.on("console", lambda m: errors.append(f"{m.text} {m.location}")
                    if m.type == "error" and "401" not in m.text else None)

            # the token first (in this tab's sessionStorage), then the lists
            await page.goto(f"{url}/ui")
            await page.fill("#token", TOKEN)
            await page.click("#token-form button")
            ship_item = page.locator(f"li.thread[data-thread-item='{ship['thread_id']}']")
            await expect(ship_item.locator(".first")).to_have_text("Ship release 1.4.2 to staging.")
            await expect(ship_item).to_contain_text("deployer, checker")
            await expect(ship_item.locator("time").first).to_be_visible()
            # the sub-agent's run sits under the run and call that started it, not among the threads
            await expect(page.locator(f"li.thread[data-thread-item='{sub_thread}']")).to_have_count(0)
            nested = ship_item.locator(f"li.child [data-run='{sub_run}']")
            await expect(nested).to_contain_text("agent_run call_0_0")
            await expect(nested).to_contain_text("checker")
            await expect(nested).to_contain_text("step(s)")
            assert "continues" not in await page.locator("#threads").inner_text()

            # search and filters narrow the list
            await page.fill("#q", "plan the")
            await expect(page.locator("li.thread")).to_have_count(1)
            await expect(page.locator("li.thread .first")).to_have_text("Plan the 1.4.2 release.")
            await page.fill("#q", "")
            await page.select_option("#f-agent", "checker")
            await expect(page.locator("li.thread")).to_have_count(1)
            await expect(page.locator("li.thread")).to_have_attribute("data-thread-item", ship["thread_id"])
            await page.select_option("#f-agent", "")
            await page.select_option("#f-status", "done")
            await expect(page.locator("li.thread")).to_have_count(1)  # only the checker's run is done
            await page.select_option("#f-status", "")
            await expect(page.locator("li.thread")).to_have_count(2)

            # navigation is the URL: click, click, Back; then a pasted link
            await page.click(f"[data-run='{ship['run_id']}']")
            await expect(page.locator("#run-id")).to_have_text(ship["run_id"])
            await page.click(f"[data-run='{plan['run_id']}']")
            await expect(page.locator("#run-id")).to_have_text(plan["run_id"])
            await page.go_back()
            await expect(page.locator("#run-id")).to_have_text(ship["run_id"])
            assert page.url.endswith(f"#/runs/{ship['run_id']}")
            await page.click(f"[data-run='{sub_run}']")
            await expect(page.locator("#run-parent")).to_contain_text(f"sub-agent run of {ship['run_id']}")

            # time travel through a pasted link: as of the user's message, the thread had one message
            await page.goto(f"{url}/ui#/runs/{ship['run_id']}/at/1:2")
            await expect(page.locator("#state-at")).to_have_text("as of event 1:2")
            await expect(page.locator("#messages li")).to_have_count(1)
            await expect(page.locator("#messages-at")).to_contain_text("later hidden")
            # the State panel stays in view while the timeline scrolls to its end
            await page.locator("#timeline .ev").last.click()  # scrolls the timeline to its end
            assert await page.evaluate("document.querySelector('#run').scrollTop") > 0
            box = await page.locator("#state").bounding_box()
            assert box is not None and 0 <= box["y"] < 800, box
            await expect(page.locator("#state-at")).not_to_have_text("now")
            await page.click("#state-now")
            await expect(page.locator("#state-at")).to_have_text("now")
            await shot(page, "inspector.png", kind)
            await expect(page.locator("#messages li")).not_to_have_count(1)

            # a structured question: the form comes from the ticket's response_schema
            await page.click(f"[data-run='{plan['run_id']}']")
            form = page.locator("#approvals form.ticket")
            await expect(form.locator("[name='f:target']")).to_be_visible()
            await shot(page, "inspector-form.png", kind)
            await form.locator("[name='f:target']").select_option(label="prod")
            await form.locator("[name='f:replicas']").fill("3")
            await form.locator("[name='f:note']").fill("canary first")
            await form.locator("[name='f:urgent']").check()
            await form.locator("button.approve").click()
            await expect(page.locator("#run-status")).to_have_text("done")
            view = await until(http, url, plan["run_id"], "done")
            (call,) = view["calls"].values()
            assert call["decision"]["result"] == {"target": "prod", "replicas": 3, "note": "canary first",
                                                  "urgent": True}, call

            # the permission gate's schema: Approve sets `approved`, its `reason` is a field
            await page.click(f"[data-run='{ship['run_id']}']")
            ticket = page.locator("#approvals form.ticket")
            await ticket.locator("[name='f:reason']").fill("checks are green")
            await ticket.locator("button.approve").click()
            await expect(page.locator("#run-status")).to_have_text("done")
            view = await until(http, url, ship["run_id"], "done")
            assert view["calls"]["call_1_0"]["decision"]["result"] == {"approved": True, "reason": "checks are green"}

            # operations: the queue, the workers' consumer, the dead letters
            await page.click("#nav-ops")
            await expect(page.locator("#ops-workers")).to_contain_text("agentlog-workers")
            await expect(page.locator("#ops-dlq")).to_contain_text("Dead letters")
            await shot(page, "inspector-ops.png", kind)

            # 400 px: one column, nothing overlaps in the header, no sideways scroll
            await page.set_viewport_size({"width": 400, "height": 800})
            await page.goto(f"{url}/ui#/runs/{ship['run_id']}")
            await expect(page.locator("#run-id")).to_have_text(ship["run_id"])
            parts = [await page.locator(sel).bounding_box() for sel in ("header h1", "header nav", "#token-form")]
            assert all(parts) and not any(overlap(a, b) for i, a in enumerate(parts) for b in parts[i + 1:]), parts  # type: ignore[arg-type]
            assert await page.evaluate("document.documentElement.scrollWidth") <= 400
            await shot(page, "inspector-narrow.png", kind)

            # /docs: Swagger UI from the package, every operation, and a request sent with the token
            await page.set_viewport_size({"width": 1280, "height": 800})
            await page.goto(f"{url}/docs")
            async with http.get(f"{url}/openapi.json") as resp:
                spec = await resp.json()
            blocks = page.locator(".opblock")
            await expect(blocks).to_have_count(sum(len(methods) for methods in spec["paths"].values()))
            await shot(page, "api-docs.png", kind)
            get_run = page.locator("#operations-runs-get_v1_runs_id")
            await get_run.locator(".opblock-summary").click()
            await get_run.locator("input[placeholder='id']").fill(ship["run_id"])
            await get_run.locator("button.execute").click()
            await expect(get_run.locator(".live-responses-table")).to_contain_text('"status": "done"')
            assert errors == [], errors
