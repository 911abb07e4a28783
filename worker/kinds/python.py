"""The `python` kind: a registered callable, input in, JSON-able result out.

Definition settings::

    settings:
      callable: "package.module:function"

The callable comes from the definition (a file or table an operator controls), never
from the message. It receives the input mapping, and the `ChildContext` as well when
it takes a second parameter or one named `ctx`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from agentq.errors import InvalidInput, NotFound
from worker.kinds import ChildContext


def resolve(spec: object) -> Callable[..., Any]:
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise InvalidInput("settings.callable", f"must be 'module:function', got {spec!r:.80}")
    module_name, _, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise NotFound("callable", spec)
    if not callable(target):
        raise InvalidInput("settings.callable", f"{spec} is not callable")
    return target  # type: ignore[no-any-return]


def _wants_context(function: Callable[..., Any]) -> bool:
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.name == "ctx" for p in parameters):
        return True
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) >= 2


def run(ctx: ChildContext) -> Any:
    function = resolve(ctx.definition.settings.get("callable"))
    payload = dict(ctx.input)
    if _wants_context(function):
        return function(payload, ctx)
    return function(payload)
