"""`Runtime.start` rejects a bad request before its first write.

A continuation of a waiting parent appends (the parent is closed first), so every check that can
reject the request must run before that: otherwise a request that fails still changes the log.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.runtime import RunConflict, RunNotFound

import test_hitl_support as S
from test_runtime_support import store  # noqa: F401  (fixture)

WAIT = 20.0


async def waiting_parent(store: Any) -> Any:
    rt = S.build(store, "continuation", 0)
    result = await S.start(rt, "continuation")
    assert result.status == "waiting"
    return rt


BAD_CONTINUATIONS: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("unknown agent", {"agent_id": "nobody"}, LookupError),
    ("bad message role", {"messages": [{"role": "robot", "content": "x"}]}, ValueError),
    ("bad visibility", {"messages": [{"role": "user", "content": "x", "visibility": "secret"}]}, ValueError),
    ("bad message id", {"messages": [{"role": "user", "content": "x", "id": "a.b"}]}, ValueError),
    ("bad run id", {"run_id": "a.b"}, ValueError),
    ("run id taken", {"run_id": S.RUN}, RunConflict),
    ("other thread", {"thread_id": "elsewhere"}, RunNotFound),
]


@pytest.mark.parametrize("case", BAD_CONTINUATIONS, ids=[c[0] for c in BAD_CONTINUATIONS])
async def test_a_rejected_continuation_writes_nothing(store: Any, case: Any) -> None:
    _, overrides, error = case
    async with asyncio.timeout(WAIT):
        rt = await waiting_parent(store)
        before = await store.last_seq()
        kwargs: dict[str, Any] = {"agent_id": "agent", "messages": "never mind",
                                  "parent_run_id": S.RUN, **overrides}
        agent_id = kwargs.pop("agent_id")
        messages = kwargs.pop("messages")
        with pytest.raises(error):
            await rt.start(agent_id, messages, **kwargs)
        assert await store.last_seq() == before
        assert (await rt.run_view(S.RUN)).status == "waiting"  # the parent was not closed
