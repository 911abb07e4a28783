"""The task child stays clear of pydantic, and reads its definition as the worker does.

Every task starts a child, so what it imports is on every task's latency (issue 19:
pydantic and the settings model took a cold child from 40 to 158 ms). Behavioural
guards, not timings: `import worker.child.runner` in a fresh interpreter, and a python task run
through `python -m worker.child` that reports what its own process had loaded.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.definitions import MAX_TIMEOUT_S, TASK_KINDS, TaskDefinition
from worker.kinds import ChildDefinition

REPO: Final = Path(__file__).resolve().parents[2]
# pydantic (and its core, and the settings package), and what the worker alone needs.
NOT_IN_A_CHILD: Final = ("pydantic", "pydantic_core", "pydantic_settings", "boto3", "botocore")

_PROBE_TASK: Final = """
import sys

def run(payload, ctx):
    return {"modules": sorted(sys.modules), "model": ctx.settings.model,
            "step_ms": ctx.settings.step_timeout_ms, "definition": ctx.definition.name}
"""


def _loaded(modules: list[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def _child_env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **extra}


def test_importing_the_child_runner_loads_no_pydantic() -> None:
    script = "import json, sys, worker.child.runner; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
        env=_child_env(), timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    modules = json.loads(result.stdout)
    assert [n for n in NOT_IN_A_CHILD if _loaded(modules, n)] == []


def test_a_python_task_runs_without_pydantic_and_gets_its_settings(tmp_path: Path) -> None:
    (tmp_path / "probe_task.py").write_text(_PROBE_TASK)
    definition = {"name": "probe", "kind": "python", "settings": {"callable": "probe_task:run"}}
    task = {"requestId": "r-1", "tenant": "acme", "attempt": 1, "definition": definition,
            "input": {}}  # fmt: skip
    (tmp_path / "task.json").write_text(json.dumps(task))
    env = _child_env(CLAUDE_MODEL="m-from-env", DEFAULT_TIMEOUT=" 4200 ")
    result = subprocess.run(
        [sys.executable, "-m", "worker.child", str(tmp_path)], capture_output=True, text=True,
        cwd=tmp_path, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads((tmp_path / "artifacts" / "task-result.json").read_text())
    assert [n for n in NOT_IN_A_CHILD if _loaded(outcome["modules"], n)] == []
    assert (outcome["model"], outcome["step_ms"], outcome["definition"]) == (
        "m-from-env", 4200, "probe",
    )  # fmt: skip


def test_a_bad_child_setting_fails_the_attempt_naming_the_variable(tmp_path: Path) -> None:
    definition = {"name": "probe", "kind": "python", "settings": {"callable": "x:y"}}
    task = {"requestId": "r-2", "tenant": "acme", "definition": definition}
    (tmp_path / "task.json").write_text(json.dumps(task))
    result = subprocess.run(
        [sys.executable, "-m", "worker.child", str(tmp_path)], capture_output=True, text=True,
        cwd=tmp_path, env=_child_env(DEFAULT_TIMEOUT="soon"), timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    error = json.loads((tmp_path / "error.json").read_text())
    assert "DEFAULT_TIMEOUT" in error["message"], error


# Settings a definition may hold: what DynamoDB stores (no empty key, numbers within
# 38 digits and 1e-130..1e125); the model refuses the rest (tests/unit/test_definition_models.py).
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**37), 10**37)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f == 0 or 1e-120 < abs(f) < 1e120)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)  # fmt: skip
DEFINITIONS = st.fixed_dictionaries(
    {"name": st.from_regex(r"\A[a-zA-Z0-9_.-]{1,20}\Z"), "kind": st.sampled_from(TASK_KINDS)},
    optional={
        "description": st.none() | st.text(max_size=20),
        "timeout_s": st.none()
        | st.integers(1, MAX_TIMEOUT_S)
        | st.floats(min_value=0.001, max_value=MAX_TIMEOUT_S),
        "max_attempts": st.none() | st.integers(1, 1000),
        "priority": st.none() | st.from_regex(r"\A[a-z][a-z0-9-]{0,10}\Z"),
        "settings": st.none() | st.dictionaries(st.text(min_size=1, max_size=8), JSON, max_size=4),
    },
)


@settings(max_examples=300, deadline=None, database=None)
@given(raw=DEFINITIONS)
def test_the_child_reads_what_the_worker_wrote_as_the_model_does(raw: dict[str, Any]) -> None:
    model = TaskDefinition.from_dict(raw)
    # What the worker writes into task.json, as the child reads it back.
    written = json.loads(json.dumps({"definition": model.to_dict()}))["definition"]
    child = ChildDefinition.from_dict(written)
    assert child.to_dict() == model.to_dict()
    for field in dataclasses.fields(ChildDefinition):
        assert getattr(child, field.name) == getattr(model, field.name), field.name
    assert child.timeout_ms(1234) == model.timeout_ms(1234)
    assert child.attempts(7) == model.attempts(7)


def test_the_child_definition_has_the_model_fields() -> None:
    assert {f.name for f in dataclasses.fields(ChildDefinition)} == set(TaskDefinition.model_fields)
