"""The console's speed in a real browser, and its AWS requests per refresh.

A stage is filled with one job of `tasks` tasks (a fan-out and its fan-in, in every
state), `jobs` one-task jobs and `searched` tasks on their own; the console serves it
and Debian's chromium opens the job page, the jobs list and two Tasks searches (part of
a request id with a state, and a state with a definition). Time to data drawn is what the page itself records when
its data is on screen (`window.__aqDrawnAt`, ms since navigation began), the median of
a few loads. Requests per refresh are the console's own AWS calls for one poll of each
page's JSON, from `agentq.aws.CallCounter`; the bound for a job page is 1 job read +
one BatchGetItem per 100 tasks + 1 timeline query, and 1 query for a list page.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from agentq.aws import AwsClients, CallCounter
from agentq.config import Settings
from agentq.console import ConsoleOptions, ConsoleServer
from agentq.envelope import TaskEnvelope
from agentq.jobs import JobStore, parse_spec, task_request_id
from agentq.local.aws import LOCAL_REGION, MotoServer
from agentq.states import TaskState
from agentq.store import TaskStore
from bench.stack import new_stage

TARGET_MS: Final = 1000.0
LOADS: Final = 3
CHROMIUM: Final = "/usr/bin/chromium"
_ARGS: Final = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
# How the fan-out's tasks are spread over states, so every colour is drawn.
_MIX: Final = (TaskState.COMPLETED, TaskState.COMPLETED, TaskState.PROCESSING,
               TaskState.FAILED, TaskState.PENDING, TaskState.CANCELLED)  # fmt: skip


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def fill(settings: Settings, dynamodb: Any, *, tasks: int, jobs: int) -> str:
    """One big job in every state plus `jobs` small ones; returns the big job's id."""
    table = settings.required("table_name")
    job_store, task_store = JobStore(dynamodb, table), TaskStore(dynamodb, table)
    tenant = settings.tenant_id
    fan_out = {f"part_{i:03d}": {"definition": "noop"} for i in range(tasks - 1)}
    spec = parse_spec({"tasks": {**fan_out, "merge": {"definition": "noop",
                                                      "depends_on": list(fan_out)}}})  # fmt: skip
    big = "bench-console-big"
    job_store.create(tenant, big, spec)
    now = int(time.time() * 1000)
    for index, task in enumerate(spec.tasks):
        envelope = TaskEnvelope(request_id=task_request_id(big, task.key), tenant=tenant,
                                definition="noop", job_id=big, task_key=task.key)  # fmt: skip
        task_store.create(envelope, state=TaskState.BLOCKED, extra={"taskKey": task.key})
        target = _MIX[index % len(_MIX)] if task.key != "merge" else TaskState.BLOCKED
        if target is not TaskState.BLOCKED:
            started = now - 60_000 + index * 200
            task_store.transition(tenant, envelope.request_id, from_states=[TaskState.BLOCKED],
                                  to_state=target, fields={"startedAt": started, "attempt": 1,
                                                           "costUsd": 0.002})  # fmt: skip
    small = parse_spec({"tasks": {"only": {"definition": "noop"}}})
    for n in range(jobs):
        job_store.create(tenant, f"bench-console-{n:05d}", small)
    return big


def fill_standalone(settings: Settings, dynamodb: Any, *, count: int) -> str:
    """`count` tasks on their own, each with its `Task Pending` event (every tenth FAILED,
    with its `Task Failed`), written 8 at a time; returns a request id part that one
    task in 1,000 holds (what the search looks for)."""
    from concurrent.futures import ThreadPoolExecutor

    from agentq.events import task_event
    from agentq.store import EventStore

    table = settings.required("table_name")
    task_store = TaskStore(dynamodb, table)
    events = EventStore(dynamodb, table, app_name=settings.app_name)
    tenant = settings.tenant_id

    def one(n: int) -> None:
        rid = f"search-{n:05d}-{'needle' if n % 1000 == 7 else 'hay'}"
        envelope = TaskEnvelope(request_id=rid, tenant=tenant, definition="noop", input={"n": n})
        task_store.create(envelope)
        events.append(task_event("Task Pending", request_id=rid, tenant=tenant, definition="noop"))
        if n % 10 == 3:
            task_store.transition(tenant, rid, from_states=[TaskState.PENDING],
                                  to_state=TaskState.FAILED)  # fmt: skip
            events.append(task_event("Task Failed", request_id=rid, tenant=tenant))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(count)))
    return "needle"


def _drawn_ms(page: Any, url: str) -> dict[str, float]:
    """Median of a few loads: time to data drawn and painted, and where it went."""
    samples: dict[str, list[float]] = {name: [] for name in _PHASES}
    for _ in range(LOADS):
        # Generous: a page far over its budget is still a figure, not a crash.
        page.goto(url, timeout=300_000)
        page.wait_for_selector("body[data-painted='1']", timeout=300_000)
        found = page.evaluate(_PHASES_JS)
        for name in _PHASES:
            samples[name].append(float(found[name]))
    medians = {name: round(statistics.median(values), 1) for name, values in samples.items()}
    # The first load finds the console's caches cold (a job's finished tasks unread).
    return medians | {"first_drawn_ms": round(samples["drawn_ms"][0], 1),
                      "first_painted_ms": round(samples["painted_ms"][0], 1)}  # fmt: skip


