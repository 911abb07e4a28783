"""Each product module holds one thing: at most one public class, families aside.

A family is a set of classes that only make sense together: dataclasses, enums,
exceptions, pydantic models, typed dicts, named tuples and protocols, and any class
built on one of them in the same module. Anything else gets a module of its own, so a
module's name says what it holds. Function size is ruff's job (C901 in pyproject.toml).

`KNOWN` lists the modules that held two public classes when the rule came in: it may
only shrink (a listed module that now passes fails the test until it is taken off).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
PRODUCT: Final = ("agentq", "worker", "lambdas", "infra")
FAMILY_BASES: Final = frozenset(
    {
        "Enum",
        "StrEnum",
        "IntEnum",
        "Flag",
        "TypedDict",
        "NamedTuple",
        "Protocol",
        "Exception",
        "BaseModel",
        "BaseSettings",
    }
)
KNOWN: Final = frozenset(
    {
        "agentq/alerts/slack.py",
        "agentq/aws.py",
        "agentq/console/security.py",
        "agentq/definitions/registry.py",
        "agentq/dlq/processor.py",
        "agentq/health.py",
        "agentq/jobs/results.py",
        "agentq/principals.py",
        "agentq/store/tenants.py",
        "agentq/store/workers.py",
        "worker/kinds/agent/summary.py",
        "worker/kinds/schema.py",
        "worker/telemetry.py",
    }
)


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call | ast.Subscript):
        return _name(node.func if isinstance(node, ast.Call) else node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_family(node: ast.ClassDef, family: set[str]) -> bool:
    if any(_name(decorator) == "dataclass" for decorator in node.decorator_list):
        return True
    bases = {_name(base) for base in node.bases}
    return any(
        base in FAMILY_BASES or base in family or base.endswith(("Error", "Exception"))
        for base in bases
    )


def public_classes(source: str) -> list[str]:
    """The module's public top-level classes that belong to no family."""
    family: set[str] = set()
    single: list[str] = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        if _is_family(node, family):
            family.add(node.name)
        elif not node.name.startswith("_"):
            single.append(node.name)
    return single


def offenders() -> dict[str, list[str]]:
    found = {}
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            classes = public_classes(path.read_text(encoding="utf-8"))
            if len(classes) > 1:
                found[str(path.relative_to(REPO))] = classes
    return found


def test_a_module_holds_at_most_one_public_class_besides_families() -> None:
    found = offenders()
    new = {module: classes for module, classes in found.items() if module not in KNOWN}
    assert new == {}, f"give each of these classes a module of its own: {new}"


def test_the_known_exceptions_only_shrink() -> None:
    fixed = sorted(KNOWN - offenders().keys())
    assert fixed == [], f"these modules now hold one class: take them off KNOWN: {fixed}"


def test_the_rule_tells_a_family_from_two_classes() -> None:
    source = (
        "from dataclasses import dataclass\n"
        "class Failure(Exception): ...\n"
        "class Refused(Failure): ...\n"
        "@dataclass\nclass Point: ...\n"
        "class _Helper: ...\n"
        "class Reader: ...\n"
        "class Writer: ...\n"
    )
    assert public_classes(source) == ["Reader", "Writer"]
