"""DynamoDB rule: a key condition `BETWEEN a AND b` with `a` above `b` is refused.

AWS (DynamoDB API reference, Query, KeyConditionExpression): "`a BETWEEN b AND c` —
true if a is greater than or equal to b, and less than or equal to c"; a Query whose
lower bound lies above its upper bound is answered `ValidationException` ("Invalid
KeyConditionExpression: The BETWEEN operator requires upper bound to be greater than or
equal to lower bound"), not an empty page.

moto answers such a Query with no items, so a reader that computes its bounds wrongly
would look like one that found nothing. Here the Query is refused as on AWS, on the
table and its indexes alike. Bounds compare as DynamoDB compares them: numbers by
value, strings and binaries by their bytes.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from agentq.local.rules import _dynamodb

_LEADING = ["self", "table_name", "hash_key_dict", "range_comparison", "range_value_dicts"]


def install() -> None:
    """Refuse a reversed BETWEEN in a Query's key condition. Idempotent."""
    db = _dynamodb.backend(("query", _LEADING))
    if getattr(db.query, "refuses_reversed_between", False):
        return
    from moto.dynamodb.exceptions import MockValidationException

    db.query = _refusing(db.query, MockValidationException)


def _refusing(query: Callable[..., Any], refused: type[Exception]) -> Callable[..., Any]:
    @functools.wraps(query)
    def checked(
        backend: Any,
        table_name: str,
        hash_key_dict: Any,
        range_comparison: Any,
        range_value_dicts: Any,
        *args: Any,
        **kw: Any,
    ) -> Any:
        conditions: list[tuple[Any, Any]] = [(range_comparison, range_value_dicts)]
        conditions += [(c[1], c[2]) for c in kw.get("range_key_conditions") or () if len(c) == 3]
        for comparison, bounds in conditions:
            reversed_bounds = _reversed(comparison, bounds)
            if reversed_bounds is not None:
                lower, upper = reversed_bounds
                raise refused(
                    "Invalid KeyConditionExpression: The BETWEEN operator requires upper bound "
                    "to be greater than or equal to lower bound; lower bound operand: "
                    f"AttributeValue: {_shown(lower)}, upper bound operand: AttributeValue: {_shown(upper)}"
                )
        return query(backend, table_name, hash_key_dict, range_comparison, range_value_dicts,
                     *args, **kw)  # fmt: skip

    checked.refuses_reversed_between = True  # type: ignore[attr-defined]
    return checked


def _reversed(comparison: Any, bounds: Any) -> tuple[Any, Any] | None:
    """The (lower, upper) bounds of a BETWEEN whose lower lies above its upper, else None."""
    if not isinstance(comparison, str) or comparison.upper() != "BETWEEN":
        return None
    pair = list(bounds) if isinstance(bounds, list | tuple) else []
    if len(pair) != 2:
        return None
    lower, upper = (_sort_value(bound) for bound in pair)
    numbers = isinstance(lower, Decimal) and isinstance(upper, Decimal)
    if not numbers and not (isinstance(lower, bytes) and isinstance(upper, bytes)):
        return None  # moto answers a malformed or mismatched bound itself
    above = lower > upper  # type: ignore[operator]  # both Decimal or both bytes
    return (pair[0], pair[1]) if above else None


def _sort_value(bound: Any) -> Decimal | bytes | None:
    """A key attribute value as DynamoDB orders it: N by value, S by its UTF-8 bytes, B
    by its bytes."""
    raw = getattr(bound, "to_json", lambda: bound)()
    if not isinstance(raw, dict) or len(raw) != 1:
        return None
    (kind, value), *_ = raw.items()
    try:
        if kind == "N":
            return Decimal(str(value))
        if kind == "S":
            return str(value).encode()
        if kind == "B":
            return value if isinstance(value, bytes) else base64.b64decode(value)
    except (InvalidOperation, binascii.Error, ValueError):
        return None
    return None


def _shown(bound: Any) -> str:
    """A bound as AWS's message shows it: `{S:abc}`."""
    raw = getattr(bound, "to_json", lambda: bound)()
    if isinstance(raw, dict) and len(raw) == 1:
        (kind, value), *_ = raw.items()
        return f"{{{kind}:{value}}}"
    return str(raw)
