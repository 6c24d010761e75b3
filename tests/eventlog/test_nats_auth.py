"""NATS auth, against real nats-servers.

* The embedded server every agentlog process uses (through `agentlog.gateway.operations.connection`) refuses a client
  without credentials; the generated credentials are a 0600 file in the data dir.
* Roles: `readonly` reads the log and KV views but cannot append, queue commands or write KV;
  `gateway` and `worker` do their jobs (a run through `agentlog gateway` + `agentlog worker`
  processes' assembly on one data dir finishes); nobody can delete or purge the log.
* The shipped production config (scripts/nats/) is what agentlog.eventlog.roles renders, passes
  `nats-server -t`, and enforces the same roles when a server runs with it.
* `client` (what NATS protocol clients of the API log in as): calls the API and the adapters
  (`agentlog.api.>`, `agentlog.ag-ui.>`, `$SRV.>`) of a real `agentlog serve` / `gateway` +
  `worker` and gets the answers on its `_INBOX.client.>` inboxes; every publish on `agentlog.ev.*`,
  `agentlog.cmd.*`, `agentlog.ctl.*`, `$KV`, `$JS` is a permissions violation and nothing lands; it
  cannot subscribe to other users' inboxes or live output. A data dir whose credentials predate
  the role gets a `client` password, the others kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import nats
import nats.errors
import nats.js.errors
import pytest

from agentlog.cli.assembly import ServerConfig, serve
from agentlog.eventlog import roles as auth
from agentlog.eventlog.embedded.server import EmbeddedNatsServer, find_nats_server
from agentlog.eventlog.errors import PermissionDenied, StoreUnavailable
from agentlog.eventlog.events import Commit, Message, MessageAppended, ThreadCreated
from agentlog.eventlog.ids import new_id
from agentlog.eventlog.jetstream.retention import archive_due
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM
from agentlog.gateway.operations.connection import ConnectionOptions, open_store
from agentlog.projections.kv import ensure_bucket
from agentlog.runtime.inputs.commands import StartRun
from agentlog.runtime.workers.commands import COMMANDS_STREAM, CommandClient

from tests.support.topology import TOPOLOGIES, Kind, deploy

ROOT = Path(__file__).resolve().parents[2]
NATS_DIR = ROOT / "scripts" / "nats"
LIMIT = 60


def _commit(thread: str) -> Commit:
    return Commit(commit_id=new_id(), thread_id=thread, run_id=None, ts=1,
                  events=[ThreadCreated(), MessageAppended(message=Message(id=new_id(), role="user", content="hi"))])


async def _login(url: str, passwords: Mapping[str, str], role: str, **kw: Any) -> JetStreamEventStore:
    return await JetStreamEventStore.connect(url, user=role, password=passwords[role], connect_timeout=2.0, **kw)


async def refused(*attempts: Awaitable[Any]) -> None:
    """Each attempt fails with a NATS error or gets no answer within its own timeout (nats-py's
    JetStream calls get no reply to a denied publish). Awaited together: each waits out its
    timeout at the same time as the others."""
    outcomes = await asyncio.gather(*attempts, return_exceptions=True)
    for outcome in outcomes:
        assert isinstance(outcome, (nats.errors.Error, asyncio.TimeoutError)), outcomes


class Violations:
    """The permissions violations the server reported to one connection (nats-py's error
    callback), to wait on: the server's own word that an operation was refused."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._changed = asyncio.Event()

    async def record(self, exc: Exception) -> None:
        """The error callback."""
        self.seen.append(str(exc))
        self._changed.set()

    async def wait_for(self, kind: str, subject: str) -> None:
        """Until the server reported `Permissions Violation for <kind> to "<subject>"` (bound by
        the caller's timeout)."""
        needle = f"permissions violation for {kind} to \"{subject}\"".lower()
        while not any(needle in seen.lower() for seen in self.seen):
            self._changed.clear()
            await self._changed.wait()


