"""`agentq worker`: run the long-running task consumer in the foreground."""

from __future__ import annotations

import argparse
import os
from typing import Any


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
    # The worker lives outside the agentq package (agentq imports no worker code at
    # import time); import on use.
    from worker.app import main

    return main()
