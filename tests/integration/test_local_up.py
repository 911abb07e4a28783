"""`agentq local up`: the stack stays up for other shells, and Ctrl-C stops all of it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import psutil
import pytest
import requests
from support import wait_for

from agentq.cli._localenv import allowed_variable, parse_env_file

REPO = Path(__file__).resolve().parents[2]


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("AGENTQ_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@dataclass
class LocalUp:
    process: subprocess.Popen[str]
    marker: str  # in every process the stack starts (AGENTQ_TEST_MARKER)
    env_file: Path


def _local_up(
    tmp_path: Path, *flags: str, stderr_file: Path | None = None, **extra_env: str
) -> LocalUp:
    marker = uuid.uuid4().hex
    env_file = tmp_path / "local.env"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
    env.update(extra_env, AGENTQ_TEST_MARKER=marker)
    process = subprocess.Popen(
        [sys.executable, "-m", "agentq.cli", "local", "up", *flags, "--env-file", str(env_file)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True,
        stderr=subprocess.PIPE if stderr_file is None else stderr_file.open("w"),
    )  # fmt: skip
    return LocalUp(process, marker, env_file)


def _summary(up: subprocess.Popen[str]) -> dict[str, Any]:
    """`local up --json`'s summary, read as it is printed (the stack keeps running)."""
    assert up.stdout is not None
    lines = []
    for line in up.stdout:
        lines.append(line)
        if line.rstrip() == "}":
            return dict(json.loads("".join(lines)))
    raise AssertionError(f"local up ended before its summary: {''.join(lines)[-2000:]}")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_local_up_with_iam_enforced_serves_the_console_as_the_operator(tmp_path: Path) -> None:
    # The env file is a producer's; the console is the operator's, whose dead letters
    # page lists the archive (which the producer may not).
    stack = _local_up(tmp_path, "--workers", "0", "--json", AGENTQ_LOCAL_IAM="enforce")
    up = stack.process
    try:
        summary = _summary(up)
        session = requests.Session()
        assert session.get(summary["console"], timeout=60).ok  # trades the token for a cookie
        base = summary["console"].split("/jobs")[0]
        letters = session.get(f"{base}/api/dlq", timeout=60)
        assert letters.status_code == 200, letters.text[-2000:]
        assert letters.json()["total"] == 0
    finally:
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=120)
    assert up.returncode == 0, err[-3000:]


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_local_up_serves_another_shell_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    relative = os.path.relpath(REPO / "definitions" / "testing", tmp_path)
    # A key in the shell must not switch the stack to the paid API (--real-claude does).
    stack = _local_up(tmp_path, "--workers", "1", "--definitions", relative, "--json",
                      ANTHROPIC_API_KEY="sk-ant-not-a-real-key")  # fmt: skip
    up, marker, env_file = stack.process, stack.marker, stack.env_file
    try:
        wait_for(env_file.exists, timeout=120, message="the env file")
        stack_env = parse_env_file(env_file.read_text())
        assert stack_env["AGENTQ_LOCAL"] == "1"
        assert stack_env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        # Only agentq's and AWS's variables: the user's HOME and Claude settings stay theirs.
        assert all(allowed_variable(name) for name in stack_env), sorted(stack_env)
        assert not {"HOME", "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"} & set(stack_env)
        # Yours are added to the bundled samples (the README's commands use them).
        assert stack_env["TASK_DEFINITIONS_DIR"] == os.pathsep.join(
            [str(REPO / "definitions" / "samples"), str(REPO / "definitions" / "testing")]
        )

        # Another shell: only the env file, the CLI and raw boto3.
        shell = {**os.environ, **stack_env}
        submitted = subprocess.run(
            [sys.executable, "-m", "agentq.cli", "submit", "sample-echo",
             "--input", '{"hello": "local"}', "--wait", "--timeout", "90", "--json"],
            env=shell, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        task = json.loads(submitted.stdout)
        assert task["state"] == "COMPLETED"
        assert len(_marked(marker)) >= 2  # the stack and its worker
        # From another directory, without sourcing anything: `--local-env`.
        elsewhere = subprocess.run(
            [sys.executable, "-m", "agentq.cli", "--local-env", str(env_file), "status",
             task["requestId"], "--json"],
            cwd="/", env=os.environ, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert elsewhere.returncode == 0, elsewhere.stderr
        listed = subprocess.run(
            [sys.executable, "-m", "agentq.cli", "definitions", "list", "--json"],
            env=shell, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        names = {d["name"] for d in json.loads(listed.stdout)}
        assert {"sample-echo", "summarize", "report"} <= names, listed.stdout

    finally:
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=120)
    assert up.returncode == 0, err[-3000:]
    summary = json.loads(out[: out.index("\nstopping")])
    assert summary["env_file"] == str(env_file)
    assert summary["model_server"].startswith("http://127.0.0.1:")  # offline
    assert summary["worker_logs"].endswith("logs")
    assert summary["console"].startswith("http://127.0.0.1:") and "token=" in summary["console"]
    assert not env_file.exists()  # a file naming a stopped stack would mislead
    wait_for(lambda: not _marked(marker), timeout=30, message="no process left")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_local_up_stops_and_says_so_when_its_moto_server_dies(tmp_path: Path) -> None:
    stack = _local_up(tmp_path, "--workers", "0")
    up, marker, env_file = stack.process, stack.marker, stack.env_file
    try:
        wait_for(env_file.exists, timeout=120, message="the env file")
        servers = [p for p in _marked(marker) if "agentq.local.moto_server" in p.cmdline()]
        # DynamoDB has a server of its own (agentq.local.moto_process): losing it alone,
        # with SQS and the rest still up, stops the stack too.
        dynamodb_url = parse_env_file(env_file.read_text())["AWS_ENDPOINT_URL_DYNAMODB"]
        port = dynamodb_url.rsplit(":", 1)[1]
        assert len(servers) == 2
        (moto,) = [p for p in servers if port in p.cmdline()]
        moto.kill()
        out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 1, out + err
    # The Lambda host's pollers may log the refused connections first; the verdict is last.
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"agentq: the local stack lost: local AWS (moto) at {dynamodb_url}")
    assert "agentq local up" in line
    assert not env_file.exists()
    wait_for(lambda: not _marked(marker), timeout=30, message="no process left")


def _log_times(log: Path, message: str) -> list[datetime]:
    times = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and str(record.get("message", "")).startswith(message):
                times.append(datetime.strptime(record["timestamp"], "%Y-%m-%d %H:%M:%S,%f%z"))
    return times


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_local_up_drains_its_workers_together_and_a_second_ctrl_c_kills_them(
    tmp_path: Path,
) -> None:
    stack = _local_up(tmp_path, "--workers", "2", "--no-console", "--json")
    up, marker, env_file = stack.process, stack.marker, stack.env_file
    try:
        assert up.stdout is not None
        lines = [up.stdout.readline()]
        while lines[-1] not in ("}\n", ""):
            lines.append(up.stdout.readline())
        logs = Path(json.loads("".join(lines))["worker_logs"])
        worker_logs = [logs / "worker-1.log", logs / "worker-2.log"]
        wait_for(
            lambda: all(_log_times(log, "worker started") for log in worker_logs),
            timeout=120,
            message="both workers started",
        )
        up.send_signal(signal.SIGINT)
        wait_for(
            lambda: all(_log_times(log, "shutdown requested") for log in worker_logs),
            timeout=60,
            message="both workers told to drain",
        )
        # Together: the second was told before the first had drained (one after the other,
        # each waited out its long poll first, up to 20 s a worker).
        told = max(_log_times(log, "shutdown requested")[0] for log in worker_logs)
        stopped = [t for log in worker_logs for t in _log_times(log, "worker stopped")]
        assert all(told <= t for t in stopped), (told, stopped)
        # Another Ctrl-C while they drain (a user who does not want to wait).
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, err[-3000:]
    assert "stopping now: killing the workers" in err
    assert not env_file.exists()
    wait_for(lambda: not _marked(marker), timeout=30, message="no process left")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_local_up_stops_everything_when_its_terminal_closes(tmp_path: Path) -> None:
    stack = _local_up(tmp_path, "--workers", "1", "--no-console")
    up, marker, env_file = stack.process, stack.marker, stack.env_file
    try:
        wait_for(env_file.exists, timeout=120, message="the env file")
        assert len(_marked(marker)) >= 3  # the stack, moto and the worker at least
        up.send_signal(signal.SIGHUP)  # what a closed terminal sends
        out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, err[-3000:]
    assert "stopping: draining workers" in out
    assert not env_file.exists()
    wait_for(lambda: not _marked(marker), timeout=30, message="no process left")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_local_up_waits_out_a_frozen_moto_and_keeps_its_data(tmp_path: Path) -> None:
    # One missed 2 s probe used to stop the whole stack and moto's data with it.
    errors = tmp_path / "stderr.txt"
    stack = _local_up(tmp_path, "--workers", "0", "--no-console", stderr_file=errors)
    up = stack.process
    try:
        wait_for(stack.env_file.exists, timeout=120, message="the env file")
        env = parse_env_file(stack.env_file.read_text())
        dynamodb_url = env["AWS_ENDPOINT_URL_DYNAMODB"]
        table = env["DYNAMODB_EVENTS_TABLE_NAME"]
        ddb = boto3.client("dynamodb", endpoint_url=dynamodb_url, region_name=env["AWS_REGION"])
        ddb.put_item(TableName=table, Item={"PK": {"S": "kept"}, "SK": {"S": "kept"}})
        port = dynamodb_url.rsplit(":", 1)[1]
        (moto,) = [p for p in _marked(stack.marker)
                   if "agentq.local.moto_server" in p.cmdline() and port in p.cmdline()]  # fmt: skip
        moto.suspend()
        try:
            wait_for(lambda: f"local AWS (moto) at {dynamodb_url} has not answered" in
                     errors.read_text(), timeout=60, message="the stall said on screen")  # fmt: skip
            assert up.poll() is None, errors.read_text()
        finally:
            moto.resume()
        wait_for(lambda: f"local AWS (moto) at {dynamodb_url} answers again" in
                 errors.read_text(), timeout=60, message="the recovery said on screen")  # fmt: skip
        assert up.poll() is None, errors.read_text()
        item = ddb.get_item(TableName=table, Key={"PK": {"S": "kept"}, "SK": {"S": "kept"}})
        assert item["Item"]["PK"] == {"S": "kept"}
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.communicate(timeout=120)
        finally:
            if up.poll() is None:
                up.kill()
    assert up.returncode == 0, errors.read_text()
    wait_for(lambda: not _marked(stack.marker), timeout=30, message="no process left")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_local_up_stops_when_moto_stays_silent_past_the_stall_limit(tmp_path: Path) -> None:
    errors = tmp_path / "stderr.txt"
    stack = _local_up(
        tmp_path, "--workers", "0", "--no-console", "--stall-limit", "5", stderr_file=errors
    )
    up = stack.process
    frozen: list[psutil.Process] = []
    try:
        wait_for(stack.env_file.exists, timeout=120, message="the env file")
        dynamodb_url = parse_env_file(stack.env_file.read_text())["AWS_ENDPOINT_URL_DYNAMODB"]
        port = dynamodb_url.rsplit(":", 1)[1]
        frozen = [p for p in _marked(stack.marker)
                  if "agentq.local.moto_server" in p.cmdline() and port in p.cmdline()]  # fmt: skip
        frozen[0].suspend()
        up.communicate(timeout=120)
    finally:
        for process in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.resume()
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 1, errors.read_text()
    line = errors.read_text().strip().splitlines()[-1]
    assert line.startswith(f"agentq: the local stack lost: local AWS (moto) at {dynamodb_url} "
                           "(no answer for ")  # fmt: skip
    wait_for(lambda: not _marked(stack.marker), timeout=30, message="no process left")
