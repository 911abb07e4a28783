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
from importlib import metadata
from types import ModuleType
from typing import Any

from agentq.errors import IncompatibleDependency

_HINT = "agentq/local/moto_server.py patches it; update the patch or pin the version"


def _refuse(package: str, problem: str) -> IncompatibleDependency:
    return IncompatibleDependency(package, metadata.version(package), f"{problem} ({_HINT})")


def _parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


def _source(function: Callable[..., Any]) -> str:
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
        raise _refuse("moto", "DynamoDBBackend.transact_write_items is gone")
    if _parameters(write) != ["self", "transact_items"]:
        raise _refuse("moto", "DynamoDBBackend.transact_write_items(self, transact_items) changed")
    if not hasattr(write, "rolls_back_items"):
        # The rollback copy must still be `copy.deepcopy` looked up in that module.
        if "copy.deepcopy(" not in _source(write):
            raise _refuse("moto", "transact_write_items no longer calls copy.deepcopy")
        if getattr(dynamodb_models, "copy", None) is not __import__("copy"):
            raise _refuse("moto", "moto.dynamodb.models no longer imports the copy module")
        # Ours puts the saved items back after exactly the errors moto rolls back for.
        source = _source(write)
        if ("except (MultipleTransactionsException, MockValidationException)" not in source
                or "raise TransactionCanceledException(errors)" not in source):  # fmt: skip
            raise _refuse("moto", "transact_write_items rolls back after other errors")
    rollback_errors = (
        TransactionCanceledException,
        MultipleTransactionsException,
        MockValidationException,
    )
    return dynamodb_models, backend, Table, rollback_errors