async def client_login(url: str, password: str, violations: Violations | None = None) -> nats.NATS:
    """A NATS protocol client as the docs tell it to connect: user `client`, inbox prefix
    `_INBOX.client`."""
    async def ignore(_exc: Exception) -> None:
        pass

    return await nats.connect(url, user="client", password=password, inbox_prefix=auth.CLIENT_INBOX,
                              connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0,
                              error_cb=violations.record if violations is not None else ignore)


async def check_client_is_refused(url: str, passwords: Mapping[str, str], gateway: JetStreamEventStore) -> None:
    """`client` may not append, queue, signal, write KV, use JetStream, or listen on others' inboxes
    or live output: each attempt is a permissions violation from the server, and nothing lands."""
    violations = Violations()
    client = await client_login(url, passwords["client"], violations)
    js = gateway.nc.jetstream(timeout=2.0)
    before = await gateway.last_seq()
    queued = (await js.stream_info(COMMANDS_STREAM)).state.messages
    try:
        # core publishes and JetStream publishes (a JetStream publish is a request on the subject)
        cjs = client.jetstream(timeout=0.5)
        for subject in ("agentlog.ev.tc.r9", "agentlog.cmd.tc", "agentlog.ctl.tc.r9", "$KV.agentlog_runs.r9",
                        "agentlog.live.tc.r9"):
            await client.publish(subject, b"{}")
            await violations.wait_for("publish", subject)
        js_subjects = ("agentlog.ev.tc.r8", "agentlog.cmd.tc", "$KV.agentlog_runs.r8")
        await refused(*(cjs.publish(subject, b"{}") for subject in js_subjects),
                      cjs.stream_info(EVENTS_STREAM))  # no JetStream API at all
        for subject in (*js_subjects, f"$JS.API.STREAM.INFO.{EVENTS_STREAM}"):
            await violations.wait_for("publish", subject)
        # nor listen where others' answers (the services' JetStream replies) and live output pass
        for subject in ("_INBOX.>", "agentlog.live.>", "agentlog.ev.>"):
            await client.subscribe(subject)
            await violations.wait_for("subscription", subject)
        await client.flush()
        assert await gateway.last_seq() == before
        assert [sc async for sc in gateway.read_thread("tc")] == []
        assert (await js.stream_info(COMMANDS_STREAM)).state.messages == queued
        kv = await ensure_bucket(js, "agentlog_runs")
        for key in ("r8", "r9"):
            with pytest.raises(nats.js.errors.KeyNotFoundError):
                await kv.get(key)
    finally:
        await client.close()


