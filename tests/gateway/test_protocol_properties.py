"""Property tests: for generated histories (text, tool calls that succeed, fail or patch the state,
approvals that suspend, continuation runs), recorded for real on a nats-server with live deltas, fed
to the translators in the order a route sees them (and in the order where the live link outruns the
log by one commit): the output passes the in-repo verifiers AND a client-side reducer ends equal to
what the server's GET views say."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import MessageAppended, RunStarted, StepStarted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.agui import session as agui_session
from agentlog.gateway.adapters.agui import translator as agui
from agentlog.gateway.adapters.aisdk import session as aisdk_session
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.runtime import PermissionPlugin
from agentlog.runtime.models import Turn
from agentlog.runtime.models.scripted import ScriptedCall

from tests.apps.protocol_app import append_log, init_log
from tests.support.adapters import ALL_TOOLS, record
from tests.support.protocol_verify.agui import verify_agui_stream
from tests.support.protocol_verify.aisdk import verify_ui_stream
from tests.support.protocol_verify.reducers import AguiClient, AiSdkChat, normalise_agui, normalise_aisdk

TOOLS = [*ALL_TOOLS, init_log, append_log]
words = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "eps"]), min_size=1, max_size=5).map(" ".join)
calls = st.sampled_from([("add", {"a": 1, "b": 2}), ("echo", {"text": "hi"}), ("broken", {}),
                         ("init_log", {}), ("append_log", {"text": "x"})])
turn = st.tuples(st.one_of(st.just(""), words), st.lists(calls, max_size=2))
run_script = st.tuples(st.lists(turn, max_size=2), words)  # tool turns, then a final text turn
histories = st.fixed_dictionaries({
    "runs": st.lists(run_script, min_size=1, max_size=2),
    "ask": st.booleans(),        # echo needs an approval: the run suspends there
    "early": st.booleans(),      # live deltas outrun the log by one commit
})


def scripts_of(runs: list[Any]) -> list[list[Any]]:
    """Scripts per run; call ids unique on the thread (as a real model's are)."""
    out = []
    for r, (tool_turns, final) in enumerate(runs):
        script: list[Any] = []
        for t, (text, cs) in enumerate(tool_turns):
            scripted = [ScriptedCall(name, args, id=f"call_{r}_{t}_{k}") for k, (name, args) in enumerate(cs)]
            script.append(Turn.tools(*scripted, text=text) if cs else Turn.text(text or "ok"))
        out.append([*script, final])
    return out


def _arrival(items: list[Any], early: bool) -> list[Any]:
    """What a route's `RunSource` yields: with `early`, each block of live deltas jumps ahead of
    the commit before it when that commit holds a step's tool results / end (the loop flushes
    those without waiting and starts the next inference: the race seen in practice), not an
    inference result (that commit is acknowledged before the next step can start); late deltas
    are then dropped, as `RunSource` drops them."""
    if early:
        blocks: list[list[Any]] = []
        for it in items:
            kind = "live" if isinstance(it, dict) else it.position.seq
            if blocks and (blocks[-1][0] == kind):
                blocks[-1][1].append(it)
            else:
                blocks.append([kind, [it]])
        for i in range(1, len(blocks)):
            if blocks[i][0] == "live" and blocks[i - 1][0] != "live":
                prev = blocks[i - 1][1]
                if not any(type(c.event) in (StepStarted, RunStarted) for c in prev):
                    blocks[i - 1], blocks[i] = blocks[i], blocks[i - 1]
        items = [it for _, group in blocks for it in group]
    out, committed = [], 0
    for it in items:
        if isinstance(it, dict):
            if it.get("type") in ("text_delta", "tool_call_delta") and it.get("step", 0) <= committed:
                continue
        elif type(it.event) is StepStarted:
            committed = max(committed, it.event.step)
        out.append(it)
    return out


async def _check(server: EmbeddedNatsServer, history: dict[str, Any], n: int) -> None:
    store = await JetStreamEventStore.connect(server.url)
    try:
        thread = f"t{n}"
        plugins = [PermissionPlugin(ask=["echo"])] if history["ask"] else []
        agui_client: AguiClient | None = None
        chat = AiSdkChat()
        for i, turns in enumerate(scripts_of(history["runs"])):
            rec = await record(store, turns, message=f"question {i}", thread_id=thread if i else None, live=True,
                               chunk_words=1, prefix=f"r{n}x{i}x", tools=TOOLS, plugins=plugins)
            thread = rec.result.thread_id
            log = await session.load_thread(store, thread)
            items = _arrival(rec.items, history["early"])
            run_id = rec.result.run_id
            # AG-UI: the client starts from the thread as it was (its own copy), sees the run
            if agui_client is None:
                agui_client = AguiClient()
            before = copy.deepcopy(agui_client)
            events = verify_agui_stream(agui.translate(thread, run_id, items, state=rec.state_before,
                                                       messages=rec.messages_before, echo_user_messages=True))
            live_view = before.apply_all(events, snapshots=False)
            agui_client.apply_all(events)
            expected = normalise_agui(agui_session.history(log))
            assert agui_client.problems == [] and live_view.problems == []
            assert normalise_agui(agui_client.messages) == expected
            assert normalise_agui(live_view.messages) == expected
            assert agui_client.state == log.state
            # AI SDK: the client adds the user message itself, then the run's stream
            user = next(ce.event.message for ce in rec.committed
                        if type(ce.event) is MessageAppended and ce.event.message.role == "user")
            chat.messages.append({"id": user.id, "role": "user", "parts": [{"type": "text", "text": user.content}]})
            parts = verify_ui_stream(aisdk.translate(thread, run_id, items), require_end=False)
            chat.receive(parts)
            assert normalise_aisdk(chat.messages) == normalise_aisdk(aisdk_session.history(log))
            if rec.result.status == "waiting":
                break
    finally:
        await store.close()


_counter = iter(range(10**6))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories)
def test_translators_end_in_the_servers_state(nats_server: EmbeddedNatsServer, history: dict[str, Any]) -> None:
    asyncio.run(asyncio.wait_for(_check(nats_server, history, next(_counter)), 30))
