"""What a caller of the HTTP API cannot do or see, against real deployments (`agentlog serve`, and
`agentlog gateway` + `agentlog worker`, tests/support/topology.py) on a real nats-server, with bearer tokens:

- verified replay never runs a tool (no side effect without its approval): `{"tools_from_log":
  false}` is refused (400 `reexecution_refused`) and the approved deploy does not run again;
- the public A2A agent card shows the agent's `description`, not its system prompt, and its URLs
  are on `AGENTLOG_PUBLIC_URL`, whatever `Host` the request sent;
- a time-travel position after the thread's end is answered as of the end, with a `warning`
  (timeline `to`, thread state `at`), never a 500; a malformed one is a typed 400;
- sub-agent children carry their parent's tenant: a tenant-scoped token reads its run's child
  run and thread (and another tenant's token gets the 404 of an unknown id).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.runtime.toolkits.subagents import child_ids

from tests.apps.hardening_app import DESCRIPTION, SECRET_PROMPT
from tests.support.topology import TOPOLOGIES, Deployment, Kind, deploy

pytestmark = pytest.mark.asyncio

ROOT, TENANT_A, TENANT_B = "root-token", "token-a", "token-b"
TOKENS = f"{ROOT},{TENANT_A}:tenantA,{TENANT_B}:tenantB"
PUBLIC_URL = "https://agents.example.com/agentlog"
TIMEOUT = 60


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module", params=TOPOLOGIES)
def hardened(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One deployment per topology for the module (its tests use separate threads)."""
    tmp = tmp_path_factory.mktemp(f"hardening-{request.param}")
    effects = tmp / "effects"
    effects.mkdir()
    env = {"HARDENING_EFFECTS_DIR": str(effects), "AGENTLOG_PUBLIC_URL": PUBLIC_URL}
    with deploy(request.param, tmp, app="tests.apps.hardening_app:app", tokens=TOKENS, env=env) as running:
        yield running


def deploys(d: Deployment) -> list[str]:
    """The deploys that really ran (one line each, written by the tool)."""
    path = Path(d.env["HARDENING_EFFECTS_DIR"]) / "deploys"
    return path.read_text().splitlines() if path.exists() else []


async def get(http: aiohttp.ClientSession, url: str, token: str = ROOT, **params: str) -> tuple[int, Any]:
    async with http.get(url, headers=auth(token), params=params) as resp:
        return resp.status, await resp.json()


async def post(http: aiohttp.ClientSession, url: str, body: Any, token: str = ROOT) -> tuple[int, Any]:
    async with http.post(url, headers=auth(token), json=body) as resp:
        return resp.status, await resp.json()


async def start(http: aiohttp.ClientSession, d: Deployment, body: dict[str, Any], token: str = ROOT
                ) -> dict[str, Any]:
    status, accepted = await post(http, f"{d.http_url}/v1/runs", body, token)
    assert status == 202, (accepted, d.outputs())
    return dict(accepted)


async def until_status(http: aiohttp.ClientSession, d: Deployment, run_id: str, seq: int, statuses: set[str],
                       token: str = ROOT) -> dict[str, Any]:
    """The run's view once its status is one of `statuses`: reads it at `seq` or later, else
    follows its events (the stream ends when the run stops or waits) and reads again."""
    while True:
        status, view = await get(http, f"{d.http_url}/v1/runs/{run_id}", token, min_seq=str(seq))
        if status == 200 and view["status"] in statuses:
            return dict(view)
        assert status == 200, view
        async with http.get(f"{d.http_url}/v1/runs/{run_id}/events", headers=auth(token),
                            params={"follow": "true"}) as events:
            await events.read()


async def approved_deploy(http: aiohttp.ClientSession, d: Deployment) -> dict[str, Any]:
    """A `deployer` run that waited for the approval of its deploy, was approved and finished."""
    accepted = await start(http, d, {"agent_id": "deployer", "messages": "ship 1.4"})
    run_id = accepted["run_id"]
    waiting = await until_status(http, d, run_id, accepted["seq"], {"waiting"})
    call = next(cid for cid, c in waiting["calls"].items() if c["status"] == "suspended")
    status, inputs = await post(http, f"{d.http_url}/v1/runs/{run_id}/inputs", {"decisions": [
        {"target_id": call, "decision_id": "ok-1", "action": "resume", "result": {"approved": True}}]})
    assert status == 202, inputs
    return await until_status(http, d, run_id, inputs["seq"], {"done"})


