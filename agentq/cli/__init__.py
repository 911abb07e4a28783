"""The `agentq` command line.

Each module of this package that defines `register(subparsers)` contributes its
commands; every command handler returns an exit code from `agentq.cli.common`, and
whatever a command raises ends as one line saying what to do (`agentq.cli._errors`).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path

from agentq import __version__
from agentq.cli.common import EXIT_USAGE, emit_json, fail, output


def build_parser() -> argparse.ArgumentParser:
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
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module_info.name.startswith("_") or module_info.name == "common":
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    output.json = "--json" in argv
    output.emitted = False
    try:
        args = build_parser().parse_args(argv)
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
