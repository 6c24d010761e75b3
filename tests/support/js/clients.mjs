// Drives the official AG-UI and AI SDK v6 clients against an agentlog server (run by
// tests/gateway/test_protocol_clients.py, which starts the server and compares what this prints with the
// server's GET views). Usage: node clients.mjs http://127.0.0.1:PORT
// Prints one JSON line: {"scenarios": {name: {protocol, threadId, messages, state?, valid?}}, "errors": [...]}.
// An optional third argument runs only the scenarios whose name contains it (e.g. "reasoning").
import { HttpAgent } from "@ag-ui/client";
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
  safeValidateUIMessages,
} from "ai";

const base = process.argv[2];
const only = process.argv[3] ?? "";
if (!base || !base.startsWith("http://127.0.0.1:")) throw new Error(`loopback base URL required, got ${base}`);

// Only loopback: every request the clients make must go to the test server.
const realFetch = globalThis.fetch;
globalThis.fetch = (input, init) => {
  const url = new URL(typeof input === "string" ? input : input.url);
  if (url.hostname !== "127.0.0.1") throw new Error(`refusing to fetch ${url}`);
  return realFetch(input, init);
};

const SEQ = "sequential";
const PAR = "parallel_batch_approval";
const PICK = { name: "pick_color", description: "Let the user pick a color", parameters: { type: "object", properties: {} } };
const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 13, 10, 26, 10, 1, 2, 3, 4]).toString("base64");
const scenarios = {};
const errors = [];
let current = ""; // the scenario running (errors name it)
let counter = 0;
const uid = (p) => `${p}${++counter}${Date.now().toString(36)}`;

async function until(cond, what, ms = 20000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

// -- AG-UI ----------------------------------------------------------------------------------------

function agent(agentId, threadId) {
  return new HttpAgent({ url: `${base}/v1/ag-ui/agents/${agentId}/runs`, threadId });
}

function user(a, text) {
  a.addMessage({ id: uid("u"), role: "user", content: text });
}

function record(name, a) {
  scenarios[name] = { protocol: "ag-ui", threadId: a.threadId, messages: a.messages, state: a.state };
}

function copyAgent(a, agentId) {
  const b = agent(agentId, a.threadId);
  b.messages = structuredClone(a.messages);
  b.state = structuredClone(a.state);
  b.pendingInterrupts = structuredClone(a.pendingInterrupts);
  return b;
}

const resumeAll = (a, status, payload) =>
  a.pendingInterrupts.map((i) => ({ interruptId: i.id, status, ...(payload ? { payload } : {}) }));

const agui = {
  "agui-text": async () => {
    const a = agent(SEQ, uid("t"));
    user(a, "text: hello");
    await a.runAgent({ runId: uid("r") });
    return a;
  },
  "agui-state": async () => {
    const a = agent(SEQ, uid("t"));
    user(a, "state: add 1 and 2");
    await a.runAgent({ runId: uid("r") });
    return a;
  },
  "agui-approve": async () => {
    const a = agent(SEQ, uid("t"));
    user(a, "approval: deploy it");
    await a.runAgent({ runId: uid("r") });
    if (a.pendingInterrupts.length !== 1) throw new Error("expected one interrupt");
    await a.runAgent({ runId: uid("r"), resume: resumeAll(a, "resolved", { approved: true }) });
    return a;
  },
  "agui-deny": async () => {
    const a = agent(SEQ, uid("t"));
    user(a, "approval: deploy it");
    await a.runAgent({ runId: uid("r") });
    await a.runAgent({ runId: uid("r"), resume: resumeAll(a, "cancelled") });
    return a;
  },
  "agui-retried-resume": async () => {
    // the answer to the resume is lost: the client sends the same resume again from its old state
    const a = agent(SEQ, uid("t"));
    user(a, "state: add 1 and 2");
    await a.runAgent({ runId: uid("r") });
    user(a, "log: append x after approval");
    await a.runAgent({ runId: uid("r") });
    if (a.pendingInterrupts.length !== 1) throw new Error("expected one interrupt");
    const lost = copyAgent(a, SEQ);
    const resume = resumeAll(a, "resolved", { approved: true });
    await a.runAgent({ runId: uid("r"), resume });
    await lost.runAgent({ runId: uid("r"), resume });
    return lost;
  },
  "agui-resume-sent-twice": async () => {
    // the client saw the first answer and sends the same resume again (a retried request):
    // the replay must not hand it a second copy of what it already holds
    const a = agent(SEQ, uid("t"));
    user(a, "log: append x after approval");
    await a.runAgent({ runId: uid("r") });
    if (a.pendingInterrupts.length !== 1) throw new Error("expected one interrupt");
    const resume = resumeAll(a, "resolved", { approved: true });
    await a.runAgent({ runId: uid("r"), resume });
    await a.runAgent({ runId: uid("r"), resume });
    return a;
  },
  "agui-two-interrupts": async () => {
    const a = agent(PAR, uid("t"));
    user(a, "two: do a and b");
    await a.runAgent({ runId: uid("r") });
    if (a.pendingInterrupts.length !== 2) throw new Error(`expected two interrupts, got ${a.pendingInterrupts.length}`);
    const [x, y] = a.pendingInterrupts;
    await a.runAgent({ runId: uid("r"), resume: [
      { interruptId: x.id, status: "resolved", payload: { approved: true } },
      { interruptId: y.id, status: "cancelled" }] });
    return a;
  },
  "agui-reasoning": async () => {
    const a = agent(SEQ, uid("t"));
    user(a, "think: add 1 and 2");
    await a.runAgent({ runId: uid("r") });
    // a second turn: the client sends its reasoning messages back with the conversation
    user(a, "think: add them again");
    await a.runAgent({ runId: uid("r") });
    return a;
  },
  "agui-image": async () => {
    const a = agent(SEQ, uid("t"));
    a.addMessage({ id: uid("u"), role: "user", content: [
      { type: "text", text: "what is in this picture?" },
      { type: "image", source: { type: "data", value: PNG, mimeType: "image/png" } }] });
    await a.runAgent({ runId: uid("r") });
    return a;
  },
  "agui-frontend-tool": async () => {
    const a = agent(SEQ, uid("t"));
    user(a, "frontend: pick a color");
    const { result } = await a.runAgent({ runId: uid("r"), tools: [PICK] });
    const call = a.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === PICK.name);
    if (!call) throw new Error("no frontend tool call");
    if (a.pendingInterrupts.length) throw new Error("a frontend tool call must not be an interrupt");
    a.addMessage({ id: uid("tm"), role: "tool", toolCallId: call.id, content: JSON.stringify({ color: "blue" }) });
    await a.runAgent({ runId: uid("r"), tools: [PICK] });
    return a;
  },
};

