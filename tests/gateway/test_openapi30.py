"""The OpenAPI 3.0 rendition `/docs` (Swagger UI, which reads 3.0 only) is built from: the same
operations as the 3.1 `/openapi.json`, in 3.0 terms (no type lists, `nullable` instead of null
types, no `const`, one `example` instead of a list of `examples`)."""

from __future__ import annotations

from typing import Any

from agentlog.gateway.http.app import route_table
from agentlog.gateway.http.openapi import as_openapi_30, build


def _walk(node: Any) -> Any:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def test_the_30_rendition_has_every_operation_in_30_terms() -> None:
    spec = build(route_table())
    old = as_openapi_30(spec)
    assert old["openapi"] == "3.0.3" and spec["openapi"] == "3.1.0"  # the exact document is untouched
    assert {p: set(m) for p, m in old["paths"].items()} == {p: set(m) for p, m in spec["paths"].items()}
    assert "/v1/ops/queue" in old["paths"]
    for node in _walk(old):
        assert not isinstance(node.get("type"), list), node
        assert node.get("type") != "null" and "const" not in node, node
        assert not isinstance(node.get("examples"), list), node
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert key not in node or isinstance(node[key], bool), node


def test_nullable_and_examples_are_translated() -> None:
    schema = {"openapi": "3.1.0", "components": {"schemas": {"X": {"type": "object", "properties": {
        "a": {"type": ["string", "null"], "examples": ["x"]},
        "b": {"anyOf": [{"$ref": "#/components/schemas/Y"}, {"type": "null"}]},
        "c": {"const": "k"}, "d": {"type": "integer", "exclusiveMinimum": 0}}}}}}
    props = as_openapi_30(schema)["components"]["schemas"]["X"]["properties"]
    assert props["a"] == {"type": "string", "nullable": True, "example": "x"}
    assert props["b"] == {"$ref": "#/components/schemas/Y", "nullable": True}
    assert props["c"] == {"enum": ["k"]}
    assert props["d"] == {"type": "integer", "minimum": 0, "exclusiveMinimum": True}
