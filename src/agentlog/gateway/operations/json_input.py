"""One decoder for every JSON request body (HTTP routes, the NATS micro service, the protocol
adapters on both transports), so hostile JSON gets the same typed 400 everywhere.

    value = parse_json(raw)     # raises InvalidJson (code "invalid_json") on anything unusable

Why not `json.loads`: it accepts what we cannot store or process and fails later with a 500:
- lone UTF-16 surrogates (`"\\ud800"`, or raw surrogate bytes, which `json.loads` of bytes lets
  through) become Python strings that UTF-8 encoders (msgspec, the log) refuse, deep in a write;
- nesting ~1,000 deep raises `RecursionError` in the parser itself, and values only a few hundred
  deep still overflow the stack later (pydantic, `copy.deepcopy` in JSON patches, the folds).
msgspec's decoder rejects every surrogate form and non-finite numbers (`NaN`, `1e400`); depth is
bounded here at `MAX_DEPTH` with an iterative walk (no recursion to overflow).
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentlog.eventlog.errors import AgentlogError

#: Deepest nesting accepted in a request body (objects and arrays; a flat object is depth 1).
#: Far beyond any real message, tool schema or state, and far below what overflows the stack.
MAX_DEPTH = 64

_decoder = msgspec.json.Decoder()


class InvalidJson(AgentlogError, ValueError):
    """A body that is not JSON we can take (syntax, encoding, surrogates, nesting). HTTP 400;
    NATS micro error 400 with the same code."""

    code = "invalid_json"


def parse_json(raw: bytes | bytearray | memoryview | str) -> Any:
    """Decode a request body; raise `InvalidJson` (never anything else) on bad input."""
    try:
        value = _decoder.decode(raw)
    except RecursionError:
        raise InvalidJson(f"body is nested deeper than {MAX_DEPTH} levels") from None
    except (msgspec.MsgspecError, UnicodeError) as exc:
        raise InvalidJson(f"body is not valid JSON: {exc}") from None
    check_depth(value)
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise `InvalidJson` if `value` nests containers deeper than `limit`. Breadth-first, one
    level of containers at a time (no recursion; scalars are never kept)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise InvalidJson(f"body is nested deeper than {limit} levels")
        deeper = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    deeper.append(child)
        level = deeper


__all__ = ["MAX_DEPTH", "InvalidJson", "check_depth", "parse_json"]
