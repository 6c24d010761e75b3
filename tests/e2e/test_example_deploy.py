"""`examples/deploy/`: Docker Compose with one NATS node, a gateway and two workers, running the
app in `examples/deploy/app`.

No Docker engine runs here, so what can drift is checked instead: the compose file's services,
logins and variables (against `env.example`); the NATS config, by `nats-server -t` next to the
accounts file the image puts beside it; every agentlog command line against the real CLI's
parser. Then the same topology runs as processes: a nats-server with the config's accounts and
limits (the passwords in its environment, as compose gives them), the gateway and two workers
with exactly the compose commands and environments (host names and the published port replaced
by loopback ones), and the README's two commands: a run waits for approval, is approved, ends.
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

from agentlog.eventlog.embedded.server import EmbeddedNatsServer, find_nats_server

from tests.project.test_deploy_docker import ROLES, interpolate
from tests.support.examples import Processes, clean_env, readme_commands, run, with_url

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "deploy"
ACCOUNTS = REPO / "scripts" / "nats" / "agentlog-accounts.conf"
#: What the NATS node's config may set: where it listens and stores (replaced here by loopback and
#: a tmp dir), and what the test's server takes as is.
PLACE_KEYS = {"server_name", "listen", "http", "jetstream"}
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


def config_lines() -> list[tuple[str, str]]:
    """(key, line) of every setting of the example's nats.conf."""
    lines = [ln.strip() for ln in (EXAMPLE / "nats.conf").read_text().splitlines()]
    return [(re.split(r"[\s:{]", ln, maxsplit=1)[0], ln) for ln in lines if ln and not ln.startswith("#")]


def test_compose_runs_nats_a_gateway_and_two_workers_on_the_app(compose: dict[str, Any], env: dict[str, str]) -> None:
    text = (EXAMPLE / "compose.yaml").read_text()
    assert {m.group(1) for m in re.finditer(r"\$\{([A-Z0-9_]+)", text)} == set(env_example())
    with pytest.raises(AssertionError, match="compose would refuse to start"):  # no passwords, no NATS
        interpolate(yaml.safe_load(text), {})
    services = compose["services"]
    assert set(services) == {"nats", "gateway", "worker"}
    nats = services["nats"]
    assert nats["entrypoint"] == ["nats-server"] and nats["command"] == ["-c", "/etc/nats/single-node.conf"]
    assert "./nats.conf:/etc/nats/single-node.conf:ro" in nats["volumes"]
    assert set(nats["environment"]) == {f"AGENTLOG_{r.upper()}_PASSWORD" for r in ROLES}
    for name in ("gateway", "worker"):
        svc = services[name]
        assert svc["command"][0] == name and svc["volumes"] == ["./app:/app:ro"]
        assert svc["depends_on"] == {"nats": {"condition": "service_healthy"}}
        assert svc["environment"]["AGENTLOG_NATS_URL"] == \
            f"nats://{name}:{env[f'AGENTLOG_{name.upper()}_PASSWORD']}@nats:4222"
    assert services["worker"]["deploy"] == {"replicas": 2}
    assert services["gateway"]["ports"] == ["127.0.0.1:8480:8480"]
    build = services["gateway"]["build"]
    assert (EXAMPLE / build["context"] / build["dockerfile"]).resolve() == REPO / "scripts" / "docker" / "Dockerfile"
    assert (EXAMPLE / "app" / "agents.py").is_file()


