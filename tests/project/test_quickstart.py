"""The README's quickstart, done as a newcomer does it: `app.py` written from the README (the same
code as examples/quickstart/app.py), served with `agentlog serve --app app:app` from its folder, a
run started and approved with the README's curl lines, then with its two CLI lines, then with its
`agentlog.client` script, and the inspector page served. docs/getting-started.md repeats the
quickstart word for word.

The one liberty taken: the server binds a free port (`--port 0`) and the README's
`http://127.0.0.1:8480` is replaced by the address its banner prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.docs import README, REPO, all_blocks, blocks

EXAMPLE = REPO / "examples" / "quickstart" / "app.py"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
README_URL = "http://127.0.0.1:8480"
#: Bounds one command (each takes about a second); not a synchronisation.
LIMIT = 120


def quickstart() -> str:
    """The README's quickstart: from its "Install" heading to the pointer at getting started."""
    text = README.read_text()
    return text[text.index("## Install\n"): text.index("Next: [getting started]")]


def quickstart_blocks(lang: str) -> list[str]:
    return [b.code for b in blocks(quickstart()) if b.lang == lang]


def test_the_readme_app_is_the_example_app() -> None:
    app, client = quickstart_blocks("python")
    assert app == EXAMPLE.read_text()
    assert "get_sync_client" in client
    marked = [b for b in all_blocks("python") if "run-by: tests/project/test_quickstart.py" in b.before]
    assert {b.page.name for b in marked} == {"README.md", "getting-started.md"}


def test_getting_started_repeats_the_quickstart_word_for_word() -> None:
    assert quickstart().rstrip() in GETTING_STARTED.read_text()


@dataclass(frozen=True)
class Served:
    url: str
    folder: Path
    env: dict[str, str]


def _env() -> dict[str, str]:
    """A user's shell after the README's install: `agentlog` and `python` of .venv first on PATH,
    no agentlog or NATS variables, no proxies (everything here is loopback)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTLOG_", "NATS_")) and "proxy" not in k.lower()}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), NO_COLOR="1",
               COLUMNS="200")
    return env


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`agentlog serve --app app:app` in a new folder holding the README's `app.py`; ready once its
    banner names its HTTP address (printed after the site is listening)."""
    folder = tmp_path_factory.mktemp("quickstart")
    (folder / "app.py").write_text(quickstart_blocks("python")[0])
    (command,) = [line for line in quickstart_blocks("bash")[1].splitlines() if line.startswith("agentlog serve")]
    assert command == "agentlog serve --app app:app"
    env = _env()
    proc = subprocess.Popen(["timeout", "600", *command.split(), "--port", "0"], cwd=folder, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    found: list[str] = []
    ready = threading.Event()

    def read_banner_then_drain() -> None:  # a thread: a blocking readline cannot be given a timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"HTTP\s+│\s+(http://127\.0\.0\.1:\d+)", line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()  # exited without a banner

    threading.Thread(target=read_banner_then_drain, daemon=True).start()
    try:
        assert ready.wait(LIMIT) and found, f"agentlog serve printed no HTTP address (exit {proc.poll()})"
        yield Served(url=found[0], folder=folder, env=env)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(served: Served, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=served.folder, env=served.env, capture_output=True, text=True, timeout=LIMIT,
                          stdin=subprocess.DEVNULL)


def get(served: Served, path: str) -> dict[str, object]:
    with urllib.request.urlopen(served.url + path, timeout=LIMIT) as resp:
        return dict(json.load(resp))


def test_approve_with_curl(served: Served) -> None:
    script = quickstart_blocks("bash")[2].replace(README_URL, served.url)
    done = run(served, ["bash", "-euo", "pipefail", "-c", script + 'echo "RUN=$RUN"\n'])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = re.findall(r"^event: (\w+)", done.stdout, re.M)
    assert events.index("RunSuspended") < events.index("ToolCallDecided") < events.index("RunFinished"), events
    (run_id,) = re.findall(r"^RUN=(\S+)$", done.stdout, re.M)
    view = get(served, f"/v1/runs/{run_id}")
    assert view["status"] == "done" and view["termination"] == {"type": "natural_end"}, view


def test_approve_with_the_cli(served: Served) -> None:
    start, approve = [line.split("#")[0].strip() for line in quickstart_blocks("bash")[3].splitlines()]
    started = run(served, ["bash", "-c", start])
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    assert "RunSuspended" in started.stdout
    # the command it ends with names the run, which the README's second line takes as <run_id>
    (run_id,) = re.findall(r"agentlog run approve (\S+)", started.stdout)
    approved = run(served, ["bash", "-c", approve.replace("<run_id>", run_id)])
    assert approved.returncode == 0, approved.stdout[-3000:] + approved.stderr[-3000:]
    assert re.search(r"RunFinished\s+natural_end", approved.stdout), approved.stdout
    assert get(served, f"/v1/runs/{run_id}")["status"] == "done"


def test_approve_with_the_client_then_replay_and_inspector(served: Served) -> None:
    script = quickstart_blocks("python")[1]
    path = served.folder / "client.py"
    path.write_text(script.replace(README_URL, served.url))
    done = run(served, ["python", str(path)])
    assert done.returncode == 0, done.stderr[-3000:]
    for claim in re.findall(r"#\s*prints:\s*(.+?)\s*$", script, re.M):
        assert claim in done.stdout, done.stdout
    # `agentlog runs` folds the log (exact, unlike a listing that may trail the views)
    listed = run(served, ["agentlog", "runs", "--status", "done", "--json"])
    assert listed.returncode == 0, listed.stderr[-3000:]
    finished = [r["run_id"] for r in json.loads(listed.stdout) if r["termination"]["type"] == "natural_end"]
    assert finished
    verified = run(served, ["agentlog", "replay", finished[-1], "--verify", "--app", "app:app"])
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    with urllib.request.urlopen(served.url + "/ui", timeout=LIMIT) as page:
        assert page.status == 200 and b"<html" in page.read().lower()
