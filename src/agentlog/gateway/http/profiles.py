"""Profile routes (DESIGN 5.1): `GET /v1/profiles/{id}/state`, the long-term state of one
`resource_id` (its id URL-encoded in the path), now or as of a sequence of its stream (`?at=`)."""

from __future__ import annotations

from aiohttp import web

from agentlog.eventlog.store import MAX_PROFILE_ID
from agentlog.gateway.http.errors import ApiError
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route, parse_query
from agentlog.gateway.operations.models import ProfileStateQuery
from agentlog.gateway.operations.profiles import profile_state


def profile_id_of(request: web.Request) -> str:
    profile_id = request.match_info["id"]
    if not 0 < len(profile_id) <= MAX_PROFILE_ID:
        raise ApiError(400, "invalid_profile_id", f"a profile id (a resource_id) is 1-{MAX_PROFILE_ID} characters")
    return profile_id


async def get_profile_state(request: web.Request) -> web.Response:
    q = parse_query(request, ProfileStateQuery)
    return reply(await profile_state(services(request), principal(request), profile_id_of(request), q))


ROUTES: list[Route] = [
    Route("GET", "/v1/profiles/{id}/state", get_profile_state,
          "A profile's state (typed keys of scope profile, shared by a resource_id's threads), now or as of `at`",
          "profiles", query=ProfileStateQuery,
          response={"type": "object", "properties": {
              "profile_id": {"type": "string"}, "at": {"type": ["integer", "null"]}, "version": {"type": "integer"},
              "state": {"type": "object"}, "keys": {"type": "object"}, "writes": {"type": "integer"},
              "rejected_writes": {"type": "integer"}, "created": {"type": "integer"}, "updated": {"type": "integer"},
              "history": {"type": "array", "items": {"type": "object"}}},
              "required": ["profile_id", "version", "state"]},
          errors=(404, 501)),
]

__all__ = ["ROUTES"]
