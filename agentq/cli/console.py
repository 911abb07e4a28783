"""`agentq console`: the web console on 127.0.0.1, printed as a URL with a token.

It reads the stage the environment configures (as every agentq command does) with
the operator's own credentials. Actions (redrive, discard, cancel, resubmit) are off
unless started with `--allow-actions`.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from agentq.cli.common import EXIT_OK


def register(subparsers: Any) -> None:
    console = subparsers.add_parser(
        "console", help="web console: jobs, DAGs, tasks, dead letters", description=__doc__
    )
    console.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: free)")
    console.add_argument(
        "--allow-actions",
        action="store_true",
        help="allow redrive, discard, cancel and resubmit (each recorded as an event)",
    )
    console.add_argument(
        "--refresh", type=float, default=2.0, help="seconds between live updates (default 2)"
    )
    console.set_defaults(func=_console)


def _console(args: argparse.Namespace) -> int:
    from agentq.config import Settings
    from agentq.console import ConsoleOptions, ConsoleServer

    options = ConsoleOptions(
        port=args.port, allow_actions=args.allow_actions, refresh_ms=int(args.refresh * 1000)
    )
    server = ConsoleServer.from_settings(Settings.from_env(), options)
    mode = "actions allowed" if args.allow_actions else "read-only"
    print(f"agentq console ({mode}) at:\n\n    {server.url}\n\nCtrl-C stops it.", flush=True)
    # uvicorn shuts down on the signal, then raises it again for the caller: Ctrl-C is
    # how an operator ends a console, not a failure.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return EXIT_OK
