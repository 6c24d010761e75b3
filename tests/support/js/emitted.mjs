// The official AG-UI client (`HttpAgent`) on one run whose tool emits CUSTOM, RAW and ACTIVITY
// events (tests/apps/protocol_app.py scenario "emit"), run by tests/gateway/test_agui_emitted.py.
// Usage: node emitted.mjs BASE AGENT THREAD. Prints one JSON line: {events: [...], messages: [...]}:
// what the client's subscriber saw (type, and the fields each kind carries), in order, and the
// client's messages afterwards (activity messages included).
import { HttpAgent } from "@ag-ui/client";

const [base, agentId, threadId] = process.argv.slice(2);
if (!base || !base.startsWith("http://127.0.0.1:")) throw new Error(`loopback base URL required, got ${base}`);

const a = new HttpAgent({ url: `${base}/v1/ag-ui/agents/${agentId}/runs`, threadId });
a.addMessage({ id: `u-${threadId}`, role: "user", content: "emit: please" });
const events = [];
const keep = (event) => {
  const { type, name, value, event: raw, source, messageId, activityType, content, patch } = event;
  events.push({ type, name, value, event: raw, source, messageId, activityType, content, patch });
};
await a.runAgent({ runId: `r-${threadId}` }, {
  onCustomEvent: ({ event }) => keep(event),
  onRawEvent: ({ event }) => keep(event),
  onActivitySnapshotEvent: ({ event }) => keep(event),
  onActivityDeltaEvent: ({ event }) => keep(event),
  onToolCallResultEvent: ({ event }) => keep(event),
  onRunFinishedEvent: ({ event }) => keep(event),
});
console.log(JSON.stringify({ events, messages: a.messages }));
