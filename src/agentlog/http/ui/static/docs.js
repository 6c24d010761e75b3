// agentlog API explorer: renders /openapi.json (operations, parameters, schemas) with a
// "try it" form per operation that sends the request with the token typed above. Plain JS.
"use strict";

let SPEC = null;

// A schema with its $refs resolved (one level per ref, cycles cut), for display.
function resolve(schema, seen) {
  seen = seen || new Set();
  if (Array.isArray(schema)) return schema.map((s) => resolve(s, seen));
  if (!schema || typeof schema !== "object") return schema;
  if (schema.$ref) {
    const name = schema.$ref.split("/").pop();
    if (seen.has(name)) return { $ref: schema.$ref };
    const next = new Set(seen); next.add(name);
    return resolve(SPEC.components.schemas[name], next);
  }
  return Object.fromEntries(Object.entries(schema).map(([k, v]) => [k, resolve(v, seen)]));
}

const pretty = (v) => JSON.stringify(v, null, 2);

function example(schema) {
  schema = resolve(schema);
  if (!schema || schema.type !== "object" || !schema.properties) return {};
  const out = {};
  for (const name of schema.required || []) {
    const p = schema.properties[name] || {};
    out[name] = p.examples ? p.examples[0] : p.type === "integer" ? 0 : p.type === "array" ? [] : p.type === "object" ? {} : "";
  }
  return out;
}

async function send(method, path, op, form, out) {
  let url = path;
  const query = new URLSearchParams();
  for (const p of op.parameters || []) {
    const v = form.elements["p:" + p.name] ? form.elements["p:" + p.name].value.trim() : "";
    if (!v) continue;
    if (p.in === "path") url = url.replace(`{${p.name}}`, encodeURIComponent(v));
    else if (p.in === "query") query.set(p.name, v);
  }
  if ([...query].length) url += "?" + query;
  const headers = authHeaders();
  const init = { method: method.toUpperCase(), headers };
  if (op.requestBody) { headers["Content-Type"] = "application/json"; init.body = form.elements.body.value; }
  const abort = new AbortController();
  init.signal = abort.signal;
  const timer = setTimeout(() => abort.abort(), 5000);  // event streams: show what came in 5 s
  out.textContent = `${init.method} ${url} …`;
  let text = "";
  try {
    const r = await fetch(url, init);
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    out.textContent = `${r.status} ${r.statusText}\n`;
    try {
      for (;;) { const { value, done } = await reader.read(); if (done) break; text += value; }
    } catch (err) { if (err.name !== "AbortError") throw err; text += "\n… (stopped after 5 s)"; }
    try { text = pretty(JSON.parse(text)); } catch (_e) { /* not JSON: as is */ }
    out.textContent += text;
  } catch (err) {
    out.textContent = String(err);
  } finally { clearTimeout(timer); }
}

function operation(path, method, op) {
  const form = el("form", { class: "try" });
  for (const p of op.parameters || []) {
    if (p.in === "header") continue;
    form.append(el("label", {}, `${p.name} (${p.in}${p.required ? ", required" : ""}) `,
      el("input", { name: "p:" + p.name, placeholder: p.description || (p.schema && p.schema.type) || "" })));
  }
  if (op.requestBody) {
    const schema = op.requestBody.content["application/json"].schema;
    form.append(el("label", {}, "body (JSON)", el("textarea", { name: "body" }, pretty(example(schema)))));
  }
  const out = el("pre", { class: "result" });
  form.append(el("button", { type: "submit" }, "send"));
  form.addEventListener("submit", (e) => { e.preventDefault(); send(method, path, op, form, out); });
  const responses = Object.entries(op.responses || {}).map(([status, r]) => {
    const content = r.content ? Object.values(r.content)[0] : null;
    return el("details", {}, el("summary", {}, `${status} ${r.description}`),
      content && content.schema ? el("pre", {}, pretty(resolve(content.schema))) : null);
  });
  return el("details", { class: "op", "data-op": op.operationId },
    el("summary", {}, el("span", { class: "method " + method }, method.toUpperCase()), el("code", {}, path),
       " ", el("small", {}, op.summary || ""), op.security ? el("small", {}, " 🔒") : null),
    el("div", { class: "body" },
      (op.parameters || []).length ? el("h3", {}, "Parameters") : null,
      (op.parameters || []).length ? el("pre", {}, pretty(resolve(op.parameters))) : null,
      op.requestBody ? el("h3", {}, "Request body") : null,
      op.requestBody ? el("pre", {}, pretty(resolve(op.requestBody.content["application/json"].schema))) : null,
      el("h3", {}, "Responses"), responses,
      el("h3", {}, "Try it"), form, out));
}

async function main() {
  $("#token").value = sessionStorage.getItem(TOKEN_KEY) || "";
  $("#token-form").addEventListener("submit", (e) => {
    e.preventDefault(); sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  });
  const r = await fetch("/openapi.json");
  SPEC = await r.json();
  $("#info").textContent = `${SPEC.info.title} ${SPEC.info.version} (OpenAPI ${SPEC.openapi}) — ${SPEC.info.description || ""}`;
  const byTag = {};
  for (const [path, methods] of Object.entries(SPEC.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      const tag = (op.tags && op.tags[0]) || "other";
      (byTag[tag] = byTag[tag] || []).push(operation(path, method, op));
    }
  }
  $("#ops").replaceChildren(...Object.entries(byTag).map(([tag, ops]) => el("section", {}, el("h2", {}, tag), ops)));
}

main().catch((err) => { const box = $("#error"); box.hidden = false; box.textContent = String(err); });
