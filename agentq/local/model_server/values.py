"""Deterministic values valid for a JSON Schema (what the fake model puts in StructuredOutput)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any, Final

from agentq.local.model_server.pattern import pattern_sample
from agentq.local.model_server.scenario import SNIPPET_LEN


def stable_hash(*parts: object) -> int:
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode()).hexdigest()
    return int(digest[:12], 16)


def snippet_of(prompt: str) -> str:
    words = " ".join(prompt.split())
    if not words:
        return "offline"
    if len(words) <= SNIPPET_LEN:
        return words
    cut = words[:SNIPPET_LEN]
    return cut.rsplit(" ", 1)[0] if " " in cut else cut


def _resolve_ref(ref: str, root: Any) -> Any:
    if not ref.startswith("#"):
        raise ValueError(f"only local $ref are supported, got {ref!r}")
    node = root
    for raw in ref[1:].split("/"):
        if not raw:
            continue
        part = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _merge_all_of(schema: Mapping[str, Any], root: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for raw in schema["allOf"]:
        part: Any = raw
        if isinstance(part, Mapping) and "$ref" in part:
            part = _resolve_ref(str(part["$ref"]), root)
        if not isinstance(part, Mapping):
            continue
        if "allOf" in part:
            part = _merge_all_of(part, root)
        for k, v in part.items():
            if k == "properties":
                merged["properties"] = {**merged.get("properties", {}), **v}
            elif k == "required":
                merged["required"] = sorted({*merged.get("required", []), *v})
            elif k in ("minimum", "minLength", "minItems", "exclusiveMinimum"):
                merged[k] = max(merged.get(k, v), v)
            elif k in ("maximum", "maxLength", "maxItems", "exclusiveMaximum"):
                merged[k] = min(merged.get(k, v), v)
            else:
                merged.setdefault(k, v)
    return merged


_FORMATS: Final[Mapping[str, str]] = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00Z",
    "email": "offline@example.com",
    "idn-email": "offline@example.com",
    "hostname": "offline.example.com",
    "idn-hostname": "offline.example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "duration": "PT1M",
}


def _gen_string(schema: Mapping[str, Any], label: str, snippet: str, seed: int) -> str:
    fmt = schema.get("format")
    min_len = int(schema.get("minLength", 0))
    max_len = schema.get("maxLength")
    pattern = schema.get("pattern")
    if fmt in _FORMATS:
        return _FORMATS[str(fmt)]
    slug = re.sub(r"[^a-z0-9]+", "-", snippet.lower()).strip("-") or "offline"
    if fmt in ("uri", "url", "iri", "uri-reference", "iri-reference"):
        return f"https://example.com/{slug[:40]}"
    if fmt == "uuid":
        return str(uuid.UUID(int=stable_hash(seed, label) << 80 | stable_hash(label, seed)))
    base = f"{label}: {snippet}" if label else snippet
    if pattern is not None:
        pat = str(pattern)
        for cand in (base, snippet, slug, label):
            if cand and re.search(pat, cand):
                base = cand
                break
        else:
            sample = pattern_sample(pat, seed)
            if sample is not None:
                return sample
    if max_len is not None and len(base) > int(max_len):
        base = base[: int(max_len)].rstrip() or base[: int(max_len)]
    if len(base) < min_len:
        filler = f" {snippet}" if snippet else " x"
        while len(base) < min_len:
            base += filler
        if max_len is not None:
            base = base[: max(min_len, min(len(base), int(max_len)))]
    return base


def _gen_number(schema: Mapping[str, Any], integer: bool, seed: int) -> int | float:
    lo: float | None = schema.get("minimum")
    hi: float | None = schema.get("maximum")
    ex_lo = schema.get("exclusiveMinimum")
    ex_hi = schema.get("exclusiveMaximum")
    step = 1 if integer else 0.01
    # draft 4 uses booleans; later drafts use numbers.
    if isinstance(ex_lo, bool):
        if ex_lo and lo is not None:
            lo = lo + step
    elif ex_lo is not None:
        lo = max(lo, ex_lo + step) if lo is not None else ex_lo + step
    if isinstance(ex_hi, bool):
        if ex_hi and hi is not None:
            hi = hi - step
    elif ex_hi is not None:
        hi = min(hi, ex_hi - step) if hi is not None else ex_hi - step
    if lo is None and hi is None:
        lo, hi = 1, 100
    elif lo is None:
        assert hi is not None
        lo = hi - 100
    elif hi is None:
        hi = lo + 100
    assert lo is not None and hi is not None
    multiple = schema.get("multipleOf")
    if multiple:
        m = float(multiple)
        k_lo, k_hi = math.ceil(lo / m), math.floor(hi / m)
        k = k_lo + seed % max(1, k_hi - k_lo + 1)
        value = k * m
        if integer or (float(value).is_integer() and float(m).is_integer()):
            return round(value)
        return value
    if integer:
        ilo, ihi = math.ceil(lo), math.floor(hi)
        if ihi < ilo:
            return ilo
        return ilo + seed % (ihi - ilo + 1)
    span = hi - lo
    value = round(lo + span * ((seed % 1000) / 1000), 2)
    return min(max(value, lo), hi)


def generate_value(
    schema: Any,
    prompt: str = "",
    *,
    _root: Any = None,
    _path: str = "$",
    _label: str = "",
    _depth: int = 0,
    _salt: int = 0,
) -> Any:
    """Return a deterministic value valid for ``schema``, mentioning ``prompt`` in strings.

    Supports ``type`` (single or list; ``null`` avoided when possible), ``enum``, ``const``,
    ``properties``/``required``/``additionalProperties``/``minProperties``, ``items``/
    ``prefixItems``/``minItems``/``maxItems``/``uniqueItems``, string ``minLength``/
    ``maxLength``/``format``/``pattern`` (best effort), numeric bounds (incl. exclusive and
    ``multipleOf``), ``$ref`` (local), ``allOf``/``anyOf``/``oneOf`` and ``default`` is ignored.
    The same schema and prompt always give the same value.
    """
    root = schema if _root is None else _root
    if _depth > 40:
        raise ValueError(f"schema too deep at {_path}")
    snippet = snippet_of(prompt)
    seed = stable_hash(prompt, _path, _salt)

    def sub(s: Any, path: str, label: str, salt: int = 0) -> Any:
        return generate_value(
            s, prompt, _root=root, _path=path, _label=label, _depth=_depth + 1, _salt=salt
        )

    if schema is True or schema is None:
        return _gen_string({}, _label, snippet, seed)
    if schema is False:
        raise ValueError(f"schema at {_path} accepts nothing")
    if not isinstance(schema, Mapping):
        raise ValueError(f"schema at {_path} is not an object")
    if "$ref" in schema:
        target = _resolve_ref(str(schema["$ref"]), root)
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        if extra and isinstance(target, Mapping):
            return sub({"allOf": [target, extra]}, _path, _label)
        return sub(target, _path, _label)
    if "allOf" in schema:
        return sub(_merge_all_of(schema, root), _path, _label)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        options = list(schema["enum"])
        if not options:
            raise ValueError(f"empty enum at {_path}")
        non_null = [o for o in options if o is not None] or options
        return non_null[seed % len(non_null)]
    for combo in ("oneOf", "anyOf"):
        if combo in schema:
            options = [
                o for o in schema[combo] if not (isinstance(o, Mapping) and o.get("type") == "null")
            ]
            choice = (options or list(schema[combo]))[0]
            rest = {k: v for k, v in schema.items() if k != combo}
            if rest and isinstance(choice, Mapping):
                return sub({"allOf": [rest, choice]}, _path, _label)
            return sub(choice, _path, _label)

    typ = schema.get("type")
    if isinstance(typ, list):
        non_null_types = [t for t in typ if t != "null"]
        typ = non_null_types[0] if non_null_types else "null"
    if typ is None:
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            typ = "object"
        elif "items" in schema or "prefixItems" in schema or "minItems" in schema:
            typ = "array"
        elif any(k in schema for k in ("minimum", "maximum", "multipleOf")):
            typ = "number"
        else:
            typ = "string"

    if typ == "object":
        props: Mapping[str, Any] = schema.get("properties", {})
        required: list[str] = list(schema.get("required", []))
        result: dict[str, Any] = {}
        for name, prop_schema in props.items():
            result[name] = sub(prop_schema, f"{_path}.{name}", name)
        additional = schema.get("additionalProperties", True)
        extra_schema: Any = additional if isinstance(additional, Mapping) else {"type": "string"}
        for name in required:
            if name not in result:
                result[name] = sub(extra_schema, f"{_path}.{name}", name)
        n = 0
        while len(result) < int(schema.get("minProperties", 0)) and additional is not False:
            n += 1
            result.setdefault(f"extra_{n}", sub(extra_schema, f"{_path}.extra_{n}", f"extra_{n}"))
        return result
    if typ == "array":
        prefix: list[Any] = list(schema.get("prefixItems", []))
        items = schema.get("items", {} if not prefix else False)
        if isinstance(items, list):  # draft 4-2019 tuple form
            prefix, items = items, schema.get("additionalItems", False)
        min_items = int(schema.get("minItems", 0))
        max_items = schema.get("maxItems")
        count = max(min_items, len(prefix), 1)
        if items is False:
            count = max(min_items, len(prefix)) if prefix else min_items
        if max_items is not None:
            count = min(count, int(max_items))
        unique = bool(schema.get("uniqueItems", False))
        out: list[Any] = []
        seen: list[str] = []
        for i in range(count):
            item_schema = prefix[i] if i < len(prefix) else items
            label = _label.rstrip("s") or "item"
            for salt in range(20):
                value = sub(item_schema, f"{_path}[{i}]", f"{label} {i + 1}", salt)
                canon = json.dumps(value, sort_keys=True)
                if not unique or canon not in seen:
                    break
            out.append(value)
            seen.append(canon)
        return out
    if typ == "string":
        return _gen_string(schema, _label, snippet, seed)
    if typ == "integer":
        return _gen_number(schema, True, seed)
    if typ == "number":
        return _gen_number(schema, False, seed)
    if typ == "boolean":
        return seed % 2 == 0
    if typ == "null":
        return None
    raise ValueError(f"unsupported schema type {typ!r} at {_path}")
