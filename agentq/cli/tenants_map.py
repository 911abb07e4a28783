"""`agentq tenants map|unmap|list`: which tenant each IAM principal acts for in the
producer API (docs/security.md).

The commands join the `tenants` group whichever module creates it: this module's name
sorts after `tenants`, so it finds a group registered there and adds to it, or makes
the group itself when there is none.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, emit_json
from agentq.errors import NotFound

GROUP = "tenants"


def tenant_commands(subparsers: Any) -> Any:
    """The `tenants` group's own subcommand action: the existing one, or a new group."""
    parser = subparsers.choices.get(GROUP)
    if parser is None:
        parser = subparsers.add_parser(GROUP, help="tenants: principals mapped to them")
    for action in parser._actions:  # argparse offers no public way to reach it
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest="tenants_command", metavar="COMMAND", required=True)


def register(subparsers: Any) -> None:
    commands = tenant_commands(subparsers)
    mapping = commands.add_parser(
        "map",
        help="make an IAM role or user act for a tenant in the producer API",
        description="Every session of a mapped role acts for its tenant; the API picks up "
        "a change within API_TENANT_CACHE_SECONDS.",
    )
    mapping.add_argument("principal", metavar="PRINCIPAL_ARN",
                         help="arn:aws:iam::ACCOUNT:role/[PATH/]NAME or .../user/[PATH/]NAME")  # fmt: skip
    mapping.add_argument("tenant", metavar="TENANT")
    views.add_json_flag(mapping)
    mapping.set_defaults(func=_map)
    unmap = commands.add_parser("unmap", help="remove a principal's mapping (the API refuses it)")
    unmap.add_argument("principal", metavar="PRINCIPAL_ARN")
    views.add_json_flag(unmap)
    unmap.set_defaults(func=_unmap)
    listing = commands.add_parser("list", help="mapped principals and their tenants")
    listing.add_argument("--tenant", help="only this tenant's principals")
    views.add_json_flag(listing)
    listing.set_defaults(func=_list)


def _store() -> Any:
    from agentq.config import Settings
    from agentq.principals import PrincipalTenants

    settings = Settings.from_env()
    return PrincipalTenants(views.aws(settings.region).dynamodb, settings.required("table_name"))


def _as_dict(mapping: Any) -> dict[str, Any]:
    at = mapping.mapped_at_ms
    return {
        "principal": mapping.principal,
        "key": mapping.key,
        "tenant": mapping.tenant,
        "mappedAt": datetime.fromtimestamp(at / 1000, UTC).isoformat() if at else None,
    }


def _map(args: argparse.Namespace) -> int:
    mapped = _store().map(args.principal, args.tenant)
    if args.json:
        emit_json(_as_dict(mapped))
    else:
        print(f"{mapped.principal} → tenant {mapped.tenant} (every session of {mapped.key})")
    return EXIT_OK


def _unmap(args: argparse.Namespace) -> int:
    removed = _store().unmap(args.principal)
    if removed is None:
        raise NotFound("principal mapping", args.principal)
    if args.json:
        emit_json({"unmapped": _as_dict(removed)})
    else:
        print(f"{removed.principal} no longer acts for tenant {removed.tenant}")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    found = _store().all(args.tenant)
    if args.json:
        emit_json([_as_dict(m) for m in found])
        return EXIT_OK
    table = Table("principal", "tenant", "mapped at")
    for m in found:
        row = _as_dict(m)
        table.add_row(escape(m.principal), escape(m.tenant), row["mappedAt"] or "")
    views.console.print(table)
    return EXIT_OK
