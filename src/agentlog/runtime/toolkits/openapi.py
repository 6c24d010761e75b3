"""OpenAPI operations as tools: each operation of an OpenAPI 3 document (a file or a URL) is a
tool whose JSON Schema parameters come from the document, called over HTTP with aiohttp.

    OpenApiConfig(name="pets", spec="https://pets.example/openapi.json",
                  bearer_token_env="PETS_TOKEN", operations=["get*", "createPet"])
    tools = load_openapi_tools(config)        # [pets__listPets, pets__getPet, pets__createPet]

A tool is named `<name>__<operationId>` (an operation without one: `<name>__<method>_<path>`,
its characters made safe). Its arguments are the operation's path, query and header parameters
by name, and `body` for a JSON request body; they are validated against that schema before the
call. The answer is the response's JSON (else its text); a non-2xx status or a network failure is
an error result the model reads, never a crash. The status, method and URL are the result's
`details` (kept from the model). Headers: `headers` (fixed values), `headers_env` (header ->
environment variable, read at load: secrets stay out of the config file) and `bearer_token_env`
(`Authorization: Bearer <value>`). `base_url` defaults to the document's first `servers` entry,
resolved against the document's URL.

The calls are outside state: a run records each result in its `ToolCallCompleted` like any
tool's, and verified replay always answers them from the log (the tools carry `replay_from_log`:
a replay never calls the API, even with `--reexecute-tools`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin

import pydantic

from agentlog.eventlog.errors import AgentlogError
from agentlog.runtime.tools import InvalidToolArguments, Tool, ToolContext, ToolResult

#: HTTP methods an OpenAPI path item may hold operations for.
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_NAME = re.compile(r"[A-Za-z0-9-]{1,40}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
#: The most characters of an error response's body shown to the model.
ERROR_BODY_CHARS = 2000


class OpenApiError(AgentlogError):
    """The OpenAPI document cannot be read or used (the message says which and why)."""

    code = "openapi_error"


class OpenApiConfig(pydantic.BaseModel):
    """One OpenAPI document whose operations become tools."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: The `<name>` part of the tool names: letters, digits, `-`.
    name: str
    #: A path (relative: to the config file) or an http(s) URL of the document (JSON or YAML).
    spec: str
    #: Where the operations are called; default: the document's first `servers` URL.
    base_url: str | None = None
    #: Only the operations whose operationId (or generated name) matches one of these globs.
    operations: list[str] = []
    headers: dict[str, str] = {}
    #: Header -> environment variable holding its value.
    headers_env: dict[str, str] = {}
    #: Environment variable holding a bearer token (`Authorization: Bearer <token>`).
    bearer_token_env: str | None = None
    #: Seconds for the document's download and for each call.
    timeout_s: float = pydantic.Field(default=30.0, gt=0)

    @pydantic.field_validator("name")
    @classmethod
    def _name_is_token(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"OpenAPI name {v!r} must match [A-Za-z0-9-]{{1,40}}")
        return v

    def resolved_headers(self) -> dict[str, str]:
        """The fixed headers plus those read from the environment. Raises `OpenApiError` for a
        variable that is not set."""
        out = dict(self.headers)
        for header, var in self.headers_env.items():
            out[header] = self._env(var)
        if self.bearer_token_env is not None:
            out["Authorization"] = f"Bearer {self._env(self.bearer_token_env)}"
        return out

    def _env(self, var: str) -> str:
        value = os.environ.get(var)
        if not value:
            raise OpenApiError(f"OpenAPI {self.name!r}: environment variable {var} is not set")
        return value


# -- the document -----------------------------------------------------------------------------------


