// The official AG-UI client (`HttpAgent`) sending a run's input besides its messages: its state,
// context and forwardedProps (with model / systemPrompt / config overrides), run by
// tests/gateway/test_agui_run_input.py against the `tunable` agent of tests/apps/protocol_app.py.
// Usage: node run_input.mjs BASE THREAD PROPS_JSON. Prints one JSON line:
// {events, messages, state} after the run, or {status, payload} when the request was refused.
import { HttpAgent } from "@ag-ui/client";

const [base, threadId, propsJson] = process.argv.slice(2);
if (!base || !base.startsWith("http://127.0.0.1:")) throw new Error(`loopback base URL required, got ${base}`);
const forwardedProps = JSON.parse(propsJson);

const a = new HttpAgent({
  url: `${base}/v1/ag-ui/agents/tunable/runs`, threadId,
  initialState: { draft: "from the client", count: 1 },
});
a.addMessage({ id: `u-${threadId}`, role: "user", content: "tell me what you got" });
const events = [];
const keep = ({ event }) => {
  const { type, snapshot, delta } = event;
  events.push({ type, snapshot, delta });
};
try {
  await a.runAgent({
    runId: `r-${threadId}`,
    context: [{ description: "page", value: "/billing" }, { description: "plan", value: "pro" }],
    forwardedProps,
  }, {
    onStateSnapshotEvent: keep,
    onStateDeltaEvent: keep,
    onRunFinishedEvent: keep,
    onRunErrorEvent: keep,
  });
} catch (err) {
  console.log(JSON.stringify({ status: err.status ?? null, payload: err.payload ?? String(err) }));
  process.exit(0);
}
console.log(JSON.stringify({ events, messages: a.messages, state: a.state }));