def test_the_nats_config_is_valid_next_to_the_images_accounts_file(tmp_path: Path, compose: dict[str, Any]) -> None:
    # where the image has them: scripts/nats/ copied to /etc/nats/, the config mounted beside it
    assert re.search(r"^COPY scripts/nats/ /etc/nats/$", (REPO / "scripts/docker/Dockerfile").read_text(), re.M)
    etc = tmp_path / "etc" / "nats"
    etc.mkdir(parents=True)
    shutil.copy(EXAMPLE / "nats.conf", etc / "single-node.conf")
    shutil.copy(ACCOUNTS, etc / ACCOUNTS.name)
    nats = compose["services"]["nats"]
    checked = subprocess.run([find_nats_server(), "-t", "-c", str(etc / "single-node.conf")], capture_output=True,
                             text=True, env=nats["environment"], timeout=30)
    assert checked.returncode == 0, checked.stderr + checked.stdout
    settings = dict(config_lines())
    assert set(settings) == PLACE_KEYS | KEPT_KEYS and settings["include"] == f"include ./{ACCOUNTS.name}"
    store = re.search(r'store_dir:\s*"([^"]+)"', settings["jetstream"])
    [volume] = [v for v in nats["volumes"] if v.startswith("nats:")]
    assert store and Path(store.group(1)).is_relative_to(volume.split(":")[1])


@pytest.mark.parametrize("service", ["gateway", "worker"])
def test_the_agentlog_command_lines_are_valid_for_the_real_cli(compose: dict[str, Any], service: str) -> None:
    [sub, *args] = compose["services"][service]["command"]
    from agentlog.cli.core import app

    group = typer.main.get_command(app)
    parent = group.make_context("agentlog", [sub])
    command = group.get_command(parent, sub)
    assert command is not None
    params = command.make_context(sub, list(args), parent=parent).params
    assert params["app_spec"] == "agents:app"


@pytest.mark.timeout(240)
def test_the_same_topology_runs_as_processes(tmp_path: Path, compose: dict[str, Any], env: dict[str, str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose["services"]
    for name, value in services["nats"]["environment"].items():  # what compose gives the NATS node
        monkeypatch.setenv(name, value)
    nats_dir = tmp_path / "nats"
    nats_dir.mkdir()
    shutil.copy(ACCOUNTS, nats_dir / ACCOUNTS.name)
    kept = [line for key, line in config_lines() if key not in PLACE_KEYS]
    app_dir = tmp_path / "app"  # the mounted /app, the processes' working directory
    shutil.copytree(EXAMPLE / "app", app_dir)
    commands = readme_commands(EXAMPLE / "README.md")
    with EmbeddedNatsServer(nats_dir, extra_config=kept) as nats:
        loopback = nats.url.removeprefix("nats://")

        def process_env(service: str) -> dict[str, str]:
            given = {k: v.replace("@nats:4222", f"@{loopback}") for k, v in services[service]["environment"].items()}
            return clean_env(**given)

        def loopback_argv(service: str) -> list[str]:
            argv = ["agentlog", *services[service]["command"]]
            for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
                if flag in argv:
                    argv[argv.index(flag) + 1] = value
            return argv

        async def scenario() -> tuple[str, str]:
            async with Processes(tmp_path) as procs:
                gateway = await procs.start(loopback_argv("gateway"), cwd=app_dir, env=process_env("gateway"))
                workers = [await procs.start(loopback_argv("worker"), cwd=app_dir, env=process_env("worker"))
                           for _ in range(services["worker"]["deploy"]["replicas"])]
                url = await procs.http_url(gateway)
                for worker in workers:
                    await procs.banner(worker)
                client = clean_env()
                code, started, err = await run(with_url(commands["run start"], url), cwd=tmp_path, env=client)
                assert code == 0, started + err + procs.errors()
                run_id = re.search(r"started run (\S+) on thread", started)
                assert run_id, started
                approve = [run_id.group(1) if a == "RUN_ID" else a for a in with_url(commands["run approve"], url)]
                code, approved, err = await run(approve, cwd=tmp_path, env=client)
                assert code == 0, approved + err + procs.errors()
                return started, approved

        started, approved = asyncio.run(scenario())
    assert "ToolCallSuspended" in started and "waiting for a human: agentlog run approve" in started, started
    assert "send_email succeeded: sent 'Release 1.4.2 is out' to team@example.com" in approved, approved
    assert "natural_end" in approved and "RunFinished" in approved, approved
    assert list(tmp_path.rglob(".agentlog")) == []  # all through the NATS and the HTTP API
