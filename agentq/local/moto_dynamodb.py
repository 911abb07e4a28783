"""moto's DynamoDB with its costs made proportional to the request, not the table.

The local server runs one DynamoDB request at a time (agentq.local.moto_server), so
each request's cost is a wait for every other worker's lock, heartbeat and finalize.
Profiles of the tenant-limit benchmark (650 tasks, A limited to 2) found costs that grow
with what the table or the expression holds, and some paid again on every request, none
needed for moto's answer:

- **TransactWriteItems deep-copied the whole table once per item**, for a rollback. It
  now saves only the items the transaction names and puts them back when moto rolls
  back (a two-item lock at 650 tasks: 37 ms as moto has it, 2.3 ms so).
- **A Query sorted every item of the table**, then kept one partition: it reads that
  partition only, of the table or of an index, whose partitions are filed per table and
  kept up to date by every write (agentq.local.moto_partitions; a seat query: 27 ms, 5.7).
- **An update expression's checks** cost a parse, a deep copy and ten walks of its tree
  per check, some quadratic: agentq.local.moto_expressions makes them proportional.
- **Each value of a response was looked up under every type's names**, through six
  alias providers: a value's own members are read directly (see the patch below).

Every target is checked before it is patched (agentq.local.moto_guards), and tests/local/
test_moto_guards.py, _partitions.py, _parses.py and _expressions.py show moto answers the
same with and without each patch (Hypothesis properties for index queries, the update
and condition expressions and every kind of value a response carries).
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from collections.abc import Callable
from typing import Any

from agentq.local import moto_guards
from agentq.local.moto_expressions import checked_expression_patches
from agentq.local.moto_partitions import checked_partition_patches


def checked_dynamodb_patches() -> Callable[[], None]:
    """Check every target (`IncompatibleDependency` if one moved), and return what
    patches them, so a caller can check all of moto before it patches any of it."""
    dynamodb_models, backend, table, rollback_errors = moto_guards.transaction_copies()
    patch_partitions = checked_partition_patches()
    patch_expressions = checked_expression_patches()
    values = moto_guards.attribute_value_serializer()

    def patch() -> None:
        _patch(dynamodb_models, backend, table, rollback_errors)
        patch_partitions()
        patch_expressions()
        if not hasattr(values.serializer._serialize_type_structure, "plain_values"):
            _serialize_plain_values(values)

    return patch


def _patch(dynamodb_models: Any, backend: Any, table: type,
           rollback_errors: tuple[type[Exception], ...]) -> None:  # fmt: skip
    """The transaction patch, skipped where already applied (idempotent)."""
    if not hasattr(backend.transact_write_items, "rolls_back_items"):
        items = _RollBackTouchedItems(table, rollback_errors)
        setattr(dynamodb_models, "copy", items)  # noqa: B010
        backend.transact_write_items = items.transaction(backend.transact_write_items)


# -- TransactWriteItems: save the items it names, not the tables ----------------------


class _RollBackTouchedItems:
    """Stands in for the `copy` module inside moto's DynamoDB backend, whose transaction
    deep-copies every table it names for a rollback. While a transaction runs, a table
    "copy" is the table itself (moto's rollback then puts back the same object: nothing),
    and the items the transaction names are saved before it runs and put back if moto
    rolls back."""

    def __init__(self, table_type: type, rollback_errors: tuple[type[Exception], ...]) -> None:
        self._table_type = table_type
        self._rollback_errors = rollback_errors
        self._scope = threading.local()

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        if getattr(self._scope, "active", False) and isinstance(value, self._table_type):
            return value
        return copy.deepcopy(value, memo)

    def __getattr__(self, name: str) -> Any:
        # Anything else a later moto takes from `copy` there (copy.copy, say) is the real one.
        return getattr(copy, name)

    def transaction(self, write: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(write)
        def transact_write_items(backend: Any, transact_items: Any) -> Any:
            saved = _touched_items(backend, transact_items)
            self._scope.active = True
            try:
                return write(backend, transact_items)
            except self._rollback_errors:
                # The errors after which moto restores its copies (and no others).
                _put_back(backend, saved)
                raise
            finally:
                self._scope.active = False

        transact_write_items.rolls_back_items = True  # type: ignore[attr-defined]
        return transact_write_items


SavedItem = tuple[str, dict[str, Any], Any]  # table, key, the item as it was (or None)


def _touched_items(backend: Any, transact_items: Any) -> list[SavedItem]:
    """Each item a transaction names, as it is before the transaction (copied: moto
    updates its items in place)."""
    saved: dict[tuple[str, str], SavedItem] = {}
    for entry in transact_items if isinstance(transact_items, list) else []:
        try:
            op_type, op = next(iter(entry.items()))
            name = op["TableName"]
            if op_type == "Put":
                table = backend.get_table(name)
                attrs = op["Item"]
                key = {table.hash_key_attr: attrs[table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attrs[table.range_key_attr]
            else:
                key = op["Key"]
            ident = (name, json.dumps(key, sort_keys=True))
            if ident not in saved:
                saved[ident] = (name, key, copy.deepcopy(backend.get_item(name, key)))
        except Exception:  # moto refuses such an entry before it writes anything
            continue
    return list(saved.values())


def _put_back(backend: Any, saved: list[SavedItem]) -> None:
    for name, key, item in saved:
        if item is not None:
            backend.put_item(name, item.to_json()["Attributes"])
        elif backend.get_item(name, key) is not None:
            backend.delete_item(name, key)


# -- responses: a value's members looked up by their own names -------------------------


def _serialize_plain_values(found: moto_guards.AttributeValueShape) -> None:
    """moto serializes each `AttributeValue` of a response (every attribute of every item,
    nested ones too) by looking each of its ten members up through six alias providers,
    each name twice: the lock's ALL_NEW item took 2.6 ms of its 8 ms so. A plain dict
    whose keys are member names, with the default picker and no response transformer,
    has its present members serialized by moto in moto's order, the rest skipped: the
    picker would have found exactly those values (moto_guards.attribute_value_serializer
    checks it tries no other member's name) and skipped the absent ones as None."""
    serialize_structure = found.serializer._serialize_type_structure
    members = found.members

    @functools.wraps(serialize_structure)
    def serialize_plain_values(self: Any, serialized: Any, value: Any, shape: Any,
                               key: str) -> None:  # fmt: skip
        picker: Any = self._value_picker
        if not (key and type(value) is dict and shape.name == "AttributeValue"
                and self.service_model.service_name == "dynamodb"
                and type(picker) is found.picker and picker.alias_providers is found.providers
                and not picker.response_transformers and value.keys() <= members):  # fmt: skip
            serialize_structure(self, serialized, value, shape, key)
            return
        wrapper = self.MAP_TYPE()
        for member_key, member_shape in shape.members.items():
            member_shape.parent = shape
            member_value = value.get(member_key)
            if member_value is not None:
                self._serialize(wrapper, member_value, member_shape, member_key)
        self._default_serialize(serialized, wrapper, shape, key)

    serialize_plain_values.plain_values = True  # type: ignore[attr-defined]
    found.serializer._serialize_type_structure = serialize_plain_values
