"""The whole of agentq on one machine: what `make demo` and `agentq local up` run.

moto's server stands in for AWS, the offline model server for the Anthropic API
(unless Claude credentials are set), the Lambda host runs the real handlers for the
rule-target queues and the DLQ plus a health-check timer, and workers run as
separate processes. `LocalStack.stop()` ends all of it, and checks nothing is left.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil

from agentq.config import Settings
from agentq.errors import ConfigError
from agentq.local.aws import LocalResources, MotoServer, provision_on
from agentq.local.health import DEFAULT_STALL_LIMIT_S, Part, StackHealth, answers
from agentq.resources import ResourceNames

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
# The bundled sample definitions the README's and the tutorial's commands use.
SAMPLE_DEFINITIONS: Final = REPO_ROOT / "definitions" / "samples"
CREDENTIAL_VARIABLES: Final = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN")
# How long `stop` lets the workers drain together before it kills what is left.
WORKER_DRAIN_S: Final = 60.0


def real_claude_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Claude credentials are set and nothing asks for the offline model server."""
    env = os.environ if environ is None else environ
    if env.get("AGENTQ_OFFLINE_MODEL", "").lower() in ("1", "true", "yes"):
        return False
    return any(env.get(name) for name in CREDENTIAL_VARIABLES)


@dataclass(kw_only=True)
class LocalStackOptions:
    stage: str = "local"
    workers: int = 2
    definitions_dirs: tuple[Path, ...] = ()
    health_interval_s: float = 5.0
    # A part silent this long is dead (agentq.local.health); shorter silences are waited out.
    stall_limit_s: float = DEFAULT_STALL_LIMIT_S
    model_script: Path | None = None
    use_real_claude: bool | None = None  # None: decide from the environment
    worker_env: dict[str, str] = field(default_factory=dict)
    work_dir: Path | None = None
    iam: bool | None = None  # None: AGENTQ_LOCAL_IAM=enforce turns it on
    # Component -> actions (or statements' Sids) taken out of its synthesized policy
    # (tests prove each is needed).
    iam_without: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)


