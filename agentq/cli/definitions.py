"""`agentq definitions list|show|put|delete|sync`: the task-definitions table."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, emit_json
from agentq.errors import InvalidInput, NotFound


def register(subparsers: Any) -> None:
    definitions = subparsers.add_parser("definitions", help="manage task definitions")
    commands = definitions.add_subparsers(dest="definitions_command", metavar="COMMAND",
                                          required=True)  # fmt: skip
    listing = commands.add_parser("list", help="definitions in the table and directory")
    views.add_json_flag(listing)
    listing.set_defaults(func=_list)
    show = commands.add_parser("show", help="one definition")
    show.add_argument("name")
    views.add_json_flag(show)
    show.set_defaults(func=_show)
    put = commands.add_parser("put", help="store definitions from a YAML/JSON file")
    put.add_argument("file", type=Path)
    views.add_json_flag(put)
    put.set_defaults(func=_put)
    delete = commands.add_parser("delete", help="remove a definition from the table")
    delete.add_argument("name")
    views.add_json_flag(delete)
    delete.set_defaults(func=_delete)
    sync = commands.add_parser(
        "sync", help="make the table hold the definitions of these directories (deploys do it too)"
    )
    sync.add_argument("directories", type=Path, nargs="+", help="definition directories")
    sync.add_argument("--prune", action="store_true", help="also delete definitions not in them")
    views.add_json_flag(sync)
    sync.set_defaults(func=_sync)


def _table() -> Any:
    from agentq.config import Settings
    from agentq.definitions import DefinitionsTable

    settings = Settings.from_env()
    name = settings.required("definitions_table")
    return DefinitionsTable(views.aws(settings.region).dynamodb, name)


def _list(args: argparse.Namespace) -> int:
    client = views.client()
    registry = client.definitions
    found = [registry.get(name) for name in registry.names()] if registry else []
    if args.json:
        emit_json([d.to_dict() for d in found])
        return EXIT_OK
    table = Table("name", "kind", "timeout", "attempts", "description")
    for d in found:
        table.add_row(d.name, d.kind, f"{d.timeout_s:g}s" if d.timeout_s else "default",
                      str(d.max_attempts or "default"), escape(d.description))  # fmt: skip
    views.console.print(table)
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    registry = views.client().definitions
    if registry is None:
        raise NotFound("task definition", args.name)
    definition = registry.get(args.name)
    if args.json:
        emit_json(definition.to_dict())
    else:
        views.console.print_json(data=definition.to_dict())
    return EXIT_OK


def _put(args: argparse.Namespace) -> int:
    from agentq.definitions import load_file

    table = _table()
    if not args.file.is_file():
        raise InvalidInput(str(args.file), "no such file")
    stored = load_file(args.file)  # every definition is validated before any is stored
    for definition in stored:
        table.put(definition)
    if args.json:
        emit_json([d.to_dict() for d in stored])
    else:
        print("stored " + ", ".join(d.name for d in stored))
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    if not _table().delete(args.name):
        raise NotFound("task definition", args.name)
    if args.json:
        emit_json({"deleted": args.name})
    else:
        print(f"deleted {args.name}")
    return EXIT_OK


def _sync(args: argparse.Namespace) -> int:
    """The same sync a deployment runs (agentq.definitions.sync): idempotent, so a rerun
    after a throttle, a retried call or a crash half-way converges on the same table."""
    from agentq.definitions.sync import DefinitionSource, load_sources, sync_definitions

    wanted = load_sources(DefinitionSource(d, str(d)) for d in args.directories)
    report = sync_definitions(_table(), wanted, prune=args.prune).to_dict()
    if args.json:
        emit_json(report)
    else:
        for what, names in report.items():
            if names:
                print(f"{what}: {', '.join(names)}")
    return EXIT_OK
