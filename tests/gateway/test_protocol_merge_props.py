"""Property tests of the order a route's translators see (`agentlog.gateway.adapters.source.Merge`): for
generated histories recorded for real (text, tool calls that succeed, fail or patch the state,
approvals that suspend, continuation runs, live deltas), and for generated ARRIVAL orders of the
same commits and deltas (the live link ahead of the log by any amount, as on a worker; or behind
it, dropping deltas), the protocol stream does not depend on the arrival order:

* every delta arriving no later than the commit it follows (any batching of the commits around
  it): exactly the stream of the in-order arrival;
* any arrival at all: a valid stream, one start per message / tool call, and a client reducer
  that ends with the server's messages and state, with or without the final snapshot.
"""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import MessageAppended, StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.agui import session as agui_session
from agentlog.gateway.adapters.agui import translator as agui
from agentlog.gateway.adapters.aisdk import session as aisdk_session
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.gateway.adapters.source import Merge
from agentlog.runtime import PermissionPlugin

from tests.gateway.test_protocol_properties import TOOLS, histories, scripts_of
from tests.support.adapters import record
from tests.support.protocol_verify.agui import verify_agui_stream
from tests.support.protocol_verify.aisdk import verify_ui_stream
from tests.support.protocol_verify.reducers import AguiClient, AiSdkChat, normalise_agui, normalise_aisdk

#: arrival orders drawn per recorded run
ORDERS = 4
SEEDS = st.integers(0, 2**32 - 1)


def _parts(rec: Any, commits: list[StoredCommit]) -> tuple[list[dict[str, Any]], list[int]]:
    """The run's live payloads in publish order, and for each the number of `commits` up to the
    one it follows (its `seq`): where it belongs."""
    live = [it for it in rec.items if isinstance(it, dict)]
    seqs = [sc.seq for sc in commits]
    return live, [sum(s <= p.get("seq", 0) for s in seqs) for p in live]


def _arrival(commits: list[StoredCommit], live: list[dict[str, Any]], at: list[int]) -> list[Any]:
    """Commits in log order with `live[i]` arriving just before commit `at[i]` (live order kept)."""
    out: list[Any] = []
    i = 0
    for k, sc in enumerate(commits):
        while i < len(live) and at[i] <= k:
            out.append(live[i])
            i += 1
        out.append(sc)
    return out + live[i:]


def _merged(run_id: str, after: int, arrival: list[Any]) -> list[Any]:
    merge = Merge(run_id, after)
    out: list[Any] = []
    for item in arrival:
        out += merge.live(item) if isinstance(item, dict) else merge.commit(item)
    return out


def _monotone(seed: int, bounds: list[tuple[int, int]]) -> list[int]:
    """A non-decreasing position within each of `bounds`, from `seed`. Why a seed and not one draw
    per position: how many live deltas a recording has depends on timing, and hypothesis needs
    each example to draw the same shape when it is run again (else it reports the example as
    flaky instead of its failure)."""
    rng = random.Random(seed)
    out, low = [], 0
    for lo, hi in bounds:
        low = rng.randint(max(low, lo), max(low, lo, hi))
        out.append(low)
    return out


def _once(events: list[dict[str, Any]], kind: str, key: str) -> None:
    ids = [e[key] for e in events if e["type"] == kind]
    assert len(ids) == len(set(ids)), (kind, ids)


async def _check(server: EmbeddedNatsServer, history: dict[str, Any], data: Any, n: int) -> None:
    store = await JetStreamEventStore.connect(server.url)
    try:
        thread = None
        plugins = [PermissionPlugin(ask=["echo"])] if history["ask"] else []
        agui_client = AguiClient()
        chat = AiSdkChat()
        for i, turns in enumerate(scripts_of(history["runs"])):
            rec = await record(store, turns, message=f"question {i}", thread_id=thread, live=True,
                               chunk_words=1, prefix=f"m{n}x{i}x", tools=TOOLS, plugins=plugins)
            thread, run_id = rec.result.thread_id, rec.result.run_id
            log = await session.load_thread(store, thread)
            first = rec.committed[0].position.seq
            commits = [sc for sc in rec.log if sc.seq >= first]
            live, belongs = _parts(rec, commits)
            in_order = _merged(run_id, first - 1, _arrival(commits, live, belongs))

            def agui_stream(items: list[Any], rec: Any = rec, thread: str = thread, run_id: str = run_id) -> list[Any]:
                return agui.translate(thread, run_id, items, state=rec.state_before,
                                      messages=rec.messages_before, echo_user_messages=True)

            expected_agui = [e.model_dump(mode="json") for e in agui_stream(in_order)]
            expected_ui = aisdk.translate(thread, run_id, in_order)
            for _ in range(ORDERS):
                # the live link ahead of the log, by any amount: the very same stream
                early = _monotone(data.draw(SEEDS), [(0, b) for b in belongs])
                items = _merged(run_id, first - 1, _arrival(commits, live, early))
                assert [e.model_dump(mode="json") for e in agui_stream(items)] == expected_agui
                assert aisdk.translate(thread, run_id, items) == expected_ui
                # any arrival (also behind the log: late deltas dropped): still a valid stream
                # that builds the server's messages
                anywhere = _monotone(data.draw(SEEDS), [(0, len(commits))] * len(live))
                items = _merged(run_id, first - 1, _arrival(commits, live, anywhere))
                events = verify_agui_stream(agui_stream(items))
                wire = [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in events]
                _once(wire, "TEXT_MESSAGE_START", "messageId")
                _once(wire, "TOOL_CALL_START", "toolCallId")
                expected = normalise_agui(agui_session.history(log))
                live_view = copy.deepcopy(agui_client).apply_all(events, snapshots=False)
                full = copy.deepcopy(agui_client).apply_all(events)
                assert live_view.problems == [] and full.problems == []
                assert normalise_agui(live_view.messages) == expected == normalise_agui(full.messages)
                assert full.state == log.state
                parts = verify_ui_stream(aisdk.translate(thread, run_id, items), require_end=False)
                _once(parts, "tool-input-start", "toolCallId")
                other = copy.deepcopy(chat)
                other.messages.append(_user_part(rec))
                other.receive(parts)
                assert normalise_aisdk(other.messages) == normalise_aisdk(aisdk_session.history(log))
            agui_client.apply_all(verify_agui_stream(agui_stream(in_order)))
            chat.messages.append(_user_part(rec))
            chat.receive(verify_ui_stream(expected_ui, require_end=False))
            if rec.result.status == "waiting":
                break
    finally:
        await store.close()


def _user_part(rec: Any) -> dict[str, Any]:
    user = next(ce.event.message for ce in rec.committed
                if type(ce.event) is MessageAppended and ce.event.message.role == "user")
    return {"id": user.id, "role": "user", "parts": [{"type": "text", "text": user.content}]}


_counter = iter(range(10**6))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories, data=st.data())
def test_stream_does_not_depend_on_arrival_order(nats_server: EmbeddedNatsServer, history: dict[str, Any],
                                                 data: Any) -> None:
    asyncio.run(asyncio.wait_for(_check(nats_server, history, data, next(_counter)), 60))
