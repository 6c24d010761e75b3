// agentlog run inspector: plain JS over the HTTP API, no build step, no dependencies.
// Everything shown comes from /v1 (the token the user typed is sent as Bearer). The URL hash is
// the page's state (#/runs/ID, #/runs/ID/at/EVENT, #/threads/ID, #/ops): links can be pasted and
// Back works, because every click only changes the hash and `route()` renders what it names.
"use strict";

const S = {
  thread: null, run: null, at: null, follow: null, refreshTimer: null, opsTimer: null,
  threads: [], runs: [], firstMessages: new Map(), messages: [], changes: null,
};

// A run that has ended: `done`, or `failed` (its termination is an error).
const finished = (r) => r.status === "done" || r.status === "failed";

const json = (v) => JSON.stringify(v, null, 2);
const enc = encodeURIComponent;
// a recorded cost (the views' `cost`, USD; null while nothing was priced)
const usd = (cost) => (cost === null || cost === undefined ? "" : ` · $${cost.toFixed(6)}`);

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
    ? `${err.message} (type a token above)` : String(err.message || err);
}

async function guarded(fn) {
  try { showError(null); return await fn(); } catch (err) { showError(err); return undefined; }
}

// -- time -------------------------------------------------------------------------------------------

const pad = (n) => String(n).padStart(2, "0");

function clock(ms) {
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  const hms = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return today ? hms : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hms}`;
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3600000) return `${Math.floor(ms / 60000)}m ${pad(Math.round((ms % 60000) / 1000))}s`;
  return `${Math.floor(ms / 3600000)}h ${pad(Math.round((ms % 3600000) / 60000))}m`;
}

// How long a run took, or has been going (running / waiting: until now).
const runDuration = (r) => duration((finished(r) ? r.updated : Date.now()) - r.created);

const time = (ms) => el("time", { datetime: new Date(ms).toISOString(), title: new Date(ms).toString() }, clock(ms));

// -- navigation -------------------------------------------------------------------------------------

function go(hash) {
  if (location.hash === hash) return route();  // same place: render again (e.g. a refresh)
  location.hash = hash;  // `hashchange` renders it
  return undefined;
}

const runHash = (runId, at) => `#/runs/${enc(runId)}` + (at ? `/at/${enc(at)}` : "");

