"""The run inspector page (`/ui`) and the interactive API docs (`/docs`): static files shipped in
the package (`src/agentlog/gateway/http/ui/static`, package data), plain HTML + JS + CSS, no build step, no CDN.
The API docs are Swagger UI, from the files the `swagger-ui-bundle` package ships (a dependency):
served from that package's directory, so the docs work offline and update with the package.

Both pages only call the HTTP API (`/v1/...`, `/openapi.json`) with the bearer token the user types
(kept in sessionStorage), so they need no auth of their own and see exactly what the token may see.
Every file is its own fixed route (no path parameter, so no path can reach outside the directory),
in the route table like any other route (so `/openapi.json` lists them too), and is served with a
Content-Security-Policy of `'self'` only: the page cannot load or send anything elsewhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

from agentlog.gateway.http.routing import Route

STATIC = Path(__file__).parent / "static"
#: Swagger UI's own assets (the `swagger-ui-bundle` package); only these two files are served.
SWAGGER_UI = Path(str(swagger_ui_path))
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
_HEADERS = {
    "Content-Security-Policy":
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}
#: URL path -> (file in `STATIC`, or a path elsewhere, what it is).
_PAGES: dict[str, tuple[str | Path, str]] = {
    "/ui": ("index.html",
            "Run inspector: threads, runs, timeline with state diffs, approvals, live follow, verify"),
    "/docs": ("docs.html", "Interactive API docs: Swagger UI over /openapi-3.0.json"),
    "/docs/swagger-ui.css": (SWAGGER_UI / "swagger-ui.css", "Swagger UI stylesheet (swagger-ui-bundle)"),
    "/docs/swagger-ui-bundle.js": (SWAGGER_UI / "swagger-ui-bundle.js", "Swagger UI script (swagger-ui-bundle)"),
    "/ui/common.js": ("common.js", "Script both pages share (token, DOM builder)"),
    "/ui/app.js": ("app.js", "Run inspector script"),
    "/ui/diff.js": ("diff.js", "Run inspector script: branches and their diff"),
    "/ui/docs.js": ("docs.js", "API docs script (starts Swagger UI)"),
    "/ui/style.css": ("style.css", "Stylesheet of both pages"),
}


def _serve(name: str | Path) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    path = STATIC / name

    async def handler(_request: web.Request) -> web.StreamResponse:
        return web.FileResponse(path, headers={**_HEADERS, "Content-Type": _TYPES[path.suffix]})

    return handler


ROUTES: list[Route] = [
    Route("GET", url, _serve(name), summary, "ui", content_type=_TYPES[Path(name).suffix], auth=False)
    for url, (name, summary) in _PAGES.items()
]

__all__ = ["ROUTES", "STATIC"]
