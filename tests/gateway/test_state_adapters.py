"""Typed state in the protocol streams (pure translators): AG-UI clients get JSON Patch they can
apply (a typed write's key as its new value, a cleanup as removals), whatever ops the log holds
(increments, lattice joins); AI SDK clients get the write as a data part."""

from __future__ import annotations

import jsonpatch
from ag_ui import core as ag

from agentlog.eventlog.events import RunFinished, RunStarted, StateCleared, StateWritten, Termination
from agentlog.gateway.adapters.agui.translator import translate
from agentlog.gateway.adapters.aisdk.translator import translate as translate_aisdk

WRITES = [
    RunStarted(run_id="r1", agent_id="a"),
    StateWritten(key="hits", ops=[{"op": "increment", "path": "/hits", "value": 2}], merge="commutative"),
    StateWritten(key="tags", ops=[{"op": "lattice", "path": "/tags", "kind": "g_set", "value": ["b", "a"]}],
                 merge="lattice"),
    StateWritten(key="hits", ops=[{"op": "increment", "path": "/hits", "value": 1}], merge="commutative"),
    StateWritten(key="scratch", ops=[{"op": "set", "path": "/scratch", "value": 1}], scope="run"),
    StateCleared(scope="thread", keys=["tags"]),
    RunFinished(termination=Termination(type="natural_end")),
]


def test_state_key_writes_reach_agui_clients_as_json_patch() -> None:
    events = translate("t1", "r1", WRITES, state={"kept": True})
    assert events[1].type == ag.EventType.STATE_SNAPSHOT
    state = events[1].snapshot
    deltas = [e for e in events if e.type == ag.EventType.STATE_DELTA]
    seen = []
    for d in deltas:  # each delta is plain RFC 6902, applied as a client does
        state = jsonpatch.apply_patch(state, [op.model_dump(by_alias=True, exclude_none=True) for op in d.delta])
        seen.append(dict(state))
    assert seen == [{"kept": True, "hits": 2}, {"kept": True, "hits": 2, "tags": ["a", "b"]},
                    {"kept": True, "hits": 3, "tags": ["a", "b"]}, {"kept": True, "hits": 3}]


def test_state_key_writes_reach_ai_sdk_clients_as_data_parts() -> None:
    parts = translate_aisdk("t1", "r1", WRITES)
    data = [p for p in parts if p["type"].startswith("data-state")]
    assert [p["type"] for p in data] == ["data-state-written"] * 3 + ["data-state-cleared"]
    assert data[0]["data"] == {"key": "hits", "ops": [{"op": "increment", "path": "/hits", "value": 2}]}
    assert data[-1]["data"] == {"keys": ["tags"]} and all(p["transient"] for p in data)
