"""`agentlog dev --app module:attr`: the server restarts when the app's code changes.

The end-to-end test runs the installed `agentlog dev` on a real nats-server with an app module
written to a temporary directory, changes the module (adds an agent) and sees the new agent
served. It synchronises on the output (the server's banner, the supervisor's restart line),
never on time. The watcher's change detection is pure and tested directly.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.cli.dev import changed, snapshot, watch_roots
from agentlog.eventlog import EmbeddedNatsServer

AGENTLOG = str(Path(sys.executable).parent / "agentlog")
runner = CliRunner()

APP = '''
from agentlog.runtime import AgentSpec, Runtime
from agentlog.runtime.models import ScriptedModel, Turn

AGENTS = {agents!r}


def app(store):
    model = ScriptedModel([Turn.text("hi")], loop=True)
    return Runtime(store, agents=[AgentSpec(id=a, model="m") for a in AGENTS], models={{"m": model}})
'''


pytestmark = pytest.mark.usefixtures("keep_structlog_config")


def write_app(path: Path, agents: list[str]) -> None:
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(APP.format(agents=agents))
    # a change must show in the mtime even on a coarse-grained file system
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


def http_port(banner: str) -> int:
    """The HTTP port a `serve` banner names."""
    found = re.search(r"http://127\.0\.0\.1:(\d+)", banner)
    assert found, banner
    return int(found[1])


def read_until(stream: IO[str], text: str) -> str:
    """Lines until one contains `text` (the process runs under `timeout`, so this is bounded)."""
    seen = ""
    while True:
        line = stream.readline()
        assert line, f"the process ended before printing {text!r}:\n{seen}"
        seen += line
        if text in line:
            return seen


@pytest.mark.parametrize("embedded", [False, True], ids=["nats-url", "embedded"])
def test_dev_restarts_the_server_when_the_app_changes(tmp_path: Path, nats_server: EmbeddedNatsServer,
                                                      embedded: bool) -> None:
    """With --nats, and on the data dir's own (locked-down, shared) embedded server: the `run`
    commands on that data dir reach it with its generated credentials, and SIGTERM leaves no
    nats-server behind."""
    module = tmp_path / "devmod_app.py"
    write_app(module, ["v1"])
    where = ["--data-dir", str(tmp_path / "data")] if embedded else ["--nats", nats_server.url]
    proc = subprocess.Popen(
        ["timeout", "120", AGENTLOG, "dev", "--app", "devmod_app:app", *where,
         # port 0: the server takes a free one (a port picked here first could be taken by any
         # of the suite's other processes before the child binds it)
         "--port", "0", "--poll", "0.1", "--tokens", ""],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    assert proc.stdout is not None

    def start(agent: str) -> object:
        return runner.invoke(app, ["run", "start", "--agent", agent, "hi", "--follow", "--json",
                                   *where, "--timeout", "10"])

    try:
        banner = read_until(proc.stdout, "parts")
        assert "agentlog dev: watching" in banner
        assert start("v1").exit_code == 0
        missing = start("v2")
        assert missing.exit_code == 2 and "agent_not_found" in missing.stderr, missing.output

        write_app(module, ["v1", "v2"])
        read_until(proc.stdout, "devmod_app.py changed; restarting")
        banner = read_until(proc.stdout, "parts")  # the new server's banner
        port = http_port(banner)
        served = start("v2")
        assert served.exit_code == 0, served.output
        assert served.stdout.splitlines()[-1].find('"RunFinished"') > 0

        proc.send_signal(signal.SIGTERM)  # timeout(1) forwards it: the child and NATS stop too
        assert proc.wait(timeout=60) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        if embedded:  # the last user of the data dir stopped its nats-server
            from agentlog.eventlog.embedded.datadir import read_server_file

            doc = read_server_file(tmp_path / "data")
            assert doc is None or not _alive(int(doc["pid"])), doc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_watch_roots_of_a_module_a_package_and_a_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkg_dev").mkdir()
    (tmp_path / "pkg_dev" / "__init__.py").write_text("")
    (tmp_path / "pkg_dev" / "mod.py").write_text("app = 1\n")
    (tmp_path / "agents.yaml").write_text("agents: []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert watch_roots("pkg_dev.mod:app") == [(tmp_path / "pkg_dev").resolve()]
    assert watch_roots("pkg_dev:app") == [(tmp_path / "pkg_dev").resolve()]
    assert watch_roots("agents.yaml") == [tmp_path.resolve()]
    result = runner.invoke(app, ["dev", "--app", "no_such_dev_module:app"])
    assert result.exit_code == 2 and "error [app_module_not_found]" in result.stderr


def test_snapshot_sees_python_files_and_skips_caches(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("ignored\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    assert sorted(p.name for p in snapshot([tmp_path])) == ["a.py", "b.py"]


Snap = st.dictionaries(st.sampled_from([Path(f"/m/{n}.py") for n in "abcdef"]),
                       st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=6)


@given(Snap, Snap)
def test_changed_is_exactly_the_files_that_differ(before: dict[Path, tuple[int, int]],
                                                  after: dict[Path, tuple[int, int]]) -> None:
    diff = changed(before, after)
    assert diff == sorted(diff) and changed(after, before) == diff and changed(before, before) == []
    for path in before.keys() | after.keys():
        assert (path in diff) == (before.get(path) != after.get(path))
