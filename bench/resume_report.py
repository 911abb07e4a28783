"""The resume benchmark's figures from its raw records, their checks, and its table.

Tokens are every token a request's usage names (input, cache creation, cache reads,
output): what the model read and wrote. A kill arm's extra tokens are its task's total
over the same task's clean run; resume's share is its extra over restart's, summed over
the tasks (target: at most 40 %). Wall time after the kill runs from the SIGKILL to the
`Task Completed` the bench saw; the retry starts at its first model request.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

from rich.table import Table

ARMS: Final = ("clean", "resume", "restart")
TARGET_PCT: Final = 40.0
USAGE_FIELDS: Final = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)


def tokens(requests: Sequence[Mapping[str, Any]]) -> int:
    return sum(int((r.get("usage") or {}).get(f, 0)) for r in requests for f in USAGE_FIELDS)


def _median(values: Sequence[float]) -> float:
    return round(float(statistics.median(values)), 3) if values else float("nan")


def _killed_task(task: Mapping[str, Any], clean: Mapping[str, Any], k: int) -> dict[str, Any]:
    """One killed task's figures and what it broke."""
    after = [r for r in task["requests"] if r["received_at"] > task["killed"]]
    total = tokens(task["requests"])
    figures: dict[str, Any] = {
        "kill_turn": k,
        "tokens": total,
        "extra_tokens": total - tokens(clean["requests"]),
        "retry_tokens": tokens(after),
        "retry_first_turn": after[0]["turn"] if after else None,
        "model_requests": len(task["requests"]),
        "wall_after_kill_s": round(task["ended"] - task["killed"], 3),
        "kill_to_retry_s": round(after[0]["received_at"] - task["killed"], 3) if after else None,
        "attempt": task["attempt"],
        "resume": task["resume"],
    }
    return figures


def _violations(arm: str, f: Mapping[str, Any], clean_tokens: int, request_id: str) -> list[str]:
    found = []
    where = f"{arm} {request_id} (killed at turn {f['kill_turn']})"
    if f["attempt"] != 2:
        found.append(f"{where}: ended by attempt {f['attempt']}, not the retry")
    if arm == "resume":
        expected = {"status": "resumed", "from_attempt": 1, "turns": f["kill_turn"]}
        if f["resume"] != expected or f["retry_first_turn"] != f["kill_turn"]:
            found.append(f"{where}: did not resume at its turn ({f['resume']}, "
                         f"first retry turn {f['retry_first_turn']})")  # fmt: skip
    elif f["resume"] is not None or f["retry_first_turn"] != 0:
        found.append(f"{where}: the restart did not start over")
    elif f["retry_tokens"] != clean_tokens:
        # The model server is deterministic: a fresh retry is the clean run again.
        found.append(f"{where}: its retry took {f['retry_tokens']} tokens, the clean run "
                     f"{clean_tokens}")  # fmt: skip
    return found


def _of(requests: Sequence[Mapping[str, Any]], method: str, *, request_id: str = "",
        after: float = 0.0) -> list[Mapping[str, Any]]:  # fmt: skip
    return [r for r in requests
            if r["method"] == method and request_id in r["key"] and r["at"] > after]  # fmt: skip


def _checkpoint(raw: Mapping[str, Any], turns: int, kill_turns: Sequence[int]) -> dict[str, Any]:
    """PutObject per turn and its bytes (clean arm: the parts each turn, the whole
    checkpoint at the end); HEAD and GetObject per resume (resume arm)."""
    clean = raw["clean"]["s3"]["checkpoint_requests"]
    puts, tasks = _of(clean, "PUT"), max(1, len(raw["clean"]["tasks"]))
    parts = [int(r["sent_bytes"]) for r in puts if "/part-" in r["key"]]
    wholes = [int(r["sent_bytes"]) for r in puts if "/part-" not in r["key"]]
    turns_run = turns * tasks
    resume = raw["resume"]["s3"]["checkpoint_requests"]
    retries = [(_of(resume, "GET", request_id=t["request_id"], after=t["killed"])
                + _of(resume, "HEAD", request_id=t["request_id"], after=t["killed"]),
                _of(resume, "PUT", request_id=t["request_id"], after=t["killed"]))
               for t in raw["resume"]["tasks"]]  # fmt: skip
    resumes = max(1, len(retries))
    reads = [g for got, _ in retries for g in got]
    restart = raw["restart"]["s3"]["checkpoint_requests"]
    return {
        "puts_per_turn": round(len(puts) / turns_run, 3),
        "part_bytes_per_turn": round(sum(parts) / turns_run),
        "largest_part_bytes": max(parts, default=0),
        "whole_bytes_per_task": round(sum(wholes) / tasks),
        "bytes_per_turn": round((sum(parts) + sum(wholes)) / turns_run),
        "bytes_per_task": round((sum(parts) + sum(wholes)) / tasks),
        "reads_per_start": round(len(_of(clean, "GET") + _of(clean, "HEAD")) / tasks, 3),
        "reads_per_resume": round(len(reads) / resumes, 3),
        "reads_found_per_resume": round(sum(1 for g in reads if g["status"] == 200) / resumes, 3),
        "bytes_per_resume": round(sum(int(g["received_bytes"]) for g in reads) / resumes),
        "puts_after_resume_per_turn": round(
            sum(len(p) for _, p in retries) / max(1, sum(turns - k for k in kill_turns)), 3
        ),
        "restart_arm_requests": len(restart),
    }


