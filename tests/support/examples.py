"""Running an example (examples/*) as its README says: the `agentlog` command lines of its
fenced bash blocks, started as processes in a copy of the example folder.

    commands = readme_commands(EXAMPLE / "README.md")
    async with Processes(tmp_path) as procs:
        serve = await procs.start(with_port_0(commands["serve"]), cwd=site, env=env)
        url = await procs.http_url(serve)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.serve import HTTP_ROW

AGENTLOG = str(Path(sys.executable).parent / "agentlog")
_FENCE = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.S | re.M)


def readme_commands(readme: Path) -> dict[str, list[str]]:
    """The `agentlog ...` command lines of the README's bash blocks, by subcommand (`serve`,
    `gateway`, `worker`, `run start`), as argv (comments and a trailing `&` dropped). A
    subcommand given twice keeps its first line."""
    found: dict[str, list[str]] = {}
    for block in _FENCE.findall(readme.read_text()):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[-1] == "&":
                argv = argv[:-1]
            if not argv or argv[0] != "agentlog":
                continue
            key = " ".join(argv[1:3]) if argv[1] == "run" else argv[1]
            found.setdefault(key, argv)
    return found


def with_port_0(argv: Sequence[str]) -> list[str]:
    """The command with `--port 0` (any free port; the banner says which), replacing its own."""
    out = list(argv)
    if "--port" in out:
        i = out.index("--port")
        del out[i : i + 2]
    return [*out, "--port", "0"]


def with_url(argv: Sequence[str], url: str) -> list[str]:
    """The command with its `--url` pointing at `url`."""
    out = list(argv)
    out[out.index("--url") + 1] = url
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without agentlog's or the providers' variables, plus `extra`."""
    drop = ("AGENTLOG_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "COLUMNS": "200", "NO_COLOR": "1", **extra}


class Processes:
    """The agentlog processes a test starts (from `argv[0] == "agentlog"`: the venv's script),
    each printing to `<tmp>/<n>.log`; stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[asyncio.subprocess.Process] = []

    async def __aenter__(self) -> Processes:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in self.procs:
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def start(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> asyncio.subprocess.Process:
        command = [AGENTLOG if argv[0] == "agentlog" else argv[0], *argv[1:]]
        log = open(self.tmp / f"{len(self.procs)}-{argv[1]}.log", "wb")
        with log:
            proc = await asyncio.create_subprocess_exec(
                *command, cwd=str(cwd), env=dict(env), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=log)
        self.procs.append(proc)
        return proc

    async def banner(self, proc: asyncio.subprocess.Process) -> str:
        """What the process printed up to its banner's last row (it listens then)."""
        assert proc.stdout is not None
        text = ""
        async with asyncio.timeout(90):
            while "parts" not in text:
                line = (await proc.stdout.readline()).decode()
                assert line, f"exited ({await proc.wait()}) before its banner:\n{text}{self.errors()}"
                text += line
        return text

    async def http_url(self, proc: asyncio.subprocess.Process) -> str:
        banner = await self.banner(proc)
        found = HTTP_ROW.search(banner)
        assert found, banner
        return found.group(1)

    def errors(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')}" for p in sorted(self.tmp.glob("*.log")))


async def run(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 90) -> tuple[int, str, str]:
    """Run an agentlog command to its end: (exit code, stdout, stderr)."""
    command = [AGENTLOG if argv[0] == "agentlog" else argv[0], *argv[1:]]
    proc = await asyncio.create_subprocess_exec(
        *command, cwd=str(cwd), env=dict(env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
