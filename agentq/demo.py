"""`make demo`: the whole of agentq on this machine, one job, in one command.

Starts the local stack (moto, the offline model server unless `--real-claude` asks for
the Anthropic API, the Lambda host with its health-check timer) and two worker processes, then runs
a job that shows the product: a fan-out of `summarize` agent tasks over the bundled
sample documents, a fan-in `report`, one task scripted to fail and succeed on its SQS
retry, one scripted to stall until the worker's timeout kills it, and (offline) one
resumable task killed mid-conversation that finishes from its checkpoint (demo_resume).
It shows live progress, then the report, where the artifacts are, one task's event
timeline and how the killed task resumed, stops everything and exits 0 only if the job
ended as designed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.pretty import Pretty
from rich.table import Table

from agentq.cli._views import timeline_table
from agentq.console import serving
from agentq.demo_resume import CHECKLIST, RESUME_MARKER, ResumeKill, resume_lines
from agentq.local.stack import REPO_ROOT, LocalStack, LocalStackOptions, real_claude_configured

SAMPLES: Final = REPO_ROOT / "definitions" / "samples"
DEMO_DEFINITIONS: Final = REPO_ROOT / "definitions" / "demo"
# Short leases and backoffs so a newcomer sees retries and takeovers within minutes.
DEMO_WORKER_ENV: Final = {
    "MAX_CONCURRENT_CLAUDE": "2",
    "WAIT_TIME_SECONDS": "2",
    "VISIBILITY_EXTENSION_INTERVAL": "2000",
    "VISIBILITY_EXTENSION_AMOUNT": "6",
    "RETRY_BACKOFF_BASE": "1",
    "RETRY_BACKOFF_MAX": "3",
    "CLAUDE_KILL_GRACE": "2000",
    "DRAIN_TIMEOUT": "20000",
    # The resumable task's checkpoint follows each turn closely, so its kill comes soon.
    "AGENT_CHECKPOINT_INTERVAL": "250",
}
FLAKY_MARKER: Final = "[[model: key demo-flaky; fail 500 x3 no-retry]]"
STALL_MARKER: Final = "[[model: key demo-stall; stall]]"


@dataclass(frozen=True)
class Expectation:
    key: str
    state: str
    min_attempts: int = 1


def demo_spec(
    *, offline: bool, resumed: bool | None = None
) -> tuple[dict[str, Any], list[Expectation]]:
    """The demo job and what each of its tasks must end as.

    `resumed` (default: offline) adds the `resumable` task, which stalls on its third
    turn until something kills it (`ResumeKill`): only the offline model server stalls.
    """
    resumed = offline if resumed is None else resumed
    documents = sorted((SAMPLES / "inputs").glob("*.md"))
    items = [{"name": doc.stem, "text": doc.read_text()} for doc in documents]
    flaky_doc = items[0]["text"]
    stalled_doc = items[-1]["text"]
    if offline:
        # Scenario markers script the offline model server; the real API never sees them.
        flaky_doc += "\n\n" + FLAKY_MARKER
        stalled_doc += "\n\n" + STALL_MARKER
    spec: dict[str, Any] = {
        "name": "agentq demo: briefing from sample documents",
        # One timed-out side task must not cancel the report: run what does not depend on it.
        "failure_policy": "continue",
        "tasks": {
            "summarize": {
                "definition": "summarize",
                "for_each": items[1:],
                "input": {"document": "${item.text}"},
            },
            "flaky": {
                "definition": "summarize",
                "group": "summarize",
                "input": {"document": flaky_doc},
            },
            "report": {
                "definition": "report",
                "input": {"summaries": "${groups.summarize.results}"},
            },
            "deadline": {
                "definition": "summarize-with-deadline",
                "input": {"document": stalled_doc},
            },
        },
    }
    expected = [Expectation(f"summarize_{i}", "COMPLETED") for i in range(len(items) - 1)]
    expected += [
        Expectation("flaky", "COMPLETED", min_attempts=2 if offline else 1),
        Expectation("report", "COMPLETED"),
        Expectation("deadline", "TIMEOUT" if offline else "COMPLETED"),
    ]
    if resumed:
        spec["tasks"]["resumable"] = {
            "definition": "checklist",
            "input": {"checklist": CHECKLIST + "\n\n" + RESUME_MARKER},
        }
        expected.append(Expectation("resumable", "COMPLETED", min_attempts=2))
    return spec, expected


def _frame(job: Any, tasks: dict[str, Any], elapsed: float) -> RenderableType:
    from agentq.cli.watch import job_frame

    return Group(job_frame(job, tasks), f"[dim]{elapsed:5.1f} s[/dim]")


def run(console: Console, *, timeout_s: float, live: bool, real_claude: bool = False) -> int:
    from agentq.client import AgentqClient
    from agentq.jobs.spec import task_request_id

    offline = not real_claude
    console.rule("[bold]agentq demo")
    if offline:
        console.print(
            "Claude: [bold]offline model server[/bold] (a local stand-in for the Anthropic "
            "API, free; `make demo DEMO_REAL_CLAUDE=1` runs the same job on the real API)"
        )
    else:
        console.print(
            "Claude: [bold yellow]the real Anthropic API[/bold yellow] (--real-claude; "
            "this costs money)"
        )
    options = LocalStackOptions(
        stage="demo",
        workers=2,
        definitions_dirs=(SAMPLES, DEMO_DEFINITIONS),
        health_interval_s=5.0,
        use_real_claude=not offline,
        worker_env=dict(DEMO_WORKER_ENV),
    )
    started = time.monotonic()
    with LocalStack(options) as stack, serving() as web:
        env = stack.env()
        console.print(
            f"local AWS (moto) {env.get('AWS_ENDPOINT_URL')}, workers: "
            + ", ".join(w.name for w in stack.workers)
        )
        console.print(f"web console (read-only): {web.url}")
        # The console and its data live as long as the demo: say so, and what keeps one up.
        console.print("  [dim]it lives as long as the demo; `agentq local up` keeps a stack "
                      "and its console running[/dim]")  # fmt: skip
        client = AgentqClient.from_env()
        spec, expected = demo_spec(offline=offline)
        job = client.create_job(spec)
        console.print(f"job [bold]{job.job_id}[/bold]: {job.total} tasks\n")
        kill = None
        if "resumable" in spec["tasks"]:
            kill = ResumeKill(task_request_id(job.job_id, "resumable"))

        def tick() -> None:
            if kill is not None:
                kill.poll(client, stack.model_server, stack.workers)

        job, tasks = _follow(console, client, job, started, timeout_s, live, tick)
        outcome = _report(console, client, job, tasks, expected, kill)
    stray = stack.stray_processes()
    if stray:
        console.print(f"[red]processes left behind: {[p.pid for p in stray]}[/red]")
        return 1
    console.print(f"\nall stopped cleanly after {time.monotonic() - started:.0f} s")
    return outcome


def _follow(
    console: Console,
    client: Any,
    job: Any,
    started: float,
    timeout_s: float,
    live: bool,
    tick: Callable[[], None],
) -> tuple[Any, dict[str, Any]]:
    deadline = started + timeout_s
    tasks = client.job_tasks(job)
    if not live:
        last = ""
        while job.state == "RUNNING" and time.monotonic() < deadline:
            time.sleep(1.0)
            tick()
            job, tasks = client.get_job(job.job_id), client.job_tasks(job)
            line = " ".join(
                f"{key}={rec.state.value if rec else '-'}" for key, rec in sorted(tasks.items())
            )
            if line != last:
                console.print(f"[{time.monotonic() - started:5.1f}s] {line}")
                last = line
        return job, tasks
    with Live(console=console, auto_refresh=False) as view:
        while True:
            view.update(_frame(job, tasks, time.monotonic() - started), refresh=True)
            if job.state != "RUNNING" or time.monotonic() >= deadline:
                return job, tasks
            time.sleep(1.0)
            tick()
            job, tasks = client.get_job(job.job_id), client.job_tasks(job)


def _report(
    console: Console,
    client: Any,
    job: Any,
    tasks: dict[str, Any],
    expected: list[Expectation],
    kill: ResumeKill | None,
) -> int:
    from agentq.jobs.spec import task_request_id

    report_id = task_request_id(job.job_id, "report")
    if tasks.get("report") is not None and tasks["report"].state.value == "COMPLETED":
        console.print(Panel(Pretty(client.result(report_id)), title="the report (fan-in)"))
    report = tasks.get("report")
    if report is not None:
        bucket, prefix = client.outputs.location(report)
        console.print(
            f"artifacts of each task in S3 (artifacts/, logs/summary.log, "
            f"traces/session_trace.json), e.g. s3://{bucket}/{prefix}\n"
            f"read them with: agentq result|logs|trace {report_id}"
        )
    flaky_id = task_request_id(job.job_id, "flaky")
    console.print(f"\ntimeline of {flaky_id} (failed, then succeeded on its retry):")
    console.print(timeline_table(client.events(flaky_id), title="event timeline"))
    if kill is not None:
        _report_resume(console, client, kill)

    checks = Table(title="did the job end as designed?", title_justify="left")
    for column in ("task", "expected", "got", "attempts", "ok"):
        checks.add_column(column)
    ok = job.state in ("COMPLETED", "FAILED")
    for key, wanted, state, attempts, good in report_rows(tasks, expected):
        ok = ok and good
        checks.add_row(key, wanted, state, attempts,
                       "[green]yes[/green]" if good else "[red]NO[/red]")  # fmt: skip
    console.print(checks)
    console.print(_verdict(job, expected, ok=ok))
    return 0 if ok else 1


def report_rows(
    tasks: dict[str, Any], expected: list[Expectation]
) -> list[tuple[str, str, str, str, bool]]:
    """The final table's rows: task, expected, state and attempts as its STATE item has
    them (as `agentq status` reads them), and whether it ended as designed."""
    rows = []
    for expectation in expected:
        record = tasks.get(expectation.key)
        state = record.state.value if record else "missing"
        attempts = record.attempt if record else 0
        good = state == expectation.state and attempts >= expectation.min_attempts
        wanted = f"{expectation.state} (≥{expectation.min_attempts} attempt)"
        rows.append((expectation.key, wanted, state, str(attempts), good))
    return rows


def _report_resume(console: Console, client: Any, kill: ResumeKill) -> None:
    if kill.killed_pids:
        console.print(f"\n{kill.request_id}: the demo SIGKILLed its process group "
                      f"(pid {', '.join(map(str, kill.killed_pids))}) mid-conversation; "
                      "its own records say:")  # fmt: skip
    else:
        console.print(f"\n{kill.request_id} was not killed ({kill.problem or 'it never stalled'})")
    for line in resume_lines(client, kill.request_id):
        console.print("  resumed task: " + escape(line))


def _verdict(job: Any, expected: list[Expectation], *, ok: bool) -> str:
    if not ok:
        return (
            f"job {job.job_id}: [bold]{job.state}[/bold], [red]not as designed[/red] (see NO above)"
        )
    on_purpose = [e.key for e in expected if e.state != "COMPLETED"]
    if job.state == "FAILED" and on_purpose:
        return (
            f"job {job.job_id}: [bold]{job.state}[/bold], [green]as designed[/green]: "
            f"{', '.join(on_purpose)} timed out on purpose, and the job's failure policy "
            "(continue) still ran every task that did not depend on it"
        )
    return f"job {job.job_id}: [bold]{job.state}[/bold], [green]as designed[/green]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentq demo", description=__doc__)
    parser.add_argument("--timeout", type=float, default=170.0, help="give up after N seconds")
    parser.add_argument(
        "--plain", action="store_true", help="line-by-line progress instead of a live table"
    )
    parser.add_argument(
        "--real-claude",
        action="store_true",
        help="run on the real Anthropic API with ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN "
        "(costs money; default: the offline model server, whatever the shell holds)",
    )
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    if args.real_claude and not real_claude_configured():
        console.print("[red]--real-claude needs ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN[/red]")
        return 5
    return run(
        console,
        timeout_s=args.timeout,
        live=not args.plain and console.is_terminal,
        real_claude=args.real_claude,
    )


if __name__ == "__main__":
    sys.exit(main())