async def check_roles(url: str, passwords: Mapping[str, str]) -> None:
    """The permission layout, role by role, on a server at `url` with these passwords."""
    with pytest.raises(StoreUnavailable, match=r"(?i)authorization"):
        await JetStreamEventStore.connect(url, connect_timeout=2.0)
    with pytest.raises(StoreUnavailable, match=r"(?i)authorization"):
        await JetStreamEventStore.connect(url, user="readonly", password="wrong", connect_timeout=2.0)

    worker = await _login(url, passwords, "worker")
    gateway = await _login(url, passwords, "gateway")
    readonly = await _login(url, passwords, "readonly", setup_stream=False)
    try:
        assert (await worker.append(_commit("tw"), 0)).seq == 1  # worker appends
        client = CommandClient(gateway.nc, timeout=2.0)  # gateway appends and queues commands
        assert (await gateway.append(_commit("tg"), 0)).seq == 2
        await client.submit(StartRun(thread_id="tg", run_id="r1", agent_id="quick", messages=["hi"]))
        js = gateway.nc.jetstream(timeout=2.0)
        queued = (await js.stream_info(COMMANDS_STREAM)).state.messages
        assert queued == 1

        # readonly reads the log, follows it, reads the stream state...
        assert [sc.seq async for sc in readonly.read_thread("tw")] == [1]
        assert await readonly.last_seq() == 2
        async for sc in readonly.follow("tg"):
            assert sc.seq == 2
            break
        # ... but cannot append, queue a command, or write KV: nothing lands.
        with pytest.raises(PermissionDenied):  # typed and at once, not after the 5 s request timeout
            await asyncio.wait_for(readonly.append(_commit("tr"), 0), 2.5)
        # ...nor write a view: a KV put is a JetStream publish on $KV.<bucket>.<key>, acked when
        # stored (the gateway's own put is, as the control); readonly's gets no ack and is not there
        kv = await ensure_bucket(js, "agentlog_runs")
        await kv.put("r0", b"{}")
        await refused(
            CommandClient(readonly.nc, timeout=0.5).submit(
                StartRun(thread_id="tr", run_id="r2", agent_id="quick", messages=["hi"])),
            # nor read the command queue
            readonly.nc.jetstream(timeout=0.5).pull_subscribe("agentlog.cmd.>", stream=COMMANDS_STREAM),
            readonly.nc.jetstream(timeout=0.5).publish("$KV.agentlog_runs.r1", b"{}"))
        await readonly.nc.publish("agentlog.cmd.tr", b"{}")
        await readonly.nc.flush()
        assert await gateway.last_seq() == 2
        assert [sc async for sc in gateway.read_thread("tr")] == []
        assert (await js.stream_info(COMMANDS_STREAM)).state.messages == queued
        assert (await kv.get("r0")).value == b"{}"
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get("r1")

        await check_client_is_refused(url, passwords, gateway)

        # Nobody deletes or purges the log.
        await refused(*(op for store in (gateway, worker) for sjs in [store.nc.jetstream(timeout=0.5)]
                        for op in (sjs.delete_stream(EVENTS_STREAM), sjs.purge_stream(EVENTS_STREAM))))
        assert await gateway.last_seq() == 2

        # ... but the archiver purges what it archived (retention), by subject; it too cannot
        # delete the stream or a single commit.
        for store in (gateway, worker, readonly):
            with pytest.raises(PermissionDenied):
                await asyncio.wait_for(store.purge_thread("tw", below=2), 2.5)
        archiver = await _login(url, passwords, "archiver")
        try:
            outcomes = await archive_due(archiver, 0)
            assert sorted((o.thread_id, o.result, o.removed) for o in outcomes) == [("tg", "archived", 1),
                                                                                   ("tw", "archived", 1)]
            ajs = archiver.nc.jetstream(timeout=0.5)
            # (nats-py's delete_msg has its own 5 s timeout, not the context's)
            await refused(ajs.delete_stream(EVENTS_STREAM), asyncio.wait_for(ajs.delete_msg(EVENTS_STREAM, 3), 0.5))
            # readonly reads archived threads (Object Store, run index) like any other
            assert [sc.seq async for sc in readonly.read_thread("tw")][0] == 1
            assert [sc.seq async for sc in readonly.read_thread("tg")][0] == 2
        finally:
            await archiver.close()
    finally:
        for store in (worker, gateway, readonly):
            await store.close()


def test_a_credentials_file_from_before_a_role_existed_gets_that_role(tmp_path: Path) -> None:
    old = {role: f"pw-{role}" for role in ("serve", "gateway", "worker", "readonly")}
    (tmp_path / auth.CREDENTIALS_FILE).write_text(json.dumps({"version": 1, "passwords": old}))
    passwords = auth.load_or_create_credentials(tmp_path).passwords
    assert set(passwords) == set(auth.ROLES)
    assert {role: passwords[role] for role in old} == old  # the existing ones are kept
    assert auth.load_or_create_credentials(tmp_path).passwords == passwords  # and the new one stays


async def test_embedded_server_refuses_clients_without_credentials_and_enforces_roles(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with asyncio.timeout(LIMIT):
        async with open_store(ConnectionOptions(data_dir=data)) as store:  # what every CLI command does
            url = store.nc.connected_url.geturl() if store.nc.connected_url else ""
            assert url
            with pytest.raises(nats.errors.Error):  # a plain client is refused
                await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0)
            creds = data / auth.CREDENTIALS_FILE
            assert stat.S_IMODE(creds.stat().st_mode) == 0o600
            assert stat.S_IMODE((data / "nats-server.conf").stat().st_mode) == 0o600
            passwords = auth.load_or_create_credentials(data).passwords
            assert set(passwords) == set(auth.ROLES) and len(set(passwords.values())) == len(auth.ROLES)
            await check_roles(url, passwords)


