"""The route table and the small helpers every handler uses to read its input.

A `Route` carries what the server needs (method, path, handler) and what the OpenAPI document
needs (query/body models, response schema, summary). `create_app` registers the table and
`openapi` renders the very same table, so a route cannot exist without being documented.
The write side (runtime routes) plugs in by passing more `Route`s to `create_app`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel

from agentlog.eventlog.ids import validate_id, validate_run_id
from agentlog.gateway.operations.json_input import parse_json

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    #: JSON schema (or `{"$ref": ...}`) of the success body; `None` for SSE / text routes.
    response: Mapping[str, Any] | None = None
    status: int = 200
    #: Content type of the success answer when not JSON (SSE, Prometheus text).
    content_type: str = "application/json"
    auth: bool = True
    #: Extra error statuses worth documenting beyond the common ones.
    errors: tuple[int, ...] = field(default=())


#: The validated empty query of each model that accepts one (query models are frozen, so one
#: instance can be shared); most reads have no query string, and validating `{}` each time is
#: the same work with the same answer.
_EMPTY: dict[type[BaseModel], BaseModel] = {}


def parse_query(request: web.Request, model: type[M]) -> M:
    """Validate the query string (last value wins for repeated keys)."""
    if not request.query_string:
        cached = _EMPTY.get(model)
        if isinstance(cached, model):  # always, when cached: the cache is keyed by the model
            return cached
        empty = model.model_validate({})  # raises (not cached) if the model needs a parameter
        if model.model_config.get("frozen"):
            _EMPTY[model] = empty
        return empty
    return model.model_validate(dict(request.query))


async def parse_body(request: web.Request, model: type[M]) -> M:
    """Validate a JSON body. Over-size bodies are refused by aiohttp (`client_max_size`) -> 413."""
    raw = await request.read()
    data: Any = parse_json(raw) if raw else {}
    return model.model_validate(data)


def path_id(request: web.Request, name: str = "id", kind: str = "thread_id") -> str:
    """A path id, checked before it becomes part of a NATS subject (`a.b` -> 400)."""
    value = request.match_info[name]
    return validate_run_id(value) if kind == "run_id" else validate_id(value, kind)


__all__ = ["Route", "parse_body", "parse_query", "path_id"]
