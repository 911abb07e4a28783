"""`agentq tenants limit|transcripts|show`: per-tenant settings across the worker fleet.

A tenant may hold at most its limit of task locks at once (TENANT_CONCURRENCY_LIMIT,
or the override set here; 0 is unlimited). `transcripts T off`: the tenant's agent
tasks store no session transcript (no checkpoint, no resume, no continue). Workers read
a change within 30 s.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from rich.markup import escape
from rich.table import Table

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, emit_json
from agentq.errors import InvalidInput, shown
from agentq.events import now_ms
from agentq.store.tenants import (
    MAX_LIMIT,
    TenantLimitStore,
    free_seats,
    validate_tenant,
)

DEFAULT_WORD: Final = "default"


def register(subparsers: Any) -> None:
    tenants = subparsers.add_parser(
        "tenants", help="per-tenant concurrency limits", description=__doc__
    )
    commands = tenants.add_subparsers(dest="tenants_command", metavar="COMMAND", required=True)
    limit = commands.add_parser(
        "limit", help="set a tenant's concurrency limit (0: unlimited; 'default': remove it)"
    )
    limit.add_argument("tenant", metavar="TENANT")
    limit.add_argument("limit", metavar="N", help=f"0..{MAX_LIMIT}, or '{DEFAULT_WORD}'")
    views.add_json_flag(limit)
    limit.set_defaults(func=_limit)
    transcripts = commands.add_parser(
        "transcripts",
        help="store a tenant's agent session transcripts (on, the default) or not (off)",
    )
    transcripts.add_argument("tenant", metavar="TENANT")
    transcripts.add_argument("setting", choices=["on", "off"])
    views.add_json_flag(transcripts)
    transcripts.set_defaults(func=_transcripts)
    show = commands.add_parser(
        "show", help="the default, every override and the seats in use (or one tenant's)"
    )
    show.add_argument("tenant", metavar="TENANT", nargs="?")
    views.add_json_flag(show)
    show.set_defaults(func=_show)


def parse_limit(text: str) -> int | None:
    """An operator's N: an integer 0..MAX_LIMIT, or `default` (None: no override)."""
    if text.strip().lower() == DEFAULT_WORD:
        return None
    stripped = text.strip()
    if (
        not stripped.isascii()
        or not stripped.isdigit()
        or len(stripped) > 5
        or int(stripped) > MAX_LIMIT
    ):
        raise InvalidInput("N", f"must be an integer from 0 to {MAX_LIMIT} or "
                                f"'{DEFAULT_WORD}', got {shown(text)}")  # fmt: skip
    return int(stripped)


def _store() -> tuple[TenantLimitStore, int]:
    from agentq.config import Settings

    settings = Settings.from_env()
    table = settings.required("table_name")
    store = TenantLimitStore(views.aws(settings.region).dynamodb, table)
    return store, settings.tenant_concurrency_limit


def _limit(args: argparse.Namespace) -> int:
    tenant = validate_tenant(args.tenant)
    limit = parse_limit(args.limit)
    store, default = _store()
    if limit is None:
        store.clear(tenant)
    else:
        store.set(tenant, limit)
    effective = default if limit is None else limit
    if args.json:
        emit_json({"tenant": tenant, "limit": effective, "override": limit is not None})
        return EXIT_OK
    source = "override" if limit is not None else "default of this environment"
    print(f"{tenant}: {_describe(effective)} ({source}); workers apply it within 30 s")
    return EXIT_OK


def _transcripts(args: argparse.Namespace) -> int:
    tenant = validate_tenant(args.tenant)
    stored = args.setting == "on"
    store, _ = _store()
    store.set_transcripts(tenant, stored=stored)
    if args.json:
        emit_json({"tenant": tenant, "transcripts": args.setting})
        return EXIT_OK
    if stored:
        print(f"{tenant}: agent session transcripts are stored (resume and continue work); "
              "workers apply it within 30 s")  # fmt: skip
    else:
        print(f"{tenant}: agent session transcripts are not stored (no checkpoint, no "
              "resume, no continue); workers apply it within 30 s. Transcripts stored "
              "before stay in S3 until the bucket's lifecycle removes them")  # fmt: skip
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    store, default = _store()
    if args.tenant:
        # By key, strongly: the override set a moment ago shows in the listing index
        # only a moment later.
        tenants = [validate_tenant(args.tenant)]
        found = store.settings(tenants[0], consistent=True)
        overrides = {} if found.limit is None else {tenants[0]: found.limit}
        silent = set() if found.transcripts else {tenants[0]}
    else:
        overrides = {o.tenant: o.limit for o in store.overrides()}
        silent = set(store.transcripts_off())
        tenants = sorted(set(overrides) | silent)
    now = now_ms()
    rows: list[dict[str, Any]] = []
    for tenant in tenants:
        limit = overrides.get(tenant, default)
        seats = store.seats(tenant)
        held = [s for s in seats if s.live(now)]
        rows.append({
            "tenant": tenant,
            "limit": limit,
            "override": tenant in overrides,
            "running": len(held),
            "free": len(free_seats(seats, limit, now)) if limit else None,
            "holders": sorted(s.request_id or "?" for s in held),
            "transcripts": "off" if tenant in silent else "on",
        })  # fmt: skip
    if args.json:
        emit_json({"default": default, "tenants": rows})
        return EXIT_OK
    print(f"default limit (TENANT_CONCURRENCY_LIMIT here): {_describe(default)}")
    if not rows:
        print("no tenant has an override")
        return EXIT_OK
    table = Table("tenant", "limit", "from", "running", "free", "transcripts")
    for row in rows:
        table.add_row(escape(row["tenant"]), _describe(row["limit"]),
                      "override" if row["override"] else "default", str(row["running"]),
                      "-" if row["free"] is None else str(row["free"]),
                      row["transcripts"])  # fmt: skip
    views.console.print(table)
    return EXIT_OK


def _describe(limit: int) -> str:
    return "unlimited" if limit == 0 else f"{limit} at once"
