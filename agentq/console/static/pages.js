// agentq console: the jobs list, a job, standalone tasks, dead letters, queues and workers.
"use strict";

(() => {
  const { el, badge, table } = AQ;
  const STATES = ["PENDING", "BLOCKED", "PROCESSING", "RETRYING", "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NOT_CREATED"];

  // Finished tasks by how they ended: completed green, failed or timed out red,
  // cancelled grey, so a failed job never reads as all green.
  function progress(j) {
    const failed = (j.failed || 0) + (j.timedOut || 0);
    const cancelled = j.cancelled || 0;
    const completed = Math.max(0, j.done - failed - cancelled);
    const part = (count, cls) => {
      const bar = el("span", { class: cls });
      bar.style.width = `${j.total ? (100 * count) / j.total : 0}%`;
      return bar;
    };
    return el("span", { class: "progress", title: `${completed} completed, ${failed} failed, ${cancelled} cancelled of ${j.total}` },
      part(completed, "ok"), part(failed, "bad"), part(cancelled, "off"));
  }

  // The search and filter fields a list page shares; the server echoes back the values
  // it accepted (data.filters), and the form is a GET, so a search is a shareable URL.
  function filterForm(action, data, states, idLabel) {
    const f = data.filters || {};
    const field = (name, label, size, hint) => el("label", {}, label,
      el("input", { name, value: f[name] || "", size, placeholder: hint || "" }));
    return el("form", { class: "filters", method: "get", action, id: "filters" },
      el("label", {}, "tenant", el("input", { name: "tenant", value: data.tenant, size: 14 })),
      field("q", idLabel, 18, "part of the id"),
      el("label", {}, "state", el("select", { name: "state" },
        ["ALL", ...states].map((s) => el("option", { value: s, selected: (f.state || "ALL") === s }, s)))),
      field("definition", "definition", 14),
      field("since", "from", 17, "2026-12-01T09:30"),
      field("until", "to", 17, "UTC"),
      el("button", { type: "submit" }, "Search"),
      el("a", { href: `${action}?tenant=${encodeURIComponent(data.tenant)}` }, "clear"));
  }

  AQ.pages.jobs = (data) => {
    const params = new URLSearchParams(location.search);
    const form = filterForm("/jobs", data, ["RUNNING", "COMPLETED", "FAILED"], "job id");
    const rows = data.jobs.map((j) => el("tr", { "data-job": j.jobId },
      el("td", {}, el("a", { href: AQ.jobHref(j.jobId, data.tenant) }, j.jobId), j.name ? el("div", { class: "muted" }, j.name) : null),
      el("td", {}, badge(j.state)),
      el("td", {}, progress(j), ` ${j.done}/${j.total}`),
      el("td", { class: "num" }, String(j.failed + j.timedOut)),
      el("td", { class: "num" }, String(j.cancelled)),
      el("td", { class: "num" }, AQ.cost(j.costUsd)),
      el("td", {}, AQ.ago(j.createdMs))));
    const pager = el("div", { class: "pager" });
    if (params.get("cursor")) {
      params.delete("cursor");
      pager.appendChild(el("a", { href: `/jobs?${params}` }, "« first page"));
    }
    if (data.next) {
      params.set("cursor", data.next);
      params.set("tenant", data.tenant);
      pager.appendChild(el("a", { href: `/jobs?${params}`, id: "next-page" }, "next page »"));
    }
    return el("section", {}, el("h1", {}, "Jobs"), form,
      data.jobs.length ? table(["job", "state", "progress", "failures#", "cancelled#", "cost#", "age"], rows, { id: "jobs" })
        : el("p", { class: "muted" }, "no jobs"), pager);
  };

  // Tasks submitted on their own (agentq submit, the producer API), newest first.
  AQ.pages.tasks = (data) => {
    const form = filterForm("/tasks", data, ["SCHEDULED", "BLOCKED", "PENDING", "PROCESSING", "RETRYING",
      "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"], "request id");
    const searching = Boolean(data.filters);
    const rows = data.tasks.map((t) => el("tr", { "data-request": t.requestId },
      el("td", {}, el("a", { href: AQ.taskHref(t.requestId, data.tenant) }, t.requestId)),
      el("td", {}, t.definition || ""),
      el("td", {}, badge(t.state)),
      el("td", { class: "num" }, String(t.attempt || 0)),
      el("td", { class: "num" }, AQ.runTime(t)),
      el("td", { class: "num" }, AQ.cost(t.costUsd)),
      el("td", {}, t.createdMs ? AQ.ago(t.createdMs) : ""),
      el("td", {}, t.errorCategory ? `${t.errorCategory}: ${t.errorMessage || ""}` : (t.cancelReason || ""))));
    let older = null;
    if (searching) {
      older = el("p", { class: "muted", id: "search-extent" }, data.more
        ? `${data.tasks.length} shown, searched the newest ${data.scanned} task events in the range: narrow the time range to search further back.`
        : `${data.tasks.length} found, every task event in the range searched.`);
    } else if (data.more) {
      older = el("p", { class: "muted" }, `From the tenant's newest ${data.scanned} events; an older task opens at /tasks/ID.`);
    }
    return el("section", {}, el("h1", {}, "Tasks"),
      el("p", { class: "muted" }, "Tasks submitted on their own; a job's tasks are on its page (a whole request id finds any task)."), form,
      data.tasks.length ? table(["request id", "definition", "state", "attempts#", "duration#", "cost#", "age", "why"], rows, { id: "standalone" })
        : el("p", { class: "muted" }, searching ? "no task matches" : "no tasks submitted on their own"), older);
  };

  // Retry one FAILED or TIMEOUT task of a job; the page's nonce makes a double click one retry.
  function retryButton(job, t) {
    if (!AQ.actionsOn() || !["FAILED", "TIMEOUT"].includes(t.state)) return null;
    return el("div", { class: "retry" }, AQ.actionButton("Retry", async () => {
      const nonce = document.querySelector('meta[name="form-nonce"]').content;
      const r = await AQ.post("retry", { jobId: job.jobId, key: t.key, tenant: job.tenant, nonce });
      return `retried: ${r.state}, job ${r.jobState}`;
    }));
  }

  AQ.pages.job = (data) => {
    const job = data.job;
    const counts = {};
    for (const t of data.tasks) counts[t.state] = (counts[t.state] || 0) + 1;
    // From the tasks' own STATE items: the job's counters move only when the dispatcher
    // has seen each terminal event, a moment later.
    const finished = data.tasks.filter((t) => ["COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"].includes(t.state)).length;
    const spent = data.tasks.reduce((sum, t) => sum + (t.costUsd || 0), 0);
    const legend = el("div", { class: "legend" }, STATES.filter((s) => counts[s]).map((s) => el("span", {}, badge(s), ` ${counts[s]}`)));
    const actions = AQ.actionsOn() && job.state === "RUNNING"
      ? el("p", {}, AQ.actionButton("Cancel tasks not started", async () => {
        const r = await AQ.post("cancel", { jobId: job.jobId, tenant: job.tenant });
        return `cancelled ${r.cancelled.length}`;
      }, true)) : null;
    const tasks = data.tasks.map((t) => el("tr", { "data-key": t.key },
      el("td", {}, t.requestId ? el("a", { href: AQ.taskHref(t.requestId, job.tenant) }, t.key) : t.key),
      el("td", {}, t.definition),
      el("td", {}, badge(t.state)),
      el("td", { class: "num" }, String(t.attempt || 0)),
      el("td", {}, (t.dependsOn || []).join(", ")),
      el("td", { class: "num" }, AQ.runTime(t)),
      el("td", { class: "num" }, AQ.cost(t.costUsd)),
      el("td", {}, t.errorCategory ? `${t.errorCategory}: ${t.errorMessage || ""}` : (t.cancelReason || ""),
        retryButton(job, t))));
    const events = data.events.map((e) => el("tr", {}, el("td", {}, AQ.time(e.timestampMs)), el("td", {}, e.detailType), el("td", {}, AQ.json(e.payload))));
    return el("section", {},
      el("h1", {}, "Job ", el("span", { id: "job-id" }, job.jobId), " ", badge(job.state)),
      job.name ? el("p", { class: "muted" }, job.name) : null,
      el("div", { class: "summary" },
        el("div", {}, el("b", { id: "done" }, `${finished}/${job.total}`), "done"),
        el("div", {}, el("b", {}, AQ.cost(Math.max(spent, job.costUsd))), job.closedMs ? "cost" : "cost so far"),
        el("div", {}, el("b", {}, job.failurePolicy), "failure policy"),
        el("div", {}, el("b", {}, AQ.span((job.closedMs || Date.now()) - job.createdMs)), job.closedMs ? "took" : "running for"),
        el("div", {}, el("b", {}, job.tenant), "tenant")),
      el("p", { id: "why" }, data.why), actions,
      el("h2", {}, "DAG"), legend, AQ.dag.draw(data.tasks, job.tenant),
      el("h2", {}, "Timeline"), AQ.dag.timeline(data.tasks, job, job.tenant),
      el("h2", {}, "Tasks"), table(["task", "definition", "state", "attempts#", "depends on", "duration#", "cost#", "why"], tasks, { id: "tasks" }),
      el("h2", {}, "Job events"), events.length ? table(["time", "event", "payload"], events) : el("p", { class: "muted" }, "none yet"));
  };

  const selected = new Set();
  let outcomes = []; // the last action's results survive the redraws that follow it
  AQ.pages.dlq = (data) => {
    const known = new Set(data.letters.map((l) => l.key));
    for (const key of [...selected]) if (!known.has(key)) selected.delete(key);
    const rows = data.letters.map((l) => el("tr", { "data-key": l.key, "data-request": l.requestId || "" },
      el("td", {}, el("input", { type: "checkbox", checked: selected.has(l.key), "aria-label": "select",
        onchange: (e) => (e.target.checked ? selected.add(l.key) : selected.delete(l.key)) })),
      el("td", {}, AQ.time(l.archivedMs)),
      el("td", {}, l.requestId ? el("a", { href: AQ.taskHref(l.requestId, l.tenant) }, l.requestId) : el("span", { class: "muted" }, "(malformed)")),
      el("td", {}, l.tenant || "—"),
      el("td", {}, l.outcome, l.detail ? el("div", { class: "muted" }, l.detail) : null),
      el("td", { class: "num" }, l.receives || "?"),
      el("td", { class: "redriven" }, l.redrivenMs ? `redriven ${AQ.ago(l.redrivenMs)} (${l.redriveCount}×)` : "not redriven"),
      el("td", {}, el("details", {}, el("summary", {}, "body"), el("pre", {}, l.body + (l.bodyTruncated ? "…" : ""))))));
    const result = el("div", { id: "dlq-result", class: "muted" }, outcomes.map((x) => el("div", {}, `${x.outcome}: ${x.requestId || x.key} ${x.detail || ""}`)));
    const act = (name) => async () => {
      if (!selected.size) return "select one or more letters first";
      const r = await AQ.post(name, { keys: [...selected] });
      selected.clear();
      outcomes = r.results;
      return `${name}: ${r.results.length} done`;
    };
    const buttons = AQ.actionsOn() ? el("p", { id: "dlq-actions" }, AQ.actionButton("Redrive selected", act("redrive")), " ",
      AQ.actionButton("Discard selected", act("discard"), true))
      : el("p", { class: "muted" }, "read-only: start the console with --allow-actions to redrive or discard");
    return el("section", {}, el("h1", {}, "Dead letters"),
      el("p", { class: "muted" }, "Archived by the dlq-processor; redrive replays the newest letter of a task with a fresh attempt budget."),
      buttons, result,
      data.total > data.letters.length
        ? el("p", { id: "dlq-shown", class: "muted" }, `showing the newest ${data.letters.length} of ${data.total} (agentq dlq list shows them all)`) : null,
      data.letters.length ? table(["", "archived", "task", "tenant", "outcome / reason", "receives#", "redrive", ""], rows, { id: "letters" })
        : el("p", { class: "muted" }, "no dead letters"));
  };

  AQ.pages.queues = (data) => {
    const queues = data.queues.map((q) => el("tr", {}, el("td", {}, q.name), el("td", { class: "num" }, AQ.num(q.depth)),
      el("td", { class: "num" }, AQ.num(q.inFlight)), el("td", { class: "num" }, AQ.num(q.delayed)),
      el("td", { class: "num" }, typeof q.oldestAgeS === "number" ? AQ.span(q.oldestAgeS * 1000) : "—")));
    const workers = data.workers.map((w) => el("tr", { "data-worker": w.worker }, el("td", {}, w.worker), el("td", {}, badge(w.status.toUpperCase())),
      el("td", { class: "num" }, w.slots === null ? "?" : String(w.slots)), el("td", { class: "num" }, String(w.busy)), el("td", {}, w.version || "?"),
      el("td", {}, AQ.ago(w.lastSeenMs || w.lastHeartbeatMs)), el("td", { class: "num" }, String(w.stale)),
      el("td", {}, w.tasks.slice(0, 10).map((t) => el("a", { href: AQ.taskHref(t.requestId, t.tenant) }, `${t.requestId} `)))));
    const types = ["Task Processing Started", "Task Completed", "Task Failed", "Task Timeout"];
    const peak = Math.max(1, ...data.rates.flatMap((m) => types.map((t) => m[t])));
    const rates = data.rates.map((m) => el("tr", {}, el("td", {}, AQ.time(m.minuteMs).slice(11, 16)),
      types.map((t) => { const bar = el("span"); bar.style.width = `${(60 * m[t]) / peak}px`; return el("td", { class: "bars" }, bar, ` ${m[t]}`); })));
    const oldest = data.oldestWaitingMs || {};
    return el("section", {}, el("h1", {}, "Queues and workers"),
      table(["queue", "visible#", "in flight#", "delayed#", "oldest message#"], queues, { id: "queues" }),
      AQ.kv([["oldest PENDING task", AQ.span(oldest.PENDING)], ["oldest RETRYING task", AQ.span(oldest.RETRYING)]]),
      el("h2", {}, "Workers"),
      data.workers.length ? table(["worker", "status", "slots#", "busy slots#", "version", "last seen", "stale leases#", "running"], workers, { id: "workers" })
        : el("p", { class: "muted" }, "no worker has been seen"),
      el("h2", {}, "Last minutes"), table(["minute", "started", "completed", "failed", "timed out"], rates, { id: "rates" }));
  };
})();
