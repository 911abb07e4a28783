// agentq console: one task: input, result, error, attempts, agent trace, conversation, logs, events.
"use strict";

(() => {
  const { el, badge, table, kv } = AQ;
  const TERMINAL = ["COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"];

  function objectHref(requestId, tenant, name) {
    return `/api/tasks/${encodeURIComponent(requestId)}/object?tenant=${encodeURIComponent(tenant)}&name=${encodeURIComponent(name)}`;
  }

  function attempts(list, ended, counted) {
    // The STATE item counts an attempt as it locks; its events reach the table later
    // (EventBridge, then the save-event Lambda), so they may not be stored yet.
    const none = counted > 0 ? `attempt ${counted} locked; its events are not stored yet`
      : ended ? "no attempt ran" : "no attempt yet";
    if (!list.length) return el("p", { class: "muted", id: "attempts" }, none);
    const t0 = Math.min(...list.map((a) => a.startedMs || a.endedMs || Date.now()));
    const t1 = Math.max(...list.map((a) => a.endedMs || Date.now()));
    const rows = list.map((a) => {
      const bar = el("span", { class: `s-${a.exit === "Task Completed" ? "COMPLETED" : a.exit ? "FAILED" : "PROCESSING"}` });
      const start = a.startedMs || t0;
      bar.style.left = `${(100 * (start - t0)) / Math.max(1, t1 - t0)}%`;
      bar.style.width = `${(100 * ((a.endedMs || Date.now()) - start)) / Math.max(1, t1 - t0)}%`;
      return el("tr", { "data-attempt": a.attempt },
        el("td", { class: "num" }, String(a.attempt)), el("td", {}, a.worker || "—"), el("td", {}, AQ.time(a.startedMs)),
        el("td", { class: "num" }, a.durationMs !== undefined ? AQ.span(a.durationMs) : "—"),
        el("td", {}, a.exit || "running"), el("td", {}, a.category || ""),
        el("td", {}, a.fenced ? "lease fenced" : a.leaseUntil ? `lease to ${AQ.time(a.leaseUntil).slice(11)}` : ""),
        el("td", { class: "tl-cell" }, el("div", { class: "tl-track" }, bar)));
    });
    return table(["attempt#", "worker", "started", "duration#", "exit", "category", "fence", "timeline"], rows, { id: "attempts" });
  }

  function trace(t) {
    if (!t) return el("p", { class: "muted", id: "trace" }, "no agent trace (not an agent task, or not finished)");
    const usage = t.usage || {};
    // The attempt's outcome first: the CLI can answer "success" with an output agentq
    // then refused (it failed the schema), so its result alone would mislead.
    const outcome = t.outcome ? (t.error ? `${t.outcome} (${t.error.category}: ${t.error.message || ""})` : t.outcome) : null;
    const totals = kv([
      ["outcome", outcome],
      ["turns", AQ.num(t.num_turns)], ["cost", AQ.cost(t.cost_usd)], ["model time", AQ.span(t.duration_ms)],
      ["input tokens", AQ.num(usage.input_tokens)], ["output tokens", AQ.num(usage.output_tokens)],
      ["cache read", AQ.num(usage.cache_read_input_tokens)], ["cache written", AQ.num(usage.cache_creation_input_tokens)],
      ["cache efficiency", t.cache_efficiency_pct !== undefined ? `${t.cache_efficiency_pct}%` : null],
      ["session", t.session_id], ["the CLI's result", t.result_subtype]]);
    const turns = (t.turns || []).map((turn, i) => el("tr", {}, el("td", { class: "num" }, String(i + 1)), el("td", { class: "num" }, String(turn.attempt)),
      el("td", { class: "num" }, AQ.span(turn.at_ms)), el("td", { class: "num" }, AQ.num(turn.usage?.input_tokens)),
      el("td", { class: "num" }, AQ.num(turn.usage?.output_tokens)), el("td", { class: "num" }, AQ.num(turn.usage?.cache_read_input_tokens)),
      el("td", {}, (turn.tools || []).join(", ")), el("td", { class: "problem" }, turn.error || "")));
    const calls = (t.tool_calls || []).map((c) => el("tr", {}, el("td", {}, c.name), el("td", {}, c.status), el("td", { class: "num" }, String(c.attempt)),
      el("td", { class: "num" }, AQ.span(c.started_ms)), el("td", { class: "num" }, c.duration_ms !== null ? AQ.span(c.duration_ms) : "—"),
      el("td", { class: "num" }, AQ.num(c.input_bytes)), el("td", { class: "num" }, AQ.num(c.output_bytes))));
    return el("div", { id: "trace" }, totals,
      el("h3", {}, `Turns (${turns.length})`), turns.length ? table(["#", "attempt#", "at#", "in#", "out#", "cache read#", "tools", "error"], turns, { id: "turns" }) : el("p", { class: "muted" }, "none"),
      el("h3", {}, `Tool calls (${calls.length})`), calls.length ? table(["tool", "status", "attempt#", "at#", "took#", "input bytes#", "output bytes#"], calls, { id: "tool-calls" }) : el("p", { class: "muted" }, "none"),
      (t.todos || []).length ? el("div", {}, el("h3", {}, "Todos"), AQ.json(t.todos)) : null);
  }

  // The conversation is loaded on its own, after the page is drawn: one request per
  // change of the task's state or attempt, not one per poll. Every string in it came
  // from the model, a tool or the task's input: it becomes text nodes only (AQ.el).
  const conversations = new Map();
  const KIND = { prompt: "prompt", resume: "↻ resumed here", follow_up: "follow-up (continuation)",
    assistant: "assistant", tool_results: "tool results", user: "user" };

  function conversationHref(requestId, tenant) {
    return `/api/tasks/${encodeURIComponent(requestId)}/conversation?tenant=${encodeURIComponent(tenant)}`;
  }

  function block(b) {
    const head = b.kind === "tool_call" ? `→ ${b.tool || "?"}` : b.kind === "tool_result" ? `← ${b.tool || "tool"}${b.is_error ? " (error)" : ""}` : null;
    return el("div", { class: `block ${b.kind}` }, head ? el("span", { class: "tool" }, head) : null,
      el("pre", {}, b.text), b.cut_chars ? el("span", { class: "muted" }, `… ${AQ.num(b.cut_chars)} more characters`) : null);
  }

  function drawConversation(c) {
    if (c.error) return el("p", { class: "problem" }, c.detail || c.error);
    const parts = new Map((c.attempts || []).map((a) => [a.attempt, a]));
    const nodes = [];
    if (c.continues) nodes.push(el("p", { class: "muted" }, `continues task ${c.continues}: the turns before the follow-up are its conversation`));
    if (c.note) nodes.push(el("p", { class: "muted", id: "conversation-note" }, c.note));
    let attempt = null;
    let previous = null;
    for (const turn of c.turns || []) {
      if (previous !== null && turn.index > previous + 1) nodes.push(el("p", { class: "muted gap" }, `… ${turn.index - previous - 1} turns not shown …`));
      if (turn.attempt !== attempt) {
        attempt = turn.attempt;
        const part = parts.get(attempt) || {};
        const how = part.resumed ? " · resumed from an earlier attempt's checkpoint" : part.fresh_session ? " · started afresh" : "";
        nodes.push(el("h3", { class: "attempt-boundary", "data-attempt": attempt }, `Attempt ${attempt}${how}`));
      }
      nodes.push(el("div", { class: `turn ${turn.kind}`, "data-kind": turn.kind, "data-attempt": turn.attempt },
        el("span", { class: turn.kind === "resume" ? "resume-marker" : "who" }, KIND[turn.kind] || turn.kind), turn.blocks.map(block)));
      previous = turn.index;
    }
    for (const part of c.attempts || []) {
      if (part.problem) nodes.push(el("p", { class: "muted" }, `attempt ${part.attempt}: ${part.problem}`));
    }
    if (c.omitted_turns) nodes.push(el("p", { class: "muted" }, `${c.total_turns} turns in all, ${c.omitted_turns} not shown`));
    if (c.skipped_lines) nodes.push(el("p", { class: "muted" }, `${c.skipped_lines} unreadable transcript lines skipped`));
    return nodes;
  }

  function conversation(t) {
    const holder = el("div", { id: "conversation", "data-loaded": "0" });
    const key = `${t.requestId}|${t.tenant}|${t.state}|${t.attempt}`;
    const show = (node, c) => { node.replaceChildren(...[drawConversation(c)].flat()); node.dataset.loaded = "1"; };
    const known = conversations.get(t.requestId);
    if (known && known.data) show(holder, known.data);
    else holder.append(el("p", { class: "muted" }, "loading…"));
    if (!known || known.key !== key) {
      const entry = { key, data: known ? known.data : null };
      conversations.set(t.requestId, entry);
      fetch(conversationHref(t.requestId, t.tenant), { credentials: "same-origin", cache: "no-store" })
        .then((r) => r.json())
        .then((c) => {
          entry.data = c;
          // The page may have been drawn again meanwhile: fill the section it shows now.
          const live = document.getElementById("conversation");
          if (live) show(live, c);
        })
        .catch(() => { entry.key = null; });
    }
    return holder;
  }

  AQ.pages.task = (data) => {
    const t = data.task;
    const art = data.artifacts || {};
    const buttons = [];
    if (AQ.actionsOn()) {
      if (["BLOCKED", "PENDING", "RETRYING"].includes(t.state)) {
        buttons.push(AQ.actionButton("Cancel", async () => {
          const r = await AQ.post("cancel", { requestId: t.requestId, tenant: t.tenant });
          return r.cancelled.length ? "cancelled" : "not cancelled (it started or finished)";
        }, true));
      }
      // A message rejected at receive names no definition: nothing to run again.
      if (TERMINAL.includes(t.state) && t.definition) {
        buttons.push(AQ.actionButton("Resubmit as a new task", async () => {
          // The page's nonce: pressing again, or a retried request, gives the same task.
          const nonce = document.querySelector('meta[name="form-nonce"]').content;
          const r = await AQ.post("resubmit", { requestId: t.requestId, tenant: t.tenant, nonce });
          location.href = AQ.taskHref(r.requestId, t.tenant);
          return `submitted ${r.requestId}`;
        }));
      }
      // A completed agent task's session goes on in a new task: the follow-up is its next turn.
      if (t.continuable) {
        const prompt = el("textarea", { id: "follow-up", rows: "2", cols: "60", placeholder: "a follow-up question" });
        buttons.push(el("span", { id: "continue" }, prompt, " ", AQ.actionButton("Continue with a follow-up", async () => {
          const nonce = document.querySelector('meta[name="form-nonce"]').content;
          const r = await AQ.post("continue", { requestId: t.requestId, tenant: t.tenant, prompt: prompt.value, nonce });
          location.href = AQ.taskHref(r.requestId, t.tenant);
          return `submitted ${r.requestId}`;
        })));
      }
    }
    // Whether a retryable error was retried, and why not when it was not.
    function retryNote(state, error) {
      if (state === "TIMEOUT") return " (its deadline passed: a timeout ends the task, not retried)";
      if (!error.retryable) return " (not retryable)";
      if (state === "RETRYING") return " (retryable: another attempt follows)";
      if (state === "FAILED") return " (retryable, but no attempt was left)";
      return " (retryable)";
    }
    // A completed task may still carry the error of an earlier, retried attempt.
    const earlier = t.state === "COMPLETED";
    const error = data.error ? el("div", { id: "error" }, el("p", { class: earlier ? "muted" : "problem" },
      earlier ? "an earlier attempt failed: " : [badge(t.state), " "],
      `${data.error.category || "?"}${retryNote(t.state, data.error)}: `, data.error.message || "",
      data.error.exception_type ? ` [${data.error.exception_type}]` : "")) : null;
    const logs = (art.logs || []).map((l) => el("div", { class: "log" }, el("h3", {}, l.name, l.truncated ? " (last 256 KB)" : ""), el("pre", {}, l.text || "(empty)")));
    const objects = (art.objects || []).map((o) => el("li", {}, el("a", { href: objectHref(t.requestId, t.tenant, o.name) }, o.name), ` ${AQ.num(o.size)} bytes`));
    const events = data.events.map((e) => el("tr", {}, el("td", {}, AQ.time(e.timestampMs)), el("td", {}, e.detailType),
      el("td", { class: "num" }, String(e.attempt || 0)), el("td", {}, e.workerId || ""), el("td", {}, AQ.json(e.payload))));
    return el("section", {},
      el("h1", {}, "Task ", el("span", { id: "request-id" }, t.requestId), " ", el("span", { id: "task-state" }, badge(t.state))),
      kv([["definition", t.definition], ["tenant", t.tenant],
        ["job", t.jobId ? el("a", { href: AQ.jobHref(t.jobId, t.tenant) }, `${t.jobId} / ${t.taskKey || ""}`) : null],
        ["resume on retry", typeof t.resume === "boolean" ? (t.resume ? "on for this task" : "off for this task") : null],
        ["attempts", String(t.attempt)], ["worker", t.owner], ["created", t.createdAt], ["started", t.startedAt], ["finished", t.finishedAt],
        ["duration", t.durationMs !== null ? AQ.span(t.durationMs) : null], ["cost", AQ.cost(t.costUsd)], ["cancelled because", t.cancelReason]]),
      data.waiting ? el("p", { id: "waiting", class: "waiting" }, data.waiting) : null,
      buttons.length ? el("p", {}, buttons) : null, error,
      el("h2", {}, "Input"), el("div", { id: "input" }, AQ.json(data.input)),
      el("h2", {}, "Result"), el("div", { id: "result" }, art.resultState === "loaded" ? AQ.json(art.result) : el("p", { class: "muted" }, art.resultState || "none")),
      el("h2", {}, "Attempts"), attempts(data.attempts, TERMINAL.includes(t.state), t.attempt || 0),
      el("h2", {}, "Agent trace"), trace(art.trace),
      t.definition ? el("div", {}, el("h2", {}, "Conversation"), conversation(t)) : null,
      el("h2", {}, "Logs"), logs.length ? el("div", { id: "logs" }, logs) : el("p", { class: "muted", id: "logs" }, TERMINAL.includes(t.state) ? "no logs" : "no logs yet"),
      el("h2", {}, "Objects"), el("p", { class: "muted" }, art.location || ""), el("ul", { id: "objects" }, objects),
      el("h2", {}, "Events"), table(["time", "event", "attempt#", "worker", "payload"], events, { id: "events" }));
  };
})();
