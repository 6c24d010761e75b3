"""`agentlog.eventlog.jetstream.headers`: the store connection's lean header parse gives exactly nats-py's result
(property test against `nats.aio.client.Client._parse_header_lines`), and the store reads
through it on a real nats-server."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import Commit, Message, MessageAppended
from agentlog.eventlog.jetstream.headers import LeanHeadersClient, parse_header_lines
from agentlog.eventlog.jetstream.store import JetStreamEventStore

_piece = st.one_of(
    st.sampled_from([b"Nats-Sequence", b"Nats-Msg-Id", b" Name ", b"Bad Name", b"X\x1cY", b"\xff\xfe", b"",
                     b":", b": ", b"\t", b"value", b" 42 ", b"\xc3\xa9t\xc3\xa9", b"\xff"]),
    st.binary(max_size=12),
)
_line = st.lists(_piece, max_size=4).map(b"".join)


@given(st.lists(_line, max_size=8), st.booleans())
def test_lean_parse_equals_nats_py(lines: list[bytes], trailing: bool) -> None:
    raw = b"\r\n".join(lines) + (b"\r\n\r\n" if trailing else b"")
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_typical_direct_get_headers() -> None:
    raw = (b"Nats-Stream: agentlog_events\r\nNats-Subject: agentlog.ev.t.r\r\nNats-Sequence: 42\r\n"
           b"Nats-Time-Stamp: 2026-11-23T17:00:00Z\r\nNats-Msg-Id: c1\r\n\r\n")
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)
    assert parse_header_lines(raw)["Nats-Sequence"] == "42"


@pytest.mark.asyncio
async def test_store_connection_reads_through_the_lean_parse(nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        assert isinstance(store.nc, LeanHeadersClient)
        seq = 0
        for i in range(5):
            commit = Commit(commit_id=f"c{i}", thread_id="t", run_id="r", ts=i,
                            events=[MessageAppended(message=Message(id=f"m{i}", role="user", content="hi"))])
            seq = (await store.append(commit, seq)).seq
        read: list[Any] = [sc async for sc in store.read_thread("t")]
        assert [sc.commit.commit_id for sc in read] == [f"c{i}" for i in range(5)]
        assert [sc.seq for sc in read] == sorted(sc.seq for sc in read) and read[-1].seq == seq
        assert await store.thread_version("t") == seq
    finally:
        await store.close()
