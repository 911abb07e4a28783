"""The local Lambda host as one process per function, for the IAM-enforced local stack.

On AWS each function runs with its own role. In one process the handlers would share
the environment's credentials (and `lambdas._common`'s cached clients), so with IAM
enforced each function gets a process of its own whose environment holds its own
user's key (agentq.local.iam). What the Lambda service does itself keeps the service's
rights: EventBridge delivering to a function is allowed by the function's resource
policy, so the rule-target queues (the local stand-in for that delivery) are polled
with the stack's admin key; the DLQ's event source mapping polls with the function's role
on AWS, so the DLQ is polled with the dlq-processor's own key.

    python -m agentq.local.lambda_procs --function save-event --resources r.json
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION, LocalResources
from agentq.local.iam import Credentials
from agentq.signal_relay import SignalRelay

FUNCTIONS: Final = ("save-event", "dispatcher", "dlq-processor", "health-check", "reconciler")


class LambdaProcesses:
    """`start()` one host process per function; `stop()` ends them (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        resources: LocalResources,
        *,
        credentials: Mapping[str, Credentials],
        env: Mapping[str, str],
        log_dir: Path,
        health_interval_s: float,
    ) -> None:
        self.resources = resources
        self._credentials = credentials
        self._env = env
        self._log_dir = log_dir
        self._health_interval_s = health_interval_s
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, function: str) -> Path:
        return self._log_dir / f"lambda-{function}.log"

    def output(self, function: str) -> str:
        try:
            return self.log_path(function).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self) -> LambdaProcesses:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        resources_file = self._log_dir / "lambda-resources.json"
        resources_file.write_text(self.resources.to_json())
        for function in FUNCTIONS:
            env = {**os.environ, **self._env, **self._credentials[function].env()}
            if function == "health-check":
                # Locally the health check peeks into the DLQ for its oldest message's
                # age (moto has no SQS metrics): a receive its deployed role rightly
                # lacks. Here it takes the deployed path (CloudWatch, which has no data).
                env["AGENTQ_LOCAL"] = "0"
            with self.log_path(function).open("ab") as log:
                self.processes[function] = subprocess.Popen(
                    [sys.executable, "-m", "agentq.local.lambda_procs", "--function", function,
                     "--resources", str(resources_file),
                     "--health-interval", str(self._health_interval_s)],
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )  # fmt: skip
        return self

    def alive(self) -> dict[str, bool]:
        return {name: process.poll() is None for name, process in self.processes.items()}

    def stop(self, timeout_s: float = 30.0) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.processes.clear()


def _service_sqs(function: str) -> object:
    from agentq.aws import AwsClients, client_config, new_session

    if function == "dlq-processor":
        return AwsClients(os.environ.get("AWS_REGION", LOCAL_REGION)).sqs
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    return session.client("sqs", config=client_config())


def main(argv: list[str] | None = None) -> None:
    from agentq.config import Settings
    from agentq.local.lambda_host import LambdaHost

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--function", choices=FUNCTIONS, required=True)
    parser.add_argument("--resources", type=Path, required=True)
    parser.add_argument("--health-interval", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    stopping = threading.Event()
    SignalRelay(lambda signum: stopping.set()).install()
    resources = LocalResources.from_json(args.resources.read_text())
    host = LambdaHost(
        resources,
        Settings.from_env(),
        sqs=_service_sqs(args.function),
        health_interval_s=args.health_interval,
        only=args.function,
    ).start()
    print(f"lambda host for {args.function} is up", flush=True)
    stopping.wait()
    host.stop()


if __name__ == "__main__":
    main()
