"""The `agentq` command line.

Each module of this package that defines `register(subparsers)` contributes its
commands; every command handler returns an exit code from `agentq.cli.common`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from agentq import __version__
from agentq.cli.common import EXIT_CONFIG, EXIT_INVALID, EXIT_NOT_FOUND, fail
from agentq.errors import ConfigError, InvalidInput, NotFound


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentq", description="Run Claude agent tasks as queued background work on AWS."
    )
    parser.add_argument("--version", action="version", version=f"agentq {__version__}")
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
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        return fail(str(exc), EXIT_CONFIG)
    except NotFound as exc:
        return fail(str(exc), EXIT_NOT_FOUND)
    except InvalidInput as exc:
        return fail(str(exc), EXIT_INVALID)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
