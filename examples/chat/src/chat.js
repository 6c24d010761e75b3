// A chat with an agentlog agent over AG-UI, using the official client (@ag-ui/client's HttpAgent).
// A run that needs a human (the demo's `deploy`, PermissionPlugin ask) ends with an interrupt
// outcome; the chat shows it as an approval card, and Approve / Deny resume the run with an AG-UI
// `resume` entry (`{interruptId, status: "resolved", payload: {approved}}`) in a new request.
import { HttpAgent } from "@ag-ui/client";

const params = new URLSearchParams(location.search);
const API = (params.get("api") || "http://127.0.0.1:8480").replace(/\/$/, "");
const AGENT = params.get("agent") || "deployer";
const TOKEN = params.get("token");  // only when the server sets AGENTLOG_TOKENS

const $ = (sel) => document.querySelector(sel);
const uid = (p) => `${p}-${crypto.randomUUID()}`;

const agent = new HttpAgent({
  url: `${API}/v1/ag-ui/agents/${encodeURIComponent(AGENT)}/runs`,
  threadId: uid("chat"),
  headers: TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {},
});

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
  return node;
}

// The conversation as the client holds it (updated while text streams in), then open interrupts.
function render() {
  // the conversation's user, assistant and tool messages (an assistant message with neither text
  // nor calls, e.g. one still opening, shows nothing; other roles, e.g. reasoning, neither)
  const shown = agent.messages.filter((m) => m.role === "user" || m.role === "tool" ||
    (m.role === "assistant" && (m.content || (m.toolCalls || []).length)));
  const items = shown.map((m) => {
    if (m.role === "tool") return el("li", { class: "tool", "data-role": "tool" }, el("b", {}, "tool "), String(m.content));
    const calls = (m.toolCalls || []).map((c) => el("div", { class: "call" }, `calls ${c.function.name}(${c.function.arguments})`));
    return el("li", { class: m.role, "data-role": m.role }, el("b", {}, m.role === "user" ? "you " : `${AGENT} `),
              typeof m.content === "string" ? m.content : "", calls);
  });
  const cards = agent.pendingInterrupts.map((i) => el("li", { class: "approval", "data-interrupt": i.id },
    el("div", {}, el("b", {}, "approval needed "), i.message || i.reason),
    el("div", { class: "buttons" },
      el("button", { class: "approve", type: "button", onclick: () => decide(i, true) }, "Approve"),
      el("button", { class: "deny", type: "button", onclick: () => decide(i, false) }, "Deny"))));
  $("#log").replaceChildren(...items, ...cards);
  $("#log").lastElementChild?.scrollIntoView({ block: "end" });
}

agent.subscribe({ onMessagesChanged: render });

async function run(input) {
  $("#status").textContent = "working…";
  for (const b of document.querySelectorAll("button")) b.disabled = true;
  try {
    await agent.runAgent({ runId: uid("run"), ...input });
    $("#status").textContent = agent.pendingInterrupts.length ? "waiting for your approval" : "done";
  } catch (err) {
    $("#status").textContent = `error: ${err.message || err}`;
  } finally {
    for (const b of document.querySelectorAll("button")) b.disabled = false;
    render();
  }
}

// Answer every open interrupt in one resume (the server wants all of them answered at once):
// this one as chosen, any other the same way.
function decide(interrupt, approved) {
  const resume = agent.pendingInterrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: { approved } }));
  return run({ resume });
}

$("#composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("#prompt").value.trim();
  if (!text) return;
  $("#prompt").value = "";
  agent.addMessage({ id: uid("msg"), role: "user", content: text });
  render();
  run({});
});
$("#agent").textContent = `${AGENT} at ${API}`;
