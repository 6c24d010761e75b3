"""Reading what an `agentlog serve` subprocess prints: the banner table it shows once it listens."""

from __future__ import annotations

import asyncio
import re

HTTP_ROW = re.compile(r"HTTP\s+│\s+(http://127\.0\.0\.1:\d+)")
NATS_ROW = re.compile(r"NATS\s+│\s+(nats://127\.0\.0\.1:\d+)")


async def read_banner(proc: asyncio.subprocess.Process) -> str:
    """The banner up to its NATS row (HTTP and NATS are both up by then); fails with what was
    printed if the process ends first. Bound it with the caller's timeout."""
    assert proc.stdout is not None
    banner = ""
    while "NATS" not in banner:
        line = (await proc.stdout.readline()).decode()
        assert line, f"agentlog serve exited before its banner: {banner}"
        banner += line
    return banner
