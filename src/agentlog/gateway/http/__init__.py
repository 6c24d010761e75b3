"""agentlog's HTTP API (DESIGN 5.1) on aiohttp: `create_app(store, views, runner, ...)`.

Read side and thread writes live here; the runtime's write routes plug in as extra `Route`s.
"""

from agentlog.gateway.http.app import create_app, route_table
from agentlog.gateway.http.errors import ApiError
from agentlog.gateway.http.requests import SERVICES, principal, services
from agentlog.gateway.http.routing import Route, parse_body, parse_query, path_id
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.metrics import Metrics
from agentlog.gateway.operations.services import Services, Settings

__all__ = [
    "ApiError", "Metrics", "Principal", "Route", "SERVICES", "Services", "Settings", "create_app",
    "parse_body", "parse_query", "path_id", "principal", "route_table", "services",
]
