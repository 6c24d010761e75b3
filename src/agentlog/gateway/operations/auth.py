"""Bearer-token auth with optional tenant scoping.

Tokens come from config or `AGENTLOG_TOKENS` (`tok1,tok2:tenantA`): a bare token sees
everything; `token:prefix` sees only threads whose `resource_id` starts with `prefix` (and the
runs on them). Out-of-scope resources answer 404, exactly like unknown ones, so a tenant cannot
probe another's ids. With no tokens configured the API is open (local/dev use). Health, metrics
and the OpenAPI document stay open so probes and scrapers need no secret.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from agentlog.gateway.operations.errors import ApiError

TOKENS_ENV = "AGENTLOG_TOKENS"


@dataclass(frozen=True)
class Principal:
    """Who is calling. `tenant` is a resource_id prefix, or None for unrestricted access."""

    tenant: str | None = None

    def can_see(self, resource_id: str | None) -> bool:
        if self.tenant is None:
            return True
        return resource_id is not None and resource_id.startswith(self.tenant)


OPEN = Principal()


def parse_tokens(spec: str) -> dict[str, str | None]:
    """`"tok1,tok2:tenantA"` -> `{"tok1": None, "tok2": "tenantA"}`; blanks are ignored."""
    tokens: dict[str, str | None] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        token, sep, tenant = part.partition(":")
        token, tenant = token.strip(), tenant.strip()
        if not token or (sep and not tenant):
            raise ValueError(f"bad token entry {part!r}: expected 'token' or 'token:resource_prefix'")
        tokens[token] = tenant if sep else None
    return tokens


def resolve_tokens(config: str | Mapping[str, str | None] | None) -> dict[str, str | None]:
    """Explicit config wins; `None` reads `AGENTLOG_TOKENS` (unset or empty: auth off)."""
    if config is None:
        config = os.environ.get(TOKENS_ENV, "")
    return parse_tokens(config) if isinstance(config, str) else dict(config)


class Authenticator:
    def __init__(self, tokens: Mapping[str, str | None]) -> None:
        self._tokens = [(t.encode(), tenant) for t, tenant in tokens.items()]

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def authenticate(self, header: str | None) -> Principal:
        if not self._tokens:
            return OPEN
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)",
                           headers={"WWW-Authenticate": "Bearer"})
        given = token.strip().encode()
        found: Principal | None = None
        for known, tenant in self._tokens:  # compare with every token: no early exit to time
            if hmac.compare_digest(given, known):
                found = Principal(tenant)
        if found is None:
            raise ApiError(403, "forbidden", "token not accepted")
        return found


__all__ = ["Authenticator", "OPEN", "Principal", "TOKENS_ENV", "parse_tokens", "resolve_tokens"]