async def test_gateway_and_worker_roles_run_a_run_on_one_data_dir(tmp_path: Path) -> None:
    """`agentlog gateway` and `agentlog worker` (their assembly, in-process) on one data dir: one
    embedded server, each logged in with its own role, and a run started over HTTP finishes."""
    connection = ConnectionOptions(data_dir=tmp_path / "data")
    async with asyncio.timeout(LIMIT):
        async with serve(ServerConfig(role="gateway", port=0, tokens="", connection=connection)) as gateway, \
                serve(ServerConfig(role="worker", app_spec="tests.apps.worker_app:app", port=0, tokens="",
                                   connection=connection)) as worker:
            assert gateway.embedded is not None and worker.embedded is not None
            assert gateway.embedded.owner and not worker.embedded.owner
            assert gateway.nats_url == worker.nats_url
            assert worker.store is not None and worker.store.nc.options["user"] == "worker"
            async with aiohttp.ClientSession(gateway.http_url) as http:
                async with http.post("/v1/runs", json={"agent_id": "quick", "messages": "hi"}) as r:
                    assert r.status == 202, await r.text()
                    run_id = (await r.json())["run_id"]
                while True:
                    async with http.get(f"/v1/runs/{run_id}") as r:
                        body = await r.json()
                    if r.status == 200 and body["status"] == "done":
                        break
                    await asyncio.sleep(0.05)
            assert body["termination"]["type"] == "natural_end"


def _production_env(passwords: Mapping[str, str]) -> dict[str, str]:
    return {auth.password_env(role): passwords[role] for role in (*auth.ROLES, "sys")}


def test_shipped_accounts_file_is_the_permission_table() -> None:
    assert (NATS_DIR / "agentlog-accounts.conf").read_text() == auth.accounts_config()


def test_shipped_production_config_is_accepted_by_nats_server() -> None:
    env = {**os.environ, "NATS_SERVER_NAME": "nats-1", **_production_env({r: "pw" for r in (*auth.ROLES, "sys")})}
    proc = subprocess.run([find_nats_server(), "-t", "-c", str(NATS_DIR / "nats-server.conf")],
                          capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is valid" in proc.stdout + proc.stderr


async def test_production_accounts_enforce_the_roles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passwords = {role: f"{role}-secret-{new_id()}" for role in (*auth.ROLES, "sys")}
    for name, value in _production_env(passwords).items():
        monkeypatch.setenv(name, value)
    (tmp_path / "prod").mkdir()  # nats-server resolves includes relative to the including file
    shutil.copy(NATS_DIR / "agentlog-accounts.conf", tmp_path / "prod")
    server = EmbeddedNatsServer(tmp_path / "prod", extra_config=["include ./agentlog-accounts.conf"])
    async with asyncio.timeout(LIMIT):
        await server.astart()
        try:
            await check_roles(server.url, passwords)
            # The CLI without a login: one typed line, at once (not a connect timeout).
            agentlog = str(Path(sys.executable).parent / "agentlog")
            cli = await asyncio.to_thread(subprocess.run, [agentlog, "runs", "--nats", server.url, "--timeout", "30"],
                                          capture_output=True, text=True, timeout=25, stdin=subprocess.DEVNULL)
            assert cli.returncode == 1 and "error [nats_unauthorized]" in cli.stderr, cli.stderr
            # What the docs tell production processes to do: the login in AGENTLOG_NATS_URL.
            url = server.url.replace("nats://", f"nats://worker:{passwords['worker']}@")
            async with open_store(ConnectionOptions(nats_url=f"{url},{url}")) as store:
                assert await store.last_seq() == 4  # two commits and the two archive markers
        finally:
            await server.astop()


@pytest.mark.parametrize("kind", TOPOLOGIES)
async def test_client_role_calls_the_api_of_a_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        kind: Kind) -> None:
    """What the docs' NATS examples do, as user `client` on a server with the production
    accounts, against `agentlog serve` and against `agentlog gateway` + `agentlog worker`."""
    passwords = {role: f"{role}-secret-{new_id()}" for role in (*auth.ROLES, "sys")}
    for name, value in _production_env(passwords).items():
        monkeypatch.setenv(name, value)
    (tmp_path / "prod").mkdir()
    shutil.copy(NATS_DIR / "agentlog-accounts.conf", tmp_path / "prod")
    server = EmbeddedNatsServer(tmp_path / "prod", extra_config=["include ./agentlog-accounts.conf"])
    await server.astart()
    try:
        # the agentlog processes log in as `serve` (gateway + worker rights) for this test
        login = server.url.replace("nats://", f"nats://serve:{passwords['serve']}@")
        with deploy(kind, tmp_path / "deployment", app="tests.apps.worker_app:app", nats=server, args=["--nats", login]):
            async with asyncio.timeout(LIMIT):
                client = await client_login(server.url, passwords["client"])
                try:
                    await _client_requests(client)
                finally:
                    await client.close()
    finally:
        await server.astop()


