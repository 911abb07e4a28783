"""Start-up checks for the local moto launcher's patches (agentq/local/moto_server.py).

Each patch reaches into one of moto's internals. An upgrade of moto (or jsonpath_ng)
that renames, reshapes or stops using that internal would make the patch a silent
no-op or, worse, wrong; so before patching, each guard checks that what it patches is
still there with the shape the patch was written for, and refuses with
`IncompatibleDependency` naming the version otherwise. Each returns the things it
checked, so the patch uses exactly what was verified.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, Final

from agentq.errors import IncompatibleDependency

SERVER: Final = "agentq/local/moto_server.py"
DYNAMODB: Final = "agentq/local/moto_dynamodb.py"


def _refuse(package: str, problem: str, patcher: str = SERVER) -> IncompatibleDependency:
    hint = f"{patcher} patches it; update the patch or pin the version"
    return IncompatibleDependency(package, metadata.version(package), f"{problem} ({hint})")


def _parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


def _source(function: Callable[..., Any] | ModuleType) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def dispatcher() -> type:
    """moto's DomainDispatcherApplication, whose `get_backend_for_host(host)` we memoize."""
    from moto.moto_server import werkzeug_app

    found = getattr(werkzeug_app, "DomainDispatcherApplication", None)
    lookup = getattr(found, "get_backend_for_host", None)
    if not isinstance(found, type) or lookup is None:
        raise _refuse("moto", "moto.moto_server.werkzeug_app has no DomainDispatcherApplication")
    if _parameters(lookup) != ["self", "host"]:
        raise _refuse(
            "moto", "DomainDispatcherApplication.get_backend_for_host(self, host) changed"
        )
    if _parameters(found)[:1] != ["create_app"]:
        raise _refuse("moto", "DomainDispatcherApplication(create_app) changed")
    return found


def jsonpath_parse() -> tuple[ModuleType, Callable[..., Any]]:
    """jsonpath_ng.ext and its `parse(path)`, which moto's EventBridge calls per path."""
    import jsonpath_ng.ext

    parse = getattr(jsonpath_ng.ext, "parse", None)
    if not callable(parse) or _parameters(parse)[:1] != ["path"]:
        raise _refuse("jsonpath-ng", "jsonpath_ng.ext.parse(path) is gone or changed")
    return jsonpath_ng.ext, parse


def sqs_clocks() -> tuple[ModuleType, dict[str, Callable[..., float]]]:
    """moto.sqs.models and its `unix_time(dt=None)` / `unix_time_millis(dt=None)`."""
    import moto.sqs.models as sqs_models

    clocks: dict[str, Callable[..., float]] = {}
    for name in ("unix_time", "unix_time_millis"):
        clock = getattr(sqs_models, name, None)
        if not callable(clock):
            raise _refuse("moto", f"moto.sqs.models no longer uses {name}")
        # Ours is a functools.partial over moto's; a second start-up finds it in place.
        original = getattr(clock, "keywords", {}).get("original", clock)
        if _parameters(original) != ["dt"]:
            raise _refuse("moto", f"moto.sqs.models.{name}(dt=None) changed")
        clocks[name] = clock
    return sqs_models, clocks


def sqs_retention() -> type:
    """moto's SQSBackend, whose `is_message_valid_based_on_retention_period(self,
    queue_name, message)` we replace: it must still read only the queue's retention."""
    import moto.sqs.models as sqs_models

    backend = getattr(sqs_models, "SQSBackend", None)
    check = getattr(backend, "is_message_valid_based_on_retention_period", None)
    if not isinstance(backend, type) or check is None:
        raise _refuse("moto", "SQSBackend.is_message_valid_based_on_retention_period is gone")
    if hasattr(check, "reads_retention_only"):
        return backend  # ours, from an earlier start-up in this process
    if _parameters(check) != ["self", "queue_name", "message"]:
        raise _refuse("moto", "is_message_valid_based_on_retention_period(...) changed")
    source = _source(check)
    if '"MessageRetentionPeriod"' not in source or "message.sent_timestamp" not in source:
        raise _refuse("moto", "the retention check no longer reads MessageRetentionPeriod")
    return backend


