"""Digests of model requests: what `InferenceCompleted.request_digest(s)` record.

Pure (hashing only). The loop computes them as it records an inference (`agentlog.runtime.decisions`);
verified replay (`agentlog.runtime.replay`) compares a replayed request against them. They live here, below
both, so that the loop does not import replay (replay imports the runtime, which imports the loop:
that was a cycle).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from .models.base import ModelRequest

_enc = msgspec.json.Encoder(order="deterministic")


def request_digest(request: ModelRequest) -> str:
    """sha256 of the canonical JSON of a model request (model, messages incl. system prompt,
    tools, options). What `InferenceCompleted.request_digest` should hold (see module notes)."""
    return hashlib.sha256(_enc.encode(request)).hexdigest()


#: The parts of a model request `request_part_digests` digests, with the words an error uses.
REQUEST_PARTS: dict[str, str] = {
    "model": "model", "system": "system prompt (incl. plugin context)", "messages": "conversation",
    "tools": "tool list", "options": "model options",
}


def request_part_digests(request: ModelRequest) -> dict[str, str]:
    """Short (64-bit) digest of each part of a request, for `InferenceCompleted.request_digests`.
    They only *name* what changed; the full `request_digest` decides whether anything did. The
    system message is built from the agent's prompt and plugins' `AddContext`, so it is one part."""
    system = [m for m in request.messages if m.role == "system"]
    parts: dict[str, Any] = {
        "model": request.model, "system": system,
        "messages": [m for m in request.messages if m.role != "system"],
        "tools": request.tools, "options": request.options,
    }
    return {k: hashlib.sha256(_enc.encode(v)).hexdigest()[:16] for k, v in parts.items()}


def differing_parts(recorded: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """The parts (as `REQUEST_PARTS` words) whose digests differ; pure."""
    return [word for key, word in REQUEST_PARTS.items() if key in recorded and recorded[key] != actual.get(key)]