class LocalStack:
    """Start with `start()` (or `with`); every component is stopped by `stop()`."""

    def __init__(self, options: LocalStackOptions | None = None) -> None:
        self.options = options or LocalStackOptions()
        self.moto: MotoServer | None = None
        self.resources: LocalResources | None = None
        self.model_server: Any = None
        self.lambda_host: Any = None
        self.ecs_agent: Any = None  # agentq.local.ecs_agent: each worker's ECS_AGENT_URI
        self.workers: list[Any] = []
        self._clients: dict[str, Any] | None = None
        self._own_work_dir = self.options.work_dir is None
        self.work_dir = self.options.work_dir or Path(tempfile.mkdtemp(prefix="agentq-local-"))
        self.real_claude = (
            real_claude_configured()
            if self.options.use_real_claude is None
            else self.options.use_real_claude
        )
        self._saved_environ: dict[str, str | None] = {}
        self.iam = (
            Settings.from_env().local_iam == "enforce"
            if self.options.iam is None
            else self.options.iam
        )
        self.credentials: dict[str, Any] = {}  # component -> agentq.local.iam.Credentials

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> LocalStack:
        try:
            self._start_aws()
            self._start_model()
            self._apply_environment()
            self._start_lambda_host()
            from agentq.local.ecs_agent import EcsAgentStandIn

            self.ecs_agent = EcsAgentStandIn().start()
            for index in range(self.options.workers):
                self.add_worker(f"worker-{index + 1}")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_aws(self) -> None:
        policies = None
        if self.iam:
            from agentq.local.iam import synthesized_policies

            policies = synthesized_policies()  # before moto: a first synthesis takes a while
        self.moto = MotoServer(iam=self.iam).start()
        self._clients, self.resources = provision_on(
            self.moto, ResourceNames(stage=self.options.stage)
        )
        if policies is not None:
            self.credentials = self._component_users(policies)

    def _component_users(self, policies: Any) -> dict[str, Any]:
        import boto3

        from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION
        from agentq.local.iam import create_component_users
        from agentq.local.moto_iam import ACCOUNT_ID

        assert self.moto is not None
        iam = boto3.client(
            "iam",
            endpoint_url=self.moto.url,
            region_name=LOCAL_REGION,
            aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        return create_component_users(
            iam, self.resources, policies, region=LOCAL_REGION, account=ACCOUNT_ID,
            without=self.options.iam_without,
        )  # fmt: skip

    def _start_model(self) -> None:
        if self.real_claude:
            return
        from agentq.local.model_server import ModelServer

        script = str(self.options.model_script) if self.options.model_script else None
        self.model_server = ModelServer(script=script).start()

    def _start_lambda_host(self) -> None:
        from agentq.local.lambda_host import LambdaHost

        assert self.resources is not None
        if self.iam:
            from agentq.local.lambda_procs import LambdaProcesses

            self.lambda_host = LambdaProcesses(
                self.resources,
                credentials=self.credentials,
                env=self.env(),
                log_dir=self.work_dir / "logs",
                health_interval_s=self.options.health_interval_s,
            ).start()
            return
        self.lambda_host = LambdaHost(
            self.resources,
            Settings.from_env(),
            health_interval_s=self.options.health_interval_s,
        ).start()

    def add_worker(self, name: str, **extra_env: str) -> Any:
        from agentq.local.workers import WorkerProcess

        self.log_dir.mkdir(parents=True, exist_ok=True)
        worker = WorkerProcess(name, log_dir=self.log_dir)
        own = self.credentials["worker"].env() if self.iam else {}
        agent = {"ECS_AGENT_URI": self.ecs_agent.uri_for(name)} if self.ecs_agent else {}
        # A new interpreter, as `agentq local up` and a host start it, whatever the test
        # suite's FORKING: the IAM-enforced tests read its key from its /proc environ.
        worker.start({**self.env(), "WORKER_ID": name, **agent, **own, **extra_env}, fresh=True)
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        """Drain workers, then stop the Lambda host, model server and moto, and give the
        process its environment back, whatever failed on the way. Idempotent."""
        try:
            self._stop_parts()
        finally:
            # An in-process caller (a test, the demo) must not go on signing with this
            # stack's keys or enforcing its IAM after it is gone.
            self._restore_environment()
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _stop_parts(self) -> None:
        # All workers drain at once: each first waits for its long poll to end (up to
        # WAIT_TIME_SECONDS), which one worker after another paid once per worker.
        workers = list(self.workers)
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.send(signal.SIGTERM)
        deadline = time.monotonic() + WORKER_DRAIN_S
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.wait(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(Exception):
                worker.kill()  # one that did not drain in time, and any child it left
        self.workers.clear()
        if self.lambda_host is not None:
            with contextlib.suppress(Exception):
                self.lambda_host.stop()
            self.lambda_host = None
        if self.ecs_agent is not None:
            self.ecs_agent.stop()
            self.ecs_agent = None
        if self.model_server is not None:
            with contextlib.suppress(Exception):
                self.model_server.stop()
            self.model_server = None
        if self.moto is not None:
            self.moto.stop()
            self.moto = None

    def kill_workers(self) -> None:
        """SIGKILL every worker and its task children now (a second Ctrl-C): their
        messages come back when their visibility lapses, their tasks when the leases do."""
        for worker in list(self.workers):
            with contextlib.suppress(Exception):
                worker.kill()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- environment ---------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What a worker needs to use this stack: AWS endpoints, names, Claude, definitions."""
        env = self.user_env()
        if self.model_server is not None:
            from agentq.local.claude_env import offline_claude_env

            home = self.work_dir / "claude-home"
            home.mkdir(parents=True, exist_ok=True)
            env.update(offline_claude_env(self.model_server.url, home))
        env.update(self.options.worker_env)
        if self.iam:
            # Whoever uses this stack through its environment (the env file, the CLI, the
            # demo's client) is a producer; workers and Lambdas get their own keys.
            env["AGENTQ_LOCAL_IAM"] = "enforce"
            env.update(self.credentials["producer"].env())
        return env

    def user_env(self) -> dict[str, str]:
        """What a user's shell needs to reach this stack: agentq's and AWS's variables only.

        Nothing for Claude (HOME, API keys): workers get those from the stack, and a
        shell that sourced them would send its own `claude` or `make demo` to a model
        server that is gone once the stack stops.
        """
        assert self.resources is not None, "start() first"
        env = dict(self.resources.env())
        dirs = self.options.definitions_dirs or (SAMPLE_DEFINITIONS,)
        # Absolute: the file is sourced, and the CLI run, from any directory.
        env["TASK_DEFINITIONS_DIR"] = os.pathsep.join(str(d.resolve()) for d in dirs)
        if self.iam:
            # A user's shell is a producer of an IAM-enforced stack, as the env is.
            env["AGENTQ_LOCAL_IAM"] = "enforce"
            env.update(self.credentials["producer"].env())
        return env

    def operator_env(self) -> dict[str, str]:
        """A user's shell acting as the operator (`agentq dlq`, `tenants`, `stats`, the
        console's actions): with IAM enforced, the `OperatorPolicy` user's key."""
        env = self.user_env()
        if self.iam:
            env.update(self.credentials["operator"].env())
        return env

    @property
    def log_dir(self) -> Path:
        """Where each worker's output goes (`<worker name>.log`)."""
        return self.work_dir / "logs"

    def health(self) -> StackHealth:
        """A watch over this started stack's parts (see agentq.local.health): workers die
        with their process; moto and the model server also when silent past the limit."""
        parts = [Part(f"worker {w.name}", exited=_not_alive(w)) for w in self.workers]
        if self.moto is not None:
            for url in self.moto.urls:
                parts.append(Part(f"local AWS (moto) at {url}", exited=_exited(self.moto, url),
                                  probe=_probe(f"{url}/moto-api/")))  # fmt: skip
        if self.model_server is not None:
            url = self.model_server.url
            parts.append(Part(f"model server at {url}", probe=_probe(url)))
        return StackHealth(parts, stall_limit_s=self.options.stall_limit_s)

    def _apply_environment(self) -> None:
        # The Lambda host and in-process clients read the same variables as workers do;
        # the host runs in this process, so its JSON logs and EMF stay off the screen
        # unless asked for.
        quiet = {"POWERTOOLS_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_DISABLED": "true"}
        for key, value in quiet.items():
            if key not in os.environ:
                self._saved_environ.setdefault(key, None)
                os.environ[key] = value
        for key, value in self.env().items():
            self._saved_environ.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def _restore_environment(self) -> None:
        for key, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_environ.clear()

    def write_env_file(self, path: Path) -> Path:
        """A file to `source` in another shell, so `agentq` and boto3 reach this stack."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(format_env_file(self.user_env()))
        return path

    def stray_processes(self) -> list[psutil.Process]:
        """Processes started by this stack that are still alive (should be none after stop)."""
        me = psutil.Process()
        return [p for p in me.children(recursive=True) if p.is_running()]


def _not_alive(worker: Any) -> Callable[[], bool]:
    return lambda: not worker.alive()


def _exited(moto: MotoServer, url: str) -> Callable[[], bool]:
    return lambda: moto.exited(url)


def _probe(url: str) -> Callable[[], bool]:
    return lambda: answers(url)


ENV_FILE_HEADER: Final = (
    "# agentq local stack: source this file, or run `agentq --local ...` instead.\n"
    "# It sets only agentq's and AWS's variables (the stack's endpoint and test credentials).\n"
)


def format_env_file(env: Mapping[str, str], *, header: str = ENV_FILE_HEADER) -> str:
    """`export KEY='value'` lines, one per variable (`agentq --local` reads them back)."""
    for key, value in env.items():
        if "\n" in value or "\x00" in value:
            raise ConfigError(key, "cannot go in an env file: its value holds a newline or NUL")
    lines = [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    return header + "\n".join(lines) + "\n"
