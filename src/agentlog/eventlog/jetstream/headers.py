"""A leaner NATS header parse for the store's connection.

Every Direct Get reply carries about seven headers (`Nats-Stream`, `Nats-Subject`,
`Nats-Sequence`, `Nats-Time-Stamp`, the commit's own `Nats-Msg-Id` and OCC headers). nats-py
parses each header block line by line and checks every character of every name for whitespace
(`any(c.isspace() for c in key)`): profiled, that is most of the time `read_thread` spends on a
long thread (figures in the docs' decision records). The names repeat on every message, so `parse_header_lines` does the same
checks once per distinct name (a small cache) and gives the same dict as nats-py's
`Client._parse_header_lines` for every input (a property test compares the two).
`LeanHeadersClient` is nats-py's client with that one function swapped; nothing else changes.
"""

from __future__ import annotations

from nats.aio.client import Client

_CRLF = b"\r\n"
_MISSING = object()
_MAX_NAMES = 1024

#: raw name -> the name nats-py keeps, or None for one it drops (non-ASCII, whitespace inside)
_names: dict[bytes, str | None] = {}


def _name(raw: bytes) -> str | None:
    """The header name as nats-py keeps it, or None (cached per distinct raw name)."""
    key = _names.get(raw, _MISSING)
    if key is _MISSING:
        try:
            key = raw.strip().decode("ascii")
        except UnicodeDecodeError:
            key = None
        if key is not None and any(c.isspace() for c in key):
            key = None
        if len(_names) < _MAX_NAMES:
            _names[raw] = key
    return key  # type: ignore[return-value]


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """`Name: Value\\r\\n` lines -> dict, exactly as nats-py's `_parse_header_lines`."""
    out: dict[str, str] = {}
    names = _names
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = names.get(name, _MISSING)
        if key is _MISSING:
            key = _name(name)
        if key is not None:
            out[key] = value.strip().decode("utf-8", "replace")  # type: ignore[index]  # str here; no cast in this hot loop
    return out


class LeanHeadersClient(Client):
    """nats-py's `Client` with the header-line parse above (same results, less work)."""

    _parse_header_lines = staticmethod(parse_header_lines)


__all__ = ["LeanHeadersClient", "parse_header_lines"]
