"""Rich tables for the benchmark results (one per benchmark) and the targets' verdicts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.table import Table

Data = Mapping[str, Any]


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for n, column in enumerate(columns):
        table.add_column(column, justify="left" if n == 0 else "right")
    return table


def _requests(d: Data) -> Table:
    t = _table(
        f"AWS requests per task ({d['tasks']} no-op tasks, concurrency {d['concurrency']})",
        "operation", "per task", "per task per heartbeat",
    )  # fmt: skip
    for row in d["operations"]:
        t.add_row(row["operation"], f"{row['per_task']:.3f}", f"{row['per_heartbeat']:.3f}")
    t.add_row("agentq total (without S3)", f"{d['per_task']:.2f} ({d['per_task_without_s3']:.2f})",
              f"{d['per_heartbeat']:.3f}")  # fmt: skip
    beat = d.get("heartbeat", {})
    if "per_task_interval" in beat:
        calls = ", ".join(f"{op.split(':')[1]} {n:.2f}" for op, n in beat["calls_per_beat"].items())
        t.add_row(f"  the heartbeat alone ({beat['held_per_beat']} held per beat; per beat: "
                  f"{calls}; PutEvents per event {beat['put_events_per_event']:.3f})",
                  "", f"{beat['per_task_interval']:.3f}")  # fmt: skip
    t.add_row("seed design", f"{d['seed_per_task']}", f"{d['seed_per_heartbeat']}")
    t.add_row("agentq ÷ seed (target ≤ 0.5 / ≤ 0.3 abs.)", f"{d['ratio_per_task']:.2f}",
              f"{d['ratio_per_heartbeat']:.2f}")  # fmt: skip
    return t


def _saturation(d: Data) -> Table:
    t = _table(
        f"slot saturation ({d['tasks']} tasks, {d['slots']} slots, 1 worker)",
        "durations / loop", "makespan s", "ideal s (measured)", "ratio", "ideal s (declared)",
        "ratio declared", "child start-up s",
    )  # fmt: skip
    for shape in ("even", "uneven"):
        for loop in ("agentq", "batch_then_wait"):
            r = d[shape][loop]
            t.add_row(f"{shape} / {loop}", f"{r['makespan_s']:.2f}", f"{r['ideal_measured_s']:.2f}",
                      f"{r['ratio']:.3f}", f"{r['ideal_declared_s']:.2f}",
                      f"{r['ratio_declared']:.2f}", f"{r['child_overhead_s']:.3f}")  # fmt: skip
    return t


def _latency(d: Data) -> Table:
    t = _table("dispatch latency (ms)", "path", "p50", "p95", "p99", "floor (raw AWS calls)")
    floor = d["floor_ms"]
    for concurrency in (1, 10):
        r = d.get(f"concurrency_{concurrency}")
        if r is None:
            continue
        for key, label, floor_key in (
            ("visible_to_child_started", "visible → child started", "dispatch_floor"),
            ("child_exit_to_deleted", "child exit → deleted", "settle_floor"),
        ):
            p = r[key]
            t.add_row(f"c={concurrency} {label}", f"{p['p50_ms']:.0f}", f"{p['p95_ms']:.0f}",
                      f"{p['p99_ms']:.0f}", f"{floor[floor_key]:.0f}")  # fmt: skip
    return t


def _throughput(d: Data) -> Table:
    t = _table(
        f"throughput ({d['tasks']} no-op tasks; raw receive→delete loop "
        f"{d['raw_tasks_per_s']} msg/s)",
        "workers", "slots", "tasks/s", "÷ raw loop",
    )  # fmt: skip
    for row in d["workers"]:
        t.add_row(str(row["workers"]), str(row["slots"]), f"{row['tasks_per_s']:.2f}",
                  f"{row['ratio_to_raw']:.3f}")  # fmt: skip
    return t


def _memory(d: Data) -> Table:
    t = _table(f"memory (RSS MB, {d['slots']} slots)", "process", "MB")
    t.add_row("worker idle", f"{d['worker_idle_mb']}")
    t.add_row("worker, all slots busy (children excluded)", f"{d['worker_busy_mb']}")
    t.add_row("python task child", f"{d['python_child_mb']}")
    agent = d.get("agent_child_mb")
    t.add_row("agent task child + Claude CLI", "skipped" if agent is None else f"{agent:.0f}")
    return t


def _lambda_import(d: Data) -> Table:
    # "ready" adds what the first invocation builds (boto3 and its clients), which the
    # handlers defer: the import figure alone would flatter them.
    t = _table(f"Lambda cold import (target ≤ {d['target_ms']:.0f} ms)", "module",
               "import ms", "ready ms", "heaviest direct imports")  # fmt: skip
    for row in d["modules"]:
        if "error" in row:
            t.add_row(row["module"], "error", "", row["error"][:60])
        else:
            ready = f"{row['ready_ms']:.0f}" if "ready_ms" in row else "—"
            t.add_row(row["module"], f"{row['import_ms']:.0f}", ready, ", ".join(row["heaviest"]))
    if "child" in d:  # the task child: no target, but on every task's latency
        child = d["child"]
        t.add_row(f"{child['module']} (task child)", f"{child['import_ms']:.0f}", "—",
                  ", ".join(child["heaviest"]))  # fmt: skip
    return t


def _agent(d: Data) -> Table:
    t = _table("agent task overhead (offline model server)", "measure", "value")
    for key in ("bare_wall_ms", "child_wall_ms", "overhead_ms", "overhead_pct",
                "overhead_beyond_isolation_pct", "child_peak_rss_mb",
                "child_with_cli_peak_rss_mb"):  # fmt: skip
        if key in d:
            t.add_row(key, f"{float(d[key]):.1f}")
    return t


def _chaos(d: Data) -> Table:
    t = _table("chaos: exactly-once under SIGKILL", "measure", "value")
    for key, value in d["summary"].items():
        t.add_row(key, str(value))
    return t


def _console(d: Data) -> Table:
    t = _table(f"console in chromium ({d['tasks']}-task job, {d['jobs']} jobs)",
               "page", "data drawn (ms)", "of it server (ms)", "AWS requests / refresh")  # fmt: skip
    t.add_row(f"job page ({d['tasks']} tasks)", f"{d['job_page_drawn_ms']:.0f}",
              f"{d['job_page_server_ms']:.0f}",
              f"{d['job_page_requests_total']} (bound {d['job_page_requests_bound']})")  # fmt: skip
    t.add_row("jobs list (50 a page)", f"{d['jobs_list_drawn_ms']:.0f}",
              f"{d['jobs_list_server_ms']:.0f}", f"{d['jobs_list_requests_total']} (bound 1)")  # fmt: skip
    t.add_row("jobs list (200 a page)", f"{d['jobs_list_200_drawn_ms']:.0f}", "", "")
    if "tasks_search_drawn_ms" in d:
        t.add_row(f"tasks search, id part + state ({d['searched_tasks']} tasks)",
                  f"{d['tasks_search_drawn_ms']:.0f}", f"{d['tasks_search_server_ms']:.0f}",
                  str(sum(d["tasks_search_requests"].values())))  # fmt: skip
        t.add_row("tasks search, state + definition", f"{d['tasks_by_state_drawn_ms']:.0f}", "", "")
    return t


def _priority(d: Data) -> Table:
    from bench.priority_report import table  # its own renderer, beside its figures

    return table(d)


def _resume(d: Data) -> Table:
    from bench.resume_report import table  # its own renderer, beside its figures

    return table(d)


def _reconcile(d: Data) -> Table:
    from bench.reconcile import table  # its own renderer, beside its figures

    result: Table = table(d)
    return result


RENDERERS: dict[str, Callable[[Data], Table]] = {
    "requests_per_task": _requests,
    "saturation": _saturation,
    "priority": _priority,
    "latency": _latency,
    "throughput": _throughput,
    "memory": _memory,
    "lambda_import": _lambda_import,
    "agent": _agent,
    "chaos": _chaos,
    "console": _console,
    "reconcile": _reconcile,
    "resume": _resume,
}


def table(name: str, data: Data) -> Table | str:
    if "skipped" in data:
        return f"{name}: skipped: {data['skipped']}"
    try:
        return RENDERERS[name](data)
    except (KeyError, TypeError, ValueError) as exc:
        return f"{name}: no table ({type(exc).__name__}: {exc})"


def verdicts(results: Mapping[str, Data]) -> Table:
    """The issue's targets, met or not."""
    t = _table("targets", "target", "measured", "met")
    checks: list[tuple[str, str, bool]] = []
    if "ratio_per_task" in results.get("requests_per_task", {}):
        r = results["requests_per_task"]
        checks.append(("requests/task ≤ 0.5 x seed", f"{r['ratio_per_task']:.2f}",
                       r["ratio_per_task"] <= 0.5))  # fmt: skip
        beat = r.get("heartbeat", {})
        if "per_task_interval" in beat:
            # The heartbeat's own calls and its events' share of PutEvents, with the ten
            # slots held together (bench.requests_per_task).
            checks.append((f"heartbeat requests/task/interval at {beat['held_per_beat']:.1f} "
                           "held ≤ 0.3", f"{beat['per_task_interval']:.3f}",
                           beat["per_task_interval"] <= 0.3))  # fmt: skip
    if "even" in results.get("saturation", {}):
        ratio = results["saturation"]["even"]["agentq"]["ratio"]
        checks.append(("saturation makespan ÷ ideal ≤ 1.10", f"{ratio:.3f}", ratio <= 1.10))
    for row in results.get("lambda_import", {}).get("modules", []):
        if "import_ms" in row:
            ready = f" (ready {row['ready_ms']:.0f} ms)" if "ready_ms" in row else ""
            checks.append((f"{row['module']} import ≤ 300 ms",
                           f"{row['import_ms']:.0f} ms{ready}", row["within_target"]))  # fmt: skip
    if "warm_overhead_pct" in results.get("agent", {}):
        a = results["agent"]
        checks.append(("agent task overhead ≤ 15% of a minimal CLI run (warm spare)",
                       f"{a['warm_overhead_pct']:.1f}%", a["warm_overhead_pct"] <= 15.0))  # fmt: skip
    if "job_page_drawn_ms" in results.get("console", {}):
        c = results["console"]
        worst = max(c["job_page_drawn_ms"], c["jobs_list_drawn_ms"],
                    c.get("tasks_search_drawn_ms", 0))  # fmt: skip
        checks.append((f"console job page ({c['tasks']} tasks), jobs list and tasks search "
                       "drawn ≤ 1 s",
                       f"{worst:.0f} ms", c["within_target"]))  # fmt: skip
        checks.append(("console AWS requests per refresh within bound",
                       f"{c['job_page_requests_total']} / {c['jobs_list_requests_total']}",
                       c["within_bound"]))  # fmt: skip
    if "modes" in results.get("priority", {}):
        from bench.priority_report import checks as priority_checks

        checks.extend(priority_checks(results["priority"]))
    if "resume_extra_pct_of_restart" in results.get("resume", {}):
        r = results["resume"]
        checks.append(("resume's extra tokens ≤ 40 % of restart's (agent task killed at a "
                       "random turn)", f"{r['resume_extra_pct_of_restart']:.1f} %", r["met"]))  # fmt: skip
    if "summary" in results.get("chaos", {}):
        n = results["chaos"]["summary"]["violations"]
        checks.append(("chaos violations = 0", str(n), n == 0))
    for label, measured, met in checks:
        t.add_row(label, measured, "yes" if met else "[red]no[/red]")
    return t