function route() {
  const h = location.hash;
  let m;
  if (h === "#/ops") return guarded(showOps);
  stopOps();
  if ((m = h.match(/^#\/runs\/([^/]+)(?:\/at\/([^/]+))?$/))) {
    return guarded(() => selectRun(decodeURIComponent(m[1]), m[2] ? decodeURIComponent(m[2]) : null));
  }
  if ((m = h.match(/^#\/threads\/([^/]+)$/))) return guarded(() => selectThread(decodeURIComponent(m[1])));
  if ((m = h.match(/^#\/diff\/([^/]+)\/([^/]+)$/))) {
    return guarded(() => showDiff(decodeURIComponent(m[1]), decodeURIComponent(m[2])));
  }
  S.thread = S.run = null;
  showMain("empty");
  return guarded(loadLists);
}

function showMain(id) {
  for (const m of ["run", "ops", "empty", "diff"]) $("#" + m).hidden = m !== id;
}

// -- lists ------------------------------------------------------------------------------------------

// The lists hold the newest LIST_SIZE threads and runs (the API lists newest first), plus, while
// the status filter is set, the newest LIST_SIZE runs of that status and their threads. Kept
// oldest first (by creation, then id, as the API orders them): the tree below reads them so.
const LIST_SIZE = 200;
const byCreation = (key) => (a, b) => a.created - b.created || (a[key] < b[key] ? -1 : a[key] > b[key] ? 1 : 0);

// `min_seq`: the lists include every commit up to it (a change the live list was told of).
async function loadLists(minSeq) {
  const seq = minSeq ? `&min_seq=${minSeq}` : "";
  const status = $("#f-status").value;
  const [threads, runs, ofStatus] = await Promise.all([
    api("GET", `/v1/threads?limit=${LIST_SIZE}${seq}`), api("GET", `/v1/runs?limit=${LIST_SIZE}${seq}`),
    status ? api("GET", `/v1/runs?status=${enc(status)}&limit=${LIST_SIZE}${seq}`) : { runs: [] }]);
  const runMap = new Map([...runs.runs, ...ofStatus.runs].map((r) => [r.run_id, r]));
  const threadMap = new Map(threads.threads.map((t) => [t.thread_id, t]));
  // the threads of the runs of that status that are older than the newest threads
  const missing = [...new Set(ofStatus.runs.map((r) => r.thread_id))].filter((id) => !threadMap.has(id));
  for (const t of await Promise.all(missing.map((id) => api("GET", `/v1/threads/${enc(id)}`).catch(() => null)))) {
    if (t && !t.deleted) threadMap.set(t.thread_id, t);
  }
  S.threads = [...threadMap.values()].sort(byCreation("thread_id"));
  S.runs = [...runMap.values()].sort(byCreation("run_id"));
  await listsChanged();
}

// After the lists changed: the agent filter's choices, the first messages, the list itself.
async function listsChanged() {
  const agents = [...new Set(S.runs.map((r) => r.agent_id).filter(Boolean))].sort();
  const select = $("#f-agent"), chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "any agent"), ...agents.map((a) => el("option", { value: a }, a)));
  select.value = agents.includes(chosen) ? chosen : "";
  // first messages never change: fetched once per thread, for the threads shown at the top
  await Promise.all(S.threads.filter((t) => !t.parent_thread_id && t.message_count && !S.firstMessages.has(t.thread_id))
    .map(async (t) => {
      const data = await api("GET", `/v1/threads/${enc(t.thread_id)}/messages?limit=1`);
      const m = data.messages[0] && data.messages[0].message;
      S.firstMessages.set(t.thread_id, m ? (typeof m.content === "string" ? m.content : JSON.stringify(m.content)) : "");
    }));
  renderLists();
}

// -- the live list ------------------------------------------------------------------------------------
// GET /v1/changes (SSE) names the threads and runs whose views changed; the page reads just those
// (with min_seq, so the answer includes the change) and puts them in the lists; a thread named
// deleted leaves them (unread: a deleted thread reads as a 404). Its first frame,
// and any frame saying `reload`, reload the lists whole. A dropped stream is opened again (and so
// reloads). Frames that come while the page is still applying earlier ones are merged.

const CHANGES_AT_ONCE = 40;  // more ids pending than this: one reload costs less than reading each

function watchChanges() {
  if (S.changes) S.changes.abort.abort();
  const w = S.changes = { abort: new AbortController(), pending: null, busy: false };
  sse("/v1/changes", w.abort.signal, (frame) => {
    if (frame.event === "changes" && frame.data) onChanges(w, JSON.parse(frame.data));
  }).then(() => "ended", (err) => (err.name === "AbortError" ? "aborted" : err instanceof ApiError ? "failed" : "ended"))
    .then((how) => {
      if (S.changes !== w) return;
      S.changes = null;
      if (how === "ended") setTimeout(() => { if (!S.changes) watchChanges(); }, 2000);
    });
}

function onChanges(w, frame) {
  const p = w.pending || (w.pending = { seq: 0, reload: false, threads: new Set(), runs: new Set(), deleted: new Set() });
  p.seq = Math.max(p.seq, frame.seq);
  p.reload = p.reload || frame.reload;
  for (const id of frame.threads) { p.threads.add(id); p.deleted.delete(id); }
  for (const id of frame.deleted || []) { p.deleted.add(id); p.threads.delete(id); }
  for (const id of frame.runs) p.runs.add(id);
  drainChanges(w);
}

async function drainChanges(w) {
  if (w.busy) return;
  w.busy = true;
  try {
    while (w.pending && S.changes === w) {
      const p = w.pending;
      w.pending = null;
      if (p.reload || p.threads.size + p.runs.size + p.deleted.size > CHANGES_AT_ONCE) await guarded(() => loadLists(p.seq));
      else await guarded(() => applyChanges(p));
    }
  } finally {
    w.busy = false;
  }
}

// Read the changed views and put them in the lists: a new run or thread newer than the oldest
// shown comes in (newest first, so a new one is at the top), a changed one is replaced, a deleted
// thread goes.
async function applyChanges(p) {
  const fetchView = (kind, id) => api("GET", `/v1/${kind}/${enc(id)}?min_seq=${p.seq}`)
    .catch((err) => { if (err instanceof ApiError && err.status === 404) return null; throw err; });
  const [threads, runs] = await Promise.all([
    Promise.all([...p.threads].map((id) => fetchView("threads", id).then((v) => [id, v]))),
    Promise.all([...p.runs].map((id) => fetchView("runs", id).then((v) => [id, v])))]);
  for (const id of p.deleted) threads.push([id, null]);
  // the run on show changed: draw it too (its thread's follow does as well; either may come first)
  const onShow = runs.find(([id, v]) => id === S.run && v);
  if (onShow) await renderRun(onShow[1]);
  S.runs = merged(S.runs, runs, "run_id", () => true);
  const shown = new Set(S.runs.map((r) => r.thread_id));  // an old thread with a new run comes in too
  S.threads = merged(S.threads, threads, "thread_id", (t) => !t.deleted, (id) => shown.has(id));
  await listsChanged();
}

// `list` (oldest first) with `changes` ([id, view or null]) applied: a view replaces its entry or
// joins the list when it is newer than the oldest kept (a full list keeps its size) or `wanted`
// says so; a null or a view `keep` rejects removes the entry.
function merged(list, changes, key, keep, wanted) {
  const map = new Map(list.map((v) => [v[key], v]));
  const oldest = list.length >= LIST_SIZE ? list[0] : null;
  for (const [id, view] of changes) {
    if (!view || !keep(view)) map.delete(id);
    else if (map.has(id) || !oldest || byCreation(key)(view, oldest) > 0 || (wanted && wanted(id))) map.set(id, view);
  }
  const out = [...map.values()].sort(byCreation(key));
  return out.length > 3 * LIST_SIZE ? out.slice(out.length - 3 * LIST_SIZE) : out;
}

// A sub-agent's run: started by a call of a run on another thread (a continuation of a run on
// the same thread also names its parent run, and stays in its thread's list).
const isSubAgent = (r) => Boolean(r.parent_run_id && r.parent_thread_id && r.parent_thread_id !== r.thread_id);

// The thread tree: top-level threads, each with its runs; a sub-agent's runs nest under the run
// (and call) that started them, not among the threads.
function tree() {
  const runsOf = new Map(), children = new Map();
  const runIds = new Set(S.runs.map((r) => r.run_id));
  for (const r of S.runs) {
    if (isSubAgent(r) && runIds.has(r.parent_run_id)) {
      if (!children.has(r.parent_run_id)) children.set(r.parent_run_id, []);
      children.get(r.parent_run_id).push(r);
    }
    if (!runsOf.has(r.thread_id)) runsOf.set(r.thread_id, []);
    runsOf.get(r.thread_id).push(r);
  }
  // a sub-agent thread is at the top only when the run that started it is not loaded
  const top = S.threads.filter((t) => !t.parent_thread_id ||
    !(runsOf.get(t.thread_id) || []).some((r) => isSubAgent(r) && runIds.has(r.parent_run_id)));
  return { top: top.slice().reverse(), runsOf, children };
}

// Every run under a thread entry, sub-agent runs included (for filters and search).
function allRuns(runs, children) {
  const out = [];
  const walk = (list) => { for (const r of list) { out.push(r); walk(children.get(r.run_id) || []); } };
  walk(runs);
  return out;
}

function matches(t, runs) {
  const q = $("#q").value.trim().toLowerCase(), status = $("#f-status").value, agent = $("#f-agent").value;
  const since = Number($("#f-time").value || 0);
  if (status && !runs.some((r) => r.status === status)) return false;
  if (agent && !runs.some((r) => r.agent_id === agent)) return false;
  if (since && t.updated < Date.now() - since) return false;
  if (!q) return true;
  const hay = [t.thread_id, S.firstMessages.get(t.thread_id) || "", ...runs.flatMap((r) => [r.run_id, r.agent_id || ""])];
  return hay.some((s) => s.toLowerCase().includes(q));
}

function renderLists() {
  const { top, runsOf, children } = tree();
  const shown = [];
  for (const t of top) {
    const runs = allRuns(runsOf.get(t.thread_id) || [], children);
    if (matches(t, runs)) shown.push([t, runs]);
  }
  $("#count").textContent = `${shown.length} of ${top.length}`;
  const ul = $("#threads");
  ul.replaceChildren(...shown.map(([t, runs]) => threadItem(t, runsOf, children, runs)));
  if (!shown.length) ul.replaceChildren(el("li", { class: "sub" }, top.length ? "nothing matches the filters" : "no threads yet"));
}

function threadItem(t, runsOf, children, runs) {
  const first = S.firstMessages.get(t.thread_id);
  const agents = [...new Set(runs.map((r) => r.agent_id).filter(Boolean))];
  const own = runsOf.get(t.thread_id) || [];
  const latest = own[own.length - 1];
  return el("li", { class: "thread" + (t.thread_id === S.thread ? " open" : ""), "data-thread-item": t.thread_id },
    el("button", { type: "button", class: "thread-btn" + (t.thread_id === S.thread && !S.run ? " sel" : ""),
                   "data-thread": t.thread_id, onclick: () => go(`#/threads/${enc(t.thread_id)}`) },
      el("span", { class: "first" }, first || (t.message_count ? "…" : "(no messages)")),
      el("span", { class: "sub" }, agents.join(", ") || "no runs", " · ", time(t.created), ` (${ago(t.updated)})`,
         ` · ${t.run_ids.length} run(s)`, usd(t.cost), latest ? [" ", badge(latest.status)] : null,
         t.parent_thread_id ? ` · sub-agent thread of ${t.parent_thread_id}` : "")),
    el("ul", { class: "runs" }, own.map((r) => runItem(r, children, 0))));
}

const badge = (status) => el("span", { class: `badge ${status}` }, status);

function runItem(r, children, depth) {
  const kids = children.get(r.run_id) || [];
  const via = depth > 0 ? subAgentCall(r) : null;
  return el("li", { class: depth ? "child" : "" },
    el("button", { type: "button", class: r.run_id === S.run ? "sel" : "", "data-run": r.run_id,
                   onclick: () => go(runHash(r.run_id)) },
      depth ? el("span", { class: "via" }, via ? `${via} → ` : "sub-agent → ") : null,
      el("strong", {}, r.agent_id || "?"), " ", badge(r.status),
      el("span", { class: "sub" }, time(r.created), ` · ${runDuration(r)} · ${r.steps} step(s)${usd(r.cost)}`)),
    kids.length ? el("ul", { class: "runs" }, kids.map((k) => runItem(k, children, depth + 1))) : null);
}

// The parent call a sub-agent run was started by, e.g. "agent_run call_0_0" (from the thread's metadata).
function subAgentCall(r) {
  const t = S.threads.find((x) => x.thread_id === r.thread_id);
  const callId = t && t.metadata && t.metadata.parent_call_id;
  const parent = S.runs.find((p) => p.run_id === r.parent_run_id);
  const call = parent && parent.calls && callId ? parent.calls[callId] : null;
  return callId ? `${call && call.name ? call.name : "call"} ${callId}` : null;
}

async function selectThread(threadId) {
  S.thread = threadId; S.run = null;
  stopFollow();
  await loadLists();
  const runs = S.runs.filter((r) => r.thread_id === threadId);
  if (runs.length) return go(runHash(runs[runs.length - 1].run_id));  // its latest run
  // no run yet (e.g. a fork just made): the thread itself, from the log, and its messages
  const [thread, data] = await Promise.all([api("GET", `/v1/threads/${enc(threadId)}`),
    api("GET", `/v1/threads/${enc(threadId)}/messages?limit=200`)]);
  if (threadId !== S.thread) return undefined;
  const from = thread.forked_from;
  showMain("empty");
  $("#empty").replaceChildren(
    el("p", { id: "thread-head" }, `Thread ${threadId} has no runs yet.`,
      from ? el("span", { class: "forked" }, ` Forked from thread ${from.thread_id} at event ${from.position}. `,
        el("a", { id: "compare-fork", href: diffHash(from.thread_id, threadId) }, "compare with its source")) : null),
    el("ol", { id: "thread-messages" }, data.messages.map(({ message: m }) => el("li", {},
      el("span", { class: "role" }, m.role + ":"), " ", m.content))));
  return undefined;
}

// A new thread from this one's history as of event `at` (POST /v1/threads/{id}/fork), then show it.
async function forkAt(at) {
  await guarded(async () => {
    const fork = await api("POST", `/v1/threads/${enc(S.thread)}/fork`, { at });
    go(`#/threads/${enc(fork.thread_id)}`);
  });
}

// -- one run ----------------------------------------------------------------------------------------

async function selectRun(runId, at) {
  if (S.run === runId && !$("#run").hidden) {  // the same run: move in time only
    await renderState(at);
    return;
  }
  S.run = runId; S.at = at;
  const run = await api("GET", `/v1/runs/${enc(runId)}`);
  S.thread = run.thread_id;
  showMain("run");
  $("#verify-result").replaceChildren();
  await Promise.all([renderRun(run), loadLists()]);
  follow(run.thread_id);
}

// Every render that awaits checks, once its answer is in, that it is still for the run on show:
// a late answer (a decision's re-read, a live refresh) must not paint over a run picked since.
async function renderRun(run) {
  run = run || await api("GET", `/v1/runs/${enc(S.run)}`);
  if (run.run_id !== S.run) return;
  $("#run-id").textContent = run.run_id;
  const status = $("#run-status");
  status.textContent = run.status; status.className = `badge ${run.status}`;
  const term = run.termination
    ? ` · finished: ${run.termination.type}${run.termination.code ? " (" + run.termination.code + ")" : ""}` : "";
  const usage = run.usage || {};  // a view leaves out zero counts
  $("#run-meta").replaceChildren(
    `agent ${run.agent_id || "?"}${run.active_agent && run.active_agent !== run.agent_id ? " → " + run.active_agent + " (handoff)" : ""} · thread `, el("a", { href: `#/threads/${enc(run.thread_id)}` }, el("code", {}, run.thread_id)),
    ` · started `, time(run.created), ` · ${runDuration(run)} · ${run.steps} step(s) · `,
    `tokens in ${usage.input_tokens || 0} / out ${usage.output_tokens || 0}${usd(run.cost)}`,
    run.model ? ` · model ${run.model}` : "", term);
  $("#run-parent").replaceChildren(...(run.parent_run_id
    ? ["sub-agent run of ", el("a", { href: runHash(run.parent_run_id) }, el("code", {}, run.parent_run_id))] : []));
  guarded(() => showBranches(run.thread_id));
  renderFailure(run);
  const [tl] = await Promise.all([renderTimeline(), loadMessages(run.thread_id)]);
  if (run.run_id !== S.run) return;
  await renderState(S.at);
  if (run.run_id !== S.run) return;
  renderApprovals(run, requestedCalls(tl));
}

// Why a failed run failed: its termination, the message whole (a model's error can be long).
function renderFailure(run) {
  const t = run.termination;
  $("#failure-box").hidden = run.status !== "failed";
  if (run.status !== "failed" || !t) return;
  $("#failure-kind").textContent = `${t.type}${t.code ? " · " + t.code : ""}`;
  $("#failure").textContent = t.detail || "(no message recorded)";
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
  $("#approvals").replaceChildren(...pending.map((c) => {
    const asked = requested[c.call_id] || {};
    return el("li", { "data-call": c.call_id, class: c.in_doubt ? "in-doubt" : "" },
      el("div", {}, el("strong", {}, c.name || asked.name || "tool"), " ",
         el("code", {}, JSON.stringify(c.name ? c.arguments : asked.arguments || {})),
         c.in_doubt ? [" ", el("span", { class: "badge in-doubt" }, "in doubt")] : null),
      c.ticket && c.ticket.message ? el("div", { class: "sub" }, c.ticket.message) : null,
      c.in_doubt ? inDoubtForm(c) : ticketForm(c));
  }));
}

// The answer form of an interrupt, built from its ticket's `response_schema` (an object schema:
// one field per property). A schema with a boolean `approved` (the permission gate's) gets
// Approve / Deny buttons that set it; any other gets one Submit button. No schema: approve / deny.
function ticketForm(call) {
  const schema = (call.ticket && call.ticket.response_schema) || { type: "object", properties: { approved: { type: "boolean" } } };
  const props = schema.type === "object" && schema.properties ? schema.properties : null;
  const required = new Set(schema.required || []);
  const form = el("form", { class: "ticket", "data-call": call.call_id });
  const fields = [];
  if (!props) {  // not an object: the whole answer as JSON
    fields.push(el("label", {}, "answer (JSON)", el("textarea", { name: "json", required: "" })));
  } else {
    for (const [name, p] of Object.entries(props)) {
      if (name === "approved" && p.type === "boolean") continue;
      fields.push(field(name, p, required.has(name)));
    }
  }
  const decideWith = props && props.approved && props.approved.type === "boolean";
  const note = el("span", { class: "form-error", role: "status" });
  const send = async (approved) => {
    let result;
    try { result = formValue(form, props, approved); } catch (err) { note.textContent = err.message; return; }
    note.textContent = "";
    for (const b of form.querySelectorAll("button")) b.disabled = true;
    await decide(call.call_id, result);
    for (const b of form.querySelectorAll("button")) b.disabled = false;
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); send(decideWith ? true : undefined); });
  form.append(...fields, el("div", { class: "actions" },
    decideWith
      ? [el("button", { class: "approve", type: "submit" }, "Approve"),
         el("button", { class: "deny", type: "button", onclick: () => send(false) }, "Deny")]
      : el("button", { class: "approve", type: "submit" }, "Submit"),
    note, el("code", { class: "sub" }, call.call_id)));
  return form;
}

// The answer form of a call in doubt (it was running when its worker stopped, and its tool is not
// idempotent): Mark done (with the result to record), Retry, Cancel -- the three shapes of its
// ticket's response_schema.
function inDoubtForm(call) {
  const form = el("form", { class: "ticket", "data-call": call.call_id });
  const result = el("textarea", { name: "result", placeholder: "the result to record (JSON)" });
  const note = el("span", { class: "form-error", role: "status" });
  const send = async (answer) => {
    note.textContent = "";
    for (const b of form.querySelectorAll("button")) b.disabled = true;
    await decide(call.call_id, answer);
    for (const b of form.querySelectorAll("button")) b.disabled = false;
  };
  const markDone = () => {
    let value;
    try { value = JSON.parse(result.value || "null"); } catch (err) { note.textContent = `result: ${err.message}`; return; }
    send({ action: "mark_done", result: value });
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); markDone(); });
  form.append(el("label", {}, "result, if its effect happened (JSON)", result), el("div", { class: "actions" },
    el("button", { class: "approve", type: "submit" }, "Mark done"),
    el("button", { type: "button", onclick: () => send({ action: "retry" }) }, "Retry"),
    el("button", { class: "deny", type: "button", onclick: () => send({ action: "cancel" }) }, "Cancel"),
    note, el("code", { class: "sub" }, call.call_id)));
  return form;
}

function field(name, p, isRequired) {
  const label = `${p.title || name}${isRequired ? " *" : ""}`;
  const attrs = { name: "f:" + name, "data-type": p.type || "json" };
  if (isRequired) attrs.required = "";
  let input;
  if (Array.isArray(p.enum)) {
    input = el("select", attrs, isRequired ? null : el("option", { value: "" }, ""),
               p.enum.map((v) => el("option", { value: JSON.stringify(v) }, String(v))));
    input.dataset.type = "enum";
  } else if (p.type === "boolean") {
    input = el("input", { ...attrs, type: "checkbox" });
    delete input.required;
    input.removeAttribute("required");
  } else if (p.type === "integer" || p.type === "number") {
    input = el("input", { ...attrs, type: "number", step: p.type === "integer" ? "1" : "any" });
  } else if (p.type === "string") {
    input = p.maxLength && p.maxLength <= 200 ? el("input", { ...attrs, type: "text" }) : el("textarea", attrs);
  } else {
    input = el("textarea", { ...attrs, placeholder: "JSON" });
  }
  return el("label", { class: p.type === "boolean" ? "check" : "" }, label, input,
            p.description ? el("small", {}, p.description) : null);
}

// The decision's `result` from the form (throws with a message on bad input).
function formValue(form, props, approved) {
  if (!props) return JSON.parse(form.querySelector("[name=json]").value);
  const out = {};
  if (approved !== undefined) out.approved = approved;
  for (const input of form.querySelectorAll("[name^='f:']")) {
    const name = input.name.slice(2), type = input.dataset.type, raw = input.value;
    if (type === "boolean") { out[name] = input.checked; continue; }
    if (raw === "") continue;
    if (type === "enum") out[name] = JSON.parse(raw);
    else if (type === "integer" || type === "number") {
      const n = Number(raw);
      if (!Number.isFinite(n) || (type === "integer" && !Number.isInteger(n))) throw new Error(`${name}: not a${type === "integer" ? "n integer" : " number"}`);
      out[name] = n;
    } else if (type === "string") out[name] = raw;
    else {
      try { out[name] = JSON.parse(raw); } catch (_e) { throw new Error(`${name}: not valid JSON`); }
    }
  }
  return out;
}

async function decide(callId, result) {
  const decision = { target_id: callId, decision_id: `ui-${callId}-${Date.now()}`, action: "resume", result };
  await guarded(async () => {
    const done = await api("POST", `/v1/runs/${enc(S.run)}/inputs`, { decisions: [decision] });
    await renderRun(await api("GET", `/v1/runs/${enc(S.run)}?min_seq=${done.seq}`));
  });
}

async function renderTimeline() {
  const runId = S.run;
  const tl = await api("GET", `/v1/runs/${enc(runId)}/timeline`);
  if (runId !== S.run) return tl;
  renderWaterfall(tl);
  $("#timeline").replaceChildren(...tl.steps.map((g) => el("li", { class: "group" },
    el("div", { class: "label" }, g.label),
    g.events.map((e) => [
      el("a", { class: "ev" + (e.type === "CommitQuarantined" ? " quarantined" : "") + (e.id === S.at ? " sel" : ""), href: runHash(S.run, e.id), "data-event": e.id },
        el("span", { class: "id mono" }, e.id), el("span", { class: "type" }, e.type),
        el("span", { class: "sum mono" }, e.summary)),
      el("button", { class: "fork", type: "button", "data-fork": e.id, hidden: e.id === S.at ? null : "",
        title: "a new thread with the messages and state as of this event" }, "Fork from here"),
      e.state_diff && e.state_diff.length ? el("pre", { class: "diff" }, e.state_diff.map(
        (op) => `${op.op} ${op.path}${"value" in op ? " = " + JSON.stringify(op.value) : ""}`).join("\n")) : null,
    ]))));
  return tl;
}

// The run's steps, inferences and tool calls on one time axis (the timeline's `spans`: what
// `agentlog trace` computes from the log). Nested by parent; a span still open (a live run) runs
// to now, or to the last recorded time of a run that waits.
function renderWaterfall(tl) {
  const spans = tl.spans || [];
  $("#waterfall-box").hidden = spans.length === 0;
  if (!spans.length) return;
  const live = tl.status === "running";
  const last = Math.max(...spans.map((s) => s.end_ms || s.start_ms));
  const endOf = (s) => (s.end_ms !== null && s.end_ms !== undefined ? s.end_ms : live ? Math.max(Date.now(), last) : last);
  const t0 = Math.min(...spans.map((s) => s.start_ms));
  const total = Math.max(1, Math.max(...spans.map(endOf)) - t0);
  const depth = new Map();
  for (const s of spans) depth.set(s.key, s.parent && depth.has(s.parent) ? depth.get(s.parent) + 1 : 0);
  $("#waterfall-total").textContent = duration(total);
  $("#waterfall").replaceChildren(...spans.map((s) => {
    const open = s.end_ms === null || s.end_ms === undefined;
    const took = endOf(s) - s.start_ms;
    const bar = el("span", { class: "bar" });
    bar.style.left = `${((s.start_ms - t0) / total) * 100}%`;
    bar.style.width = `max(2px, ${(took / total) * 100}%)`;
    const name = el("span", { class: "name", title: s.error || s.name }, s.name);
    name.style.paddingLeft = `${depth.get(s.key) * 0.9}rem`;
    return el("li", { class: `span ${s.key.split(":")[0]}${s.error ? " error" : ""}${open ? " open" : ""}`, "data-span": s.key },
      name, el("span", { class: "track" }, bar),
      el("span", { class: "took" }, open ? `${duration(took)}…` : duration(took)));
  }));
}

// "12:3" -> [12, 3]: event ids order by (seq, index).
const pos = (id) => id.split(":").map(Number);
const atOrBefore = (id, at) => { const [a, b] = pos(id), [c, d] = pos(at); return a < c || (a === c && b <= d); };

// The thread's state as of an event (time travel: a fold of the log up to it), or now; the
// Messages follow: only those the thread had by then.
async function renderState(at) {
  S.at = at || null;
  for (const b of document.querySelectorAll(".ev")) b.classList.toggle("sel", b.dataset.event === S.at);
  for (const b of document.querySelectorAll("button.fork")) b.hidden = b.dataset.fork !== S.at;
  $("#permalink").href = runHash(S.run, S.at);
  const thread = S.thread;
  const stateOf = (at) => api("GET", `/v1/threads/${enc(thread)}/state${at ? `?at=${enc(at)}` : ""}`);
  const [data, now] = await Promise.all([stateOf(S.at), S.at ? stateOf(null) : null]);
  if (thread !== S.thread) return;
  $("#state-at").textContent = S.at ? `as of event ${S.at}` : "now";
  $("#state-now").hidden = !S.at;
  $("#state").textContent = json(data.state);
  renderStanding((now || data).state);
  renderMessages();
}

// The thread's standing permission rules ("always allow / always deny" answers, thread state
// `agentlog.permissions`), as they are now whatever event the page travelled to: they are what
// the thread's next calls meet. Each has a Revoke button (DELETE /v1/threads/{id}/permissions),
// which the API refuses (409 run_active, shown above) while a run is active on the thread.
const STANDING = "agentlog.permissions";

function renderStanding(state) {
  const stored = (state && state[STANDING]) || {};
  const rules = [];
  for (const verdict of ["allow", "deny"]) {
    for (const r of Array.isArray(stored[verdict]) ? stored[verdict] : []) {
      if (r && typeof r.tool === "string") rules.push({ verdict, tool: r.tool, args: r.args || {} });
    }
  }
  $("#standing-box").hidden = rules.length === 0;
  $("#standing").replaceChildren(...rules.map((r) => el("li", { "data-tool": r.tool, "data-verdict": r.verdict },
    el("span", { class: `badge ${r.verdict}` }, `always ${r.verdict}`), " ", el("code", {}, r.tool),
    Object.keys(r.args).length ? [" ", el("code", { class: "sub", title: "argument patterns" }, JSON.stringify(r.args))] : null,
    " ", el("button", { class: "revoke", type: "button", title: `ask again before ${r.tool} on this thread`,
                        onclick: () => revoke(r) }, "Revoke"))));
}

// Revoking removes every rule of the tool with that verdict (argument patterns included).
async function revoke(rule) {
  const thread = S.thread;
  await guarded(async () => {
    await api("DELETE", `/v1/threads/${enc(thread)}/permissions?tool=${enc(rule.tool)}&verdict=${enc(rule.verdict)}`);
    if (thread === S.thread) await renderState(S.at);
  });
}

async function loadMessages(threadId) {
  const data = await api("GET", `/v1/threads/${enc(threadId)}/messages?limit=200`);
  if (threadId !== S.thread) return;
  S.messages = data.messages;
  renderMessages();
}

function renderMessages() {
  const shown = S.at ? S.messages.filter((m) => atOrBefore(m.event_id, S.at)) : S.messages;
  const later = S.messages.length - shown.length;
  $("#messages-at").textContent = S.at ? `as of event ${S.at}${later ? ` (${later} later hidden)` : ""}` : "of the thread";
  $("#messages").replaceChildren(...shown.map(({ message: m, event_id: id }) => el("li", { title: id, "data-event": id },
    el("span", { class: "role" }, m.role + ":"), reasoningOf(m),
    typeof m.content === "string" ? m.content : JSON.stringify(m.content),
    attachmentsOf(m),
    m.tool_calls && m.tool_calls.length ? el("div", { class: "sub mono" },
      m.tool_calls.map((c) => `-> ${c.name}(${JSON.stringify(c.arguments || {})})`).join(" ")) : null)));
}

// The model's reasoning before an answer: collapsed, it is long and rarely what one looks for.
function reasoningOf(m) {
  const text = (m.reasoning || []).map((r) => r.text || "").join("");
  return text ? el("details", { class: "reasoning" }, el("summary", {}, "reasoning"), el("div", { class: "sub" }, text)) : null;
}

// A message's images and files (its non-text parts), named, not shown: the bytes stay server-side.
function attachmentsOf(m) {
  const files = (m.parts || []).filter((p) => p.type !== "text");
  if (!files.length) return null;
  const name = (p) => `${p.type} ${p.filename || p.media_type || p.url || ""}`.trim() +
    (p.data ? ` (${Math.round((p.data.length * 3) / 4 / 1024)} KiB)` : "");
  return el("div", { class: "sub mono attachments" }, "attached: " + files.map(name).join(", "));
}

async function verify() {
  const box = $("#verify-result");
  box.replaceChildren("verifying…");
  const r = await guarded(() => api("POST", `/v1/runs/${enc(S.run)}/verify`, {}));
  if (!r) { box.replaceChildren(); return; }
  box.replaceChildren(r.ok
    ? el("span", { class: "verify-ok", id: "verify-ok" },
         `verified: ${r.commits_verified}/${r.commits_recorded} commits, ${r.events_verified} events replay identically (${r.status})`)
    : el("span", { class: "verify-bad", id: "verify-bad" },
         `diverged at ${r.divergence.position}: ${r.divergence.message}`));
}

// -- operations -------------------------------------------------------------------------------------

async function showOps() {
  S.run = null; stopFollow();
  showMain("ops");
  await renderOps();
  stopOps();
  S.opsTimer = setInterval(() => guarded(renderOps), 5000);
}

function stopOps() { clearInterval(S.opsTimer); S.opsTimer = null; }

async function renderOps() {
  const q = await api("GET", "/v1/ops/queue");
  const kv = (rows) => el("table", { class: "kv" }, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
  const c = q.commands, w = q.workers, d = q.dead_letters;
  $("#ops-body").replaceChildren(
    el("section", { id: "ops-queue" }, el("h3", {}, "Command queue"), c
      ? kv([["stream", c.stream], ["queued commands", String(c.queued)]])
      : el("p", { class: "sub" }, "no command was ever queued")),
    el("section", { id: "ops-workers" }, el("h3", {}, "Workers"), w
      ? kv([["consumer", w.consumer], ["open pull requests (idle worker slots)", String(w.open_pull_requests)],
            ["commands in progress", String(w.in_progress)], ["waiting for a worker", String(w.pending)],
            ["redelivered", String(w.redelivered)],
            ["last command handed out", w.last_delivered ? [time(w.last_delivered), ` (${ago(w.last_delivered)})`] : "never"]])
      : el("p", { class: "sub" }, "no worker has started yet")),
    el("section", { id: "ops-dlq" }, el("h3", {}, "Dead letters ", el("small", {}, d ? `${d.count} in ${d.stream}` : "")),
      d && d.recent.length
        ? el("table", { class: "dlq" },
            el("tr", {}, ["time", "run", "thread", "code", "error", "deliveries"].map((h) => el("th", {}, h))),
            d.recent.map((x) => el("tr", { "data-dlq": String(x.seq) },
              el("td", {}, x.time ? time(x.time) : ""),
              el("td", {}, x.run_id ? el("a", { href: runHash(x.run_id) }, el("code", {}, x.run_id)) : ""),
              el("td", {}, x.thread_id ? el("code", {}, x.thread_id) : ""),
              el("td", {}, el("code", {}, x.code || "")), el("td", {}, x.error || ""),
              el("td", {}, x.deliveries === null ? "" : String(x.deliveries)))))
        : el("p", { class: "sub" }, "none")));
}

// -- live follow (SSE over fetch, so the bearer token can be sent) ------------------------------------

function stopFollow() {
  if (S.follow) { S.follow.abort.abort(); S.follow = null; }
  $("#live").hidden = true;
}

// Reads the SSE stream at `path` (fetch, so the bearer token can be sent), calling `onFrame` with
// each frame ({id, event, data}); resolves when the stream ends, rejects with an ApiError when the
// API refuses it (401, 404) or with an Error on an `error` frame (e.g. dropped as too slow).
async function sse(path, signal, onFrame) {
  const r = await fetch(path, { headers: authHeaders({ Accept: "text/event-stream" }), signal });
  if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const frame = {};
      for (const line of buf.slice(0, cut).split("\n")) {
        const at = line.indexOf(":");
        if (at > 0) frame[line.slice(0, at)] = (frame[line.slice(0, at)] || "") + line.slice(at + 1).trim();
      }
      buf = buf.slice(cut + 2);
      if (frame.event === "error") throw new Error(frame.data);
      onFrame(frame);
    }
  }
}

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
    await sse(`/v1/threads/${enc(threadId)}/events?follow=true&after=${enc(f.last)}`, f.abort.signal, (frame) => {
      if (frame.id) f.last = frame.id;
      if (frame.data) onLive(JSON.parse(frame.data), frame.id);
    });
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

