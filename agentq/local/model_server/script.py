"""Script files: rules (JSON or YAML) that apply a scenario to matching requests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentq.local.model_server.grammar import USAGE_NAMES, parse_directives
from agentq.local.model_server.scenario import (
    Delay,
    Failure,
    Rule,
    Scenario,
    ScriptError,
    Stall,
    ToolCall,
)


def rule_from_mapping(raw: Mapping[str, Any], index: int) -> Rule:
    known = {
        "match",
        "key",
        "do",
        "fail",
        "stall",
        "delay_ms",
        "output",
        "output_times",
        "tools",
        "text",
        "usage",
    }
    unknown = set(raw) - known
    if unknown:
        raise ScriptError(f"rule {index}: unknown field(s) {sorted(unknown)}")
    scn = parse_directives(str(raw["do"])) if raw.get("do") else Scenario()
    fails = raw.get("fail")
    if fails is not None:
        for f in [fails] if isinstance(fails, Mapping) else list(fails):
            if not isinstance(f, Mapping) or "status" not in f:
                raise ScriptError(f"rule {index}: fail needs a mapping with 'status'")
            ra = f.get("retry_after")
            scn.failures.append(
                Failure(
                    status=int(f["status"]),
                    times=None if f.get("times") is None else int(f["times"]),
                    turn=None if f.get("turn") is None else int(f["turn"]),
                    retry_after=None if ra is None else float(ra),
                    no_retry=bool(f.get("no_retry", False)),
                )
            )
    stall = raw.get("stall")
    if stall:
        scn.stalls.append(Stall(midstream=stall == "midstream"))
    if raw.get("delay_ms") is not None:
        scn.delays.append(Delay(ms=int(raw["delay_ms"])))
    if "output" in raw:
        scn.output = raw["output"]
        scn.output_times = None if raw.get("output_times") is None else int(raw["output_times"])
    for t in raw.get("tools") or []:
        if not isinstance(t, Mapping) or not isinstance(t.get("input", {}), Mapping):
            raise ScriptError(f"rule {index}: tools entries need 'name' and an 'input' mapping")
        scn.tools.append(ToolCall(str(t["name"]), dict(t.get("input", {}))))
    if raw.get("text") is not None:
        scn.text = str(raw["text"])
    for name, value in dict(raw.get("usage") or {}).items():
        if name not in USAGE_NAMES:
            raise ScriptError(f"rule {index}: unknown usage field {name!r}")
        scn.usage[USAGE_NAMES[name]] = int(value)
    match = None if raw.get("match") is None else str(raw["match"])
    key = str(raw.get("key") or scn.key or match or f"rule{index}")
    scn.key = key
    return Rule(scenario=scn, key=key, match=match)


def load_script(source: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[Rule]:
    """Load rules from a JSON/YAML file path, or from already-parsed data."""
    data: Any
    if isinstance(source, str | Path):
        path = Path(source)
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml  # optional: only needed for YAML scripts

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    else:
        data = source
    if isinstance(data, Mapping):
        data = data.get("rules", [])
    if not isinstance(data, Sequence) or isinstance(data, str):
        raise ScriptError("a script is a list of rules or a mapping with 'rules'")
    rules: list[Rule] = []
    for i, raw in enumerate(data):
        if not isinstance(raw, Mapping):
            raise ScriptError(f"rule {i} is not a mapping")
        rules.append(rule_from_mapping(raw, i))
    return rules
