"""`agentq local up`: the embedded local stack in the foreground, for experimenting."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agentq.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, emit_json, fail
from agentq.signal_relay import SignalRelay

# How often the foreground process checks that moto, the model server and the
# workers are still alive: a dead part must not leave a stack that looks up.
HEALTH_EVERY_S: Final = 2.0

if TYPE_CHECKING:
    from agentq.console import ConsoleServer
    from agentq.local.health import StackHealth
    from agentq.local.stack import LocalStack, LocalStackOptions


def register(subparsers: Any) -> None:
    local = subparsers.add_parser("local", help="run agentq's local stack (moto, model, Lambdas)")
    commands = local.add_subparsers(dest="local_command", metavar="COMMAND", required=True)
    up = commands.add_parser("up", help="start the local stack and keep it running until Ctrl-C")
    up.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    up.add_argument(
        "--env-file",
        type=Path,
        default=Path(".agentq/local.env"),
        help="where to write the variables to source (default .agentq/local.env)",
    )
    up.add_argument(
        "--definitions",
        type=Path,
        action="append",
        default=[],
        help="a directory of your task definitions (repeatable), added to the bundled "
        "samples; one of yours overrides a sample of the same name",
    )
    up.add_argument(
        "--no-samples",
        action="store_true",
        help="leave out the bundled samples (definitions/samples): only --definitions",
    )
    up.add_argument(
        "--real-claude",
        action="store_true",
        help="workers call the real Anthropic API with ANTHROPIC_API_KEY or "
        "CLAUDE_CODE_OAUTH_TOKEN from this shell (default: the offline model server)",
    )
    up.add_argument(
        "--stall-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop when moto or the model server has not answered for this long "
        "(default 60; shorter silences are waited out and said on screen)",
    )
    up.add_argument("--json", action="store_true", help="print the endpoints as JSON")
    up.add_argument("--no-console", action="store_true", help="do not start the web console")
    up.add_argument(
        "--allow-actions", action="store_true", help="let the web console redrive, cancel, ..."
    )
    up.set_defaults(func=_up)


def _up(args: argparse.Namespace) -> int:
    from agentq.local.stack import SAMPLE_DEFINITIONS, LocalStackOptions, real_claude_configured

    if args.real_claude and not real_claude_configured():
        return fail("--real-claude needs ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN", 5,
                    hint="export one of them, or leave out --real-claude")  # fmt: skip
    missing = [str(d) for d in args.definitions if not d.is_dir()]
    if missing:
        return fail(f"--definitions {missing[0]}: not a directory", EXIT_USAGE,
                    hint="give a directory of task definition YAML files")  # fmt: skip
    stopping = threading.Event()
    running: list[LocalStack] = []

    def _on_signal(signum: int) -> None:
        # The first asks for a drain; another while it drains stops the workers now.
        if stopping.is_set() and running:
            print("stopping now: killing the workers (their tasks come back after their leases)",
                  file=sys.stderr, flush=True)  # fmt: skip
            running[0].kill_workers()
        stopping.set()

    # SIGHUP too: closing the terminal must not leave moto, the workers and the model
    # server running in their own sessions, with nobody to stop them.
    relay = SignalRelay(_on_signal, signals=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    relay.install()
    options = LocalStackOptions(
        workers=args.workers,
        definitions_dirs=_definitions_dirs(args, SAMPLE_DEFINITIONS),
        use_real_claude=args.real_claude,
    )
    if args.stall_limit is not None:
        options.stall_limit_s = args.stall_limit
    try:
        return _serve(args, options, stopping, running)
    finally:
        relay.uninstall()


def _definitions_dirs(args: argparse.Namespace, samples: Path) -> tuple[Path, ...]:
    """The samples first, so a definition of the user's with the same name wins."""
    own = tuple(d.resolve() for d in args.definitions)
    return own if args.no_samples else (samples, *own)


def _serve(
    args: argparse.Namespace,
    options: LocalStackOptions,
    stopping: threading.Event,
    running: list[LocalStack],
) -> int:
    from agentq.local.stack import LocalStack

    with LocalStack(options) as stack, _console(args, stack) as web:
        running.append(stack)
        env_file = stack.write_env_file(args.env_file.resolve())
        written = env_file.read_text()
        env = stack.env()
        summary = {
            "aws_endpoint": env.get("AWS_ENDPOINT_URL"),
            "dynamodb": env.get("AWS_ENDPOINT_URL_DYNAMODB", env.get("AWS_ENDPOINT_URL")),
            "model_server": stack.model_server.url if stack.model_server else "real Claude API",
            "queue_url": env["SQS_QUEUE_URL"],
            "table": env["DYNAMODB_EVENTS_TABLE_NAME"],
            "bus": env["EVENTBRIDGE_BUS_NAME"],
            "bucket": env["S3_BUCKET"],
            "workers": [w.name for w in stack.workers],
            "worker_logs": str(stack.log_dir),
            "env_file": str(env_file),
            "console": web.url if web else None,
        }
        if args.json:
            emit_json(summary)
        else:
            print("agentq local stack is up")
            for key, value in summary.items():
                print(f"  {key:<13} {value}")
            print(f"\nIn another shell:  source {env_file}   (or add --local to each command)")
            print("  agentq submit <definition> --input '{...}'   agentq watch   agentq job list")
            print("Ctrl-C stops everything (the worker logs go with it).")
        sys.stdout.flush()
        dead = _watch(stack.health(), stopping)
        print("stopping: draining workers (each ends its long poll first, up to 20 s; "
              "Ctrl-C again kills them), then the Lambda host, model server and moto")  # fmt: skip
        sys.stdout.flush()
        # A file naming a stopped stack only leads the next command to a dead endpoint;
        # one another `local up` wrote since is that stack's, and stays.
        if env_file.is_file() and env_file.read_text() == written:
            env_file.unlink()
    if dead:
        return fail(f"the local stack lost: {', '.join(dead)}", EXIT_ERROR,
                    hint="start it again with `agentq local up` and source its env file")  # fmt: skip
    return EXIT_OK


def _watch(health: StackHealth, stopping: threading.Event) -> list[str]:
    """Check the stack until asked to stop or a part is dead; say on screen while a part
    is silent, so a long pause reads as a wait, not a hang. Returns the dead parts."""
    while not stopping.wait(HEALTH_EVERY_S):
        report = health.check()
        for stall in report.stalled:
            print(f"agentq: {stall.name} has not answered for {stall.silent_s:.0f} s; "
                  f"waiting (the stack stops if it stays silent for "
                  f"{health.stall_limit_s:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
        for name in report.recovered:
            print(f"agentq: {name} answers again", file=sys.stderr, flush=True)
        if report.dead:
            return report.dead
    return []


@contextlib.contextmanager
def _console(args: argparse.Namespace, stack: LocalStack) -> Iterator[ConsoleServer | None]:
    if args.no_console:
        yield None
        return
    from agentq.aws import AwsClients
    from agentq.config import Settings
    from agentq.console import ConsoleOptions, serving

    # The console is the operator's: with IAM enforced it signs with the operator's key,
    # not the environment's (the producer's).
    aws = (
        AwsClients(Settings.from_env().region, credentials=stack.credentials["operator"].env())
        if stack.iam
        else None
    )
    with serving(ConsoleOptions(allow_actions=args.allow_actions), aws=aws) as web:
        yield web
