"""Digests of model requests (what `InferenceCompleted.request_digest(s)` record) and of an app
(what `RunStarted.app.digest` records: `app_digest`).

Pure (hashing only). The loop computes them as it records an inference (`agentlog.runtime.loop.decisions`);
verified replay (`agentlog.runtime.replay.verify`) compares a replayed request against them. They live here, below
both, so that the loop does not import replay (replay imports the runtime, which imports the loop:
that was a cycle).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from agentlog.runtime.models.base import ModelRequest

_enc = msgspec.json.Encoder(order="deterministic")


def request_digest(request: ModelRequest) -> str:
    """sha256 of the canonical JSON of a model request (model, messages incl. system prompt,
    tools, options). What `InferenceCompleted.request_digest` should hold (see module notes)."""
    return _digests(request)[0]


#: The parts of a model request `request_part_digests` digests, with the words an error uses.
REQUEST_PARTS: dict[str, str] = {
    "model": "model", "system": "system prompt (incl. plugin context)", "messages": "conversation",
    "tools": "tool list", "options": "model options",
}


def request_part_digests(request: ModelRequest) -> dict[str, str]:
    """Short (64-bit) digest of each part of a request, for `InferenceCompleted.request_digests`.
    They only *name* what changed; the full `request_digest` decides whether anything did. The
    system message is built from the agent's prompt and plugins' `AddContext`, so it is one part."""
    return dict(_digests(request)[1])


#: The last request digested and its digests: the loop asks for both kinds of one request in a row,
#: and they share the encoding of the conversation (the bulk of a long run's request). Reused only
#: for the very same request whose conversation, tools and options are still equal (the lists
#: are compared element by element, which is by identity first: cheap).
_last: tuple[ModelRequest, list[Any], list[Any], dict[str, Any], str, dict[str, str]] | None = None
_MESSAGES_KEY = b'"messages":[]'


def _digests(request: ModelRequest) -> tuple[str, dict[str, str]]:
    """(`request_digest`, `request_part_digests`) from one encoding of the conversation.

    The canonical JSON of the request is `{"model":..,"messages":[m1,m2,..],"tools":..,...}`
    and that of the conversation part `[m_k,..]` (the messages after the system ones): both are
    hashed from the same encoded messages, spliced into the encoding of the request without
    them, instead of encoding the whole conversation twice. Same bytes, same digests as encoding
    each whole (`_digests_plain`, what a conversation whose system messages are not all first
    still takes)."""
    global _last
    last = _last
    messages = request.messages
    if (last is not None and last[0] is request and last[1] == messages and last[2] == request.tools
            and last[3] == request.options):
        return last[4], last[5]
    n = 0
    while n < len(messages) and messages[n].role == "system":
        n += 1
    if any(m.role == "system" for m in messages[n:]):
        full, parts = _digests_plain(request)
    else:
        system, rest = _enc.encode(messages[:n]), _enc.encode(messages[n:])
        shell = _enc.encode(msgspec.structs.replace(request, messages=[]))
        # the first occurrence is the key: only the model name comes before it, and a string's
        # quotes are escaped
        at = shell.index(_MESSAGES_KEY) + len(_MESSAGES_KEY) - 1
        h = hashlib.sha256(memoryview(shell)[:at])
        h.update(memoryview(system)[1:-1])
        if n and len(messages) > n:
            h.update(b",")
        h.update(memoryview(rest)[1:-1])
        h.update(memoryview(shell)[at:])
        full = h.hexdigest()
        parts = {
            "model": _short(_enc.encode(request.model)), "system": _short(system), "messages": _short(rest),
            "tools": _short(_enc.encode(request.tools)), "options": _short(_enc.encode(request.options)),
        }
    _last = (request, list(messages), list(request.tools), dict(request.options), full, parts)
    return full, parts


def _short(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _digests_plain(request: ModelRequest) -> tuple[str, dict[str, str]]:
    """The digests by their definition: the request encoded whole, each part encoded whole."""
    system = [m for m in request.messages if m.role == "system"]
    parts: dict[str, Any] = {
        "model": request.model, "system": system,
        "messages": [m for m in request.messages if m.role != "system"],
        "tools": request.tools, "options": request.options,
    }
    return hashlib.sha256(_enc.encode(request)).hexdigest(), {k: _short(_enc.encode(v)) for k, v in parts.items()}


def differing_parts(recorded: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """The parts (as `REQUEST_PARTS` words) whose digests differ; pure."""
    return [word for key, word in REQUEST_PARTS.items() if key in recorded and recorded[key] != actual.get(key)]




def app_digest(agents: Iterable[Any], tools: Iterable[Any]) -> str:
    """Short (64-bit) digest of an app: its agents' specs and its tools' names, descriptions and
    parameter schemas. Two processes serving the same app code get the same digest; a changed
    prompt, agent or tool changes it. A spec field that is an object (a `Model` instance, a
    plugin) counts by its type name: the digest says which app, not which instance."""
    agent_docs = sorted((a.model_dump(mode="python") for a in agents), key=lambda d: str(d.get("id")))
    tool_docs = sorted(({"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools),
                       key=lambda d: str(d["name"]))
    return _short(_app_enc.encode({"agents": agent_docs, "tools": tool_docs}))


def _by_type(obj: Any) -> Any:
    return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


_app_enc = msgspec.json.Encoder(order="deterministic", enc_hook=_by_type)
