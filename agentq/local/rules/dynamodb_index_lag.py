"""DynamoDB rule: a global secondary index shows the table as it was a moment ago.

AWS (DynamoDB developer guide, global secondary indexes): "Queries on global secondary
indexes support eventual consistency only"; "in a DynamoDB table, each key value must
be unique. However, the key values in a global secondary index do not need to be
unique" and, on synchronization, "changes to the table data are propagated to the
global secondary indexes within a fraction of a second, under normal conditions".

moto answers an index query from the table as it is now. Here a Query or Scan with
`IndexName` sees every item written in the last `AGENTQ_LOCAL_INDEX_LAG_MS` (default
500: a slow "fraction of a second"; 0: off) as it was before that window: a new item
is missing, a changed one old, a deleted one still there. Table reads are not affected.
Each write keeps its item's previous version for the lag, only while on.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from agentq.local import moto_guards, moto_partitions
from agentq.local.rules import _dynamodb

VARIABLE: Final = "AGENTQ_LOCAL_INDEX_LAG_MS"
DEFAULT_MS: Final = 500
_lock = threading.Lock()
# table name -> (hash, range) -> [(written at, the item before that write or None)]
_history: dict[str, dict[tuple[Any, Any], list[tuple[float, Any]]]] = {}


def lag_s() -> float:
    return _dynamodb.milliseconds_knob(VARIABLE, DEFAULT_MS)


def install() -> None:
    db = _dynamodb.backend(
        ("put_item", ["self", "table_name", "item_attrs"]),
        ("update_item", ["self", "table_name", "key"]),
        ("delete_item", ["self", "table_name", "key"]),
        ("query", ["self", "table_name"]),
        ("scan", ["self", "table_name"]),
    )
    for name in ("query", "scan"):
        if "index_name" not in moto_guards.parameters(getattr(db, name)):
            raise moto_guards.refuse("moto", f"DynamoDBBackend.{name} has no index_name",
                                     _dynamodb.RULES_DIR)  # fmt: skip
    lag = lag_s()
    if lag <= 0 or getattr(db.query, "lags_indexes", False):
        return
    from moto.dynamodb.models.dynamo_type import DynamoType

    for name in ("put_item", "update_item", "delete_item"):
        setattr(db, name, _remembering(getattr(db, name), DynamoType, lag))
    for name in ("query", "scan"):
        setattr(db, name, _lagging(getattr(db, name), lag))


def _remembering(write: Callable[..., Any], dynamo_type: type, lag: float) -> Callable[..., Any]:
    @functools.wraps(write)
    def remembered(backend: Any, table_name: str, attributes: Any, *args: Any, **kw: Any) -> Any:
        table = backend.tables.get(table_name)
        if table is None or not isinstance(attributes, dict):
            return write(backend, table_name, attributes, *args, **kw)
        try:
            key = _key(table, attributes, dynamo_type)
            before = copy.deepcopy(_get(table, key))
        except (KeyError, TypeError, ValueError):
            return write(backend, table_name, attributes, *args, **kw)
        result = write(backend, table_name, attributes, *args, **kw)
        now = time.monotonic()
        with _lock:
            versions = _history.setdefault(table.name, {}).setdefault(key, [])
            versions.append((now, before))
            _prune(table.name, now - lag)
        return result

    return remembered


def _lagging(read: Callable[..., Any], lag: float) -> Callable[..., Any]:
    @functools.wraps(read)
    def lagged(backend: Any, table_name: str, *args: Any, **kw: Any) -> Any:
        index = kw.get("index_name")
        table = backend.tables.get(table_name)
        if not index or table is None:
            return read(backend, table_name, *args, **kw)
        with _as_of(table, time.monotonic() - lag):
            return read(backend, table_name, *args, **kw)

    lagged.lags_indexes = True  # type: ignore[attr-defined]
    return lagged


@contextlib.contextmanager
def _as_of(table: Any, cutoff: float) -> Iterator[None]:
    """The table's items as they were at `cutoff`, for the time of one read (DynamoDB
    requests run one at a time on the local server, so no write sees the swap)."""
    with _lock:
        _prune(table.name, cutoff)
        earlier = {key: versions[0][1] for key, versions in _history.get(table.name, {}).items()}
    now = {key: _get(table, key) for key in earlier}
    for key, item in earlier.items():
        _put(table, key, item)
    try:
        yield
    finally:
        for key, item in now.items():
            _put(table, key, item)


def _prune(table_name: str, cutoff: float) -> None:
    """Forget writes the index has caught up with (lock held)."""
    keys = _history.get(table_name, {})
    for key in list(keys):
        versions = [v for v in keys[key] if v[0] > cutoff]
        if versions:
            keys[key] = versions
        else:
            del keys[key]


def _key(table: Any, attributes: dict[str, Any], dynamo_type: type) -> tuple[Any, Any]:
    hash_value = dynamo_type(attributes[table.hash_key_attr])
    range_value = dynamo_type(attributes[table.range_key_attr]) if table.range_key_attr else None
    return hash_value, range_value


def _get(table: Any, key: tuple[Any, Any]) -> Any:
    hash_value, range_value = key
    found = table.items.get(hash_value)
    if range_value is None or found is None:
        return found
    return found.get(range_value)


def _put(table: Any, key: tuple[Any, Any], item: Any) -> None:
    """Put `item` (or none) at `key` in moto's table, and say so to the index partitions
    the local server keeps (agentq.local.moto_partitions)."""
    moto_partitions.item_replaced(table, key)
    hash_value, range_value = key
    if range_value is None:
        if item is None:
            table.items.pop(hash_value, None)
        else:
            table.items[hash_value] = item
        return
    if item is not None:
        table.items[hash_value][range_value] = item
        return
    found = table.items.get(hash_value)
    if found is not None:
        found.pop(range_value, None)
        if not found:
            del table.items[hash_value]
