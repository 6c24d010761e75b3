"""JSON answers encoded with msgspec, so views (msgspec Structs) go out as they are stored."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

_encode = msgspec.json.Encoder().encode


def reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(data), status=status, content_type="application/json")


def page(items: list[Any], *, limit: int, offset: int, key: str) -> dict[str, Any]:
    """One page of an already filtered, ordered list, with enough to ask for the next one."""
    return {key: items[offset : offset + limit], "total": len(items), "limit": limit, "offset": offset}


__all__ = ["page", "reply"]
