"""Identity-policy evaluation as AWS does it, for the IAM-enforced local stack.

moto's own evaluation knows one condition operator (`StringEquals`), is never handed
the request's condition keys, and skips every other operator: a statement conditioned
on `s3:prefix` or `dynamodb:LeadingKeys` grants unconditionally, and a failed condition
on an Allow counts as an explicit Deny. This module evaluates a request's
(action, resource, context) against policy documents the way the IAM policy evaluation
logic describes: an explicit Deny wins, otherwise some Allow must apply, otherwise the
request is implicitly denied.

Condition operators: the String*, Arn*, Bool and Null families, each with `IfExists`,
and the `ForAllValues:` / `ForAnyValue:` set qualifiers. Missing keys follow AWS's
rule: "If the key that you specify in a policy condition is not present in the request
context, the values do not match and the condition is false. If the policy condition
requires that the key is not matched, such as StringNotLike or ArnNotLike, and the right
key is not present, the condition is true"; `...IfExists` is true when the key is
missing, `ForAllValues` is true for a missing or empty key, `ForAnyValue` false. An
operator this module does not know fails closed: the Allow does not apply, the Deny does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from functools import lru_cache
from typing import Any, Final

Context = Mapping[str, Sequence[str]]


class Decision(Enum):
    ALLOW = "allow"
    DENY = "deny"  # explicit
    NONE = "none"  # no statement applies: implicitly denied


@lru_cache(maxsize=4096)
def _wildcard(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    """IAM's `*` (any run) and `?` (one character); everything else literal."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.compile(f"^{body}$", flags)


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _matches(patterns: Any, value: str, *, ignore_case: bool) -> bool:
    return any(_wildcard(str(p), ignore_case=ignore_case).match(value) for p in _listed(patterns))


def _string_equals(policy: str, actual: str) -> bool:
    return policy == actual


def _string_equals_ignore_case(policy: str, actual: str) -> bool:
    return policy.lower() == actual.lower()


def _string_like(policy: str, actual: str) -> bool:
    return _wildcard(policy, ignore_case=False).match(actual) is not None


def _arn_like(policy: str, actual: str) -> bool:
    # ARNs compare part by part; a wildcard never spans the first five separators.
    policy_parts, actual_parts = policy.split(":", 5), actual.split(":", 5)
    if len(policy_parts) != 6 or len(actual_parts) != 6:
        return False
    return all(_string_like(p, a) for p, a in zip(policy_parts, actual_parts, strict=True))


def _bool(policy: str, actual: str) -> bool:
    return policy.lower() == actual.lower()


# Operator (without IfExists / set qualifier) -> (value test, whether it is negated).
_OPERATORS: Final = {
    "StringEquals": (_string_equals, False),
    "StringNotEquals": (_string_equals, True),
    "StringEqualsIgnoreCase": (_string_equals_ignore_case, False),
    "StringNotEqualsIgnoreCase": (_string_equals_ignore_case, True),
    "StringLike": (_string_like, False),
    "StringNotLike": (_string_like, True),
    "ArnEquals": (_arn_like, False),
    "ArnLike": (_arn_like, False),
    "ArnNotEquals": (_arn_like, True),
    "ArnNotLike": (_arn_like, True),
    "Bool": (_bool, False),
}


class UnknownOperator(ValueError):
    pass


def _lookup(context: Context, key: str) -> list[str] | None:
    """Condition keys are case-insensitive; None when the request has no such key."""
    for name, values in context.items():
        if name.lower() == key.lower():
            return [str(v) for v in values]
    return None


def condition_holds(operator: str, key: str, expected: Any, context: Context) -> bool:
    """One operator applied to one key, with AWS's semantics for a missing key."""
    actual = _lookup(context, key)
    wanted = [str(v) for v in _listed(expected)]
    if operator == "Null":
        # "true": the key must be absent; "false": present.
        return any((actual is None) == (w.lower() == "true") for w in wanted)
    qualifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    if base not in _OPERATORS or qualifier not in ("", "ForAllValues", "ForAnyValue"):
        raise UnknownOperator(operator)
    test, negated = _OPERATORS[base]

    def one(value: str) -> bool:
        hit = any(test(w, value) for w in wanted)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in actual or [])
    if qualifier == "ForAnyValue":
        return any(one(v) for v in actual or [])
    if actual is None:
        return if_exists or negated
    # A single-valued operator on a key with several values: any of them may match.
    return any(one(v) for v in actual)


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Context) -> bool:
    return all(
        condition_holds(operator, key, expected, context)
        for operator, keys in conditions.items()
        for key, expected in keys.items()
    )


def statement_applies(statement: Mapping[str, Any], action: str, resource: str,
                      context: Context) -> bool:  # fmt: skip
    if "NotAction" in statement:
        if _matches(statement["NotAction"], action, ignore_case=True):
            return False
    elif not _matches(statement.get("Action", []), action, ignore_case=True):
        return False
    if "NotResource" in statement:
        if _matches(statement["NotResource"], resource, ignore_case=False):
            return False
    elif not _matches(statement.get("Resource", []), resource, ignore_case=False):
        return False
    try:
        return _conditions_hold(statement.get("Condition") or {}, context)
    except UnknownOperator:
        # Fail closed: an unknown operator never grants, and never lifts a Deny.
        return statement.get("Effect") == "Deny"


def decide(documents: Iterable[Mapping[str, Any]], action: str, resource: str,
           context: Context) -> Decision:  # fmt: skip
    allowed = False
    for document in documents:
        for statement in _listed(document.get("Statement", [])):
            if statement_applies(statement, action, resource, context):
                if statement.get("Effect") == "Deny":
                    return Decision.DENY
                allowed = True
    return Decision.ALLOW if allowed else Decision.NONE