# Per load, in ms since navigation began (drawMs: the drawing itself).
_PHASES: Final = ("drawn_ms", "painted_ms", "server_ms", "received_ms", "draw_ms")
_PHASES_JS: Final = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  return {drawn_ms: window.__aqDrawnAt, painted_ms: window.__aqPaintedAt,
          server_ms: nav.responseStart, received_ms: nav.responseEnd,
          draw_ms: window.__aqDrawMs};
}"""


def _requests(
    server: ConsoleServer, counter: CallCounter, cookie: str, path: str
) -> dict[str, int]:
    before = counter.snapshot()
    request = urllib.request.Request(server.base_url + path, headers={"Cookie": cookie})
    with urllib.request.urlopen(request) as response:
        response.read()
    after = counter.snapshot()
    return {op: n - before.get(op, 0) for op, n in after.items() if n - before.get(op, 0)}


def run(server: MotoServer, *, quick: bool = False, tasks: int | None = None,
        jobs: int | None = None, searched: int | None = None) -> dict[str, Any]:  # fmt: skip
    from playwright.sync_api import sync_playwright

    tasks = tasks or (50 if quick else 200)
    jobs = jobs or (100 if quick else 1000)
    searched = searched or (1000 if quick else 10_000)
    stage = new_stage(server, prefix="c")
    env = stage.env()
    with _environment(env):
        settings = Settings.from_env()
        began = time.monotonic()
        big = fill(settings, stage.clients["dynamodb"], tasks=tasks, jobs=jobs)
        needle = fill_standalone(settings, stage.clients["dynamodb"], count=searched)
        fill_s = time.monotonic() - began
        search = f"/tasks?q={needle}&state=FAILED"
        by_state = "/tasks?state=FAILED&definition=noop"
        counter = CallCounter()
        aws = AwsClients(LOCAL_REGION, counter=counter)
        console = ConsoleServer.from_settings(settings, ConsoleOptions(refresh_ms=60_000), aws=aws)
        with console, sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=_ARGS
            )
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
                page.goto(console.url)
                cookie = "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())
                job_ms = _drawn_ms(page, f"{console.base_url}/jobs/{big}")
                list_ms = _drawn_ms(page, f"{console.base_url}/jobs")
                list_200_ms = _drawn_ms(page, f"{console.base_url}/jobs?limit=200")
                search_ms = _drawn_ms(page, console.base_url + search)
                by_state_ms = _drawn_ms(page, console.base_url + by_state)
            finally:
                browser.close()
            job_calls = _requests(console, counter, cookie, f"/api/jobs/{big}")
            list_calls = _requests(console, counter, cookie, "/api/jobs")
            search_calls = _requests(console, counter, cookie, "/api" + search)
    job_bound = 2 + math.ceil(tasks / 100)
    worst = max(job_ms["drawn_ms"], list_ms["drawn_ms"], search_ms["drawn_ms"])
    return {
        "tasks": tasks,
        "jobs": jobs,
        "fill_s": round(fill_s, 1),
        # The machine's load (1, 5, 15 min) as the pages were timed: it is shared.
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "job_page_drawn_ms": job_ms["drawn_ms"],
        "job_page_server_ms": job_ms["server_ms"],
        "job_page": job_ms,
        "jobs_list_drawn_ms": list_ms["drawn_ms"],
        "jobs_list_server_ms": list_ms["server_ms"],
        "jobs_list": list_ms,
        "jobs_list_200_drawn_ms": list_200_ms["drawn_ms"],
        "job_page_requests": job_calls,
        "job_page_requests_total": sum(job_calls.values()),
        "job_page_requests_bound": job_bound,
        "jobs_list_requests": list_calls,
        "jobs_list_requests_total": sum(list_calls.values()),
        "searched_tasks": searched,
        "tasks_search_drawn_ms": search_ms["drawn_ms"],
        "tasks_search_server_ms": search_ms["server_ms"],
        "tasks_search": search_ms,
        "tasks_by_state_drawn_ms": by_state_ms["drawn_ms"],
        "tasks_search_requests": search_calls,
        "within_target": worst <= TARGET_MS,
        "within_bound": sum(job_calls.values()) <= job_bound and sum(list_calls.values()) <= 1,
    }


def screenshots(directory: Path, *, timeout_s: float = 400.0) -> list[Path]:
    """Each page of the console, drawn by chromium from the demo's job on the local stack.

    Two dead letters are put on the DLQ first (one task, one malformed body) so the
    dead-letter page has rows; the job page and the queues page are taken mid-run.
    """
    from playwright.sync_api import sync_playwright

    from agentq.client import AgentqClient
    from agentq.console import serving
    from agentq.demo import DEMO_DEFINITIONS, DEMO_WORKER_ENV, SAMPLES, demo_spec
    from agentq.local.stack import LocalStack, LocalStackOptions
    from bench.console_states import tasks_in_each_state

    directory.mkdir(parents=True, exist_ok=True)
    from agentq.local.workers import SAMPLE_DEFINITIONS

    dirs = (SAMPLES, DEMO_DEFINITIONS, SAMPLE_DEFINITIONS)
    options = LocalStackOptions(stage="shots", workers=2, definitions_dirs=dirs,
                                use_real_claude=False, worker_env=dict(DEMO_WORKER_ENV))  # fmt: skip
    taken: list[Path] = []
    with (
        LocalStack(options) as stack,
        serving(ConsoleOptions(allow_actions=True, refresh_ms=1000)) as web,
    ):
        env = stack.env()
        sqs = AwsClients(LOCAL_REGION).sqs
        lost = TaskEnvelope(request_id="nightly-digest-7f3a", tenant="default", definition="summarize",
                            input={"document": "Nightly digest of support tickets"})  # fmt: skip
        sqs.send_message(QueueUrl=env["SQS_DLQ_URL"], MessageBody=lost.to_body(),
                         MessageAttributes=lost.message_attributes())  # fmt: skip
        sqs.send_message(QueueUrl=env["SQS_DLQ_URL"], MessageBody="{not json")
        client = AgentqClient.from_env()
        spec, _ = demo_spec(offline=True, resumed=False)  # nothing here kills it
        # A few small jobs beside the demo's, so the list shows each state.
        echo = {"definition": "sample-echo", "input": {"rows": 120}}
        client.create_job({"name": "nightly import", "tasks": {"fetch": echo, "load": {
            **echo, "depends_on": ["fetch"]}}}, job_id="nightly-import-0412")  # fmt: skip
        client.create_job({"name": "ticket triage", "tasks": {"classify": {
            "definition": "sample-fail", "input": {"category": "validation"}}, "route": {
            **echo, "depends_on": ["classify"]}}}, job_id="ticket-triage-0412")  # fmt: skip
        job = client.create_job(spec, job_id="demo-briefing")
        # And work submitted on its own, for the Tasks page.
        for n in range(3):
            client.submit("sample-echo", {"rows": 40 * (n + 1)})
        client.submit("sample-fail", {"category": "validation", "message": "no customer id"})
        deadline = time.monotonic() + timeout_s
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=_ARGS
            )
            page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
            page.goto(web.url)

            def shot(name: str, path: str, selector: str = "body[data-drawn='1']") -> None:
                page.goto(web.base_url + path)
                page.wait_for_selector(selector, timeout=60_000)
                target = directory / f"console-{name}.png"
                page.screenshot(path=str(target))
                taken.append(target)

            while time.monotonic() < deadline:
                states = {r.state.value for r in client.job_tasks(job).values() if r}
                if "COMPLETED" in states and "PROCESSING" in states:
                    break
                time.sleep(0.5)
            shot("job", f"/jobs/{job.job_id}")
            shot("queues", "/queues")
            while client.get_job(job.job_id).state == "RUNNING" and time.monotonic() < deadline:
                time.sleep(1.0)
            shot("jobs", "/jobs")
            shot("task", f"/tasks/{job.job_id}-flaky", "#trace")
            page.locator("#attempts").scroll_into_view_if_needed()
            target = directory / "console-task-trace.png"
            page.screenshot(path=str(target))
            taken.append(target)
            shot("dlq", "/dlq", "#letters")
            shot("tasks", "/tasks", "#standalone")
            # Readable at 200 tasks: a fan-out wrapped into sub-columns, every state drawn.
            big = fill(Settings.from_env(), AwsClients(LOCAL_REGION).dynamodb, tasks=200, jobs=0)
            shot("job-200", f"/jobs/{big}")
            page.locator("#dag").scroll_into_view_if_needed()
            page.screenshot(path=str(taken[-1]))
            # A task page in each state, made without a worker (the demo's are done).
            stack.kill_workers()
            for name, (request_id, tenant) in tasks_in_each_state(client, "sample-echo").items():
                shot(f"state-{name}", f"/tasks/{request_id}?tenant={tenant}", "#task-state")
            browser.close()
    return taken


if __name__ == "__main__":
    import json
    import sys

    from bench.stack import moto_server

    if "--screenshots" in sys.argv:
        for path in screenshots(Path(sys.argv[sys.argv.index("--screenshots") + 1])):
            print(path)
        sys.exit(0)
    with moto_server() as moto:
        searched = (
            int(sys.argv[sys.argv.index("--searched") + 1]) if "--searched" in sys.argv else None
        )
        figures = run(moto, quick="--quick" in sys.argv, searched=searched)
    print(json.dumps(figures, indent=1))
