"""A small pet-store API with its OpenAPI 3 document, on 127.0.0.1 (a free port), for the
OpenAPI-tools tests. `/openapi.json` (JSON) and `/openapi.yaml` serve the document, whose server
URL is relative (`/api`), so a loader must resolve it against the document's URL.

    async with FakePetStore() as api:            # in the test's event loop
        api.spec_url                             # http://127.0.0.1:<port>/openapi.json
    with FakePetStore().in_thread() as api: ...  # a thread of its own, for deployed processes

Operations: `listPets` (GET /api/pets?limit&tag), `getPet` (GET /api/pets/{petId}: 404 for an
unknown id), `createPet` (POST /api/pets, JSON body; needs `Authorization: Bearer <token>`, else
401), `deletePet` (DELETE, no operationId), `petCount` (text/plain). Every request is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from aiohttp import web

TOKEN = "s3cret"

DOCUMENT: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "pets", "version": "1"},
    "servers": [{"url": "/api"}],
    "paths": {
        "/pets": {
            "get": {
                "operationId": "listPets", "summary": "List pets",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    {"name": "tag", "in": "query", "schema": {"type": "string"}, "description": "only this tag"},
                ],
                "responses": {"200": {"description": "pets"}},
            },
            "post": {
                "operationId": "createPet", "summary": "Create a pet",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/NewPet"}}}},
                "responses": {"201": {"description": "created"}},
            },
        },
        "/pets/{petId}": {
            "parameters": [{"name": "petId", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {"operationId": "getPet", "summary": "One pet", "description": "By id.",
                    "responses": {"200": {"description": "a pet"}}},
            "delete": {"summary": "Delete a pet", "responses": {"204": {"description": "gone"}}},
        },
        "/count": {"get": {"operationId": "petCount", "responses": {"200": {"description": "text"}}}},
    },
    "components": {"schemas": {"NewPet": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string"}, "tag": {"type": "string"}},
    }}},
}


class FakePetStore:
    def __init__(self) -> None:
        self.pets: dict[int, dict[str, Any]] = {1: {"id": 1, "name": "Rex", "tag": "dog"},
                                                2: {"id": 2, "name": "Tom", "tag": "cat"}}
        self.requests: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spec_url(self) -> str:
        return f"{self.url}/openapi.json"

    def _record(self, request: web.Request, body: Any = None) -> None:
        self.requests.append({"method": request.method, "path": request.path, "query": dict(request.query),
                              "authorization": request.headers.get("Authorization"), "body": body})

    async def _doc(self, request: web.Request) -> web.Response:
        if request.path.endswith(".yaml"):
            import yaml

            return web.Response(text=yaml.safe_dump(DOCUMENT), content_type="application/yaml")
        return web.json_response(DOCUMENT)

    async def _list(self, request: web.Request) -> web.Response:
        self._record(request)
        pets = [p for p in self.pets.values() if "tag" not in request.query or p["tag"] == request.query["tag"]]
        return web.json_response(pets[: int(request.query.get("limit", 100))])

    async def _get(self, request: web.Request) -> web.Response:
        self._record(request)
        pet = self.pets.get(int(request.match_info["pet_id"]))
        if pet is None:
            return web.json_response({"error": "no such pet"}, status=404)
        return web.json_response(pet)

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "unauthorized"}, status=401)
        pet = {"id": max(self.pets) + 1, **body}
        self.pets[pet["id"]] = pet
        return web.json_response(pet, status=201)

    async def _delete(self, request: web.Request) -> web.Response:
        self._record(request)
        self.pets.pop(int(request.match_info["pet_id"]), None)
        return web.Response(status=204)

    async def _count(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(text=f"{len(self.pets)} pets")

    async def start(self) -> FakePetStore:
        app = web.Application()
        app.router.add_get("/openapi.json", self._doc)
        app.router.add_get("/openapi.yaml", self._doc)
        app.router.add_get("/api/pets", self._list)
        app.router.add_post("/api/pets", self._create)
        app.router.add_get("/api/pets/{pet_id}", self._get)
        app.router.add_delete("/api/pets/{pet_id}", self._delete)
        app.router.add_get("/api/count", self._count)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakePetStore:
        return await self.start()

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[FakePetStore]:
        """Serve from a thread of its own (its own event loop) until the block ends."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def body() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=body, name="fake-petstore", daemon=True)
        thread.start()
        ready.wait(10)
        try:
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(self.close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


def document_text() -> str:
    return json.dumps(DOCUMENT)
