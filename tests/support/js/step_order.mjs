// Runs with a tool step and then a text step, followed by the official AG-UI client, run by
// tests/gateway/test_agui_reconnect.py. Usage: node step_order.mjs BASE AGENT THREAD_PREFIX COUNT.
// Prints one JSON line: {runs: [{threadId, events: [[type, id]...], messages}]}, the events being
// the client's TEXT_MESSAGE_START / TOOL_CALL_RESULT in the order it got them.
import { HttpAgent } from "@ag-ui/client";

const [base, agentId, prefix, count] = process.argv.slice(2);
if (!base || !base.startsWith("http://127.0.0.1:")) throw new Error(`loopback base URL required, got ${base}`);
const runs = [];
for (let i = 0; i < Number(count); i++) {
  const threadId = `${prefix}${i}`;
  const a = new HttpAgent({ url: `${base}/v1/ag-ui/agents/${agentId}/runs`, threadId });
  a.addMessage({ id: `u-${threadId}`, role: "user", content: "add: 1 and 2" });
  const events = [];
  await a.runAgent({ runId: `r-${threadId}` }, {
    onEvent: ({ event }) => {
      if (event.type === "TEXT_MESSAGE_START") events.push([event.type, event.messageId]);
      if (event.type === "TOOL_CALL_RESULT") events.push([event.type, event.toolCallId]);
    },
  });
  runs.push({ threadId, events, messages: a.messages });
}
console.log(JSON.stringify({ runs }));
