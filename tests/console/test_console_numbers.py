"""One set of numbers: a task's run time, attempts and state read the same in every
view: `agentq status --json` and `job status` (agentq.jobs.summary.task_dict), `agentq
watch` (its JSON and the table it draws), the console's tasks page (whose rows its job
page shares), task page and its attempts, the demo's final table (state and attempts)
and the task's end event; `agentq stats` counts exactly those events' attempts and run
times; and an agent task's tokens read the same wherever they are shown.

Real worker and children against moto's server: a task that sleeps, and one that fails
once then completes (two attempts)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_support import agentq
from conftest import Stack
from support import EventLog, settle_indexes

from agentq.aws import AwsClients
from agentq.cli._views import duration
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.console.artifacts import TaskArtifacts
from agentq.console.reads import ConsoleReader, attempts_of
from agentq.console.search import Filters
from agentq.definitions import DefinitionRegistry, DefinitionsTable
from agentq.demo import Expectation, report_rows
from agentq.events import Event
from agentq.jobs.summary import task_dict
from agentq.local.aws import LOCAL_REGION
from agentq.local.workers import SAMPLE_DEFINITIONS, WorkerProcess, fast_env
from agentq.stats import StatsReader, percentile
from agentq.store import EventStore

# The agent tests' rig (a real worker, the CLI, the offline model server), importable
# however this module is collected (pytest puts only a test's own directory on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_support import agent_definition, agent_rig

pytestmark = pytest.mark.timeout(180)

TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "slow": ("sample-sleep", {"seconds": 0.4}),
    "flaky": ("sample-fail", {"category": "server", "times": 1}),
}


def test_every_view_gives_a_task_the_same_run_time_attempts_and_state(stack: Stack) -> None:
    events = EventLog(stack)
    client = AgentqClient.from_env()
    # Known to the submit's validation as the worker knows them.
    samples = DefinitionRegistry.from_sources(directories=[SAMPLE_DEFINITIONS])
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    for definition, _ in TASKS.values():
        table.put(samples.get(definition))
    with WorkerProcess("numbers").start({**stack.env(), **fast_env()}):
        ids = {key: client.submit(definition, given, tenant="acme").request_id
               for key, (definition, given) in TASKS.items()}  # fmt: skip
        ends = {key: events.wait(rid, "Task Completed")[0] for key, rid in ids.items()}
    aws = AwsClients(LOCAL_REGION)
    reader = ConsoleReader(client, TaskArtifacts(aws.s3, client.results, client.outputs))
    # Stored as the save-event Lambda stores them (none runs beside this stack): `watch`
    # finds recent tasks by their stored events, `stats` counts them.
    saved = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    for event in events.poll():
        detail = {k: v for k, v in event.items() if k != "detail-type"}
        saved.append(Event.from_detail(detail, event["detail-type"]))
    settle_indexes(stack)  # both read them through indexes
    watched = _watch(stack)

    for key, end in ends.items():
        ran = end["payload"]["duration_ms"]  # the worker's measure, as stats counts it
        page = reader.task("acme", ids[key])
        # The attempts the task page draws from its stored events (here as the bus
        # carried them: no save-event Lambda runs beside this stack).
        last = attempts_of(events.of(ids[key]))[-1]
        status = task_dict(client.get_task(ids[key], tenant="acme"))
        # The tasks page's row (a search by the whole request id: the rows of the job
        # page and of the newest tasks are built the same, agentq.console.jobtasks).
        [row] = [r for r in reader.tasks("acme", Filters(text=ids[key]))["tasks"]
                 if r["requestId"] == ids[key]]  # fmt: skip
        seen = {
            "status": (status["durationMs"], status["attempt"], status["state"]),
            "tasks page": (row["durationMs"], row["attempt"], row["state"]),
            "task page": (page["task"]["durationMs"], page["task"]["attempt"],
                          page["task"]["state"]),
            "its last attempt": (last["durationMs"], last["attempt"],
                                 "COMPLETED" if last["exit"] == "Task Completed" else last["exit"]),
            "watch": watched["json"][ids[key]],
        }  # fmt: skip
        # The demo's final table, its row of the task: the same state and attempts.
        [(_, _, drawn_state, drawn_attempts, _)] = report_rows(
            {key: client.get_task(ids[key], tenant="acme")}, [Expectation(key, "COMPLETED")]
        )
        seen["demo table"] = (ran, int(drawn_attempts), drawn_state)
        # The table `watch` draws, its row of the task: the same run time, as text.
        assert f"{ids[key]} " in watched["table"]
        [drawn] = [line for line in watched["table"].splitlines() if ids[key] in line]
        assert f" {duration(ran)} " in f"{drawn} ", (key, ran, drawn)
        assert set(seen.values()) == {(ran, end["attempt"], "COMPLETED")}, (key, ran, seen)
    assert ends["flaky"]["attempt"] == 2 and ends["slow"]["payload"]["duration_ms"] >= 400

    # `agentq stats` counts the attempts' end events: the same attempts, the same times.
    figures = StatsReader(Settings.from_env(), sqs=aws.sqs, dynamodb=aws.dynamodb).read(3600)
    [acme] = [t for t in figures["tenants"] if t["tenant"] == "acme"]
    ran_all = sorted(e["payload"]["duration_ms"] for e in events.poll()
                     if e["detail-type"] in ("Task Completed", "Task Processing Failed"))  # fmt: skip
    assert (acme["claims"], acme["completions"], acme["retries"]) == (3, 2, 1), acme
    assert acme["processingMs"] == {"count": 3, "p50": percentile(ran_all, 0.5),
                                    "p95": percentile(ran_all, 0.95)}, (acme, ran_all)  # fmt: skip


def _watch(stack: Stack) -> dict[str, Any]:
    """`agentq watch --once` as a user runs it: its JSON (request id -> run time, attempt,
    state) and the table it draws."""
    env = {**stack.env(), "COLUMNS": "200"}

    def run(*args: str) -> str:
        done = agentq(env, "watch", "--once", "--tenant", "acme", *args, timeout=60)
        assert done.code == 0, done
        return done.stdout

    tasks = json.loads(run("--json"))["tasks"]
    return {
        "json": {t["requestId"]: (t["durationMs"], t["attempt"], t["state"]) for t in tasks},
        "table": run(),
    }


# -- tokens --------------------------------------------------------------------------------

_TOKEN_LABELS = {"input_tokens": "input", "output_tokens": "output",
                 "cache_read_input_tokens": "cache read",
                 "cache_creation_input_tokens": "cache write"}  # fmt: skip


def test_every_view_gives_an_agent_task_the_same_tokens(stack: Stack) -> None:
    """An agent task run by the real CLI against the offline model server: its tokens,
    input, output, cache and their total, read the same in its end event, its STATE item
    (the console's task page), the console's trace and `agentq trace` (JSON and drawn),
    and no turn of either trace shows an output count the total contradicts."""
    definition = agent_definition("numbers-note", settings={"allowed_tools": ["Bash"]})
    script = '[[model: key numbers; tool Bash {"command": "echo counted"}]]'
    with agent_rig(stack, [definition]) as rig:
        task = rig.send("numbers-note", {"text": f"Write about counting. {script}"})
        end = rig.events.wait(task.request_id, "Task Completed")[0]
        env = {**rig.env, "COLUMNS": "200"}
    rid = task.request_id
    total = end["payload"]["usage"]  # what the worker settled: usage.json
    assert set(total) >= set(_TOKEN_LABELS) and total["output_tokens"] > 1, total

    client = AgentqClient.from_env()
    aws = AwsClients(LOCAL_REGION)
    page = ConsoleReader(client, TaskArtifacts(aws.s3, client.results, client.outputs)).task(
        "acme", rid
    )
    console_trace = page["artifacts"]["trace"]
    drawn_trace = _cli(env, "trace", rid, "--tenant", "acme")
    json_trace = json.loads(_cli(env, "trace", rid, "--tenant", "acme", "--json"))
    seen = {
        "end event": {k: total[k] for k in _TOKEN_LABELS},
        "task page (STATE item)": {k: page["usage"][k] for k in _TOKEN_LABELS},
        "task page (trace)": {k: console_trace["usage"][k] for k in _TOKEN_LABELS},
        "agentq trace --json": {k: json_trace["usage"][k] for k in _TOKEN_LABELS},
    }
    assert all(figures == seen["end event"] for figures in seen.values()), seen
    [line] = [line for line in drawn_trace.splitlines() if line.startswith("tokens: ")]
    for name, label in _TOKEN_LABELS.items():
        assert f"{label} {total[name]:,}" in line, (name, line)

    # Turn by turn: the prompt's figures add up to the totals (one attempt here), and a
    # turn's output, which the CLI reports before the model has written it, is not shown
    # as a count the total contradicts: the traces give none, the table draws "—".
    for trace in (console_trace, json_trace):
        turns = trace["turns"]
        assert len(turns) >= 2, turns
        for name in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            assert sum(t["usage"][name] for t in turns) == total[name], (name, turns)
        outputs = [t["usage"].get("output_tokens") for t in turns]
        assert all(o is None for o in outputs) or sum(outputs) == total["output_tokens"], (
            outputs, total)  # fmt: skip
    rows = _turn_rows(drawn_trace)
    assert len(rows) == len(json_trace["turns"]), drawn_trace
    assert sum(int(r[3].replace(",", "")) for r in rows) == total["input_tokens"], rows
    assert all(r[4] == "—" for r in rows) or sum(int(r[4].replace(",", "")) for r in rows) == (
        total["output_tokens"]), rows  # fmt: skip


def _cli(env: dict[str, str], *args: str) -> str:
    done = agentq(env, *args)
    assert done.code == 0, done
    return done.stdout


def _turn_rows(drawn: str) -> list[list[str]]:
    """The rows of the "model responses" table `agentq trace` draws: its cells."""
    rows, inside = [], False
    for line in drawn.splitlines():
        if line.startswith("model responses"):
            inside = True
            continue
        if inside and line.startswith("└"):
            break
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if inside and cells and cells[0].isdigit():
            rows.append(cells)
    return rows
