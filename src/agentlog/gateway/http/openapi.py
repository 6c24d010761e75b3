"""The OpenAPI 3.1 document, rendered from the route table and the models it names.

Nothing here is written by hand per route: parameters come from the pydantic query models,
bodies from the pydantic body models, view schemas from the msgspec view structs, so the document
always says what the server enforces. 3.1 is JSON Schema 2020-12, which is what pydantic and
msgspec both emit.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from pydantic import BaseModel

from agentlog.eventlog.events import Message
from agentlog.gateway.http.routing import Route
from agentlog.projections.views import RunView, ThreadView

_REF = "#/components/schemas/{name}"
_PATH_PARAM = re.compile(r"{(\w+)}")
_COMMON_ERRORS = {400: "Invalid input", 401: "Missing bearer token", 403: "Token not accepted",
                  503: "NATS unreachable or projection not caught up"}
_ERROR = {"type": "object", "required": ["error", "code"], "properties": {
    "error": {"type": "string"}, "code": {"type": "string"},
    "detail": {"type": "array", "items": {"type": "object"}}}}
#: A time-travel answer given as of the thread's last event, the asked one being after it
#: (`agentlog.projections.timeline.within`).
_POSITION_WARNING = {"type": "object", "required": ["code", "requested", "end", "message"], "properties": {
    "code": {"type": "string", "enum": ["position_past_end"]}, "requested": {"type": "string"},
    "end": {"type": "string"}, "message": {"type": "string"}}}


def _model_schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF.replace("{name}", "{model}"))
    components.update(schema.pop("$defs", {}))
    return schema


def _query_parameters(model: type[BaseModel], components: dict[str, Any]) -> list[dict[str, Any]]:
    schema = _model_schema(model, components)
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required,
         **({"description": prop["description"]} if "description" in prop else {}), "schema": prop}
        for name, prop in schema.get("properties", {}).items()
    ]


def _operation(route: Route, components: dict[str, Any]) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True,
         "schema": {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,128}$"}}
        for name in _PATH_PARAM.findall(route.path)
    ]
    if route.query is not None:
        params += _query_parameters(route.query, components)
    if route.content_type == "text/event-stream":
        params.append({"name": "Last-Event-ID", "in": "header", "required": False,
                       "description": "resume exactly after this event id", "schema": {"type": "string"}})
    op: dict[str, Any] = {
        "operationId": f"{route.method.lower()}_{route.path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
        "summary": route.summary,
        "tags": [route.tag],
    }
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": _model_schema(route.body, components)}}}
    content = ({"schema": route.response} if route.response is not None else {"schema": {"type": "string"}})
    responses: dict[str, Any] = {str(route.status): {"description": "OK", "content": {route.content_type: content}}}
    statuses = set(route.errors)
    if route.query is not None or route.body is not None or "{" in route.path:
        statuses.add(400)
    if route.auth:
        statuses |= {401, 403, 503}
    for status in sorted(statuses):
        responses[str(status)] = {
            "description": _COMMON_ERRORS.get(status, {404: "Not found", 409: "Conflict",
                                                       413: "Too large"}.get(status, "Error")),
            "content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}},
        }
    op["responses"] = responses
    if route.auth:
        op["security"] = [{"bearer": []}]
    return op


def build(routes: Iterable[Route], *, title: str = "agentlog", version: str = "0.1.0") -> dict[str, Any]:
    _, views = msgspec.json.schema_components([ThreadView, RunView, Message], ref_template=_REF)
    components: dict[str, Any] = {**views, "Error": _ERROR, "PositionWarning": _POSITION_WARNING}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "agentlog HTTP API: errors are {\"error\": message, \"code\": machine_code}"},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def as_openapi_30(node: Any) -> Any:
    """The same document in OpenAPI 3.0 terms, for docs UIs that read 3.0 only (the Swagger UI
    the `swagger-ui-bundle` package ships, at `/docs`). 3.1 schemas are JSON Schema 2020-12; 3.0
    has a subset plus `nullable`, so: `type: [X, "null"]` and `anyOf: [..., {type: null}]` become
    `nullable: true`, a list of `examples` its first `example`, `const` a one-value `enum`, and a
    numeric `exclusiveMinimum`/`Maximum` the boolean form. Nothing is lost that a reader of the
    docs needs; `/openapi.json` stays the exact 3.1 document."""
    if isinstance(node, list):
        return [as_openapi_30(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "openapi":
            out[key] = "3.0.3"
        elif key == "type" and isinstance(value, list):
            kinds = [k for k in value if k != "null"]
            if len(kinds) < len(value):
                out["nullable"] = True
            if len(kinds) == 1:
                out["type"] = kinds[0]
            elif kinds:
                out["anyOf"] = [{"type": k} for k in kinds]
        elif key in ("anyOf", "oneOf") and isinstance(value, list):
            options = [as_openapi_30(v) for v in value if v != {"type": "null"}]
            if len(options) < len(value):
                out["nullable"] = True
            if len(options) == 1 and isinstance(options[0], dict):
                out.update({k: v for k, v in options[0].items() if k not in out})
            else:
                out[key] = options
        elif key == "examples" and isinstance(value, list):
            if value:
                out["example"] = as_openapi_30(value[0])
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = as_openapi_30(value)
    return out


class Documents:
    """An app's OpenAPI documents (3.1, and 3.0 for the Swagger UI), rendered on first request.

    Rendering walks the JSON schema of every model the routes name: ~0.4 s of CPU that every
    `serve` and `gateway` start paid up front, for documents most processes never serve."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self._routes = list(routes)

    @functools.cached_property
    def v31(self) -> dict[str, Any]:
        return build(self._routes)

    @functools.cached_property
    def v30(self) -> dict[str, Any]:
        converted: dict[str, Any] = as_openapi_30(self.v31)
        return converted


__all__ = ["Documents", "as_openapi_30", "build"]
