// Reconnecting to a live run with the official AG-UI client, run by tests/gateway/test_agui_reconnect.py.
// Usage: node reconnect.mjs BASE AGENT THREAD HOLD_DIR. One client starts a run whose tool holds
// it open (tests/apps/protocol_app.py scenario "hold") and drops the connection once the tool call
// starts; a second client with the first one's messages reconnects (`connectAgent`, our
// `connect()` on POST .../connect) and releases the hold once it has the snapshots. Prints one
// JSON line: {before, after, events}: the messages before and after, the reconnect's event types.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { HttpAgent, enforceOutgoingInput, runHttpRequest, transformHttpEventStream } from "@ag-ui/client";

const [base, agentId, threadId, holdDir] = process.argv.slice(2);
if (!base || !base.startsWith("http://127.0.0.1:")) throw new Error(`loopback base URL required, got ${base}`);
const runs = `${base}/v1/ag-ui/agents/${agentId}/runs`;

class Reconnecting extends HttpAgent {
  // The documented extension point: `connectAgent()` streams what `connect()` returns.
  connect(input) {
    const url = this.url.replace(/\/runs$/, "/connect");
    return transformHttpEventStream(
      runHttpRequest(() => this.fetch(url, this.requestInit(enforceOutgoingInput(input)))), this.debugLogger);
  }
}

const a = new HttpAgent({ url: runs, threadId });
a.addMessage({ id: `u-${threadId}`, role: "user", content: "hold: on" });
let holding;
const started = new Promise((resolve) => { holding = resolve; });
const first = a.runAgent({ runId: `r-${threadId}` }, {
  onToolCallStartEvent: ({ event }) => { if (event.toolCallName === "hold") holding(); },
}).catch((e) => ({ error: String(e) }));
await started;
a.abortRun();
await first;
const before = structuredClone(a.messages);

const b = new Reconnecting({ url: runs, threadId });
b.messages = structuredClone(a.messages);
b.state = structuredClone(a.state);
const events = [];
let released = false;
await b.connectAgent({}, {
  onEvent: ({ event }) => {
    events.push(event.type);
    if (event.type === "MESSAGES_SNAPSHOT" && !released) {
      released = true;
      mkdirSync(holdDir, { recursive: true });
      writeFileSync(join(holdDir, threadId), "go");
    }
  },
});
console.log(JSON.stringify({ before, after: b.messages, events }));
