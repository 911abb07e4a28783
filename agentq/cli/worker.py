"""`agentq worker`: run the long-running task consumer in the foreground."""

from __future__ import annotations

import argparse
import os
import pkgutil
from collections.abc import Callable
from typing import Any, Final

# The worker stands on agentq, so agentq names its entry point instead of importing
# it, as the local Lambda host names the handlers (agentq/local/lambda_host.py).
WORKER_MAIN: Final = "worker.app:main"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run a worker: receive tasks from the queue and run them",
        description=(
            "Long-polls the task queue and runs tasks in isolated child processes. "
            "Configured by environment variables (docs/configuration.md). "
            "SIGTERM drains (exit 0, or 3 when DRAIN_TIMEOUT passed); a second signal "
            "exits at once (4); bad configuration exits 5."
        ),
    )
    parser.add_argument("--concurrency", type=int, help="task slots (MAX_CONCURRENT_CLAUDE)")
    parser.add_argument("--definitions", help="task definitions directory (TASK_DEFINITIONS_DIR)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # Flags are shorthands for the environment: Settings stays the one source.
    if args.concurrency is not None:
        os.environ["MAX_CONCURRENT_CLAUDE"] = str(args.concurrency)
    if args.definitions:
        os.environ["TASK_DEFINITIONS_DIR"] = args.definitions
    main: Callable[[], int] = pkgutil.resolve_name(WORKER_MAIN)
    return main()
