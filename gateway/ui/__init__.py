"""The run inspector page (`/ui`) and the interactive API docs (`/docs`): static files shipped in
the package (`gateway/ui/static`, package data), plain HTML + JS + CSS, no build step, no CDN.

Both pages only call the HTTP API (`/v1/...`, `/openapi.json`) with the bearer token the user types
(kept in sessionStorage), so they need no auth of their own and see exactly what the token may see.
The files are served from a fixed allow-list, so no path can reach outside the directory, and with
a Content-Security-Policy of `'self'` only: the page cannot load or send anything elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}


def _files() -> dict[str, Path]:
    return {p.name: p for p in STATIC.iterdir() if p.suffix in _TYPES}


def _page(name: str) -> web.StreamResponse:
    files = _files()
    path = files.get(name)
    if path is None:
        raise web.HTTPNotFound()
    return web.FileResponse(path, headers={**_HEADERS, "Content-Type": _TYPES[path.suffix]})


async def inspector(_request: web.Request) -> web.StreamResponse:
    return _page("index.html")


async def docs(_request: web.Request) -> web.StreamResponse:
    return _page("docs.html")


async def asset(request: web.Request) -> web.StreamResponse:
    return _page(request.match_info["name"])


def install(app: web.Application) -> None:
    """Serve the pages: `/ui` (inspector), `/docs` (API explorer), their assets under `/ui/`."""
    app.router.add_get("/ui", inspector)
    app.router.add_get("/ui/", inspector)
    app.router.add_get("/docs", docs)
    app.router.add_get("/ui/{name}", asset)


__all__ = ["STATIC", "install"]
