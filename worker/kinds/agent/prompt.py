"""Prompt templates: `{placeholders}` filled from the task input, each value fenced as data.

A placeholder is a plain name (``{document}``); ``{{`` and ``}}`` are literal braces.
Each value is rendered as::

    <input name="document">
    ...the sanitized value...
    </input>

so the model can tell the author's instructions from user-supplied material, and a
value cannot close its fence early (`agentq.security.sanitize_prompt_input`). Text values
go in as they are, others as JSON; a follow-up (`follow_up_prompt`) goes before them.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentq.errors import InvalidInput
from agentq.security import MAX_PROMPT_VALUE, sanitize_prompt_input

MAX_PROMPT: Final = 400_000


@dataclass(frozen=True)
class Template:
    text: str
    placeholders: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        names: list[str] = []
        try:
            parts = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise InvalidInput("settings.prompt", f"malformed template: {exc}") from None
        for _, name, spec, conversion in parts:
            if name is None:
                continue
            # Attribute and index lookups ({x.__class__}, {x[0]}) would let a template
            # reach into Python objects; only plain names are placeholders.
            if not name.isidentifier() or spec or conversion:
                raise InvalidInput(
                    "settings.prompt",
                    f"placeholder {{{name}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}} must be a plain name like {{document}}",
                )
            if name not in names:
                names.append(name)
        return cls(text=text, placeholders=tuple(names))

    def render(self, values: Mapping[str, Any]) -> str:
        missing = [name for name in self.placeholders if name not in values]
        if missing:
            raise InvalidInput(
                f"input.{missing[0]}",
                "is required by the prompt template"
                + (f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""),
            )
        fenced = {name: fence(name, values[name]) for name in self.placeholders}
        prompt = self.text.format(**fenced)
        if len(prompt) > MAX_PROMPT:
            raise InvalidInput(
                "input", f"the prompt is {len(prompt)} characters; the limit is {MAX_PROMPT}"
            )
        return prompt


def fence(name: str, value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError):
            raise InvalidInput(f"input.{name}", "must be JSON-serializable") from None
    clean = sanitize_prompt_input(text, name=f"input.{name}", limit=MAX_PROMPT_VALUE)
    return f'<input name="{name}">\n{clean}\n</input>'


def follow_up_prompt(text: str, values: Mapping[str, Any]) -> str:
    """A continuation's next user turn: the submitter's follow-up as written (control
    characters gone, a forged `<input>` tag defused), then each input value fenced."""
    clean = sanitize_prompt_input(text, name="prompt", limit=MAX_PROMPT_VALUE)
    prompt = "\n\n".join([clean, *(fence(name, value) for name, value in values.items())])
    if len(prompt) > MAX_PROMPT:
        raise InvalidInput(
            "input", f"the prompt is {len(prompt)} characters; the limit is {MAX_PROMPT}"
        )
    return prompt