// -- AI SDK ---------------------------------------------------------------------------------------

class State {
  constructor() { this.status = "ready"; this.error = undefined; this.messages = []; }
  pushMessage = (m) => { this.messages = this.messages.concat(m); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (i, m) => { this.messages = [...this.messages.slice(0, i), this.snapshot(m), ...this.messages.slice(i + 1)]; };
  snapshot = (t) => structuredClone(t);
}

class Chat extends AbstractChat {
  constructor(agentId, opts = {}) {
    const state = new State();
    super({
      id: uid("c"),
      state,
      transport: new DefaultChatTransport({
        api: `${base}/v1/ai-sdk/agents/${agentId}/runs`,
        prepareReconnectToStreamRequest: ({ id }) => ({ api: `${base}/v1/ai-sdk/runs/${opts.runId()}/stream` }),
      }),
      sendAutomaticallyWhen: ({ messages }) =>
        lastAssistantMessageIsCompleteWithApprovalResponses({ messages }) ||
        lastAssistantMessageIsCompleteWithToolCalls({ messages }),
      onToolCall: opts.onToolCall,
      onError: (e) => errors.push(`${current} (${agentId}): ${e.message}`),
    });
    this.store = state;
  }
  ready() { return until(() => this.status === "ready" || this.status === "error", "the chat to settle"); }
  toolParts() { return this.messages.at(-1).parts.filter((p) => p.type.startsWith("tool-")); }
}

async function recordChat(name, chat) {
  await chat.ready();
  const v = await safeValidateUIMessages({ messages: chat.messages });
  scenarios[name] = { protocol: "ai-sdk", threadId: chat.id, messages: chat.messages, valid: v.success,
                      ...(v.success ? {} : { invalid: String(v.error) }) };
}

async function approveAll(chat, approved) {
  for (const p of chat.toolParts().filter((p) => p.state === "approval-requested")) {
    await chat.addToolApprovalResponse({ id: p.approval.id, approved });
  }
  await until(() => chat.status !== "ready" || chat.toolParts().every((p) => p.state !== "approval-responded"),
              "the automatic resend");
  await chat.ready();
}

const ai = {
  "ai-text": async () => {
    const chat = new Chat(SEQ);
    await chat.sendMessage({ text: "text: hello" });
    return chat;
  },
  "ai-state": async () => {
    const chat = new Chat(SEQ);
    await chat.sendMessage({ text: "state: add 1 and 2" });
    return chat;
  },
  "ai-approve": async () => {
    const chat = new Chat(SEQ);
    await chat.sendMessage({ text: "approval: deploy it" });
    await approveAll(chat, true);
    return chat;
  },
  "ai-deny": async () => {
    const chat = new Chat(SEQ);
    await chat.sendMessage({ text: "approval: deploy it" });
    await approveAll(chat, false);
    return chat;
  },
  "ai-partial": async () => {
    const chat = new Chat(PAR);
    await chat.sendMessage({ text: "two: do a and b" });
    const [first, second] = chat.toolParts();
    // answer one: the client does not resend until all are answered, so send explicitly
    await chat.addToolApprovalResponse({ id: first.approval.id, approved: true });
    await chat.ready();
    if (chat.toolParts().some((p) => p.state === "approval-requested")) {
      await chat.sendMessage();
      await chat.ready();
    }
    await chat.addToolApprovalResponse({ id: second.approval.id, approved: false });
    await chat.ready();
    await until(() => chat.toolParts().every((p) => !p.state.startsWith("approval")), "both answers to land");
    return chat;
  },
  "ai-client-tool": async () => {
    let chat;
    chat = new Chat(SEQ, {
      onToolCall: async ({ toolCall }) => {
        if (toolCall.toolName === PICK.name) {
          chat.addToolOutput({ tool: PICK.name, toolCallId: toolCall.toolCallId, output: { color: "blue" } });
        }
      },
    });
    await chat.sendMessage({ text: "frontend: pick a color" });
    await until(() => chat.messages.at(-1).parts.some((p) => p.type === "text" && p.text.includes("Thanks")),
                "the run after the client's tool output");
    return chat;
  },
  "ai-reasoning": async () => {
    const chat = new Chat(SEQ);
    await chat.sendMessage({ text: "think: add 1 and 2" });
    return chat;
  },
  "ai-image": async () => {
    const chat = new Chat(SEQ);
    await chat.sendMessage({ text: "what is in this picture?",
                             files: [{ type: "file", mediaType: "image/png", url: `data:image/png;base64,${PNG}` }] });
    return chat;
  },
  "ai-resumed-stream": async () => {
    let chat;
    chat = new Chat(SEQ, { runId: () => chat.messages.at(-1).id });
    await chat.sendMessage({ text: "approval: deploy it" });
    await approveAll(chat, true);
    await chat.resumeStream();
    return chat;
  },
  "ai-resumed-stream-partial": async () => {
    // one of two approvals answered (the run waits for the other), then the stream resumed (a
    // reload): the replay must ask for both again, as the history shows them
    let chat;
    chat = new Chat(PAR, { runId: () => chat.messages.at(-1).id });
    await chat.sendMessage({ text: "two: do a and b" });
    const [first] = chat.toolParts();
    await chat.addToolApprovalResponse({ id: first.approval.id, approved: true });
    await chat.ready();
    await chat.sendMessage(); // the client waits for every answer: send this one now
    await chat.ready();
    await chat.resumeStream();
    await chat.ready();
    if (chat.toolParts().filter((p) => p.state === "approval-requested").length !== 2) {
      throw new Error(`expected two approval requests after the replay: ${JSON.stringify(chat.toolParts())}`);
    }
    return chat;
  },
  "ai-resumed-stream-after-a-step": async () => {
    // a tool step before the approval: the message the client holds when it resumes the stream
    let chat;
    chat = new Chat(SEQ, { runId: () => chat.messages.at(-1).id });
    await chat.sendMessage({ text: "log: append x after approval" });
    await approveAll(chat, true);
    await chat.resumeStream();
    return chat;
  },
};

for (const [name, run] of Object.entries(agui)) {
  if (!name.includes(only)) continue;
  current = name;
  try {
    record(name, await run());
  } catch (e) {
    errors.push(`${name}: ${e.stack ?? e}`);
  }
}
for (const [name, run] of Object.entries(ai)) {
  if (!name.includes(only)) continue;
  current = name;
  try {
    await recordChat(name, await run());
  } catch (e) {
    errors.push(`${name}: ${e.stack ?? e}`);
  }
}
process.stdout.write(JSON.stringify({ scenarios, errors }) + "\n");
