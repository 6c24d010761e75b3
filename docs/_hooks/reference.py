"""MkDocs hook: the reference pages, generated from the code at build time.

- `reference/http.md` from the OpenAPI document the server serves (`agentlog.gateway.http.openapi`,
  over the route table of `agentlog serve`: the read routes, the write routes and the adapters);
- `reference/cli.md` from the `agentlog` Typer app (its click command tree: every command, its
  arguments and options with their help);
- `reference/python.md`: a mkdocstrings block per name `agentlog` exports, then the client and
  the testing helpers.

Generated, not committed: a page cannot fall behind the code it describes.
"""

from __future__ import annotations

import json
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(s) for s in schema[key])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(f"`{k}`" for k in kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    return f"`{kind}`"


def _properties(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties") or {}
    if not props:
        return []
    required = set(schema.get("required", ()))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in props.items():
        rows.append(f"| `{name}` | {_cell(_type(prop))} | {'yes' if name in required else ''} | "
                    f"{_cell(prop.get('description', ''))} |")
    return rows + [""]


def http_page() -> str:
    from agentlog.gateway.adapters import routes as adapter_routes
    from agentlog.gateway.http import openapi
    from agentlog.gateway.http.app import route_table
    from agentlog.gateway.http.write import write_routes

    doc = openapi.build(route_table([*write_routes(None), *adapter_routes.ROUTES]))  # type: ignore[arg-type]
    components = doc.get("components", {}).get("schemas", {})
    out = ["# HTTP API", "",
           "Every route of `agentlog serve` (and `agentlog gateway`), generated from the OpenAPI document "
           "the server serves at `/openapi.json` (3.1; `/openapi-3.0.json` for 3.0 tools, Swagger UI at "
           "`/docs`). Errors are `{\"error\", \"code\"}` with the status; with `AGENTLOG_TOKENS` set, "
           "every `/v1` route needs `Authorization: Bearer <token>`. The A2A (`/a2a/...`) and MCP "
           "(`/v1/mcp`) endpoints are served when the app is known: see the A2A and MCP guides.", ""]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method.upper(), path, op))
    for tag, ops in by_tag.items():
        out += [f"## {tag}", ""]
        for method, path, op in ops:
            out += [f"### `{method} {path}`", "", _cell(op.get("summary", "")), ""]
            if op.get("description"):
                out += [op["description"], ""]
            params = op.get("parameters") or []
            if params:
                out += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(f"| `{p['name']}` | {p['in']} | {_cell(_type(p.get('schema', {})))} | "
                               f"{'yes' if p.get('required') else ''} | {_cell(p.get('description', ''))} |")
                out.append("")
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                name = body.get("$ref", "").rsplit("/", 1)[-1]
                resolved = components.get(name, body)
                out += [f"Request body: {_type(body)}", ""]
                out += _properties(resolved)
            responses = op.get("responses") or {}
            if responses:
                out += ["Responses: " + ", ".join(f"`{code}` {_cell(r.get('description', ''))}"
                                                  for code, r in responses.items()), ""]
    return "\n".join(out) + "\n"


def _click_section(command: Any, path: list[str], ctx: Any, out: list[str]) -> None:
    """One command's section, then its subcommands' (typer ships its own click: duck-typed)."""
    name = " ".join(path)
    if command.hidden:
        return
    out += [f"{'#' * min(len(path) + 1, 4)} `{name}`", ""]
    if command.help:
        out += [command.help.split("\f")[0].strip(), ""]
    pieces = command.collect_usage_pieces(ctx)
    out += ["```text", f"Usage: {name} {' '.join(pieces)}", "```", ""]
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if param.param_type_name == "argument":
            rows.append((f"`{(record or (param.name.upper(), ''))[0]}`", record[1] if record else getattr(param, "help", None) or ""))
        elif record is not None:
            rows.append((f"`{record[0]}`", record[1]))
    if rows:
        out += ["| argument / option | description |", "|---|---|"]
        out += [f"| {_cell(left)} | {_cell(right)} |" for left, right in rows]
        out.append("")
    if hasattr(command, "list_commands"):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None:
                sub_ctx = sub.make_context(sub_name, [], parent=ctx, resilient_parsing=True)
                _click_section(sub, [*path, sub_name], sub_ctx, out)


def cli_page() -> str:
    import typer

    from agentlog.cli.core import app

    root = typer.main.get_command(app)
    ctx = root.make_context("agentlog", [], resilient_parsing=True)
    out = ["# CLI", "", "Every command of `agentlog`, generated from its Typer app (the same text as "
           "`agentlog COMMAND --help`). How to use them: the CLI guide.", ""]
    _click_section(root, ["agentlog"], ctx, out)
    return "\n".join(out) + "\n"


def python_page() -> str:
    from agentlog import _EXPORTS

    out = ["# Python API", "",
           "The names an application imports from `agentlog` (each defined in the module named), the HTTP "
           "client `agentlog.client` and the test helpers `agentlog.testing`, from their docstrings.", "",
           "## `agentlog`", ""]
    for name, module in sorted(_EXPORTS.items(), key=lambda item: item[0].lower()):
        out += [f"::: {module}.{name}", "    options:", "      heading_level: 3", ""]
    out += ["## `agentlog.client`", "", "::: agentlog.client", "    options:", "      heading_level: 3", "",
            "## `agentlog.testing`", "", "::: agentlog.testing", "    options:", "      heading_level: 3", ""]
    return "\n".join(out)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, render in (("reference/http.md", http_page), ("reference/cli.md", cli_page),
                        ("reference/python.md", python_page)):
        files.append(File.generated(config, uri, content=render()))
    return files
