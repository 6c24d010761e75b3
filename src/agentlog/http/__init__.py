"""agentlog's HTTP API (DESIGN 5.1) on aiohttp: `create_app(store, views, runner, ...)`.

Read side and thread writes live here; the runtime's write routes plug in as extra `Route`s.
"""

from .app import create_app, route_table
from .auth import Principal, principal
from .context import SERVICES, Services, Settings, services
from .errors import ApiError
from .metrics import Metrics
from .routing import Route, parse_body, parse_query, path_id

__all__ = [
    "ApiError", "Metrics", "Principal", "Route", "SERVICES", "Services", "Settings", "create_app",
    "parse_body", "parse_query", "path_id", "principal", "route_table", "services",
]
