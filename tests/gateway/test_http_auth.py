"""Bearer tokens and tenant isolation: 401 without a token, 403 with a wrong one; a token scoped
to a resource_id prefix sees only its tenant (everything else is 404, as if unknown). Against
what users run: `tokens_deployment` (conftest.py), `agentlog serve` and `agentlog gateway` +
`agentlog worker` with tokens, shared by the session; this module's tenants are A and B."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentlog.gateway.operations.auth import parse_tokens, resolve_tokens

from tests.support.http_stack import TIMEOUT, Remote, body, error, open_remote, recorded_thread, uid
from tests.support.topology import Deployment

TOKENS = "admin, ta:tenantA, tb:tenantB"


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_parse_tokens() -> None:
    assert parse_tokens(TOKENS) == {"admin": None, "ta": "tenantA", "tb": "tenantB"}
    assert parse_tokens("") == {}
    for bad in ("tok:", ":tenant"):
        with pytest.raises(ValueError):
            parse_tokens(bad)


def test_tokens_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOG_TOKENS", "x,y:t")
    assert resolve_tokens(None) == {"x": None, "y": "t"}
    assert resolve_tokens("") == {}


@pytest.fixture
async def remote(tokens_deployment: Deployment) -> AsyncIterator[Remote]:
    """A client of the shared deployment with tokens (`tokens_deployment`, conftest.py)."""
    async with open_remote(tokens_deployment) as value:
        yield value


async def test_missing_and_wrong_tokens(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        c = remote.client
        for method, path in (("GET", "/v1/threads"), ("POST", "/v1/threads"), ("GET", "/v1/runs"),
                             ("GET", "/v1/threads/x/events"), ("DELETE", "/v1/threads/x")):
            await error(await c.request(method, path), 401, "unauthorized")
            await error(await c.request(method, path, headers={"Authorization": "Basic YWRtaW4="}), 401)
            await error(await c.request(method, path, headers=_h("nope")), 403, "forbidden")
        for open_path in ("/health", "/health/live", "/metrics", "/openapi.json"):
            assert (await c.get(open_path)).status == 200
        await body(await c.get("/v1/threads", headers=_h("admin")), 200)


async def _seed(remote: Remote) -> tuple[int, dict[str, str]]:
    """Threads a1 (tenant A), b1 and b2 (tenant B, b2 with run rb): this module's tenants are
    A and B only, so their listings are exactly these (the admin's holds others too)."""
    ids = {name: uid(name) for name in ("a1", "b1", "b2", "rb")}
    c = remote.client
    await body(await c.post("/v1/threads", json={"thread_id": ids["a1"], "resource_id": "tenantA/u1"},
                            headers=_h("ta")), 201)
    await body(await c.post("/v1/threads", json={"thread_id": ids["b1"], "resource_id": "tenantB/u1"},
                            headers=_h("tb")), 201)
    await error(await c.post("/v1/threads", json={"thread_id": uid("x"), "resource_id": "tenantB/u2"},
                             headers=_h("ta")), 403, "tenant_mismatch")
    await error(await c.post("/v1/threads", json={"thread_id": uid("x")}, headers=_h("ta")), 403, "tenant_mismatch")
    await error(await c.post("/v1/threads", json={"thread_id": uid("x"), "resource_id": "tenantA/u2",
                                                  "parent_thread_id": ids["b1"]}, headers=_h("ta")),
                404, "thread_not_found")
    return await recorded_thread(remote, ids["b2"], ids["rb"], resource_id="tenantB/u2"), ids


async def test_tenant_isolation(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        c = remote.client
        seq, ids = await _seed(remote)
        a1, b1, b2, rb = ids["a1"], ids["b1"], ids["b2"], ids["rb"]
        q = {"min_seq": seq}
        listed = await body(await c.get("/v1/threads", params=q, headers=_h("ta")), 200)
        assert [t["thread_id"] for t in listed["threads"]] == [a1]
        listed = await body(await c.get("/v1/threads", params=q, headers=_h("tb")), 200)
        assert [t["thread_id"] for t in listed["threads"]] == [b2, b1]  # newest first
        listed = await body(await c.get("/v1/threads", params={**q, "limit": 200}, headers=_h("admin")), 200)
        assert {a1, b1, b2} <= {t["thread_id"] for t in listed["threads"]}
        # A tenant asking for another tenant's resource_id gets nothing, not an error.
        other = await body(await c.get("/v1/threads", params={"resource_id": "tenantB/u1"}, headers=_h("ta")), 200)
        assert other["threads"] == []
        for path in (f"/v1/threads/{b2}", f"/v1/threads/{b2}/messages", f"/v1/threads/{b2}/state",
                     f"/v1/threads/{b2}/events"):
            await error(await c.get(path, headers=_h("ta")), 404, "thread_not_found")
            assert (await c.get(path, headers=_h("tb"))).status == 200
        await error(await c.patch(f"/v1/threads/{b1}", json={"metadata": {"x": 1}}, headers=_h("ta")),
                    404, "thread_not_found")
        await error(await c.delete(f"/v1/threads/{b1}", headers=_h("ta")), 404, "thread_not_found")
        for path in (f"/v1/runs/{rb}", f"/v1/runs/{rb}/events"):
            await error(await c.get(path, headers=_h("ta")), 404, "run_not_found")
            assert (await c.get(path, headers=_h("tb"))).status == 200
        runs = await body(await c.get("/v1/runs", params=q, headers=_h("ta")), 200)
        assert runs["runs"] == []
        runs = await body(await c.get("/v1/runs", params=q, headers=_h("tb")), 200)
        assert [r["run_id"] for r in runs["runs"]] == [rb]
        # Admin patches across tenants; tenant B still owns its thread afterwards.
        await body(await c.patch(f"/v1/threads/{b1}", json={"metadata": {"x": 1}}, headers=_h("admin")), 200)
        await body(await c.delete(f"/v1/threads/{b1}", headers=_h("tb")), 200)
