"""moto's DynamoDB with its costs made proportional to the request, not the table.

The local server runs one DynamoDB request at a time (agentq.local.moto_server), so
each request's cost is a wait for every other worker's lock, heartbeat and finalize. A
profile of the tenant-limit benchmark (650 tasks, A limited to 2) found three costs
that grow with what the table or the expression holds, and one paid again on every
request, none needed for moto's answer:

- **TransactWriteItems deep-copied the whole table once per item**, for a rollback. It
  now saves only the items the transaction names and puts them back when moto rolls
  back (a two-item lock at 650 tasks: 37 ms as moto has it, 2.3 ms so).
- **A Query of the table sorted every item of the table** (all partitions, compared
  through `DynamoType.cast_value`) and then kept one partition. A query of the base
  table now reads its partition only; index queries are left as they are. A tenant's
  seat query at 650 tasks: 27 ms held under load, 5.7 ms so.
- **An update expression's validation was quadratic.** moto checks "one SET / ADD /
  REMOVE clause" at every node of the expression's tree by walking that node's whole
  subtree again, and every tree walk rebuilt each processor's type table per node. The
  counts are now summed once, bottom-up, and the type table is built once per
  processor. The lock's 18-action SET held the server 34 ms at p50 on an idle
  benchmark run, 52 ms before.
- **Every update and condition expression was parsed anew**, the update expression
  twice per request (the handler's check, then the backend's), though agentq sends the
  same few expressions with other values. A parsed update expression is kept by its
  text (each validator already works on its own copy of the tree), and a condition
  expression's tokens by its text (its parse, which reads the values, runs as before).

Every target is checked before it is patched (agentq.local.moto_guards), and
tests/local/test_moto_guards.py and test_moto_parses.py show moto answers the same with
and without each patch (Hypothesis properties for the update and condition expressions).
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from agentq.local import moto_guards


def checked_dynamodb_patches() -> Callable[[], None]:
    """Check every target (`IncompatibleDependency` if one moved), and return what
    patches them, so a caller can check all of moto before it patches any of it."""
    dynamodb_models, backend, table, rollback_errors = moto_guards.transaction_copies()
    query_table = moto_guards.partition_queries()
    expressions = moto_guards.update_validators()
    parsers = moto_guards.expression_parsers()

    def patch() -> None:
        _patch(dynamodb_models, backend, table, rollback_errors, query_table, expressions)
        _remember_parses(*parsers)

    return patch


def _patch(dynamodb_models: Any, backend: Any, table: type,
           rollback_errors: tuple[type[Exception], ...], query_table: Any,
           expressions: moto_guards.UpdateValidators) -> None:  # fmt: skip
    """The three patches; each is skipped where already applied (idempotent)."""
    if not hasattr(backend.transact_write_items, "rolls_back_items"):
        items = _RollBackTouchedItems(table, rollback_errors)
        setattr(dynamodb_models, "copy", items)  # noqa: B010
        backend.transact_write_items = items.transaction(backend.transact_write_items)
    if not hasattr(query_table.query, "reads_one_partition"):
        _read_one_partition(query_table)
    if not hasattr(expressions.traverser.nodes_to_be_processed, "built_once"):
        _count_clauses_once(expressions)


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


# -- Query: a base-table query reads its own partition -------------------------------

_partition = threading.local()


def _read_one_partition(table_type: Any) -> None:
    """moto's base-table query is `[i for i in self.all_items() if i.hash_key == key]`,
    then sorted by range key; `all_items()` sorts every item of the table. While such a
    query runs, `all_items()` gives that partition's items (sorted the same way), so the
    query keeps exactly what it kept before, in the same order."""
    query, all_items = table_type.query, table_type.all_items

    @functools.wraps(all_items)
    def partition_items(table: Any) -> Any:
        wanted = getattr(_partition, "key", None)  # never None while a base query runs
        if wanted is None:
            return all_items(table)
        _partition.key = None  # the query's one call; anything after it sees the table
        found = table.items.get(wanted)  # .get: a defaultdict must not grow here
        if found is None:
            return []
        items = list(found.values()) if table.range_key_attr else [found]
        return sorted(items, key=lambda x: (x.hash_key, x.range_key) if x.range_key else x.hash_key)

    @functools.wraps(query)
    def partition_query(table: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index_name or hash_key is None:
            return query(table, hash_key, *args, **kwargs)
        _partition.key = hash_key
        try:
            return query(table, hash_key, *args, **kwargs)
        finally:
            _partition.key = None

    partition_query.reads_one_partition = True  # type: ignore[attr-defined]
    table_type.all_items = partition_items
    table_type.query = partition_query


# -- update expressions: each clause counted once -------------------------------------


def _count_clauses_once(found: moto_guards.UpdateValidators) -> None:
    """moto's `ActionCountValidator` runs at every `UpdateExpression` node bottom-up and
    counts the SET / ADD / REMOVE clauses below it with `Node.find_clauses`, which walks
    the node's subtree each time. Here each node's counts are its children's counts
    summed, by `find_clauses`' own rule (a child of a counted type counts one and is not
    descended; an `Expression` or `UpdateExpressionFunction` child is descended), so
    every node raises exactly what it raised before, in the same order."""
    kinds = found.clause_types  # in the order moto checks them: ADD, REMOVE, SET
    descend = found.descended_types
    traverse = found.action_count.traverse

    def counts(memo: dict[int, tuple[Any, list[int]]], node: Any) -> list[int]:
        hit = memo.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        totals = [0] * len(kinds)
        for child in node.children or []:
            below = counts(memo, child) if isinstance(child, descend) else None
            for i, kind in enumerate(kinds):
                if type(child) is kind:
                    totals[i] += 1
                elif below is not None:
                    totals[i] += below[i]
        memo[id(node)] = (node, totals)  # the node is kept, so its id is not reused
        return totals

    def verify_action_counts(self: Any, node: Any) -> Any:
        memo = self.__dict__.get("_agentq_counts")
        totals = counts({} if memo is None else memo, node)
        for name, count in zip(found.clause_names, totals, strict=True):
            if count > 1:
                raise found.too_many(name)
        return node

    @functools.wraps(traverse)
    def counting_traverse(self: Any, node: Any) -> Any:
        self._agentq_counts = {}  # one tree's counts: a reused validator starts afresh
        try:
            return traverse(self, node)
        finally:
            del self._agentq_counts

    def nodes_to_be_processed(self: Any) -> tuple[type, ...]:
        # moto rebuilds the processor's dict (bound methods and all) at every node; its
        # keys are the same for the processor's life.
        try:
            return self.__dict__["_agentq_types"]  # type: ignore[no-any-return]
        except KeyError:
            types = self.__dict__["_agentq_types"] = tuple(self._processing_map().keys())
            return types

    nodes_to_be_processed.built_once = True  # type: ignore[attr-defined]
    found.action_count.verify_action_counts = verify_action_counts
    found.action_count.traverse = counting_traverse
    found.traverser.nodes_to_be_processed = nodes_to_be_processed


# -- expressions: each text parsed once ----------------------------------------------

# Distinct expressions kept: agentq sends about twenty; a sender of more still gets
# every answer right, the oldest kept parse making room.
_KEPT_PARSES: Final = 256


def _remember_parses(update_parser: Any, condition_parser: Any) -> None:
    """Keep `UpdateExpressionParser.make`'s tree and the condition lexer's tokens by
    their text (moto_guards.expression_parsers checks why sharing them is safe). A text
    that fails to parse is not kept: it fails the same way each time. Idempotent."""
    if not hasattr(update_parser.make, "remembered"):
        make = update_parser.make
        kept = functools.lru_cache(maxsize=_KEPT_PARSES)(make)

        def make_once(cls: Any, expression_str: Any) -> Any:
            if cls is not update_parser or not isinstance(expression_str, str):
                return make.__func__(cls, expression_str)
            return kept(expression_str)

        make_once.remembered = True  # type: ignore[attr-defined]
        update_parser.make = classmethod(make_once)
    if not hasattr(condition_parser._lex_condition_expression, "remembered"):
        lex = condition_parser._lex_condition_expression
        tokens: dict[str, tuple[Any, ...]] = {}

        @functools.wraps(lex)
        def lex_once(parser: Any) -> deque[Any]:
            text = parser.condition_expression
            found = tokens.get(text)
            if found is None:
                found = tuple(lex(parser))
                if len(tokens) >= _KEPT_PARSES:
                    tokens.pop(next(iter(tokens)))
                tokens[text] = found
            return deque(found)  # the parse consumes the deque, never the nodes

        lex_once.remembered = True  # type: ignore[attr-defined]
        condition_parser._lex_condition_expression = lex_once
