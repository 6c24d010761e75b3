// agentlog run inspector: plain JS over the HTTP API, no build step, no dependencies.
// Everything shown comes from /v1 (the token the user typed is sent as Bearer); nothing is cached
// beyond the current selection, so a reload always shows what the log says now.
"use strict";

const S = { thread: null, run: null, follow: null, selected: null, refreshTimer: null };

const json = (v) => JSON.stringify(v, null, 2);

class ApiError extends Error {
  constructor(status, body) {
    super(`${status} ${body && body.code ? body.code + ": " : ""}${body && body.error ? body.error : ""}`);
    this.status = status; this.body = body;
  }
}

async function api(method, path, body) {
  const init = { method, headers: authHeaders(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_e) { data = { error: text }; }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

function showError(err) {
  const box = $("#error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false;
  box.textContent = err.status === 401 || err.status === 403
    ? `${err.message} — type a token above` : String(err.message || err);
}

async function guarded(fn) {
  try { showError(null); return await fn(); } catch (err) { showError(err); return undefined; }
}

const enc = encodeURIComponent;
// a recorded cost (the views' `cost`, USD; null while nothing was priced)
const usd = (cost) => (cost === null || cost === undefined ? "" : ` · $${cost.toFixed(6)}`);

// -- lists -----------------------------------------------------------------------------------------

async function loadThreads() {
  // listings ascend by id (creation order): the newest 200 are the last page
  const { total } = await api("GET", "/v1/threads?limit=1");
  const data = await api("GET", `/v1/threads?limit=200&offset=${Math.max(0, total - 200)}`);
  const ul = $("#threads");
  ul.replaceChildren(...data.threads.slice().reverse().map((t) => el("li", {},
    el("button", { class: t.thread_id === S.thread ? "sel" : "", "data-thread": t.thread_id,
                   onclick: () => guarded(() => selectThread(t.thread_id)) },
      el("code", {}, t.thread_id),
      el("span", { class: "sub" }, `${t.run_ids.length} run(s) · ${t.message_count} message(s)`,
         usd(t.cost), t.active_run_id ? " · active" : "")))));
  if (!data.threads.length) ul.replaceChildren(el("li", { class: "sub" }, "no threads yet"));
}

async function loadRuns() {
  const ul = $("#runs");
  if (!S.thread) { ul.replaceChildren(); return; }
  $("#runs-of").textContent = "of " + S.thread;
  const data = await api("GET", `/v1/runs?thread_id=${enc(S.thread)}&limit=200`);
  ul.replaceChildren(...data.runs.map((r) => el("li", {},
    el("button", { class: r.run_id === S.run ? "sel" : "", "data-run": r.run_id,
                   onclick: () => guarded(() => selectRun(r.run_id)) },
      el("code", {}, r.run_id), " ", el("span", { class: `badge ${r.status}` }, r.status),
      el("span", { class: "sub" }, `${r.agent_id || "?"} · ${r.steps} step(s)`,
         r.parent_run_id ? ` · continues ${r.parent_run_id}` : "")))));
}

async function selectThread(threadId) {
  S.thread = threadId;
  location.hash = "#/threads/" + enc(threadId);
  await Promise.all([loadThreads(), loadRuns()]);
}

// -- one run ----------------------------------------------------------------------------------------

async function selectRun(runId) {
  S.run = runId; S.selected = null;
  const run = await api("GET", `/v1/runs/${enc(runId)}`);
  S.thread = run.thread_id;
  location.hash = `#/runs/${enc(runId)}`;
  $("#empty").hidden = true; $("#run").hidden = false;
  $("#verify-result").replaceChildren();
  await Promise.all([renderRun(run), loadRuns(), loadThreads()]);
  follow(run.thread_id);
}

async function renderRun(run) {
  run = run || await api("GET", `/v1/runs/${enc(S.run)}`);
  $("#run-id").textContent = run.run_id;
  const badge = $("#run-status");
  badge.textContent = run.status; badge.className = `badge ${run.status}`;
  const term = run.termination ? ` · finished: ${run.termination.type}${run.termination.code ? " (" + run.termination.code + ")" : ""}` : "";
  $("#run-meta").replaceChildren(
    `thread `, el("code", {}, run.thread_id), ` · agent ${run.agent_id || "?"} · ${run.steps} step(s) · `,
    `tokens in ${run.usage.input_tokens} / out ${run.usage.output_tokens}${usd(run.cost)}`,
    run.model ? ` · model ${run.model}` : "", term,
    run.parent_run_id ? ` · continues ${run.parent_run_id}` : "");
  const [tl] = await Promise.all([renderTimeline(), renderMessages(run.thread_id), renderState(S.selected)]);
  renderApprovals(run, requestedCalls(tl));
}

// Tool calls as the model asked for them (name, arguments), by call id: a call suspended by the
// permission gate never started, so its view has no name or arguments yet.
function requestedCalls(tl) {
  const calls = {};
  for (const g of tl.steps) for (const e of g.events) {
    const m = e.event.message;
    if (e.type === "MessageAppended" && m.tool_calls) for (const c of m.tool_calls) calls[c.id] = c;
  }
  return calls;
}

function renderApprovals(run, requested) {
  const pending = Object.values(run.calls || {}).filter((c) => c.status === "suspended");
  $("#approvals-box").hidden = pending.length === 0;
  $("#approvals").replaceChildren(...pending.map((c) => el("li", { "data-call": c.call_id },
    el("div", {}, el("strong", {}, c.name || (requested[c.call_id] || {}).name || "tool"), " ",
       el("code", {}, JSON.stringify(c.name ? c.arguments : (requested[c.call_id] || {}).arguments || {}))),
    c.ticket && c.ticket.message ? el("div", { class: "sub" }, c.ticket.message) : null,
    el("div", { class: "actions" },
      el("button", { class: "approve", type: "button", onclick: (e) => decide(c.call_id, true, e.target) }, "Approve"),
      el("button", { class: "deny", type: "button", onclick: (e) => decide(c.call_id, false, e.target) }, "Deny"),
      el("code", { class: "sub" }, c.call_id)))));
}

async function decide(callId, approved, button) {
  button.disabled = true;
  const decision = { target_id: callId, decision_id: `ui-${callId}-${Date.now()}`, action: "resume",
                     result: { approved } };
  await guarded(async () => {
    const done = await api("POST", `/v1/runs/${enc(S.run)}/inputs`, { decisions: [decision] });
    await renderRun(await api("GET", `/v1/runs/${enc(S.run)}?min_seq=${done.seq}`));
  });
  button.disabled = false;
}

async function renderTimeline() {
  const tl = await api("GET", `/v1/runs/${enc(S.run)}/timeline`);
  const ol = $("#timeline");
  ol.replaceChildren(...tl.steps.map((g) => el("li", { class: "group" },
    el("div", { class: "label" }, g.label),
    g.events.map((e) => [
      el("button", { class: "ev" + (e.id === S.selected ? " sel" : ""), type: "button", "data-event": e.id,
                     onclick: () => guarded(() => renderState(e.id)) },
        el("span", { class: "id mono" }, e.id), el("span", { class: "type" }, e.type),
        el("span", { class: "sum mono" }, e.summary)),
      e.state_diff && e.state_diff.length ? el("pre", { class: "diff" }, e.state_diff.map(
        (op) => `${op.op} ${op.path}${"value" in op ? " = " + JSON.stringify(op.value) : ""}`).join("\n")) : null,
    ]))));
  return tl;
}

// The thread's state as of an event (time travel: a fold of the log up to it), or now.
async function renderState(eventId) {
  S.selected = eventId;
  for (const b of document.querySelectorAll(".ev")) b.classList.toggle("sel", b.dataset.event === eventId);
  const at = eventId ? `?at=${enc(eventId)}` : "";
  const data = await api("GET", `/v1/threads/${enc(S.thread)}/state${at}`);
  $("#state-at").textContent = eventId ? `as of event ${eventId}` : "now";
  $("#state").textContent = json(data.state);
}

async function renderMessages(threadId) {
  const data = await api("GET", `/v1/threads/${enc(threadId)}/messages?limit=200`);
  $("#messages").replaceChildren(...data.messages.map(({ message: m, event_id: id }) => el("li", { title: id },
    el("span", { class: "role" }, m.role + ":"), typeof m.content === "string" ? m.content : JSON.stringify(m.content),
    m.tool_calls && m.tool_calls.length ? el("div", { class: "sub mono" },
      m.tool_calls.map((c) => `→ ${c.name}(${JSON.stringify(c.arguments)})`).join(" ")) : null)));
}

async function verify() {
  const box = $("#verify-result");
  box.replaceChildren("verifying…");
  const r = await guarded(() => api("POST", `/v1/runs/${enc(S.run)}/verify`, {}));
  if (!r) { box.replaceChildren(); return; }
  box.replaceChildren(r.ok
    ? el("span", { class: "verify-ok", id: "verify-ok" },
         `✓ verified: ${r.commits_verified}/${r.commits_recorded} commits, ${r.events_verified} events replay identically (${r.status})`)
    : el("span", { class: "verify-bad", id: "verify-bad" },
         `✗ diverged at ${r.divergence.position}: ${r.divergence.message}`));
}

// -- live follow (SSE over fetch, so the bearer token can be sent) ------------------------------------

// Tails the thread from `after` (an event id; default: the end of the log as of now). When the
// stream ends or the network drops it, follows again from the last event seen (what a browser's
// EventSource does with Last-Event-ID); an API error (401, 404) stops it and is shown.
function follow(threadId, after) {
  if (S.follow && S.follow.thread === threadId && !after) return;
  if (S.follow) S.follow.abort.abort();
  const f = S.follow = { thread: threadId, abort: new AbortController(), last: after || null };
  $("#live").hidden = false;
  (async () => {
    if (!f.last) f.last = `${(await api("GET", `/v1/threads/${enc(threadId)}`)).version}:2147483647`;
    const r = await fetch(`/v1/threads/${enc(threadId)}/events?follow=true&after=${enc(f.last)}`,
                          { headers: authHeaders({ Accept: "text/event-stream" }), signal: f.abort.signal });
    if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const frame = {};
        for (const line of buf.slice(0, cut).split("\n")) {
          const at = line.indexOf(":");
          if (at > 0) frame[line.slice(0, at)] = (frame[line.slice(0, at)] || "") + line.slice(at + 1).trim();
        }
        buf = buf.slice(cut + 2);
        if (frame.event === "error") throw new Error(frame.data);  // e.g. dropped as too slow: follow again
        if (frame.id) f.last = frame.id;
        if (frame.data) onLive(JSON.parse(frame.data));
      }
    }
  })().then(() => "ended", (err) => {
    if (err.name === "AbortError") return "aborted";
    if (err instanceof ApiError) { showError(err); return "failed"; }
    return "ended";  // the network dropped the stream
  }).then((how) => {
    if (S.follow !== f) return;  // replaced by another follow meanwhile
    $("#live").hidden = true; S.follow = null;
    if (how === "ended") setTimeout(() => { if (!S.follow && S.thread === threadId) follow(threadId, f.last); }, 2000);
  });
}

function onLive(frame) {
  clearTimeout(S.refreshTimer);
  S.refreshTimer = setTimeout(() => guarded(async () => {
    if (frame.run_id === S.run) await renderRun(); else await renderMessages(S.thread);
    await Promise.all([loadRuns(), loadThreads()]);
  }), 150);
}

// -- start ------------------------------------------------------------------------------------------

function route() {
  const m = location.hash.match(/^#\/(threads|runs)\/(.+)$/);
  if (!m) return guarded(loadThreads);
  const id = decodeURIComponent(m[2]);
  return guarded(() => (m[1] === "runs" ? selectRun(id) : selectThread(id)));
}

$("#token").value = sessionStorage.getItem(TOKEN_KEY) || "";
$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  if (S.follow) { S.follow.abort.abort(); S.follow = null; }
  route();
});
$("#refresh").addEventListener("click", () => guarded(() => Promise.all([loadThreads(), loadRuns()])));
$("#verify").addEventListener("click", verify);
route();
