"""How a setting is declared (`var`) and how its allowed values are put into words.

One description serves both the documented table (docs/configuration.md) and the
error a bad value raises, so the two cannot disagree.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypedDict, Union, get_args, get_origin

import annotated_types
from pydantic import BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from agentq.errors import ConfigError

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})


def _flag(raw: object) -> object:
    # Only the spellings agentq has always documented; pydantic alone would also take
    # "t"/"y" and refuse the empty string, which has always meant false here.
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(f"not a flag: {raw!r}")
    return raw


def _stripped(raw: object) -> object:
    return raw.strip() if isinstance(raw, str) else raw


def _level(raw: object) -> object:
    return raw.strip().upper() if isinstance(raw, str) else raw


Flag = Annotated[bool, BeforeValidator(_flag)]
Int = Annotated[int, BeforeValidator(_stripped)]
Float = Annotated[float, BeforeValidator(_stripped)]
Choice = BeforeValidator(_stripped)
Level = BeforeValidator(_level)


class Length(TypedDict):
    min_length: int
    max_length: int


# Lengths for names and URLs: generous bounds that still catch a pasted document.
NAME: Final[Length] = {"min_length": 1, "max_length": 256}
URL: Final[Length] = {"min_length": 1, "max_length": 2048}
DAY_MS: Final = 86_400_000


def var(
    env: str,
    default: Any,
    doc: str,
    readers: str,
    *,
    ge: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
    secret: bool = False,
) -> Any:
    """Declare a setting read from `env`; `readers` says which processes use it."""
    return Field(
        default,
        validation_alias=env,
        description=doc,
        ge=ge,
        le=le,
        min_length=min_length,
        max_length=max_length,
        pattern=pattern,
        repr=not secret,
        json_schema_extra={"env": env, "readers": readers},
    )


def _base(annotation: Any) -> Any:
    """The annotation without `| None`."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _bounds(field: FieldInfo) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            found["ge"] = item.ge
        elif isinstance(item, annotated_types.Le):
            found["le"] = item.le
        elif isinstance(item, annotated_types.MinLen):
            found["min_length"] = item.min_length
        elif isinstance(item, annotated_types.MaxLen):
            found["max_length"] = item.max_length
        elif getattr(item, "pattern", None) is not None:
            found["pattern"] = item.pattern
    return found


def _number(value: Any) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def allowed(field: FieldInfo) -> str:
    """The field's allowed values, as the table shows them."""
    base = _base(field.annotation)
    bounds = _bounds(field)
    if base is bool:
        return "true/false"
    if get_origin(base) is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(base))
    if base in (int, float):
        return f"{_number(bounds['ge'])} … {_number(bounds['le'])}"
    text = f"{bounds['min_length']} … {_number(bounds['max_length'])} chars"
    if "pattern" in bounds:
        text += f", `{bounds['pattern']}`"
    return text


def describe_error(field: FieldInfo, raw: Any) -> str:
    """`expected <what the field allows>, got <the value>`, for a value it refused.

    A secret's value is never repeated: the error goes to logs.
    """
    got = f"a value of {len(str(raw))} characters" if not field.repr else repr(raw)
    base = _base(field.annotation)
    bounds = _bounds(field)
    if base is bool:
        wanted = "true/false"
    elif get_origin(base) is Literal:
        wanted = "one of " + ", ".join(str(choice) for choice in get_args(base))
    elif base in (int, float):
        kind = "an integer" if base is int else "a number"
        wanted = f"{kind} from {_number(bounds['ge'])} to {_number(bounds['le'])}"
    else:
        wanted = f"{bounds['min_length']} to {bounds['max_length']} characters"
        if "pattern" in bounds:
            wanted += f" matching {bounds['pattern']}"
    return f"expected {wanted}, got {got}"


class Environment(PydanticBaseSettingsSource):
    """The settings' variables from one mapping: `os.environ`, or a caller's own."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._environ.get(str(field.validation_alias)), field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            raw, _, _ = self.get_field_value(field, name)
            # An empty variable leaves an optional setting unset (templates export "").
            if raw is None or (raw == "" and field.default is None):
                continue
            values[name] = raw
        return values


def config_error(
    model: type[BaseSettings], exc: ValidationError, values: Mapping[str, Any]
) -> ConfigError:
    """The first refusal in `exc`, naming the variable and what it allows."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    field = model.model_fields.get(name)
    if field is None:  # cannot happen for values read by Environment; keep pydantic's word
        return ConfigError(name or "configuration", str(exc))
    return ConfigError(str(field.validation_alias), describe_error(field, values.get(name)))
