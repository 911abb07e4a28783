"""What the DynamoDB rules share: moto's backend checked for the shape they patch, the
key of an item a write names, and work deferred until the request's answer is due.

agentq/local/moto_server.py serializes DynamoDB requests under one lock and calls
`run_deferred()` once the request's answer is made and the lock released: a rule that
makes a request last (a transaction in flight) waits there, while other requests run.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from agentq.errors import ConfigError
from agentq.local import moto_guards

RULES_DIR: Final = "agentq/local/rules"
_deferred = threading.local()


def backend(*methods: tuple[str, list[str]]) -> Any:
    """moto's DynamoDBBackend, each named method taking the leading parameters given."""
    import moto.dynamodb.models as dynamodb_models

    found = getattr(dynamodb_models, "DynamoDBBackend", None)
    if not isinstance(found, type):
        raise moto_guards.refuse("moto", "moto.dynamodb.models.DynamoDBBackend is gone", RULES_DIR)
    for name, leading in methods:
        method = getattr(found, name, None)
        if method is None or moto_guards.parameters(method)[: len(leading)] != leading:
            problem = f"DynamoDBBackend.{name}({', '.join(leading)}, ...) changed"
            raise moto_guards.refuse("moto", problem, RULES_DIR)
    return found


def error_class(name: str) -> type[Exception]:
    """A DynamoDB error moto answers as `{"__type": "...#<name>"}` with HTTP 400."""
    from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX, DynamodbException

    error_type = ERROR_TYPE_PREFIX + name

    class Refused(DynamodbException):  # type: ignore[misc]
        def __init__(self, message: str) -> None:
            super().__init__(error_type, message=message)

    Refused.__name__ = Refused.__qualname__ = name
    Refused.error_type = error_type
    return Refused


def item_key(db: Any, table_name: str, attributes: Mapping[str, Any]) -> str | None:
    """The item's identity across requests: table and key attributes (None when the
    table is unknown: moto answers that itself)."""
    table = db.tables.get(table_name)
    if table is None:
        return None
    names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
    return json.dumps([table.name, [attributes.get(n) for n in names]], sort_keys=True)


def transaction_keys(db: Any, transact_items: Any) -> list[str | None]:
    """The key of each item of a TransactWriteItems, in order."""
    keys: list[str | None] = []
    for entry in transact_items if isinstance(transact_items, list) else []:
        kind, op = next(iter(entry.items())) if entry else ("", {})
        raw = op.get("Item") if kind == "Put" else op.get("Key")
        name = op.get("TableName")
        keys.append(item_key(db, name, raw or {}) if isinstance(name, str) else None)
    return keys


def defer(work: Callable[[], None]) -> None:
    """Run `work` on this request's thread after its answer is made, outside the lock."""
    pending: list[Callable[[], None]] = getattr(_deferred, "work", [])
    pending.append(work)
    _deferred.work = pending


def run_deferred() -> None:
    pending: list[Callable[[], None]] = getattr(_deferred, "work", [])
    _deferred.work = []
    for work in pending:
        work()


def milliseconds_knob(variable: str, default_ms: int) -> float:
    """A rule's knob from the moto process's environment: whole ms, 0 (off) to 60000,
    `default_ms` when unset; in seconds."""
    raw = os.environ.get(variable, str(default_ms))
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(variable, f"{raw!r} is not a whole number of ms") from None
    if not 0 <= value <= 60_000:
        raise ConfigError(variable, "must be from 0 to 60000 ms")
    return value / 1000