def read_document(source: str, base: Path | None = None, timeout_s: float = 30.0) -> tuple[dict[str, Any], str | None]:
    """The document at `source` (a path, relative to `base`, or an http(s) URL) and its URL (None
    for a file). Raises `OpenApiError`."""
    import yaml

    if source.startswith(("http://", "https://")):
        text = _run_sync(_download(source, timeout_s))
        url: str | None = source
    else:
        path = Path(source) if base is None or Path(source).is_absolute() else base / source
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise OpenApiError(f"cannot read the OpenAPI document {str(path)!r}: {exc.strerror or exc}") from None
        url = None
    try:
        doc = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise OpenApiError(f"the OpenAPI document {source!r} is neither JSON nor YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), dict):
        raise OpenApiError(f"{source!r} is not an OpenAPI document (no `paths` object)")
    if not str(doc.get("openapi", "")).startswith("3"):
        raise OpenApiError(f"{source!r}: only OpenAPI 3 documents are supported (openapi: {doc.get('openapi')!r})")
    return doc, url


async def _download(url: str, timeout_s: float) -> str:
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(url) as resp:
                if resp.status >= 400:
                    raise OpenApiError(f"GET {url} answered HTTP {resp.status}")
                return await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise OpenApiError(f"cannot download the OpenAPI document {url}: {type(exc).__name__}: {exc}") from None


def _run_sync(coro: Any) -> Any:
    """Run `coro` to its end from synchronous code, also when an event loop runs in this thread
    (config files load at start-up, from async commands too): then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box["error"] = exc

    worker = threading.Thread(target=body, name="agentlog-openapi-load", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _resolve(doc: dict[str, Any], node: Any, seen: tuple[str, ...] = ()) -> Any:
    """`node` with every local `$ref` (`#/components/...`) replaced by what it names; a ref
    that points back into itself becomes `{}` (any value) instead of recursing forever."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#/") or ref in seen:
                return {}
            target: Any = doc
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise OpenApiError(f"unresolvable $ref {ref!r} in the OpenAPI document")
                target = target[part]
            return _resolve(doc, target, (*seen, ref))
        return {k: _resolve(doc, v, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(doc, v, seen) for v in node]
    return node


# -- operations as tools ----------------------------------------------------------------------------


class _Param(pydantic.BaseModel):
    name: str
    location: str  # path | query | header


class OpenApiTool(Tool):
    """One operation. Arguments are checked against its parameters' JSON Schema."""

    def __init__(self, config: OpenApiConfig, *, name: str, description: str, method: str, path: str,
                 base_url: str, parameters: dict[str, Any], params: list[_Param], has_body: bool,
                 headers: Mapping[str, str]) -> None:
        super().__init__(name, description, _AnyArgs, _not_local, None, category=f"openapi:{config.name}")
        self.parameters = parameters
        self.is_async = True
        self.method = method.upper()
        self.path = path
        self.base_url = base_url
        self._params = params
        self._has_body = has_body
        self._headers = dict(headers)
        self._timeout_s = config.timeout_s
        self.replay_from_log = True  # a remote side effect (a POST...): never sent again by replay
        import jsonschema

        self._validator = jsonschema.Draft202012Validator(parameters)

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise InvalidToolArguments(self.name, [{"loc": (), "msg": "arguments must be a JSON object"}])
        errors = [{"loc": tuple(e.absolute_path), "msg": e.message} for e in self._validator.iter_errors(arguments)]
        if errors:
            raise InvalidToolArguments(self.name, errors)
        return dict(arguments)

    def request(self, arguments: Mapping[str, Any]) -> tuple[str, dict[str, str], dict[str, str], Any]:
        """(url, query, headers, json body) of a call with these (validated) arguments."""
        path = self.path
        query: dict[str, str] = {}
        headers = dict(self._headers)
        for p in self._params:
            if p.name not in arguments:
                continue
            value = arguments[p.name]
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            if isinstance(value, bool):
                text = "true" if value else "false"
            if p.location == "path":
                path = path.replace("{" + p.name + "}", quote(text, safe=""))
            elif p.location == "query":
                query[p.name] = text
            else:
                headers[p.name] = text
        url = self.base_url.rstrip("/") + "/" + path.lstrip("/")
        return url, query, headers, arguments.get("body") if self._has_body else None

    async def invoke(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        import aiohttp

        args = self.validate(arguments)
        url, query, headers, body = self.request(args)
        details: dict[str, Any] = {"method": self.method, "url": url}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s)) as session:
                async with session.request(self.method, url, params=query, headers=headers,
                                           json=body if self._has_body and "body" in args else None) as resp:
                    details["status"] = resp.status
                    raw = await resp.read()
                    value = _decode(raw, resp.content_type)
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            return ToolResult.failure(f"{self.method} {url} failed: {type(exc).__name__}: {exc}", details=details)
        if 200 <= details["status"] < 300:
            return ToolResult.success(value, details=details)
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return ToolResult.failure(f"HTTP {details['status']}: {shown[:ERROR_BODY_CHARS]}", details=details)


def _decode(raw: bytes, content_type: str) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if content_type.endswith("json") or content_type.endswith("+json"):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


