"""DynamoDB rule: an item that a transaction holds refuses every other write.

AWS (DynamoDB developer guide, transaction conflict handling): a transactional conflict
can occur when "a PutItem, UpdateItem, or DeleteItem request for an item conflicts with
an ongoing TransactWriteItems request that includes the same item" (that request
"fails with a TransactionConflictException") or when "an item within a
TransactWriteItems request is part of another ongoing transaction" (that request fails
with a TransactionCanceledException whose CancellationReasons name TransactionConflict).

moto applies a transaction at once, and the local server runs DynamoDB requests one at
a time, so no transaction is ever in flight beside another request. Here each
TransactWriteItems stays in flight for `AGENTQ_LOCAL_TRANSACTION_MS` (default 30, about
a small transaction's own duration on AWS; 0: off) after it applied, before its answer
goes out: writes to its items from other requests meanwhile are refused as above. A
transaction's own caller never meets it: its answer comes once the transaction is over.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from agentq.local.rules import _dynamodb

VARIABLE: Final = "AGENTQ_LOCAL_TRANSACTION_MS"
DEFAULT_MS: Final = 30
MESSAGE: Final = "Transaction is ongoing for the item"
_lock = threading.Lock()
_held: dict[str, int] = {}  # item key -> the transaction in flight that holds it
_ids = itertools.count(1)


def hold_s() -> float:
    return _dynamodb.milliseconds_knob(VARIABLE, DEFAULT_MS)


def install() -> None:
    db = _dynamodb.backend(
        ("transact_write_items", ["self", "transact_items"]),
        ("put_item", ["self", "table_name", "item_attrs"]),
        ("update_item", ["self", "table_name", "key"]),
        ("delete_item", ["self", "table_name", "key"]),
    )
    if getattr(db.transact_write_items, "holds_items", False):
        return
    from moto.dynamodb.exceptions import TransactionCanceledException

    conflict = _dynamodb.error_class("TransactionConflictException")
    holding = hold_s()
    write = db.transact_write_items

    @functools.wraps(write)
    def transact_write_items(backend: Any, transact_items: Any) -> Any:
        keys = _dynamodb.transaction_keys(backend, transact_items)
        with _lock:
            busy = [key is not None and key in _held for key in keys]
        if any(busy):
            raise TransactionCanceledException(
                [("TransactionConflict", MESSAGE, None) if b else (None, None, None) for b in busy]
            )
        result = write(backend, transact_items)
        if holding > 0:
            mine, taken = next(_ids), [key for key in keys if key is not None]
            with _lock:
                _held.update(dict.fromkeys(taken, mine))
            _dynamodb.defer(functools.partial(_release, taken, mine, holding))
        return result

    transact_write_items.holds_items = True  # type: ignore[attr-defined]
    db.transact_write_items = transact_write_items
    for name in ("put_item", "update_item", "delete_item"):
        setattr(db, name, _refusing(getattr(db, name), conflict))


def _refusing(write: Callable[..., Any], conflict: type[Exception]) -> Callable[..., Any]:
    @functools.wraps(write)
    def checked(backend: Any, table_name: str, attributes: Any, *args: Any, **kw: Any) -> Any:
        key = _dynamodb.item_key(backend, table_name, attributes or {})
        with _lock:
            held = key is not None and key in _held
        if held:
            raise conflict(MESSAGE)  # type: ignore[call-arg]
        return write(backend, table_name, attributes, *args, **kw)

    return checked


def _release(keys: list[str], transaction: int, holding_s: float) -> None:
    time.sleep(holding_s)  # the transaction in flight; other requests run meanwhile
    with _lock:
        for key in keys:
            if _held.get(key) == transaction:
                del _held[key]
