// Branches in the run inspector: where a run's thread came from and where it went (its fork
// origin, its child threads), and two branches compared event by event from their fork point
// (GET /v1/threads/{a}/diff/{b}) on the page #/diff/A/B. Loaded before app.js (which routes to
// it); uses its helpers (api, go, showMain, stopFollow) and common.js's (el, $).
"use strict";

const diffHash = (a, b) => `#/diff/${encodeURIComponent(a)}/${encodeURIComponent(b)}`;
const DIFF_MARK = { same: "=", changed: "≠", only_a: "<", only_b: ">" };

// The run page's lineage line: "branch of run R at call C · compare with its source", and a
// link to compare with each child thread (its counterfactual branches).
async function showBranches(threadId) {
  const box = $("#run-branch");
  const t = await api("GET", `/v1/threads/${encodeURIComponent(threadId)}`);
  if (S.thread !== threadId) return;
  const from = t.forked_from;
  const parts = [];
  if (from) {
    parts.push(from.run_id ? `branch of run ${from.run_id} at call ${from.call_id} · `
      : `fork of thread ${from.thread_id} at ${from.position} · `,
    el("a", { id: "compare-source", href: diffHash(from.thread_id, threadId) }, "compare with its source"));
  }
  for (const child of t.children || []) {
    parts.push(parts.length ? " · " : "",
      el("a", { class: "compare-child", href: diffHash(threadId, child) }, `compare with branch ${child}`));
  }
  box.replaceChildren(...parts);
}

// #/diff/A/B: the common prefix's length, then the aligned rest side by side.
async function showDiff(a, b) {
  S.thread = S.run = null;
  stopFollow();
  const d = await api("GET", `/v1/threads/${encodeURIComponent(a)}/diff/${encodeURIComponent(b)}`);
  showMain("diff");
  const side = (s) => (s ? [el("code", {}, s.id), " ", el("strong", {}, s.type), " ", s.summary || ""] : "");
  const thread = (id) => el("a", { href: `#/threads/${encodeURIComponent(id)}` }, el("code", {}, id));
  $("#diff").replaceChildren(
    el("h2", {}, "Branches ", thread(a), " vs ", thread(b)),
    el("p", { id: "diff-common" }, `${d.common} event(s) in common from the fork point, then `
      + `${d.a_events - d.common} / ${d.b_events - d.common}.`),
    el("table", { id: "diff-rows" },
      el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, a), el("th", {}, b))),
      el("tbody", {}, d.rows.map((r) => el("tr", { class: r.kind },
        el("td", { class: "mark" }, DIFF_MARK[r.kind]), el("td", {}, side(r.a)), el("td", {}, side(r.b)))))));
}