def transaction_copies() -> tuple[ModuleType, Any, type, tuple[type[Exception], ...]]:
    """moto's DynamoDB models module (whose `copy` we replace), its backend, Table, and
    the errors after which its transaction restores its rollback copies."""
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.exceptions import (
        MockValidationException,
        MultipleTransactionsException,
        TransactionCanceledException,
    )
    from moto.dynamodb.models.table import Table

    backend = getattr(dynamodb_models, "DynamoDBBackend", None)
    write = getattr(backend, "transact_write_items", None)
    if not isinstance(backend, type) or write is None:
        raise _refuse_dynamodb("DynamoDBBackend.transact_write_items is gone")
    if _parameters(write) != ["self", "transact_items"]:
        raise _refuse_dynamodb("DynamoDBBackend.transact_write_items(self, transact_items) changed")
    if not hasattr(write, "rolls_back_items"):
        # The rollback copy must still be `copy.deepcopy` looked up in that module.
        if "copy.deepcopy(" not in _source(write):
            raise _refuse_dynamodb("transact_write_items no longer calls copy.deepcopy")
        if getattr(dynamodb_models, "copy", None) is not __import__("copy"):
            raise _refuse_dynamodb("moto.dynamodb.models no longer imports the copy module")
        # Ours puts the saved items back after exactly the errors moto rolls back for.
        source = _source(write)
        if ("except (MultipleTransactionsException, MockValidationException)" not in source
                or "raise TransactionCanceledException(errors)" not in source):  # fmt: skip
            raise _refuse_dynamodb("transact_write_items rolls back after other errors")
    rollback_errors = (
        TransactionCanceledException,
        MultipleTransactionsException,
        MockValidationException,
    )
    return dynamodb_models, backend, Table, rollback_errors


def _refuse_dynamodb(problem: str) -> IncompatibleDependency:
    return _refuse("moto", problem, DYNAMODB)


# moto's Table.query(self, hash_key, range_comparison, range_objs, limit,
# exclusive_start_key, scan_index_forward, projection_expressions, index_name, ...): the
# patch reads `index_name` as the 7th argument after `hash_key`.
_QUERY_PARAMETERS: Final = ["self", "hash_key", "range_comparison", "range_objs", "limit",
                            "exclusive_start_key", "scan_index_forward",
                            "projection_expressions", "index_name"]  # fmt: skip


def partition_queries() -> Any:
    """moto's DynamoDB Table, whose base-table `query` keeps the items of
    `self.all_items()` with the queried hash key, and whose `items` maps a hash key to
    its partition."""
    from moto.dynamodb.models.table import Table

    query, all_items = getattr(Table, "query", None), getattr(Table, "all_items", None)
    if query is None or all_items is None:
        raise _refuse_dynamodb("Table.query or Table.all_items is gone")
    if not hasattr(query, "reads_one_partition"):
        if _parameters(query)[: len(_QUERY_PARAMETERS)] != _QUERY_PARAMETERS:
            raise _refuse_dynamodb("Table.query(self, hash_key, ..., index_name) changed")
        if _parameters(all_items) != ["self"] or "self.items.values()" not in _source(all_items):
            raise _refuse_dynamodb("Table.all_items(self) no longer lists self.items")
        source = _source(query)
        if ("for item in self.all_items()" not in source
                or "item.hash_key == hash_key" not in source):  # fmt: skip
            raise _refuse_dynamodb("Table.query no longer filters all_items() by hash key")
    return Table


@dataclass(frozen=True)
class UpdateValidators:
    """What the clause-count patch replaces, and the rule it must count by."""

    traverser: Any  # DepthFirstTraverser: its nodes_to_be_processed
    action_count: Any  # ActionCountValidator: its verify_action_counts and traverse
    clause_types: tuple[type, ...]  # ADD, REMOVE, SET clauses, in the order moto checks
    clause_names: tuple[str, ...]
    descended_types: tuple[type, ...]  # what find_clauses descends into
    too_many: Callable[[str], Exception]