// The run on show, live (the lists follow GET /v1/changes on their own). Reads ask for the views
// as of the newest event seen (`min_seq`): a view read without it may not have that event yet, and
// no later frame would come to correct it.
function onLive(frame, id) {
  clearTimeout(S.refreshTimer);
  const seq = parseInt(String(id || "").split(":")[0], 10);
  if (seq > (S.liveSeq || 0)) S.liveSeq = seq;
  const minSeq = S.liveSeq ? `?min_seq=${S.liveSeq}` : "";
  S.refreshTimer = setTimeout(() => guarded(async () => {
    if (frame.run_id === S.run) await renderRun(await api("GET", `/v1/runs/${enc(S.run)}${minSeq}`));
    else await loadMessages(S.thread);  // read from the log: always current
  }), 150);
}

// -- start ------------------------------------------------------------------------------------------

$("#token").value = sessionStorage.getItem(TOKEN_KEY) || "";
$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  stopFollow();
  S.run = null;  // render the current place again, with the new token
  route();
  watchChanges();
});
for (const id of ["#q", "#f-agent", "#f-time"]) $(id).addEventListener("input", renderLists);
// a status filter also reads that status's newest runs from the API (older than the newest runs)
$("#f-status").addEventListener("input", () => { renderLists(); guarded(loadLists); });
$("#filters").addEventListener("submit", (e) => e.preventDefault());
$("#refresh").addEventListener("click", () => guarded(loadLists));
$("#verify").addEventListener("click", verify);
$("#timeline").addEventListener("click", (e) => {
  const button = e.target.closest("button.fork");
  if (button) forkAt(button.dataset.fork);
});
$("#state-now").addEventListener("click", () => go(runHash(S.run)));
window.addEventListener("hashchange", route);
route();
watchChanges();
