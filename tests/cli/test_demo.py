"""`scripts/demo` end to end, running `agentlog demo --auto-approve`: the run waits, the printed curl
names the real run and call ids, the demo approves through that very HTTP request, the run
finishes, exit 0. Subprocesses (the installed script), each bounded by `timeout`, data in tmp."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTLOG = Path(sys.executable).parent / "agentlog"
CURL = re.compile(r"curl -sS -X POST http://127\.0\.0\.1:(\d+)/v1/runs/(\w+)/inputs "
                  r"-H 'Content-Type: application/json' -d '(\{.*\})'")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOG_")}
    env.update(AGENTLOG_DATA_DIR=str(tmp_path / "data"), COLUMNS="300", NO_COLOR="1")
    return env


def _check_output(out: str) -> None:
    match = CURL.search(out)
    assert match, out
    _port, run_id, body = match.groups()
    assert f"started run {run_id}" in out
    # where to look next: the inspector and the API docs of this very server
    assert re.search(r"inspector\s+http://127\.0\.0\.1:\d+/ui\b", out), out
    assert re.search(r"API docs\s+http://127\.0\.0\.1:\d+/docs\b", out), out
    assert '"action":"resume"' in body and '"approved":true' in body
    call_id = re.search(r'"target_id":"([^"]+)"', body).group(1)  # type: ignore[union-attr]
    assert "ToolCallSuspended    deploy suspended" in out and f"call={call_id}" in out
    # the MCP step: a tool of a real MCP server subprocess, recorded like any other
    assert "ToolCallCompleted    mcp__notes__release_notes succeeded" in out
    assert f"is waiting for approval of deploy (call {call_id})" in out
    assert re.search(rf"--auto-approve: POST \S+/v1/runs/{run_id}/inputs -> 202", out), out
    # the run goes on after the decision: the deploy runs, then the final answer
    after = out[match.end():]
    assert "ToolCallDecided" in after and "deploy succeeded" in after
    assert f"run {run_id} finished: natural_end after 3 step(s)" in after
    assert '"deployed": {"env": "staging", "release": "1.4.2"}' in after
    # the checks ran in a sub-agent: a child run of `checker` on its own thread
    assert "agent_run succeeded" in out
    assert re.search(r"sub-agent checker ran as run subrun-\w+ on its own thread sub-\w+: "
                     r"'All 42 release checks passed for 1.4.2.'", after), after


def test_scripts_demo_installs_with_pip_when_uv_cannot_be_had(tmp_path: Path) -> None:
    """Offline, or where no uv wheel exists: the install falls back to pip, and still happens once."""
    checkout = _checkout_with_venv(tmp_path / "checkout", uv_available=False)
    for _ in range(2):
        proc = subprocess.run([str(checkout / "scripts" / "demo"), "--help"], cwd=tmp_path, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "--auto-approve" in proc.stdout, proc.stdout + proc.stderr
    assert [line.split() for line in (checkout / "pip.log").read_text().splitlines()] == [
        ["-m", "pip", "install", "--disable-pip-version-check", "-q", "uv"],
        ["-m", "pip", "install", "--disable-pip-version-check", "-q", "-e", "."],
    ]
    assert not (checkout / "uv.log").exists()


def _checkout_with_venv(root: Path, *, uv_available: bool = True) -> Path:
    """`scripts/demo` and `pyproject.toml` in `root`, with a `.venv` whose python is the suite's
    own except for `-m pip` (recorded in `root/pip.log`, not run; installing `uv` puts a `uv`
    that records its arguments in `root/uv.log`, or fails when not `uv_available`): the script's
    install step and its stamp logic run for real, but the suite's shared venv is never
    reinstalled while other tests spawn `agentlog` from it (a reinstall removes the package and
    its entry point for a moment)."""
    (root / "scripts" / "lib").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "demo", root / "scripts" / "demo")
    shutil.copy2(ROOT / "scripts" / "lib" / "venv.sh", root / "scripts" / "lib" / "venv.sh")
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    get_uv = (f'printf "#!/usr/bin/env bash\\necho \\"\\$*\\" >> {root}/uv.log\\n" > "$(dirname "$0")/uv"; '
              'chmod +x "$(dirname "$0")/uv"; exit 0' if uv_available else "exit 1")
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "${1:-}" = "-m" ] && [ "${2:-}" = pip ]; then echo "$*" >> "$(dirname "$0")/../../pip.log"\n'
        f'  if [ "${{@: -1}}" = uv ]; then {get_uv}; fi; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (bin_dir / "agentlog").symlink_to(AGENTLOG)
    return root


@pytest.mark.timeout(320)
def test_scripts_demo_end_to_end(tmp_path: Path) -> None:
    if not AGENTLOG.exists():
        pytest.skip("no installed `agentlog` entry point next to this python")
    if shutil.which("timeout") is None:
        pytest.skip("needs coreutils timeout")
    checkout = _checkout_with_venv(tmp_path / "checkout")
    env = _env(tmp_path)
    env["AGENTLOG_DEMO_ARGS"] = "--auto-approve --port 0"
    # `agentlog` on PATH afterwards: a bin dir on PATH (standing in for ~/.local/bin) and no other
    # `agentlog` on PATH, so the demo links this checkout's there
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "agentlog").exists()]
    env.update(AGENTLOG_BIN_DIR=str(bin_dir), PATH=os.pathsep.join([str(bin_dir), *path]))
    stamp = checkout / ".venv" / ".agentlog-demo-install"  # none yet: a first run
    proc = subprocess.run(["timeout", "300", str(checkout / "scripts" / "demo")], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_output(proc.stdout)  # `agentlog demo --auto-approve --port 0`, run by the script
    assert not (checkout / ".agentlog").exists()  # the data dir variable was honoured
    assert (tmp_path / "data" / "jetstream").is_dir()
    assert "scripts/demo: installing agentlog" in proc.stderr, proc.stderr
    # pip fetches uv (one wheel), uv installs the package (parallel downloads)
    assert (checkout / "pip.log").read_text().split() == ["-m", "pip", "install", "--disable-pip-version-check", "-q", "uv"]
    assert (checkout / "uv.log").read_text().split() == ["pip", "install", "--python", ".venv/bin/python", "-q",
                                                                   "--compile-bytecode", "-e", "."]
    assert stamp.read_text().split()[0] == hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    # nothing changed since: the next start skips pip (and says nothing about installing)
    again = subprocess.run(["timeout", "120", str(checkout / "scripts" / "demo"), "--help"], cwd=tmp_path,
                           env={**env, "AGENTLOG_DEMO_ARGS": ""}, capture_output=True, text=True)
    assert again.returncode == 0 and "--auto-approve" in again.stdout, again.stdout + again.stderr
    assert "installing" not in again.stderr, again.stderr
    assert len((checkout / "uv.log").read_text().splitlines()) == 1  # no second install
    venv_cli = checkout / ".venv" / "bin" / "agentlog"
    assert (bin_dir / "agentlog").resolve() == venv_cli.resolve()
    assert f"linked {bin_dir / 'agentlog'} -> {venv_cli}" in proc.stderr, proc.stderr