async def test_verify_never_runs_a_tool(hardened: Deployment) -> None:
    d = hardened
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession() as http:
        done = await approved_deploy(http, d)
        run_id = done["run_id"]
        assert [line for line in deploys(d) if line.startswith(run_id)] == [f"{run_id} prod"]
        verify = f"{d.http_url}/v1/runs/{run_id}/verify"
        for _ in range(2):  # the attack: every call re-ran the approved deploy
            status, refused = await post(http, verify, {"tools_from_log": False})
            assert (status, refused["code"]) == (400, "reexecution_refused"), refused
            assert "--reexecute-tools" in refused["error"]
        status, report = await post(http, verify, {})
        if d.kind == "serve":  # the app runs in the gateway's process: a verified replay, tools from the log
            assert status == 200 and report["ok"] is True, report
            assert (report["tools_executed"], report["tools_from_log"]) == (0, 1)
        else:  # `agentlog gateway` has no app of its own to replay with
            assert (status, report["code"]) == (409, "verify_unavailable"), report
        assert [line for line in deploys(d) if line.startswith(run_id)] == [f"{run_id} prod"]


async def test_a2a_card_shows_the_description_on_the_public_url(hardened: Deployment) -> None:
    d = hardened
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession() as http:
        for path in ("/.well-known/agent-card.json", "/a2a/deployer/.well-known/agent-card.json"):
            # no token (the card is public), and a Host header of the attacker's choosing
            async with http.get(f"{d.http_url}{path}", headers={"Host": "evil.example:666"}) as resp:
                assert resp.status == 200, await resp.text()
                text = await resp.text()
                card = await resp.json()
            assert card["name"] == "deployer" and card["description"] == DESCRIPTION
            assert SECRET_PROMPT not in text and "hunter2" not in text and "evil.example" not in text
            assert [i["url"] for i in card["supportedInterfaces"]] == [f"{PUBLIC_URL}/a2a/deployer"]
            assert [s["description"] for s in card["skills"]] == [DESCRIPTION]
        # an agent without a description gets a neutral one
        async with http.get(f"{d.http_url}/a2a/boss/.well-known/agent-card.json") as resp:
            assert (await resp.json())["description"] == "agentlog agent boss"
        status, agents = await get(http, f"{d.http_url}/v1/agents")
        assert status == 200
        assert {a["id"]: a["description"] for a in agents["agents"]}["deployer"] == DESCRIPTION


async def test_positions_after_the_end_answer_the_end_with_a_warning(hardened: Deployment) -> None:
    d = hardened
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession() as http:
        done = await approved_deploy(http, d)
        run_id, thread_id = done["run_id"], done["thread_id"]
        timeline = f"{d.http_url}/v1/runs/{run_id}/timeline"
        status, whole = await get(http, timeline)
        assert status == 200 and "warning" not in whole
        last = whole["steps"][-1]["last_event"]
        for far in ("99999999999999999999:0", "99999999999999999999", f"{last.split(':')[0]}:999999",
                    "9223372036854775808:0"):
            status, report = await get(http, timeline, to=far)
            assert status == 200, report
            assert report["to"] == last and report["status"] == "done"
            assert report["warning"]["code"] == "position_past_end"
            assert (report["warning"]["requested"], report["warning"]["end"]) == (str(far if ":" in far else f"{far}:0"), last)
            assert report["steps"] == whole["steps"] and report["state"] == whole["state"]
        status, at_end = await get(http, f"{d.http_url}/v1/threads/{thread_id}/state", at=last)
        assert status == 200 and "warning" not in at_end
        status, past = await get(http, f"{d.http_url}/v1/threads/{thread_id}/state", at="99999999999999999999:0")
        assert status == 200, past
        assert (past["at"], past["state"], past["warning"]["code"]) == (last, at_end["state"], "position_past_end")
        # malformed ids stay typed 400s
        for bad in ("x:y", "0:0", "-1", "1:-1", "1:2:3"):
            for url, key in ((timeline, "to"), (f"{d.http_url}/v1/threads/{thread_id}/state", "at")):
                status, err = await get(http, url, **{key: bad})
                assert (status, err["code"]) == (400, "invalid_input"), (key, bad, err)


