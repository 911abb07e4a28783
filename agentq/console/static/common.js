// agentq console: shared helpers. Everything from task data reaches the page as text
// nodes or attribute values set through the DOM, never as HTML, so a task's input or
// result can never become markup or script.
"use strict";

const AQ = (() => {
  const body = document.body;
  const tenantParam = () => new URLSearchParams(location.search).get("tenant");

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "onclick" || name === "onchange" || name === "onsubmit") node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function withTenant(path, tenant) {
    const t = tenant || tenantParam();
    return t ? `${path}?tenant=${encodeURIComponent(t)}` : path;
  }
  const jobHref = (id, tenant) => withTenant(`/jobs/${encodeURIComponent(id)}`, tenant);
  const taskHref = (id, tenant) => withTenant(`/tasks/${encodeURIComponent(id)}`, tenant);

  function badge(state) {
    return el("span", { class: `badge s-${state || "NOT_CREATED"}`, "data-state": state }, state || "—");
  }

  function ago(ms) {
    if (!ms) return "—";
    return `${span(Date.now() - ms)} ago`;
  }

  function span(ms) {
    if (ms === null || ms === undefined) return "—";
    const s = Math.max(0, ms) / 1000;
    if (s < 1) return `${Math.round(ms)} ms`;
    if (s < 120) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
    if (s < 7200) return `${(s / 60).toFixed(0)} min`;
    if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(0)} d`;
  }

  // A task row's run time: its last ended attempt's (the server's `durationMs`, the
  // number every view shows), or, while an attempt runs, the time since its lock.
  function runTime(t) {
    if (t.durationMs !== null && t.durationMs !== undefined) return span(t.durationMs);
    return t.state === "PROCESSING" && t.startedMs ? span(Date.now() - t.startedMs) : "—";
  }

  function time(ms) {
    if (!ms) return "—";
    return new Date(ms).toISOString().replace("T", " ").replace("Z", "").slice(0, 23);
  }

  const cost = (usd) => (typeof usd === "number" ? `$${usd.toFixed(4)}` : "—");
  const num = (n) => (typeof n === "number" ? n.toLocaleString("en") : "—");

  // A JSON value as a tree: objects and arrays of more than FOLD entries, and strings
  // longer than LONG characters, start folded.
  const FOLD = 12;
  const LONG = 400;
  function json(value, label) {
    const root = el("div", { class: "json" });
    root.appendChild(jsonNode(value, label, 0));
    return root;
  }

  function jsonNode(value, label, depth) {
    const key = label === undefined ? null : el("span", { class: "k" }, `${label}: `);
    if (value !== null && typeof value === "object") {
      const entries = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
      const open = entries.length <= FOLD && depth < 4;
      const kind = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
      const details = el("details", open ? { open: true } : {}, el("summary", {}, key, kind));
      for (const [k, v] of entries) details.appendChild(jsonNode(v, k, depth + 1));
      return details;
    }
    let shown;
    if (typeof value === "string") {
      if (value.length > LONG) {
        shown = el("details", {}, el("summary", {}, el("span", { class: "str" }, JSON.stringify(value.slice(0, 80)) + "…"), ` (${value.length} chars)`),
          el("span", { class: "str" }, JSON.stringify(value)));
      } else shown = el("span", { class: "str" }, JSON.stringify(value));
    } else if (typeof value === "number") shown = el("span", { class: "num" }, String(value));
    else shown = el("span", { class: "lit" }, String(value));
    return el("div", { class: "row" }, key, shown);
  }

  function table(headers, rows, attrs) {
    return el("table", attrs || {},
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.endsWith("#") ? "num" : null }, h.replace(/#$/, ""))))),
      el("tbody", {}, rows));
  }

  function kv(pairs) {
    const dl = el("dl", { class: "kv" });
    for (const [k, v] of pairs) {
      if (v === null || v === undefined || v === "") continue;
      dl.appendChild(el("dt", {}, k));
      dl.appendChild(el("dd", {}, v));
    }
    return dl;
  }

  async function post(action, payload) {
    const token = document.querySelector('meta[name="csrf-token"]').content;
    const response = await fetch(`/api/actions/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": token },
      body: JSON.stringify({ tenant: tenantParam(), ...payload }),
      credentials: "same-origin",
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.detail || `${response.status}`);
    return data;
  }

  const actionsOn = () => body.dataset.actions === "1";

  function actionButton(label, run, danger) {
    const out = el("span", { class: "muted action-result" });
    const button = el("button", { class: danger ? "danger" : null, type: "button", onclick: async () => {
      button.disabled = true;
      out.textContent = "…";
      // A refusal stays on screen: only a change done is worth drawing the page again.
      let done = false;
      try { out.textContent = await run(); done = true; } catch (e) { out.textContent = `refused: ${e.message}`; }
      button.disabled = false;
      if (done) AQ.refresh();
    } }, label);
    return el("span", {}, button, " ", out);
  }

  return { el, append, badge, ago, span, runTime, time, cost, num, json, table, kv, post, actionsOn,
    actionButton, jobHref, taskHref, withTenant, tenantParam, pages: {}, refresh: () => {} };
})();