async def _client_requests(client: nats.NATS) -> None:
    async def call(subject: str, body: dict[str, Any]) -> Any:
        msg = await client.request(subject, json.dumps(body).encode(), timeout=10)
        assert "Nats-Service-Error-Code" not in (msg.headers or {}), (msg.headers, msg.data)
        return json.loads(msg.data)

    started = await call("agentlog.api.runs.start", {"agent_id": "quick", "messages": "hi"})
    assert set(started) == {"thread_id", "run_id", "seq"}
    run = await call("agentlog.api.runs.get", {"run_id": started["run_id"], "min_seq": started["seq"]})
    assert run["run_id"] == started["run_id"] and run["agent_id"] == "quick"
    info = await client.request("$SRV.INFO.agentlog", b"", timeout=10)
    assert json.loads(info.data)["name"] == "agentlog"
    # an adapter: many answers on one inbox, then the empty end marker
    inbox = client.new_inbox()
    assert inbox.startswith(auth.CLIENT_INBOX + ".")
    sub = await client.subscribe(inbox)
    body = {"threadId": f"t-{new_id()}", "runId": f"r-{new_id()}", "tools": [], "context": [], "state": {},
            "forwardedProps": {}, "messages": [{"id": "u1", "role": "user", "content": "hi"}]}
    await client.publish("agentlog.ag-ui.runs", json.dumps(body).encode(), reply=inbox,
                         headers={"Agentlog-Agent": "quick"})
    types = []
    async for msg in sub.messages:
        if not msg.data:
            break
        types.append(json.loads(msg.data)["type"])
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types


async def test_credentials_made_before_the_client_role_get_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    old = {role: f"old-{role}-{new_id()}" for role in ("serve", "gateway", "worker", "readonly")}
    creds = data / auth.CREDENTIALS_FILE
    creds.write_text(json.dumps({"version": 1, "passwords": old}))
    creds.chmod(0o600)
    async with asyncio.timeout(LIMIT):
        async with open_store(ConnectionOptions(data_dir=data)) as store:  # starts the embedded server
            url = store.nc.connected_url.geturl() if store.nc.connected_url else ""
            passwords = auth.load_or_create_credentials(data).passwords
            assert {r: passwords[r] for r in old} == old and passwords["client"] not in old.values()
            assert stat.S_IMODE(creds.stat().st_mode) == 0o600
            client = await client_login(url, passwords["client"])
            try:
                await client.flush()
            finally:
                await client.close()
    # every later process on the data dir reads the same password
    assert auth.load_or_create_credentials(data).passwords == passwords


def test_concurrent_upgrades_of_old_credentials_agree(tmp_path: Path) -> None:
    """Processes starting together on an old data dir each add the missing role: they agree on
    one password (the upgrade re-reads under a lock), and no one reads a half-written file."""
    from concurrent.futures import ThreadPoolExecutor

    old = {role: f"old-{role}" for role in ("serve", "gateway", "worker", "readonly")}
    (tmp_path / auth.CREDENTIALS_FILE).write_text(json.dumps({"version": 1, "passwords": old}))
    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(lambda _: dict(auth.load_or_create_credentials(tmp_path).passwords), range(16)))
    assert all(passwords == seen[0] for passwords in seen)
    assert {r: seen[0][r] for r in old} == old and set(seen[0]) == set(auth.ROLES)