def update_validators() -> UpdateValidators:
    """moto's update-expression validators, as the patch found them."""
    from moto.dynamodb.parsing import ast_nodes as untyped_nodes
    from moto.dynamodb.parsing import validators

    ast_nodes: Any = untyped_nodes  # moto's AST module is untyped (`# type: ignore`)
    traverser: Any = getattr(ast_nodes, "DepthFirstTraverser", None)
    action_count: Any = getattr(validators, "ActionCountValidator", None)
    node = getattr(ast_nodes, "Node", None)
    if not (isinstance(traverser, type) and isinstance(action_count, type) and node):
        raise _refuse_dynamodb("DepthFirstTraverser, ActionCountValidator or Node is gone")
    found = UpdateValidators(
        traverser=traverser,
        action_count=action_count,
        clause_types=(
            ast_nodes.UpdateExpressionAddClause,
            ast_nodes.UpdateExpressionRemoveClause,
            ast_nodes.UpdateExpressionSetClause,
        ),
        clause_names=("ADD", "REMOVE", "SET"),
        descended_types=(ast_nodes.Expression, ast_nodes.UpdateExpressionFunction),
        too_many=validators.TooManyClauses,
    )
    if hasattr(found.traverser.nodes_to_be_processed, "built_once"):
        return found
    if "self._processing_map().keys()" not in _source(found.traverser.nodes_to_be_processed):
        raise _refuse_dynamodb("DepthFirstTraverser.nodes_to_be_processed changed")
    counting = _source(found.action_count.verify_action_counts).replace(" ", "")
    checks = [counting.find(f'raiseTooManyClauses("{name}")') for name in found.clause_names]
    if (-1 in checks or checks != sorted(checks)
            or any(f"find_clauses([{kind.__name__}])" not in counting
                   for kind in found.clause_types)):  # fmt: skip
        raise _refuse_dynamodb("ActionCountValidator no longer counts ADD, REMOVE, SET")
    rule = _source(node.find_clauses)
    if not all(part in rule for part in ("type(child) in clause_types",
                                         "isinstance(child, Expression)",
                                         "isinstance(child, UpdateExpressionFunction)")):  # fmt: skip
        raise _refuse_dynamodb("Node.find_clauses counts by another rule")
    return found


def expression_parsers() -> tuple[Any, Any]:
    """moto's `UpdateExpressionParser` (its `make(expression_str)`, a pure parse) and
    `ConditionExpressionParser` (its `_lex_condition_expression(self)`, a pure lex of
    `self.condition_expression` into immutable nodes), whose results the patch keeps."""
    from moto.dynamodb import comparisons
    from moto.dynamodb.parsing import expressions, validators

    update: Any = getattr(expressions, "UpdateExpressionParser", None)
    condition: Any = getattr(comparisons, "ConditionExpressionParser", None)
    if update is None or condition is None:
        raise _refuse_dynamodb("UpdateExpressionParser or ConditionExpressionParser is gone")
    make, lex = getattr(update, "make", None), getattr(condition, "_lex_condition_expression", None)
    if make is None or lex is None:
        raise _refuse_dynamodb("UpdateExpressionParser.make or the condition lexer is gone")
    if not hasattr(make, "remembered"):
        if _parameters(make) != ["expression_str"] or "cls(token_list).parse()" not in _source(
            make
        ):
            raise _refuse_dynamodb("UpdateExpressionParser.make(expression_str) changed")
        # A kept tree is shared: only safe while every validator works on its own copy.
        if "self.node_to_validate = deepcopy(expression)" not in _source(
            validators.Validator.__init__
        ):
            raise _refuse_dynamodb("Validator no longer copies the tree it validates")
    if not hasattr(lex, "remembered"):
        module = _source(comparisons)
        if (_parameters(lex) != ["self"] or "self.condition_expression" not in _source(lex)
                or "children=[]" not in module or ".children.append(" in module):  # fmt: skip
            raise _refuse_dynamodb("the condition lexer no longer makes plain, unshared nodes")
    return update, condition