class _AnyArgs(pydantic.BaseModel):
    """Placeholder argument model: an operation's arguments are checked by its JSON Schema."""

    model_config = pydantic.ConfigDict(extra="allow")


def _not_local(**_: Any) -> None:
    raise RuntimeError("an OpenAPI tool calls its API (OpenApiTool.invoke)")


def tool_name(prefix: str, method: str, path: str, operation: Mapping[str, Any]) -> str:
    op_id = operation.get("operationId")
    local = op_id if isinstance(op_id, str) and op_id else f"{method}_{path}"
    safe = re.sub("_{2,}", "_", _UNSAFE.sub("_", local)).strip("_") or method
    return f"{prefix}__{safe}"[:128]


def _operation_schema(doc: dict[str, Any], item: Mapping[str, Any], operation: Mapping[str, Any]
                      ) -> tuple[dict[str, Any], list[_Param], bool]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    params: list[_Param] = []
    declared = [*(item.get("parameters") or []), *(operation.get("parameters") or [])]
    by_key: dict[tuple[str, str], Any] = {}
    for raw in declared:  # an operation's parameter overrides the path item's of the same name+place
        p = _resolve(doc, raw)
        if isinstance(p, dict) and isinstance(p.get("name"), str) and p.get("in") in ("path", "query", "header"):
            by_key[(p["name"], p["in"])] = p
    for (name, location), p in by_key.items():
        schema = dict(p.get("schema") or {})
        if p.get("description") and "description" not in schema:
            schema["description"] = p["description"]
        properties[name] = schema
        if p.get("required") or location == "path":
            required.append(name)
        params.append(_Param(name=name, location=location))
    has_body = False
    body = _resolve(doc, operation.get("requestBody"))
    if isinstance(body, dict):
        content = body.get("content") or {}
        media = next((content[k] for k in content if k == "application/json" or k.endswith("+json")), None)
        if isinstance(media, dict):
            has_body = True
            schema = dict(media.get("schema") or {})
            if body.get("description") and "description" not in schema:
                schema["description"] = body["description"]
            properties["body"] = schema
            if body.get("required"):
                required.append("body")
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        parameters["required"] = required
    return parameters, params, has_body


def load_openapi_tools(config: OpenApiConfig, base: Path | None = None) -> list[OpenApiTool]:
    """The tools of one document (`base`: the folder a relative `spec` path is read from).
    Raises `OpenApiError`."""
    doc, url = read_document(config.spec, base, config.timeout_s)
    headers = config.resolved_headers()
    base_url = config.base_url
    if base_url is None:
        servers = doc.get("servers") or []
        first = servers[0].get("url") if servers and isinstance(servers[0], dict) else None
        if not isinstance(first, str):
            raise OpenApiError(f"OpenAPI {config.name!r}: the document names no server: give base_url")
        base_url = urljoin(url, first) if url is not None else first
        if not base_url.startswith(("http://", "https://")):
            raise OpenApiError(f"OpenAPI {config.name!r}: server URL {first!r} is relative: give base_url")
    tools: list[OpenApiTool] = []
    for path, item in doc["paths"].items():
        if not isinstance(item, dict):
            continue
        for method in METHODS:
            operation = item.get(method)
            if not isinstance(operation, dict):
                continue
            name = tool_name(config.name, method, path, operation)
            local = name.split("__", 1)[1]
            if config.operations and not any(fnmatchcase(local, g) for g in config.operations):
                continue
            parameters, params, has_body = _operation_schema(doc, item, operation)
            summary, more = operation.get("summary") or "", operation.get("description") or ""
            description = "\n\n".join(t for t in (summary, more) if t) or f"{method.upper()} {path}"
            tools.append(OpenApiTool(config, name=name, description=description, method=method, path=path,
                                     base_url=base_url, parameters=parameters, params=params, has_body=has_body,
                                     headers=headers))
    names = [t.name for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise OpenApiError(f"OpenAPI {config.name!r}: operations with the same tool name: {', '.join(dupes)}")
    if config.operations and not tools:
        raise OpenApiError(f"OpenAPI {config.name!r}: no operation matches {config.operations}")
    return tools


def load_all(configs: Iterable[OpenApiConfig], base: Path | None = None) -> list[OpenApiTool]:
    return [t for c in configs for t in load_openapi_tools(c, base)]


__all__ = ["OpenApiConfig", "OpenApiError", "OpenApiTool", "load_all", "load_openapi_tools", "read_document",
           "tool_name"]
