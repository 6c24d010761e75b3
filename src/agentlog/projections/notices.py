"""`BatchChanges`: which threads and runs one projection batch changed, for whoever lists them live.

The projection runner tells its listeners (`ProjectionRunner.listeners`, e.g. the gateway's
`GET /v1/changes`) of each batch as it becomes visible. Only the holder of the writer lease folds
batches, so it also publishes each one as a core NATS notice (`agentlog.eventlog.subjects.
view_changes_subject`), and
every other runner of the view set hands the notices it receives to its own listeners: every
gateway's listeners hear of every batch, whichever gateway wrote it.

A notice names the batch's last seq, the end of the batch before it (`after`: a standby that did
not hear of everything up to `after` missed a notice), the view generation it was written to,
the threads it changed (with their `resource_id`, what a listener scopes by, and whether it
deleted them) and the runs (with their thread). Past `MAX_NOTICE_IDS` ids it names none and says
`reload`: a batch that big is a catch-up, and a listener then loads its lists again anyway.

Core NATS is at most once: a notice lost (a reconnect, a slow subscriber) is found by the next
one's `after`, or by the stored position moving past what was heard while the writer is idle; the
standby then tells its listeners `reload` (`ProjectionRunner`).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from agentlog.projections.views import RunView, ThreadView

#: Most thread and run ids one notice names; past it the notice says `reload` instead.
MAX_NOTICE_IDS = 2000


class ThreadChange(msgspec.Struct, frozen=True, array_like=True):
    """One changed thread as a listener needs it: who may see it, and whether it is gone."""

    resource_id: str | None = None
    deleted: bool = False


class BatchChanges(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one batch (or, with `reload`, an unknown span of batches up to `seq`) changed."""

    seq: int
    #: The seq the batch went on from (the previous batch's end); 0 when unknown.
    after: int = 0
    generation: int = 0
    threads: dict[str, ThreadChange] = msgspec.field(default_factory=dict)
    #: run id -> its thread id
    runs: dict[str, str] = msgspec.field(default_factory=dict)
    #: More changed than this names: load the lists again (at `seq`).
    reload: bool = False

    @classmethod
    def of_views(cls, seq: int, threads: Mapping[str, ThreadView], runs: Mapping[str, RunView], *,
                 after: int = 0, generation: int = 0) -> BatchChanges:
        """The changes of a batch that wrote these views (ids only past `MAX_NOTICE_IDS`: reload)."""
        if len(threads) + len(runs) > MAX_NOTICE_IDS:
            return cls(seq=seq, after=after, generation=generation, reload=True)
        return cls(seq=seq, after=after, generation=generation,
                   threads={tid: ThreadChange(t.resource_id, t.deleted) for tid, t in threads.items()},
                   runs={rid: r.thread_id for rid, r in runs.items()})


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(BatchChanges)


def encode_changes(changes: BatchChanges) -> bytes:
    return _encoder.encode(changes)


def decode_changes(data: bytes) -> BatchChanges:
    """A notice's payload; `msgspec.ValidationError`/`DecodeError` if it is not one."""
    return _decoder.decode(data)


__all__ = ["MAX_NOTICE_IDS", "BatchChanges", "ThreadChange", "decode_changes", "encode_changes"]
