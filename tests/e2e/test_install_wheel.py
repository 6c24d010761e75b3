"""agentlog installed the ways a user's project gets it, into fresh venvs outside the checkout.

* The wheel (`uv build --wheel` of a copy of the sources) in a venv of its own, with only the
  runtime dependencies: `agentlog demo --auto-approve` runs from there; an app file in a folder of
  the user's is served (`agentlog serve --app app:app`) and driven by the CLI from yet another
  folder over `--url` (the second run over the HTTP API). Its model is a `ScriptedModel` as a first
  app writes it, so the second run shows the trap's message: it names `position="conversation"`. An app on `anthropic:` without
  the extra does not start, and the command its error prints installs what it lacks: run, the
  app starts.
* A git URL with an extra (`agentlog[openai] @ git+file://<checkout>@<HEAD>`): the extra's SDK
  comes with it.

Hermetic enough: uv installs from its local cache (`--offline`), warm from the dev install
(`scripts/test` installs with uv); only where that fails (a cache that never saw a package) does
the test go to the package index the machine's uv config names, and then says so in its output.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentlog.client import AsyncClient

from tests.support.examples import Processes, clean_env, run

REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"

pytestmark = [pytest.mark.early, pytest.mark.skipif(not UV.exists(), reason="uv is not installed in the venv"),
              pytest.mark.timeout(300)]

FIRST_APP = '''
from agentlog import AgentSpec, App, ScriptedModel, Turn, tool


@tool
def greet(name: str) -> str:
    """Greet someone."""
    return f"Hello, {name}!"


# as a first app writes it: the default position counts turns across every run it answers
model = ScriptedModel([Turn.tool("greet", {"name": "Ada"}), "I greeted Ada."])
app = App(agents=[AgentSpec(id="greeter", model=model, tools=["greet"])], tools=[greet])
'''

PROVIDER_APP = '''
from agentlog import AgentSpec, App

app = App(agents=[AgentSpec(id="writer", model="anthropic:claude-test")])
'''


def uv(*args: str) -> subprocess.CompletedProcess[str]:
    """`uv ARGS` from the local cache only, else (a cache miss) from the configured index."""
    done = subprocess.run([str(UV), *args, "--offline"], capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        print(f"uv {args[0]} --offline failed, going online: {done.stderr[-500:]}")
        done = subprocess.run([str(UV), *args], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def fresh_venv(where: Path) -> Path:
    """A venv with nothing in it (no pip either): its python."""
    uv("venv", "-q", "--python", sys.executable, str(where))
    return where / "bin" / "python"


def venv_env(venv_python: Path, **extra: str) -> dict[str, str]:
    """The environment of a shell in that venv (its bin first on PATH); bytecode is written so
    that the processes after the first one import from it."""
    env = clean_env(**extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{venv_python.parent}:/usr/bin:/bin"
    env["VIRTUAL_ENV"] = str(venv_python.parent.parent)
    return env


def build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of the sources (the build writes into the tree it builds)."""
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    uv("build", "-q", "--wheel", "--out-dir", str(tmp / "dist"), str(source))
    [wheel] = (tmp / "dist").glob("agentlog-*.whl")
    return wheel


def test_wheel_installs_in_a_clean_venv_and_runs_the_demo_and_an_app(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    python = fresh_venv(tmp_path / "venv")
    uv("pip", "install", "-q", "--python", str(python), str(wheel))
    agentlog = python.parent / "agentlog"
    env = venv_env(python)
    checked = subprocess.run([str(python), "-c", "import agentlog, importlib.util as u; print(agentlog.__file__, "
                                                 "u.find_spec('pytest'), u.find_spec('anthropic'))"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert checked.stdout.startswith(str(tmp_path / "venv")) and checked.stdout.endswith("None None\n"), checked
    project = tmp_path / "myproject"
    project.mkdir()
    (project / "app.py").write_text(FIRST_APP)
    (project / "writer.py").write_text(PROVIDER_APP)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    async def demo() -> None:
        code, out, err = await run([str(agentlog), "demo", "--auto-approve", "--data-dir", str(tmp_path / "demo"),
                                    "--port", "0"], cwd=elsewhere, env=env, timeout=200)
        assert code == 0, out + err
        assert re.search(r"--auto-approve: POST \S+/v1/runs/\w+/inputs -> 202", out), out
        assert "deploy succeeded" in out and "natural_end" in out, out

    async def served_app(procs: Processes) -> None:
        serve = await procs.start([str(agentlog), "serve", "--app", "app:app", "--port", "0"], cwd=project, env=env)
        url = await procs.http_url(serve)
        client = [str(agentlog), "run", "start", "hi", "--agent", "greeter", "--url", url, "--follow"]
        code, first, err = await run(client, cwd=elsewhere, env=env)
        assert code == 0, first + err + procs.errors()
        assert "greet succeeded: Hello, Ada!" in first and "natural_end" in first, first
        # the second run, over the HTTP API: the model's one script was played by the first
        async with AsyncClient(url, timeout=60) as api:
            second = await api.runs.create("greeter", "hi again")
            termination = (await api.runs.wait(second["run_id"], timeout=60))["termination"]
        assert termination["code"] == "script_exhausted", termination
        assert "position='conversation'" in termination["detail"], termination

    async def provider_app(procs: Processes) -> None:
        """An app on a provider whose extra is not installed: it does not start, and the command
        it prints installs what it lacks (the printed requirements, through uv's pip offline:
        the venv has no pip); then it starts."""
        writer = [str(agentlog), "serve", "--app", "writer:app", "--port", "0", "--data-dir", str(tmp_path / "w")]
        with_key = {**env, "ANTHROPIC_API_KEY": "k"}
        code, out, err = await run(writer, cwd=project, env=with_key, timeout=60)
        assert code == 2, out + err
        hint = re.search(r"the 'anthropic' package is not installed: pip install (.+?) "
                         r"\(agentlog's 'anthropic' extra\)", err)
        assert hint, err
        await asyncio.to_thread(uv, "pip", "install", "-q", "--python", str(python), *shlex.split(hint.group(1)))
        assert "parts" in await procs.banner(await procs.start(writer, cwd=project, env=with_key))

    async def scenario() -> None:
        async with Processes(tmp_path) as procs:
            await asyncio.gather(demo(), served_app(procs), provider_app(procs))

    asyncio.run(scenario())
    assert not (elsewhere / ".agentlog").exists()  # the client commands created no data dir


def test_git_url_install_with_an_extra(tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("the checkout is not a git repository")
    python = fresh_venv(tmp_path / "venv")
    uv("pip", "install", "-q", "--python", str(python), f"agentlog[openai] @ git+file://{REPO}@{head.stdout.strip()}")
    env = venv_env(python)
    checked = subprocess.run(
        [str(python), "-c", "import agentlog, openai; from agentlog.runtime.models.sdk import installed; "
                            "print(agentlog.__file__, installed('openai'), installed('anthropic'))"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(str(tmp_path / "venv")) and checked.stdout.endswith("True False\n")
    version = subprocess.run([str(python.parent / "agentlog"), "--version"], capture_output=True, text=True, env=env,
                             timeout=60, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("agentlog "), version
