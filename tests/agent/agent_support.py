"""Helpers of the agent tests: a real worker + the offline model server + agent definitions."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from conftest import Stack
from support import EventLog

from agentq.envelope import TaskEnvelope
from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer
from agentq.local.workers import WorkerProcess, fast_env
from agentq.store.tasks import TaskStore

REPO = Path(__file__).resolve().parents[2]
# Leases of 9 s instead of fast_env's 3 s: a worker running the CLI on a loaded host (CI's
# eight test processes on two cores, a chaos run beside them) was seen renewing 2.5 s late,
# and the fence then stopped a task at a step the test did not plan. A worker killed on
# purpose is taken over a few seconds later.
AGENT_LEASE: dict[str, str] = {"VISIBILITY_EXTENSION_AMOUNT": "6"}
# No spare imports the SDK ahead of a task (WARM_AGENT=recent would after each agent
# task): a rig runs a few agent tasks and ends, so most such spares were never used, and
# each cost ~1.4 s of CPU (a third of this directory's). The tasks import it themselves;
# tests/worker/test_worker_warm.py covers warming, and the chaos bench runs the default.
AGENT_RIG_WORKER: dict[str, str] = {**AGENT_LEASE, "WARM_AGENT": "never"}
SAMPLES = REPO / "definitions" / "samples"

# A small schema: quick for the fake model to fill, strict enough to violate on purpose.
NOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "points", "score"],
    "properties": {
        "title": {"type": "string", "maxLength": 200},
        "points": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
}


def agent_definition(name: str, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "prompt": "Write a note about the text below.\n\n{text}",
        "output_schema": NOTE_SCHEMA,
        "max_turns": 6,
        "step_timeout_s": 90,
        "retry_backoff_s": 0.2,
        "retry_backoff_max_s": 1,
    }
    settings.update(overrides.pop("settings", {}))
    return {"name": name, "kind": "agent", "timeout_s": 150, "settings": settings, **overrides}


def write_definitions(directory: Path, definitions: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "agent-tests.yaml").write_text(yaml.safe_dump(definitions, sort_keys=False))
    return directory


@dataclass
class AgentRig:
    stack: Stack
    model: ModelServer
    worker: WorkerProcess
    events: EventLog
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    others: list[WorkerProcess] = field(default_factory=list)

    def another_worker(self, name: str) -> WorkerProcess:
        """A second worker like the first (same definitions, model server and HOME)."""
        worker = WorkerProcess(name, log_dir=self.log_dir)
        self.others.append(worker)
        return worker.start(self.env)

    def send(
        self, definition: str, payload: Mapping[str, Any], *, request_id: str | None = None
    ) -> TaskEnvelope:
        envelope = TaskEnvelope(
            request_id=request_id or f"ag-{uuid.uuid4().hex[:12]}",
            tenant="acme",
            definition=definition,
            input=dict(payload),
        )
        self.stack.sqs.send_message(
            QueueUrl=self.stack.resources.queue_url,
            MessageBody=envelope.to_body(),
            MessageAttributes=envelope.message_attributes(),
        )
        return envelope

    def s3_json(self, key: str) -> Any:
        return json.loads(self.s3_text(key))

    def s3_text(self, key: str) -> str:
        body = self.stack.s3.get_object(Bucket=self.stack.resources.bucket, Key=key)["Body"]
        return str(body.read().decode())

    def prefix(self, request_id: str) -> str:
        """The S3 folder of the attempt the task's STATE item names (as every reader finds it)."""
        record = TaskStore(self.stack.dynamodb, self.stack.resources.table_name).require(
            "acme", request_id
        )
        return str(record.raw["artifacts"]["prefix"])

    def s3_files(self, request_id: str) -> dict[str, str]:
        prefix = self.prefix(request_id)
        listing = self.stack.s3.list_objects_v2(Bucket=self.stack.resources.bucket, Prefix=prefix)
        return {
            obj["Key"][len(prefix) :]: self.s3_text(obj["Key"])
            for obj in listing.get("Contents", [])
        }

    def queue_counts(self, url: str | None = None) -> tuple[int, int]:
        attributes = self.stack.sqs.get_queue_attributes(
            QueueUrl=url or self.stack.resources.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return (
            int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        )


@contextlib.contextmanager
def agent_rig(
    stack: Stack,
    definitions: list[dict[str, Any]],
    *,
    extra_env: Mapping[str, str] | None = None,
    **worker_env: str,
) -> Iterator[AgentRig]:
    """A real worker with agent definitions, its CLI pointed at a fresh model server."""
    scratch = Path(tempfile.mkdtemp(prefix="agentq-agent-test-"))
    definitions_dir = write_definitions(scratch / "definitions", definitions)
    home = scratch / "home"
    home.mkdir()
    model = ModelServer().start()
    worker = WorkerProcess("agent-worker", log_dir=scratch)
    env = {
        **stack.env(),
        **fast_env(TASK_DEFINITIONS_DIR=str(definitions_dir), **{**AGENT_RIG_WORKER, **worker_env}),
        **offline_claude_env(model.url, home),
        "HOME": str(home),
        "AGENTQ_WORK_DIR": str(scratch / "work"),
        **(extra_env or {}),
    }
    worker.start(env)
    rig = AgentRig(stack=stack, model=model, worker=worker, events=EventLog(stack), env=env,
                   log_dir=scratch)  # fmt: skip
    try:
        yield rig
    except BaseException:
        for each in [worker, *rig.others]:
            print(f"--- {each.name} output ---\n{each.output()[-8000:]}")
        raise
    finally:
        for each in [worker, *rig.others]:
            if each.alive():
                each.stop(timeout=30)
        model.stop()


def processes_using(base_url: str, *, besides: int) -> list[psutil.Process]:
    """Live processes (but `besides`, the worker, and its idle warm spares) pointed at
    this model server: the CLI, its tools, a task child."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in (os.getpid(), besides):
            continue
        with contextlib.suppress(psutil.Error, OSError):
            environ = proc.environ()
            if environ.get("ANTHROPIC_BASE_URL") == base_url and not _idle_spare(proc, environ):
                found.append(proc)
    return found


def _idle_spare(proc: psutil.Process, environ: dict[str, str]) -> bool:
    """A warm spare still waiting for a task (worker/child/spares.py), or the fork server and
    the spares it forked (worker/child/forkserver.py: they share its command line), sits in
    its HOME; once it has a task it lives in the task dir and counts like any task child."""
    command = proc.cmdline()
    spare = "--spare" in command or "worker.child.forkserver" in command
    return spare and proc.cwd() == environ.get("HOME")
