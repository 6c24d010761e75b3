"""JSON answers encoded with msgspec, so views (msgspec Structs) go out as they are stored."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

_encode = msgspec.json.Encoder().encode


def reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(data), status=status, content_type="application/json")


__all__ = ["reply"]
