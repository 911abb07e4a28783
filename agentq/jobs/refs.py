"""Result references inside a job task's input: `${tasks.<key>.result[.<path>]}`,
`${groups.<group>.results}`, `${item}`/`${index}` in a `for_each` task, `$${` for a
literal `${` (docs/jobs.md, "References", has the syntax).

A string that is exactly one reference becomes the referenced JSON value; a reference
inside a longer string is spliced in as text. `${item}`/`${index}` are replaced when the
spec is parsed; task and group references when the dispatcher enqueues the task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from agentq.errors import InvalidInput
from agentq.spec_models import TASK_NAME

_TOKEN: Final = re.compile(r"\$\$\{|\$\{([^{}]*)\}")
NAME: Final = re.compile(TASK_NAME)

RefKind = Literal["task", "group", "item", "index"]


@dataclass(frozen=True)
class Ref:
    kind: RefKind
    name: str = ""
    path: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind == "task":
            return "${tasks." + ".".join((self.name, "result", *self.path)) + "}"
        if self.kind == "group":
            return "${groups." + self.name + ".results}"
        return "${" + ".".join((self.kind, *self.path)) + "}"


def parse_ref(expression: str, field: str) -> Ref:
    parts = expression.strip().split(".")
    head = parts[0]
    if head == "tasks" and len(parts) >= 3 and parts[2] == "result" and NAME.match(parts[1]):
        return Ref("task", parts[1], tuple(parts[3:]))
    if head == "groups" and len(parts) == 3 and parts[2] == "results" and NAME.match(parts[1]):
        return Ref("group", parts[1])
    if head == "item":
        return Ref("item", path=tuple(parts[1:]))
    if head == "index" and len(parts) == 1:
        return Ref("index")
    raise InvalidInput(
        field,
        f"bad reference ${{{expression}}}: use ${{tasks.<key>.result}}, "
        "${groups.<group>.results}, or ${item}/${index} in a for_each task",
    )


def find_refs(value: Any, field: str) -> list[Ref]:
    """Every reference in a JSON value (strings at any depth)."""
    found: list[Ref] = []

    def visit(text: str, where: str) -> str:
        for match in _TOKEN.finditer(text):
            if match.group(1) is not None:
                found.append(parse_ref(match.group(1), where))
        return text

    _walk(value, field, visit)
    return found


def substitute(value: Any, field: str, lookup: Callable[[Ref, str], Any]) -> Any:
    """Replace every reference for which `lookup` returns a value (see module doc).

    `lookup` returns `_KEEP` to leave a reference as it is for a later stage.
    """

    def visit(text: str, where: str) -> Any:
        whole = _TOKEN.fullmatch(text)
        if whole and whole.group(1) is not None:
            ref = parse_ref(whole.group(1), where)
            replaced = lookup(ref, where)
            return text if replaced is KEEP else replaced

        def splice(match: re.Match[str]) -> str:
            if match.group(1) is None:
                return match.group(0)
            ref = parse_ref(match.group(1), where)
            replaced = lookup(ref, where)
            if replaced is KEEP:
                return match.group(0)
            return replaced if isinstance(replaced, str) else _compact(replaced)

        return _TOKEN.sub(splice, text)

    return _walk(value, field, visit)


def unescape(value: Any) -> Any:
    """Turn `$${` into `${` once nothing is left to resolve."""
    return _walk(value, "", lambda text, _where: text.replace("$${", "${"))


def escape(value: Any) -> Any:
    """Protect data (e.g. a for_each element) from being read as references."""
    return _walk(value, "", lambda text, _where: text.replace("${", "$${"))


def select(value: Any, path: tuple[str, ...], field: str) -> Any:
    for step in path:
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        elif isinstance(value, list) and (index := _index(step)) is not None and index < len(value):
            value = value[index]
        else:
            raise InvalidInput(field, f"result has no field {'.'.join(path)!r}")
    return value


def _index(step: str) -> int | None:
    """A list index, if `step` is one: ASCII digits only (``"²".isdigit()`` is true and
    `int` refuses it) and short enough that `int` takes it (a list has fewer items)."""
    return int(step) if step.isascii() and step.isdigit() and len(step) <= 18 else None


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()


def _walk(value: Any, field: str, visit: Callable[[str, str], Any]) -> Any:
    if isinstance(value, str):
        return visit(value, field)
    if isinstance(value, Mapping):
        return {k: _walk(v, f"{field}.{k}", visit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, f"{field}[{i}]", visit) for i, v in enumerate(value)]
    return value


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)
