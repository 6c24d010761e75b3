"""The JetStream wire format agentlog speaks, and the pure helpers around it.

Header names, API error codes, the PubAck / API answer structs and their decoders, the server
version gate (`check_server_version`), ack-subject and status parsing, `api_failure`. No I/O:
everything here is a function of bytes or strings, shared by the store (`agentlog.eventlog.jetstream.store`),
its request layer (`agentlog.eventlog.jetstream.requests`) and its live tail (`agentlog.eventlog.jetstream.follow`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from agentlog.eventlog.errors import AgentlogError, ServerTooOld, StoreUnavailable

#: First nats-server release that honours `Nats-Expected-Last-Subject-Sequence-Subject`
#: (nats-io/nats-server#5281, shipped in v2.11.0).
MIN_SERVER_VERSION = "2.11.0"

ERR_WRONG_LAST_SEQUENCE = 10071
ERR_STREAM_NOT_FOUND = 10059
ERR_NO_MESSAGE_FOUND = 10037
#: "no suitable peers for placement": too few peers online for a new stream's replicas.
ERR_NO_SUITABLE_PEERS = 10005

NS_PER_SECOND = 1_000_000_000
HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
HDR_EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
HDR_SEQUENCE = "Nats-Sequence"
HDR_NUM_PENDING = "Nats-Num-Pending"
HDR_STATUS = "Status"
#: On a Direct Get reply: the stored message's subject and time (RFC 3339).
HDR_SUBJECT = "Nats-Subject"
HDR_TIME_STAMP = "Nats-Time-Stamp"
WRONG_LAST_RE = re.compile(r"wrong last sequence:\s*(\d+)")


# -- wire structs ---------------------------------------------------------------------------------


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


class ApiResponse(msgspec.Struct):
    """Any JetStream API answer: the fields we look at, the rest kept raw."""

    error: _ApiError | None = None
    config: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    name: str | None = None


ack_decoder = msgspec.json.Decoder(_PubAck)
api_decoder = msgspec.json.Decoder(ApiResponse)
json_encoder = msgspec.json.Encoder()


# -- server version -------------------------------------------------------------------------------


def parse_version(text: str) -> tuple[int, int, int, bool]:
    """`"2.11.0-RC.1"` -> (2, 11, 0, True); the flag says it is a pre-release. ValueError if not
    a version."""
    match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$", text.strip())
    if match is None:
        raise ValueError(f"not a server version: {text!r}")
    return int(match[1]), int(match[2]), int(match[3]), match[4] is not None


def version_at_least(found: str, needed: str = MIN_SERVER_VERSION) -> bool:
    """Semver comparison: a pre-release of `needed` is older than `needed`; garbage is too old."""
    try:
        f_major, f_minor, f_patch, f_pre = parse_version(found)
    except ValueError:
        return False
    n_major, n_minor, n_patch, n_pre = parse_version(needed)
    if (f_major, f_minor, f_patch) != (n_major, n_minor, n_patch):
        return (f_major, f_minor, f_patch) > (n_major, n_minor, n_patch)
    return n_pre or not f_pre


def check_server_version(found: str, needed: str = MIN_SERVER_VERSION) -> None:
    """Raise `ServerTooOld(found, needed)` unless `found` >= `needed`."""
    if not version_at_least(found, needed):
        raise ServerTooOld(found, needed)


def server_version(nc: NATS) -> str:
    version = nc.connected_server_version
    try:
        text = f"{version.major}.{version.minor}.{version.patch}"
        return f"{text}-{version.prerelease}" if version.prerelease else text
    except (ValueError, TypeError):
        return repr(version)


# -- helpers --------------------------------------------------------------------------------------


def ack_reply_seqs(reply: str) -> tuple[int, int]:
    """(stream seq, consumer seq) from a JetStream ack subject, old or domain-qualified form."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
        return int(tokens[5]), int(tokens[6])
    if len(tokens) >= 12:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>...
        return int(tokens[7]), int(tokens[8])
    raise StoreUnavailable(f"unexpected JetStream ack subject {reply!r}")


def ack_reply_time(reply: str) -> int | None:
    """The stored time (ns since the epoch) from a JetStream ack subject, None if it has none."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[7])
    if len(tokens) >= 12:
        return int(tokens[9])
    return None


def msg_status(msg: Msg) -> str | None:
    headers = msg.headers
    if not headers or msg.data:
        return None
    return headers.get(HDR_STATUS)


# -- module helpers -------------------------------------------------------------------------------


def header_size(headers: dict[str, str]) -> int:
    """Bytes the headers add to the message (NATS/1.0 line, `k: v` lines, blank line); the
    server's max_payload bounds headers + payload."""
    return 12 + sum(len(k) + len(v) + 4 for k, v in headers.items())


def api_failure(what: str, error: _ApiError) -> AgentlogError:
    if error.code == 503 or error.code >= 500:
        return StoreUnavailable(f"{what}: JetStream unavailable: {error.description} (err {error.err_code})")
    return AgentlogError(f"{what}: JetStream refused: {error.description} (err {error.err_code})")

