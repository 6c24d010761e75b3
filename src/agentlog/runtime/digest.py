"""Digests of model requests (what `InferenceCompleted.request_digest(s)` record) and of an app
(what `RunStarted.app.digest` records: `app_digest`).

Pure (hashing only). The loop computes them as it records an inference (`agentlog.runtime.loop.decisions`);
verified replay (`agentlog.runtime.replay.verify`) compares a replayed request against them. They live here, below
both, so that the loop does not import replay (replay imports the runtime, which imports the loop:
that was a cycle).
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict
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
    """(`request_digest`, `request_part_digests`), hashing only what is new in the conversation.

    The canonical JSON of the request is `{"model":..,"messages":[m1,m2,..],"tools":..,...}`
    and that of the conversation part `[m_k,..]` (the messages after the system ones). Both are
    hashed as streams: the bytes before the messages, then each message's encoding (a list's
    JSON is its items' joined by commas), then the bytes after. A long run asks with the same
    conversation plus a few messages each time, so the hashes of its earlier messages are
    taken from `_CONVERSATIONS` (`_Hashed`) and only the rest is encoded and hashed. Same bytes,
    same digests as encoding each whole (`_digests_plain`, what a conversation whose system
    messages are not all first still takes)."""
    global _last
    last = _last
    messages = request.messages
    if (last is not None and last[0] is request and last[1] == messages and last[2] == request.tools
            and last[3] == request.options):
        return last[4], last[5]
    n = 0
    while n < len(messages) and messages[n].role == "system":
        n += 1
    rest = messages[n:]
    if any(m.role == "system" for m in rest):
        full, parts = _digests_plain(request)
    else:
        system = _enc.encode(messages[:n])
        shell = _enc.encode(msgspec.structs.replace(request, messages=[]))
        # the first occurrence is the key: only the model name comes before it, and a string's
        # quotes are escaped
        at = shell.index(_MESSAGES_KEY) + len(_MESSAGES_KEY) - 1
        head = shell[:at] + system[1:-1]
        hashed = _Hashed.of(head, bool(n), rest)
        whole, conversation = hashed.whole.copy(), hashed.conversation.copy()
        whole.update(memoryview(shell)[at:])
        conversation.update(b"]")
        full = whole.hexdigest()
        parts = {
            "model": _short(_enc.encode(request.model)), "system": _short(system),
            "messages": conversation.hexdigest()[:16],
            "tools": _short(_enc.encode(request.tools)), "options": _short(_enc.encode(request.options)),
        }
    _last = (request, list(messages), list(request.tools), dict(request.options), full, parts)
    return full, parts


class _Hashed:
    """The two hashes of a conversation part as far as its messages go: `whole` (the request's
    bytes up to the end of the last message: `head`, then the messages) and `conversation`
    (`[` and the messages), each without its closing bytes; with copies of both every
    `_CHECKPOINT` messages, so a conversation that shares only some first messages with it
    goes on from the last checkpoint before they differ.

    The messages are kept (so their ids stay theirs) and matched by identity: a resumed run's
    earlier messages are the very objects of the process's snapshot chunks
    (`agentlog.runtime.snapshots.format.ChunkCache`); equal but other objects are hashed again."""

    __slots__ = ("checkpoints", "conversation", "messages", "separated", "size", "whole")

    def __init__(self, head: bytes, separated: bool) -> None:
        #: whether the first message follows a system message (a comma before it in `whole`)
        self.separated = separated
        self.messages: list[Any] = []
        self.whole = hashlib.sha256(head)
        self.conversation = hashlib.sha256(b"[")
        #: bytes of the messages hashed (what `_CONVERSATIONS` bounds: it keeps them alive)
        self.size = 0
        #: (whole, conversation, size) after every `_CHECKPOINT` messages, from 0 on
        self.checkpoints: list[tuple[Any, Any, int]] = [(self.whole.copy(), self.conversation.copy(), 0)]

    @classmethod
    def of(cls, head: bytes, separated: bool, messages: list[Any]) -> _Hashed:
        """Hashes of `messages` after `head`: from the cached ones with the same head and first
        message if any (the longest run of the same messages, back to its checkpoint), else
        from the start; kept in `_CONVERSATIONS` for the next request."""
        global _conversations_size
        key = (head, id(messages[0])) if messages else None
        hashed = _CONVERSATIONS.pop(key, None) if key is not None else None
        if hashed is not None:
            _conversations_size -= hashed.size
        if hashed is None or hashed.separated != separated:
            hashed = cls(head, separated)
        else:
            same = list(map(operator.is_, messages, hashed.messages))
            kept = same.index(False) if False in same else len(same)
            hashed._truncate(kept)
        hashed._extend(messages[len(hashed.messages):])
        if key is not None:
            _CONVERSATIONS[key] = hashed
            _conversations_size += hashed.size
            while _conversations_size > _CONVERSATIONS_BYTES and _CONVERSATIONS:
                _conversations_size -= _CONVERSATIONS.popitem(last=False)[1].size
        return hashed

    def _truncate(self, kept: int) -> None:
        """Back to the last checkpoint at or before `kept` messages."""
        if kept == len(self.messages):
            return
        mark = kept // _CHECKPOINT
        del self.checkpoints[mark + 1:]
        del self.messages[mark * _CHECKPOINT:]
        whole, conversation, self.size = self.checkpoints[mark]
        self.whole, self.conversation = whole.copy(), conversation.copy()

    def _extend(self, messages: list[Any]) -> None:
        for message in messages:
            data = _enc.encode(message)
            first = not self.messages
            self.whole.update(b"," + data if self.separated or not first else data)
            self.conversation.update(data if first else b"," + data)
            self.messages.append(message)
            self.size += len(data)
            if len(self.messages) % _CHECKPOINT == 0:
                self.checkpoints.append((self.whole.copy(), self.conversation.copy(), self.size))


#: Messages between two checkpoints of a `_Hashed` (a resumed run's messages past its snapshot's
#: last chunk are new objects: chunks are multiples of 16 messages, so this many at most are
#: hashed again).
_CHECKPOINT = 16
#: Bytes of messages the kept conversations may hold alive; least recently asked dropped first.
_CONVERSATIONS_BYTES = 32 * 1024 * 1024
#: The conversations of the requests last digested, by their head and the identity of their
#: first message (which the entry keeps alive, so the id is its own).
_CONVERSATIONS: OrderedDict[tuple[bytes, int], _Hashed] = OrderedDict()
_conversations_size = 0


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
