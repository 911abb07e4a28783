"""The `agentq` command line.

Each module of this package that defines `register(subparsers)` contributes its
commands (`COMMANDS` says which, so a command imports its own module alone); every
command handler returns an exit code from `agentq.cli.common`, and whatever a command
raises ends as one line saying what to do (`agentq.cli._errors`).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from agentq import __version__
from agentq.cli.common import EXIT_USAGE, emit_json, fail, output

# The modules that register each command (in this order). Importing every command module
# was most of a command's start-up; help and unknown commands still import them all.
COMMANDS: Final[dict[str, tuple[str, ...]]] = {
    "cancel": ("tasks",), "console": ("console",), "cost": ("cost",),
    "definitions": ("definitions",), "dlq": ("dlq",), "env": ("env",),
    "events": ("tasks",), "job": ("jobs",), "local": ("local",), "logs": ("outputs",),
    "result": ("outputs",), "stats": ("stats",), "status": ("tasks",),
    "submit": ("tasks",), "tenants": ("tenants", "tenants_map"), "trace": ("outputs",),
    "watch": ("watch",), "worker": ("worker",),
}  # fmt: skip


def command_modules() -> list[str]:
    """Every module of this package that may register commands."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if not m.name.startswith("_") and m.name != "common")  # fmt: skip


def command_of(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is no option nor an option's value."""
    words = iter(argv)
    for word in words:
        if word == "--local-env":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `command` alone when `COMMANDS` names it."""
    parser = argparse.ArgumentParser(
        prog="agentq", description="Run Claude agent tasks as queued background work on AWS."
    )
    parser.add_argument("--version", action="version", version=f"agentq {__version__}")
    parser.add_argument(
        "--local",
        action="store_true",
        help="use the running local stack (reads .agentq/local.env here or in a parent "
        "directory; no need to source it)",
    )
    parser.add_argument(
        "--local-env", type=Path, help="the env file `agentq local up` wrote (implies --local)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    names = COMMANDS.get(command or "") or tuple(command_modules())
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    output.json = "--json" in argv
    output.emitted = False
    try:
        args = build_parser(command_of(argv)).parse_args(argv)
    except SystemExit as exc:
        # argparse printed the usage line already; scripts reading stdout still get JSON.
        usage_code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        if usage_code != 0 and output.json:
            emit_json({"error": {"code": usage_code, "kind": "usage", "message": "bad arguments",
                                 "hint": "see `agentq COMMAND --help`"}})  # fmt: skip
        return usage_code
    output.json = bool(getattr(args, "json", False))
    try:
        if args.local or args.local_env:
            from agentq.cli._localenv import apply_local_env

            apply_local_env(args.local_env)
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.debug:
            raise
        from agentq.cli._errors import describe

        failure = describe(exc)
        return fail(failure.message, failure.code, hint=failure.hint, kind=failure.kind)
    return code


if __name__ == "__main__":
    sys.exit(main())
