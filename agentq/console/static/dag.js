// agentq console: a job's DAG as SVG, and its tasks on a timeline.
// Layout: a task's column is its longest path from a root; a column taller than
// ROWS tasks wraps into side-by-side sub-columns, so a 200-task fan-out stays a
// readable grid instead of a 5,000-pixel strip.
"use strict";

AQ.dag = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const W = 150, H = 22, GAP_Y = 6, GAP_X = 56, SUB_GAP = 12, ROWS = 25, PAD = 10;

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function levels(tasks) {
    const byKey = new Map(tasks.map((t) => [t.key, t]));
    const level = new Map();
    const visit = (key, seen) => {
      if (level.has(key)) return level.get(key);
      if (seen.has(key)) return 0; // a cycle cannot be stored; stay safe anyway
      seen.add(key);
      const deps = (byKey.get(key)?.dependsOn || []).filter((d) => byKey.has(d));
      const value = deps.length ? 1 + Math.max(...deps.map((d) => visit(d, seen))) : 0;
      level.set(key, value);
      return value;
    };
    tasks.forEach((t) => visit(t.key, new Set()));
    return level;
  }

  function layout(tasks) {
    const level = levels(tasks);
    const columns = [];
    for (const t of tasks) (columns[level.get(t.key)] ||= []).push(t);
    const pos = new Map();
    let x = PAD, height = 0;
    columns.forEach((column) => {
      // Order by the parents' rows (one barycentre pass) to untangle edges; each rank
      // is computed once, not once per comparison.
      const ranks = new Map(column.map((t) => [t.key, rank(t)]));
      column.sort((a, b) => ranks.get(a.key) - ranks.get(b.key) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
      const subs = Math.ceil(column.length / ROWS);
      column.forEach((t, i) => {
        const sub = Math.floor(i / ROWS), row = i % ROWS;
        pos.set(t.key, { x: x + sub * (W + SUB_GAP), y: PAD + row * (H + GAP_Y) });
      });
      height = Math.max(height, Math.min(column.length, ROWS) * (H + GAP_Y));
      x += subs * (W + SUB_GAP) - SUB_GAP + GAP_X;
    });
    function rank(t) {
      let sum = 0, n = 0;
      for (const d of t.dependsOn || []) {
        const p = pos.get(d);
        if (p) { sum += p.y * 1000 + p.x; n += 1; }
      }
      return n ? sum / n : 0;
    }
    return { pos, width: x - GAP_X + PAD, height: height + 2 * PAD };
  }

  // One pass over the tasks, into a detached tree the caller attaches once: every edge
  // is a segment of a single path (one node, not one per edge: a fan-in of 200 tasks
  // would otherwise be 200 curves to style and paint), then the nodes.
  function draw(tasks, tenant) {
    const { pos, width, height } = layout(tasks);
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "job DAG" });
    const segments = [];
    for (const t of tasks) {
      const to = pos.get(t.key);
      for (const d of t.dependsOn || []) {
        const from = pos.get(d);
        if (!from || !to) continue;
        const x1 = from.x + W, y1 = from.y + H / 2, x2 = to.x, y2 = to.y + H / 2, mx = (x1 + x2) / 2;
        segments.push(`M${x1},${y1}C${mx},${y1} ${mx},${y2} ${x2},${y2}`);
      }
    }
    if (segments.length) root.appendChild(svg("path", { class: segments.length > 120 ? "edge many" : "edge", d: segments.join("") }));
    for (const t of tasks) {
      const p = pos.get(t.key);
      const g = svg("g", { class: `task s-${t.state}`, "data-key": t.key, "data-state": t.state, "data-attempt": t.attempt || 0 });
      const a = t.requestId ? svg("a", { href: AQ.taskHref(t.requestId, tenant) }) : g;
      a.appendChild(svg("title", {}, `${t.key} · ${t.state} · attempt ${t.attempt || 0}${t.errorCategory ? ` · ${t.errorCategory}` : ""}`));
      a.appendChild(svg("rect", { class: `node s-${t.state}`, x: p.x, y: p.y, width: W, height: H, rx: 4 }));
      const label = t.key.length > 17 ? `${t.key.slice(0, 16)}…` : t.key;
      a.appendChild(svg("text", { x: p.x + 6, y: p.y + 15 }, label));
      if ((t.attempt || 0) > 1) a.appendChild(svg("text", { x: p.x + W - 24, y: p.y + 15 }, `×${t.attempt}`));
      if (a !== g) g.appendChild(a);
      root.appendChild(g);
    }
    return AQ.el("div", { class: "dag", id: "dag" }, root);
  }

  // Each task a bar from start to finish (waiting time before it in grey), on one scale.
  function timeline(tasks, job, tenant) {
    const now = Date.now();
    const rows = tasks.filter((t) => t.createdMs).sort((a, b) => (a.startedMs || a.createdMs) - (b.startedMs || b.createdMs));
    const t0 = Math.min(job.createdMs || now, ...rows.map((t) => t.createdMs));
    const t1 = Math.max(job.closedMs || now, ...rows.map((t) => t.finishedMs || (t.startedMs ? now : t.createdMs)));
    const scale = (ms) => `${(100 * (ms - t0)) / Math.max(1, t1 - t0)}%`;
    const width = (a, b) => `${(100 * Math.max(0, b - a)) / Math.max(1, t1 - t0)}%`;
    const box = AQ.el("div", { class: "timeline", id: "timeline" });
    for (const t of rows) {
      const track = AQ.el("div", { class: "tl-track" });
      const start = t.startedMs || null;
      const end = t.finishedMs || (t.state === "PROCESSING" ? now : null);
      const wait = AQ.el("span", { class: "wait" });
      wait.style.left = scale(t.createdMs);
      wait.style.width = width(t.createdMs, start || end || now);
      track.appendChild(wait);
      if (start) {
        const bar = AQ.el("span", { class: `s-${t.state}`, title: `${t.key}: ${AQ.span((end || now) - start)}` });
        bar.style.left = scale(start);
        bar.style.width = width(start, end || now);
        track.appendChild(bar);
      }
      const label = t.requestId ? AQ.el("a", { href: AQ.taskHref(t.requestId, tenant) }, t.key) : t.key;
      box.appendChild(AQ.el("div", { class: "tl-row" }, AQ.el("span", { class: "label" }, label), track));
    }
    return AQ.el("div", {}, AQ.el("p", { class: "muted" }, `${AQ.time(t0)} → ${AQ.time(t1)} (${AQ.span(t1 - t0)})`), box);
  }

  return { draw, timeline, layout };
})();
