"""The gateway's own address in what it publishes (A2A agent cards): never the request's `Host`.

A URL a server builds from the `Host` header is whatever the caller sent: a spoofed card would
send the next client (or a cache in between) to another host with its token. So the base is the
operator's `AGENTLOG_PUBLIC_URL` (`--public-url`) when set (behind a proxy, or bound to 0.0.0.0),
else the local address of the socket the request arrived on: the address this server listens on,
which no header changes.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web

from agentlog.eventlog.errors import AgentlogError

#: The environment variable `--public-url` reads.
PUBLIC_URL_ENV = "AGENTLOG_PUBLIC_URL"


class InvalidPublicUrl(AgentlogError, ValueError):
    """`--public-url` / `AGENTLOG_PUBLIC_URL` is not an absolute http(s) URL without query or fragment."""

    code = "invalid_public_url"
    usage_error = True  # a bad option value: exit 2, like any usage error


def public_base_url(value: str | None) -> str | None:
    """`value` checked and without its trailing slash (None or blank: None, use the listen address)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise InvalidPublicUrl(f"{PUBLIC_URL_ENV} / --public-url: {exc}: {text!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
            or parts.username is not None:
        raise InvalidPublicUrl(f"{PUBLIC_URL_ENV} / --public-url must be http(s)://host[:port][/prefix], "
                               f"not {text!r}")
    return text.rstrip("/")


def listen_base_url(request: web.Request) -> str:
    """`scheme://host:port` of the socket `request` arrived on (this server's listen address)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not isinstance(sockname, tuple) or len(sockname) < 2:  # a unix socket: only this host reaches it
        return f"{request.scheme}://localhost"
    host, port = str(sockname[0]), int(sockname[1])
    shown = f"[{host}]" if ":" in host else host
    return f"{request.scheme}://{shown}:{port}"


__all__ = ["PUBLIC_URL_ENV", "InvalidPublicUrl", "listen_base_url", "public_base_url"]
