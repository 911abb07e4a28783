"""Resume against restart: agent tasks killed at a random turn, tokens and time to finish.

A scripted agent task of `turns` turns (a Bash call each, then the structured answer)
runs on real workers, the bundled Claude CLI and the offline model server. Three arms
on the same tasks, each with its own model server (so their prompts are identical):
`clean` runs each task once, unkilled (`resume: true`); `resume` and `restart`
(`resume: false`) stall each task's model at a random turn k in [2, turns - 1] once k
turns are done (and, resuming, turn k's checkpoint is in S3), SIGKILL the worker with
its child and CLI, and let a standby worker finish it. Tokens are the model server's
(input, cache and output, every request); S3 requests go through a counting relay.

    python -m bench.resume [--tasks N] [--turns T] [--seed S] [--model-delay-ms MS] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from rich.console import Console

from agentq.checkpoints import CheckpointError, decode, is_checkpoint_key, read_attempt
from agentq.local.aws import MotoServer
from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer, RequestRecord
from agentq.local.workers import WorkerProcess
from bench.resume_report import ARMS, summarize, table
from bench.s3_counter import S3Counter
from bench.stack import Stage, envelope, moto_server, new_stage, worker_env

RESULTS: Final = Path(__file__).resolve().parent / "results" / "resume.json"
DEFINITION: Final = "resume-bench"
SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "points"],
    "properties": {
        "title": {"type": "string", "maxLength": 200},
        "points": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    },
}
# One put per completed turn: the bench's turns take about a second, production's
# seconds to minutes, so the default 5 s interval would hide the per-turn cost here.
CHECKPOINT_INTERVAL_MS: Final = 100
ARM_CODES: Final = {"clean": "cl", "resume": "rs", "restart": "rt"}
ENDS: Final = ("Task Completed", "Task Failed", "Task Timeout", "Task Processing Failed")


@dataclass(frozen=True, kw_only=True)
class Config:
    tasks: int = 6
    turns: int = 20  # model turns of a clean run: turns - 1 Bash calls, then the answer
    seed: int = 41
    # Each model answer waits this long: offline answers are instant, a real model's take
    # seconds, and the wall time a resume saves is the skipped turns' model time.
    model_delay_ms: int = 1000
    timeout_s: float = 300.0  # for each wait of one task

    def kill_turns(self) -> list[int]:
        """Turn k of each task: k turns done, the worker killed before turn k + 1."""
        rng = random.Random(self.seed)
        return [rng.randint(2, self.turns - 1) for _ in range(self.tasks)]


@dataclass
class Run:
    """One task in one arm: what the model server, the events and the clock saw."""

    request_id: str
    sent: float = 0.0
    killed: float | None = None
    ended: float = 0.0
    end: dict[str, Any] = field(default_factory=dict)
    requests: list[RequestRecord] = field(default_factory=list)


def prompt_text(index: int, turns: int, delay_ms: int = 0) -> str:
    """Each step prints about a kilobyte, as a file read or a search would."""
    steps = "; ".join(
        f'tool Bash {{"command": "seq -s \' \' {n * 1000} {n * 1000 + 199}"}}'
        for n in range(1, turns)
    )
    delay = f"delay {delay_ms}ms; " if delay_ms else ""
    return f"Work through the steps. [[model: key task-{index:02d}; {delay}{steps}]]"


def definition(turns: int, *, resume: bool) -> dict[str, Any]:
    return {
        "name": DEFINITION,
        "kind": "agent",
        "timeout_s": 900,
        "max_attempts": 3,
        "settings": {
            "prompt": "Write a note about the text below.\n\n{text}",
            "output_schema": SCHEMA,
            "allowed_tools": ["Bash"],
            "max_turns": turns + 5,
            "step_timeout_s": 300,
            "retry_attempts": 1,
            "retry_backoff_s": 0.2,
            "retry_backoff_max_s": 1,
            "resume": resume,
        },
    }


class Bench:
    """One stage, its S3 relay and event tap; runs the arms one task at a time."""

    def __init__(self, server: MotoServer, config: Config, scratch: Path) -> None:
        self.config = config
        self.scratch = scratch
        self.stage: Stage = new_stage(server, prefix="rb")
        self.tap = self.stage.tap(*ENDS)
        self.ends: dict[str, dict[str, Any]] = {}
        self.home = scratch / "home"
        self.home.mkdir()
        self.workers = 0

    def _env(self, arm: str, model: ModelServer, s3_url: str) -> dict[str, str]:
        definitions = self.scratch / f"definitions-{arm}"
        definitions.mkdir()
        resume = arm != "restart"
        (definitions / "resume-bench.yaml").write_text(
            yaml.safe_dump([definition(self.config.turns, resume=resume)], sort_keys=False)
        )
        overrides = {
            **offline_claude_env(model.url, self.home),
            "HOME": str(self.home),
            "TASK_DEFINITIONS_DIR": str(definitions),
            "AGENT_CHECKPOINT_INTERVAL": str(CHECKPOINT_INTERVAL_MS),
            "AWS_ENDPOINT_URL_S3": s3_url,
            "AGENTQ_WORK_DIR": str(self.scratch / "work"),
        }
        return worker_env(self.stage, **overrides)

    @contextlib.contextmanager
    def _worker(self, env: dict[str, str]) -> Iterator[WorkerProcess]:
        self.workers += 1
        worker = WorkerProcess(f"resume-w{self.workers}", log_dir=self.scratch)
        worker.start(env)
        try:
            yield worker
        finally:
            if worker.alive():
                worker.stop(timeout=30)

    def _send(self, arm: str, index: int) -> Run:
        # The same length in every arm: the CLI's prompt names the task's directory.
        run = Run(request_id=f"rb-{ARM_CODES[arm]}-{self.config.seed:04d}-{index:02d}")
        task = envelope(DEFINITION, {"text": prompt_text(index, self.config.turns, self.config.model_delay_ms)},
                        request_id=run.request_id)  # fmt: skip
        run.sent = time.time()
        self.stage.send([task])
        return run

    def _wait_end(self, run: Run, worker: WorkerProcess) -> None:
        deadline = time.monotonic() + self.config.timeout_s
        while run.request_id not in self.ends:
            if time.monotonic() > deadline or not worker.alive():
                raise RuntimeError(f"{run.request_id} did not end: {worker.output()[-3000:]}")
            response = self.stage.sqs.receive_message(QueueUrl=self.tap, MaxNumberOfMessages=10,
                                                      WaitTimeSeconds=1)  # fmt: skip
            for message in response.get("Messages", []):
                body = json.loads(message["Body"])
                detail = {"detail-type": body["detail-type"], **body["detail"], "seen": time.time()}
                if detail["detail-type"] != "Task Processing Failed":
                    self.ends.setdefault(str(detail.get("requestId")), detail)
                self.stage.sqs.delete_message(QueueUrl=self.tap,
                                              ReceiptHandle=message["ReceiptHandle"])  # fmt: skip
        run.end = self.ends[run.request_id]
        run.ended = float(run.end["seen"])

    def clean(self, model: ModelServer, env: dict[str, str]) -> list[Run]:
        runs = []
        with self._worker(env) as worker:
            worker.wait_for_output("worker started", timeout=120)
            for index in range(self.config.tasks):
                run = self._send("clean", index)
                self._wait_end(run, worker)
                run.requests = model.requests(f"task-{index:02d}")
                runs.append(run)
        return runs

    def killed(self, arm: str, model: ModelServer, env: dict[str, str]) -> list[Run]:
        return [self._kill_one(arm, model, env, index, k)
                for index, k in enumerate(self.config.kill_turns())]  # fmt: skip

    def _kill_one(
        self, arm: str, model: ModelServer, env: dict[str, str], index: int, k: int
    ) -> Run:
        """Task `index` stalls at turn k; its worker dies there; a standby finishes it."""
        key = f"task-{index:02d}"
        model.add_rule({"match": f"key {key};", "key": key, "do": f"stall x1 turn {k}"})
        with contextlib.ExitStack() as workers:
            victim = workers.enter_context(self._worker(env))
            victim.wait_for_output("worker started", timeout=120)
            run = self._send(arm, index)
            # The standby starts once the victim holds the task: it gets only the retry.
            self._wait(lambda: bool(model.requests(key)), victim, f"{key} started")
            standby = workers.enter_context(self._worker(env))
            standby.wait_for_output("worker started", timeout=120)
            self._wait(lambda: _stalled(model, key, k), victim, f"{key} stalled at turn {k}")
            if arm == "resume":
                self._wait(lambda: self._checkpoint_turns(run.request_id) == k, victim,
                           f"the checkpoint of {key}'s turn {k}")  # fmt: skip
            victim.kill()
            run.killed = time.time()
            self._wait_end(run, standby)
        run.requests = model.requests(key)
        return run

    def _wait(self, ready: Any, worker: WorkerProcess, what: str) -> None:
        deadline = time.monotonic() + self.config.timeout_s
        while not ready():
            if time.monotonic() > deadline or not worker.alive():
                raise RuntimeError(f"waited in vain for {what}: {worker.output()[-3000:]}")
            time.sleep(0.05)

    def _checkpoint_turns(self, request_id: str) -> int:
        s3 = self.stage.clients["s3"]  # straight to moto: the bench's reads are not counted
        try:
            found = read_attempt(s3, self.stage.resources.bucket, "bench", request_id, 1)
            return -1 if found is None else decode(found.data).turns
        except CheckpointError:
            return -1


def _stalled(model: ModelServer, key: str, turn: int) -> bool:
    return any(r.outcome == "stall" and r.turn == turn for r in model.requests(key))


def _s3_figures(counter: S3Counter) -> dict[str, Any]:
    checkpoints = [r for r in counter.requests() if is_checkpoint_key(r.key)
                   and r.method in ("PUT", "GET", "HEAD")]  # fmt: skip
    return {
        "requests": len(counter.requests()),
        "checkpoint_requests": [dataclasses.asdict(r) for r in checkpoints],
    }


def _record(run: Run) -> dict[str, Any]:
    payload = run.end.get("payload") or {}
    return {
        "request_id": run.request_id,
        "end": run.end.get("detail-type"),
        "attempt": run.end.get("attempt"),
        "resume": payload.get("resume"),
        "sent": run.sent,
        "killed": run.killed,
        "ended": run.ended,
        "requests": [
            {"turn": r.turn, "outcome": r.outcome, "usage": r.usage, "received_at": r.received_at}
            for r in run.requests
        ],
    }


def run(config: Config | None = None, *, server: MotoServer | None = None) -> dict[str, Any]:
    """Run the three arms; returns the report (raw records under "runs")."""
    config = config or Config()
    if config.turns < 3:
        raise ValueError("a task needs at least three turns")
    scratch = Path(tempfile.mkdtemp(prefix="agentq-bench-resume-"))
    raw: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        moto = server or stack.enter_context(moto_server())
        bench = Bench(moto, config, scratch)
        for arm in ARMS:
            with ModelServer() as model, S3Counter(moto.url) as counter:
                env = bench._env(arm, model, counter.url)
                runs = bench.clean(model, env) if arm == "clean" else bench.killed(arm, model, env)
                raw[arm] = {"tasks": [_record(r) for r in runs], "s3": _s3_figures(counter)}
    report = summarize(raw, turns=config.turns, kill_turns=config.kill_turns())
    report["config"] = {"tasks": config.tasks, "turns": config.turns, "seed": config.seed,
                        "model_delay_ms": config.model_delay_ms,
                        "checkpoint_interval_ms": CHECKPOINT_INTERVAL_MS}  # fmt: skip
    report["runs"] = raw
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=Config.tasks)
    parser.add_argument("--turns", type=int, default=Config.turns)
    parser.add_argument("--seed", type=int, default=Config.seed)
    parser.add_argument("--model-delay-ms", type=int, default=Config.model_delay_ms,
                        help="how long each model answer waits")  # fmt: skip
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the report goes")
    args = parser.parse_args(argv)
    began = time.monotonic()
    config = Config(tasks=args.tasks, turns=args.turns, seed=args.seed,
                    model_delay_ms=args.model_delay_ms)  # fmt: skip
    report = run(config)
    report["seconds"] = round(time.monotonic() - began, 1)
    report["command"] = "python -m bench.resume " + " ".join(argv or sys.argv[1:])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    Console().print(table(report))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