def summarize(raw: Mapping[str, Any], *, turns: int, kill_turns: Sequence[int]) -> dict[str, Any]:
    """The report: per task and per arm figures, checkpoint cost, verdict, violations."""
    clean = raw["clean"]["tasks"]
    violations: list[str] = []
    for task in clean:
        if task["end"] != "Task Completed" or task["attempt"] != 1:
            violations.append(f"clean {task['request_id']}: {task['end']} by {task['attempt']}")
        answered = sum(1 for r in task["requests"] if r["usage"])
        if answered != turns:
            violations.append(f"clean {task['request_id']}: {answered} turns, not {turns}")
    per_task: list[dict[str, Any]] = []
    for i, k in enumerate(kill_turns):
        row: dict[str, Any] = {"kill_turn": k, "clean_tokens": tokens(clean[i]["requests"]),
                               "clean_wall_s": round(clean[i]["ended"] - clean[i]["sent"], 3)}  # fmt: skip
        for arm in ("resume", "restart"):
            task = raw[arm]["tasks"][i]
            if task["end"] != "Task Completed":
                violations.append(f"{arm} {task['request_id']}: ended {task['end']}")
            row[arm] = _killed_task(task, clean[i], k)
            violations += _violations(arm, row[arm], row["clean_tokens"], task["request_id"])
        row["resume_pct_of_restart"] = round(
            100 * row["resume"]["extra_tokens"] / max(1, row["restart"]["extra_tokens"]), 1
        )
        per_task.append(row)
    arms: dict[str, Any] = {"clean": {
        "tokens_median": _median([r["clean_tokens"] for r in per_task]),
        "wall_s_median": _median([r["clean_wall_s"] for r in per_task]),
    }}  # fmt: skip
    for arm in ("resume", "restart"):
        extra = [r[arm]["extra_tokens"] for r in per_task]
        arms[arm] = {
            "extra_tokens_total": sum(extra),
            "extra_tokens_median": _median(extra),
            "extra_pct_of_clean": round(
                100 * sum(extra) / max(1, sum(r["clean_tokens"] for r in per_task)), 1
            ),
            "wall_after_kill_s_median": _median([r[arm]["wall_after_kill_s"] for r in per_task]),
            "kill_to_retry_s_median": _median(
                [r[arm]["kill_to_retry_s"] for r in per_task if r[arm]["kill_to_retry_s"]]
            ),
        }
    restart_extra = arms["restart"]["extra_tokens_total"]
    pct = round(100 * arms["resume"]["extra_tokens_total"] / max(1, restart_extra), 1)
    checkpoint = _checkpoint(raw, turns, kill_turns)
    if checkpoint["restart_arm_requests"]:
        violations.append("the restart arm (resume: false) touched a checkpoint")
    if per_task and not checkpoint["puts_per_turn"]:
        violations.append("the clean arm (resume: true) wrote no checkpoint")
    return {
        "tasks": per_task,
        "arms": arms,
        "resume_extra_pct_of_restart": pct,
        "target_pct": TARGET_PCT,
        "met": pct <= TARGET_PCT,
        "checkpoint": checkpoint,
        "violations": violations,
    }


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for n, column in enumerate(columns):
        table.add_column(column, justify="left" if n == 0 else "right")
    return table


def table(d: Mapping[str, Any]) -> Table:
    config, arms, c = d["config"], d["arms"], d["checkpoint"]
    t = _table(
        f"resume against restart: {config['tasks']} agent tasks of {config['turns']} turns "
        f"(model answers {config['model_delay_ms']} ms), each killed at a random turn",
        "task (killed at)", "clean tokens", "resume extra", "restart extra", "resume ÷ restart",
        "resume s after kill", "restart s after kill",
    )  # fmt: skip
    for n, row in enumerate(d["tasks"]):
        t.add_row(f"{n} (turn {row['kill_turn']})", f"{row['clean_tokens']:,}",
                  f"{row['resume']['extra_tokens']:,}", f"{row['restart']['extra_tokens']:,}",
                  f"{row['resume_pct_of_restart']:.1f} %",
                  f"{row['resume']['wall_after_kill_s']:.1f}",
                  f"{row['restart']['wall_after_kill_s']:.1f}")  # fmt: skip
    verdict = "met" if d["met"] else "[red]not met[/red]"
    t.add_row("all (median)", f"{arms['clean']['tokens_median']:,.0f}",
              f"{arms['resume']['extra_tokens_total']:,}",
              f"{arms['restart']['extra_tokens_total']:,}",
              f"{d['resume_extra_pct_of_restart']:.1f} % (≤ {d['target_pct']:.0f} %: {verdict})",
              f"{arms['resume']['wall_after_kill_s_median']:.1f}",
              f"{arms['restart']['wall_after_kill_s_median']:.1f}")  # fmt: skip
    t.caption = (
        f"clean run {arms['clean']['wall_s_median']:.1f} s (median); retry's first model "
        f"request {arms['resume']['kill_to_retry_s_median']:.1f} s (resume) / "
        f"{arms['restart']['kill_to_retry_s_median']:.1f} s (restart) after the kill. "
        f"Checkpoint: {c['puts_per_turn']:.2f} PutObject a turn, {c['part_bytes_per_turn']:,} "
        f"bytes a turn in parts (largest {c['largest_part_bytes']:,}) and "
        f"{c['whole_bytes_per_task']:,} for the whole at a task's end, {c['bytes_per_task']:,} "
        f"a task; {c['reads_per_resume']:.2f} HEAD or GetObject a resume "
        f"({c['reads_found_per_resume']:.2f} found, {c['bytes_per_resume']:,} bytes). "
        f"Violations: {len(d['violations'])}."
    )
    t.caption_justify = "left"
    return t
