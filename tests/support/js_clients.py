"""The pinned JS clients in tests/support/js (`@ag-ui/client`, `ai`), installed once per checkout.

Four test modules drive them, from any of the pytest processes, and on a fresh clone each found
them missing: `npm ci` deletes `node_modules` before it installs, so two installs at once (or one
under a client that was running) broke each other, and a module that only checked for the
packages skipped when it ran first. Here one install runs under an exclusive lock on the tests/support/js
directory; the others wait for it, then find the packages.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parent / "js"
PACKAGES = ("@ag-ui/client", "ai")
#: npm's codes for "no network": only these skip; a lockfile or package error fails the test.
NETWORK_ERRORS = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH")
INSTALL_TIMEOUT = 300


def _installed() -> bool:
    return all((JS / "node_modules" / package / "package.json").is_file() for package in PACKAGES)


def _install_once() -> str | None:
    """Install the pinned packages unless they are there; why the clients cannot run, or None."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node/npm not installed"
    if _installed():
        return None
    fd = os.open(JS, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the fd closes
        if _installed():  # another pytest process installed them while this one waited
            return None
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT, check=False)
    finally:
        os.close(fd)
    output = done.stdout + done.stderr
    if done.returncode != 0 and any(code in output for code in NETWORK_ERRORS):
        return f"the npm registry is unreachable, the pinned clients cannot be installed: {output[-300:]}"
    assert done.returncode == 0, f"npm ci in tests/support/js failed:\n{output[-2000:]}"
    return None


async def ensure_js_clients() -> None:
    """Make the pinned clients ready, or skip the calling test (no node/npm, no network)."""
    why = await asyncio.to_thread(_install_once)
    if why is not None:
        pytest.skip(why)
