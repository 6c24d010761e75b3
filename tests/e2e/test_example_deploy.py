"""`examples/deploy/`: Docker Compose with a 3-node NATS cluster (R3), two gateways behind HAProxy
and two workers, running the app in `examples/deploy/app`.

No Docker engine runs here (and no HAProxy binary), so what can drift is checked instead: the
compose file's services, logins and variables (against `env.example`); each NATS node's config, by
`nats-server -t` next to the accounts file the image puts beside it, and that the three nodes'
routes form one cluster of exactly them; `haproxy.cfg`: its frontend on the published port, its
backend naming both gateways (their host names and port), each checked on `GET /health`; every
agentlog command line against the real CLI's parser. Then the same topology runs as processes:
three nats-servers as one cluster with the config's accounts and limits (the passwords in their
environment, as compose gives them), the two gateways and two workers with exactly the compose
commands and environments (host names and ports replaced by loopback ones), and the README's two
commands: a run started through one gateway waits for approval, is approved through the other
(the client alternating gateways in place of the load balancer), ends.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from agentlog.eventlog.embedded.server import find_nats_server
from agentlog.testing.cluster import CLUSTER_NAME, LocalCluster

from tests.project.test_deploy_docker import ROLES, interpolate
from tests.support.examples import Processes, clean_env, readme_commands, run, with_url

pytestmark = pytest.mark.early  # many seconds: started first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "deploy"
ACCOUNTS = REPO / "scripts" / "nats" / "agentlog-accounts.conf"
NODES = ["nats-1", "nats-2", "nats-3"]
GATEWAYS = ["gateway-1", "gateway-2"]
#: Where each node's config is mounted in its container (beside the image's accounts file).
NODE_CONF = "/etc/nats/node.conf"
#: What the NATS node's config may set: where it listens and stores and its cluster (replaced here
#: by loopback ones and a tmp dir), and what the test's servers take as is.
PLACE_KEYS = {"server_name", "listen", "http", "jetstream", "cluster"}
KEPT_KEYS = {"max_payload", "include"}


def env_example() -> dict[str, str]:
    pairs = [line.split("=", 1) for line in (EXAMPLE / "env.example").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {k: v for k, v in pairs}


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    """env.example filled in as the operator would: one URL-safe password per role."""
    return {**env_example(), **{f"AGENTLOG_{role.upper()}_PASSWORD": f"pw-{role}-0123abcd" for role in ROLES}}


@pytest.fixture(scope="module")
def compose(env: dict[str, str]) -> dict[str, Any]:
    return interpolate(yaml.safe_load((EXAMPLE / "compose.yaml").read_text()), env)


def config_settings(path: Path) -> dict[str, str]:
    """The top-level settings of a nats-server config, by key: each one's text, a block whole."""
    settings: dict[str, str] = {}
    depth, key = 0, ""
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if depth == 0:
            key = re.split(r"[\s:{]", line, maxsplit=1)[0]
            settings[key] = line
        else:
            settings[key] += "\n" + line
        depth += line.count("{") + line.count("[") - line.count("}") - line.count("]")
    return settings


def haproxy_sections(path: Path) -> dict[str, list[str]]:
    """`haproxy.cfg` by section (`global`, `defaults`, `frontend api`, ...): its lines, comments dropped."""
    sections: dict[str, list[str]] = {}
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line[0].isspace():
            current = line.strip()
            sections[current] = []
        else:
            sections[current].append(" ".join(line.split()))
    return sections


