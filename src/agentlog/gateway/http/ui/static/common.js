// Shared by the run inspector (app.js) and the API docs (docs.js): the token the user typed, and
// a DOM builder. Loaded first by both pages; plain script, no modules, no build step.
"use strict";

// The bearer token lives in this tab's sessionStorage (both pages share it, it dies with the tab).
const TOKEN_KEY = "agentlog.token";

const $ = (sel, root) => (root || document).querySelector(sel);

// Build DOM nodes (text only, never innerHTML: event payloads and schemas are untrusted).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) node.append(c.nodeType ? c : String(c));
  return node;
}

// Request headers with the stored token as Bearer (none if the user typed none).
function authHeaders(extra) {
  const h = Object.assign({ Accept: "application/json" }, extra || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h.Authorization = "Bearer " + token;
  return h;
}