async def check_children_carry_the_tenant(d: Deployment, agent: str) -> None:
    """A tenant's `agent` run delegates to a sub-agent: the tenant reads the child run and thread,
    another tenant gets the 404 of an unknown id."""
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession() as http:
        accepted = await start(http, d, {"agent_id": agent, "messages": "delegate", "resource_id": "tenantA/team-1"},
                               TENANT_A)
        done = await until_status(http, d, accepted["run_id"], accepted["seq"], {"done"}, TENANT_A)
        assert done["termination"]["type"] == "natural_end", done
        [call] = done["calls"]
        child_thread, child_run = child_ids(done["run_id"], call)
        status, child = await get(http, f"{d.http_url}/v1/runs/{child_run}")  # the child exists
        assert status == 200 and child["status"] == "done", child
        # the tenant reads its child run and thread, like its own run
        status, child = await get(http, f"{d.http_url}/v1/runs/{child_run}", TENANT_A)
        assert status == 200 and child["status"] == "done" and child["parent_run_id"] == done["run_id"], child
        status, thread = await get(http, f"{d.http_url}/v1/threads/{child_thread}", TENANT_A)
        assert status == 200 and thread["resource_id"] == "tenantA/team-1", thread
        status, messages = await get(http, f"{d.http_url}/v1/threads/{child_thread}/messages", TENANT_A)
        assert status == 200 and messages["messages"], messages
        status, listed = await get(http, f"{d.http_url}/v1/threads", TENANT_A, parent_thread_id=done["thread_id"])
        assert status == 200 and [t["thread_id"] for t in listed["threads"]] == [child_thread], listed
        # another tenant gets exactly the answer of an unknown id
        status, hidden = await get(http, f"{d.http_url}/v1/runs/{child_run}", TENANT_B)
        status_unknown, unknown = await get(http, f"{d.http_url}/v1/runs/subrun-0", TENANT_B)
        assert (status, hidden["code"]) == (status_unknown, unknown["code"]) == (404, "run_not_found")


async def test_subagent_children_carry_the_parent_tenant(hardened: Deployment) -> None:
    """Children started in the parent's process (`SubAgents()`)."""
    await check_children_carry_the_tenant(hardened, "boss")


@pytest.mark.parametrize("kind", TOPOLOGIES)
async def test_queued_subagent_children_carry_the_parent_tenant(tmp_path: Path, kind: Kind) -> None:
    """Children started through the work queue (`SubAgents(commands=...)`: any worker runs them)."""
    with deploy(kind, tmp_path, app="tests.apps.worker_app:app", tokens=TOKENS) as d:
        await check_children_carry_the_tenant(d, "boss")


async def test_public_url_option_of_serve(tmp_path: Path) -> None:
    """`--public-url` (the option; the module's deployments set the environment variable) is the
    base of the card's URLs; a value that is not an http(s) base URL stops the command at once."""
    url = "http://10.1.2.3:8480/"
    env = {"HARDENING_EFFECTS_DIR": str(tmp_path)}
    with deploy("serve", tmp_path / "serve", app="tests.apps.hardening_app:app", env=env, args=["--public-url", url]) as d:
        async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession() as http:
            async with http.get(f"{d.http_url}/.well-known/agent-card.json", headers={"Host": "evil.example"}) as resp:
                card = await resp.json()
    assert [i["url"] for i in card["supportedInterfaces"]] == ["http://10.1.2.3:8480/a2a/deployer"]
    for bad in ("ftp://host", "agents.example.com", "http://host/?q=1", "http://user:pw@host"):
        cli = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "agentlog", "serve", "--public-url", bad, "--port", "0",
                             "--nats", "nats://127.0.0.1:1"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert cli.returncode == 2 and "error [invalid_public_url]" in cli.stderr, (bad, cli.stderr)