def test_compose_runs_three_nats_nodes_two_gateways_behind_haproxy_and_two_workers(
        compose: dict[str, Any], env: dict[str, str]) -> None:
    text = (EXAMPLE / "compose.yaml").read_text()
    assert {m.group(1) for m in re.finditer(r"\$\{([A-Z0-9_]+)", text)} == set(env_example())
    with pytest.raises(AssertionError, match="compose would refuse to start"):  # no passwords, no NATS
        interpolate(yaml.safe_load(text), {})
    services = compose["services"]
    assert set(services) == {*NODES, *GATEWAYS, "worker", "lb"}
    for node in NODES:
        nats = services[node]
        assert nats["entrypoint"] == ["nats-server"] and nats["command"] == ["-c", NODE_CONF]
        assert nats["hostname"] == nats["environment"]["NATS_SERVER_NAME"] == node
        assert nats["volumes"] == [f"./nats.conf:{NODE_CONF}:ro", f"{node}:/var/lib/nats"]
        assert set(nats["environment"]) == {f"AGENTLOG_{r.upper()}_PASSWORD" for r in ROLES} | {"NATS_SERVER_NAME"}
    assert set(compose["volumes"]) == set(NODES)
    for name in (*GATEWAYS, "worker"):
        svc = services[name]
        role = name.split("-")[0]
        assert svc["command"][0] == role and svc["volumes"] == ["./app:/app:ro"]
        assert svc["depends_on"] == {node: {"condition": "service_healthy"} for node in NODES}
        password = env[f"AGENTLOG_{role.upper()}_PASSWORD"]
        assert svc["environment"]["AGENTLOG_NATS_URL"] == ",".join(f"nats://{role}:{password}@{n}:4222" for n in NODES)
        assert svc["command"][svc["command"].index("--replicas") + 1] == "3"  # R3: the cluster's size
        assert "ports" not in svc  # only the load balancer is published
    assert services["gateway-1"]["command"] == services["gateway-2"]["command"]
    assert [services[g]["hostname"] for g in GATEWAYS] == GATEWAYS
    assert services["worker"]["deploy"]["replicas"] >= 2
    lb = services["lb"]
    assert lb["image"].startswith("haproxy:") and lb["ports"] == ["127.0.0.1:8480:8480"]
    assert lb["volumes"] == ["./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
    assert set(lb["depends_on"]) == set(GATEWAYS)
    build = services["gateway-1"]["build"]
    assert (EXAMPLE / build["context"] / build["dockerfile"]).resolve() == REPO / "scripts" / "docker" / "Dockerfile"
    assert (EXAMPLE / "app" / "agents.py").is_file()


def test_the_load_balancer_sends_to_both_gateways_and_checks_their_health(compose: dict[str, Any]) -> None:
    sections = haproxy_sections(EXAMPLE / "haproxy.cfg")
    [frontend] = [name for name in sections if name.startswith("frontend ")]
    published = compose["services"]["lb"]["ports"][0].rsplit(":", 1)[1]
    assert f"bind :{published}" in sections[frontend]
    [backend_name] = [line.split()[1] for line in sections[frontend] if line.startswith("default_backend ")]
    backend = sections[f"backend {backend_name}"]
    port = {g: compose["services"][g]["command"][compose["services"][g]["command"].index("--port") + 1]
            for g in GATEWAYS}
    servers = [line.split() for line in backend if line.startswith("server ")]
    assert {tuple(s[1:3]) for s in servers} == {(g, f"{g}:{port[g]}") for g in GATEWAYS}
    # each is health checked: GET /health, 200 (ok or degraded) in rotation, 503 out
    assert "option httpchk GET /health" in backend and "http-check expect status 200" in backend
    defaults = next((line.split() for line in backend if line.startswith("default-server ")), [])
    assert all("check" in s[3:] or "check" in defaults for s in servers)
    # Its health endpoint is the gateway's: /health answers 503 when the gateway cannot serve.
    from agentlog.gateway.http.health import ROUTES

    assert any(r.path == "/health" and 503 in r.errors for r in ROUTES)
    # event streams outlive the gateway's heartbeat interval (15 s) between two reads
    timeouts = {line.split()[1]: line.split()[2] for line in sections["defaults"] if line.startswith("timeout ")}
    assert all(int(timeouts[k].removesuffix("s")) > 15 for k in ("client", "server"))


def test_the_three_nats_configs_form_one_cluster_and_are_valid_next_to_the_images_accounts_file(
        tmp_path: Path, compose: dict[str, Any]) -> None:
    # where the image has them: scripts/nats/ copied to /etc/nats/, the config mounted beside it
    assert re.search(r"^COPY scripts/nats/ /etc/nats/$", (REPO / "scripts/docker/Dockerfile").read_text(), re.M)
    etc = tmp_path / "etc" / "nats"
    etc.mkdir(parents=True)
    shutil.copy(EXAMPLE / "nats.conf", etc / Path(NODE_CONF).name)
    shutil.copy(ACCOUNTS, etc / ACCOUNTS.name)
    for node in NODES:
        nats = compose["services"][node]
        checked = subprocess.run([find_nats_server(), "-t", "-c", str(etc / Path(NODE_CONF).name)],
                                 capture_output=True, text=True, env=nats["environment"], timeout=30)
        assert checked.returncode == 0, checked.stderr + checked.stdout
    settings = config_settings(EXAMPLE / "nats.conf")
    assert set(settings) == PLACE_KEYS | KEPT_KEYS and settings["include"] == f"include ./{ACCOUNTS.name}"
    assert settings["server_name"] == "server_name: $NATS_SERVER_NAME"  # each node's own name
    cluster = settings["cluster"]
    assert re.search(rf"name:\s*{CLUSTER_NAME}\b", cluster)
    listen = re.search(r"listen:\s*\S+:(\d+)", cluster)
    assert listen
    routes = re.findall(r"nats-route://([\w-]+):(\d+)", cluster)
    assert sorted(routes) == [(node, listen.group(1)) for node in NODES]  # every node, by its host name
    store = re.search(r'store_dir:\s*"([^"]+)"', settings["jetstream"])
    for node in NODES:
        [volume] = [v for v in compose["services"][node]["volumes"] if v.startswith(f"{node}:")]
        assert store and Path(store.group(1)).is_relative_to(volume.split(":")[1])


@pytest.mark.parametrize("service", [*GATEWAYS, "worker"])
def test_the_agentlog_command_lines_are_valid_for_the_real_cli(compose: dict[str, Any], service: str) -> None:
    [sub, *args] = compose["services"][service]["command"]
    from agentlog.cli.core import app

    group = typer.main.get_command(app)
    parent = group.make_context("agentlog", [sub])
    command = group.get_command(parent, sub)
    assert command is not None
    params = command.make_context(sub, list(args), parent=parent).params
    assert params["app_spec"] == "agents:app" and params["replicas"] == 3


@pytest.mark.timeout(300)
def test_the_same_topology_runs_as_processes(tmp_path: Path, compose: dict[str, Any], env: dict[str, str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose["services"]
    for name, value in services["nats-1"]["environment"].items():  # what compose gives a NATS node
        if name != "NATS_SERVER_NAME":
            monkeypatch.setenv(name, value)
    kept = [text for key, text in config_settings(EXAMPLE / "nats.conf").items() if key not in PLACE_KEYS]
    app_dir = tmp_path / "app"  # the mounted /app, the processes' working directory
    shutil.copytree(EXAMPLE / "app", app_dir)
    commands = readme_commands(EXAMPLE / "README.md")
    cluster = LocalCluster(tmp_path / "nats", len(NODES), extra_config=kept,
                           login=("serve", env["AGENTLOG_SERVE_PASSWORD"]))
    for node in cluster.nodes:
        node.data_dir.mkdir(parents=True)
        shutil.copy(ACCOUNTS, node.data_dir / ACCOUNTS.name)

    def process_env(service: str) -> dict[str, str]:
        given = dict(services[service]["environment"])
        for name, url in zip(NODES, cluster.urls, strict=True):
            given = {k: v.replace(f"@{name}:4222", "@" + url.removeprefix("nats://")) for k, v in given.items()}
        return clean_env(**given)

    def loopback_argv(service: str) -> list[str]:
        argv = ["agentlog", *services[service]["command"]]
        for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        return argv

    async def scenario() -> tuple[str, str]:
        async with cluster, Processes(tmp_path) as procs:
            gateways = [await procs.start(loopback_argv(g), cwd=app_dir, env=process_env(g)) for g in GATEWAYS]
            workers = [await procs.start(loopback_argv("worker"), cwd=app_dir, env=process_env("worker"))
                       for _ in range(services["worker"]["deploy"]["replicas"])]
            urls = [await procs.http_url(g) for g in gateways]
            for worker in workers:
                await procs.banner(worker)
            client = clean_env()
            code, started, err = await run(with_url(commands["run start"], urls[0]), cwd=tmp_path, env=client)
            assert code == 0, started + err + procs.errors()
            run_id = re.search(r"started run (\S+) on thread", started)
            assert run_id, started
            approve = [run_id.group(1) if a == "RUN_ID" else a for a in with_url(commands["run approve"], urls[1])]
            code, approved, err = await run(approve, cwd=tmp_path, env=client)
            assert code == 0, approved + err + procs.errors()
            return started, approved

    started, approved = asyncio.run(scenario())
    assert "ToolCallSuspended" in started and "waiting for a human: agentlog run approve" in started, started
    assert "send_email succeeded: sent 'Release 1.4.2 is out' to team@example.com" in approved, approved
    assert "natural_end" in approved and "RunFinished" in approved, approved
    assert list(tmp_path.rglob(".agentlog")) == []  # all through the NATS and the HTTP API
