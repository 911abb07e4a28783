"""What `pip install .` and `make demo` install: declared in pyproject, pinned in
requirements*.txt, the two in step, and the demo without the CDK and lint toolchain."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from cli_support import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _pins(name: str, *, follow: bool = True) -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (REPO / name).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            if follow:
                pins.update(_pins(line.removeprefix("-r ").strip()))
            continue
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{name}: {line} is not pinned"
        pins[str(canonicalize_name(requirement.name))] = spec.version
    return pins


def _declared(group: str | None) -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] if group is None else project["optional-dependencies"][group]
    found: dict[str, Requirement] = {
        str(canonicalize_name(Requirement(line).name)): Requirement(line) for line in lines
    }
    found.pop("agentq", None)  # dev pulls in the other extras by name
    return found


@pytest.mark.parametrize(
    ("group", "requirements"),
    [
        (None, "requirements.txt"),
        ("local", "requirements-local.txt"),
        ("cdk", "requirements-cdk.txt"),
        ("dev", "requirements-dev.txt"),
    ],
)
def test_pyproject_declares_exactly_what_requirements_pin(
    group: str | None, requirements: str
) -> None:
    pins = _pins(requirements, follow=False)
    declared = _declared(group)
    assert set(declared) == set(pins), (requirements, sorted(set(declared) ^ set(pins)))
    for name, requirement in declared.items():
        assert requirement.specifier.contains(pins[name]), (name, str(requirement), pins[name])


def test_lambda_requirements_are_the_runtime_pins() -> None:
    runtime = _pins("requirements.txt")
    for name, version in _pins("requirements-lambdas.txt").items():
        assert runtime.get(name) == version, name


def test_make_demo_installs_the_runtime_and_moto_only(tmp_path: Path) -> None:
    # A dry run in a fresh venv location: what a first `make demo` would do.
    planned = subprocess.run(
        ["make", "-n", "--no-print-directory", "demo", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "-r requirements-local.txt" in planned
    assert "requirements-dev.txt" not in planned and "requirements-cdk.txt" not in planned
    local = _pins("requirements-local.txt")
    assert not {"aws-cdk-lib", "cfn-lint", "mypy", "ruff"} & set(local)
    assert "--real-claude" not in planned  # offline unless DEMO_REAL_CLAUDE=1
    real = subprocess.run(
        ["make", "-n", "--no-print-directory", "demo", f"VENV={tmp_path / 'venv'}",
         "DEMO_REAL_CLAUDE=1"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "-m agentq.demo --real-claude" in real


def test_make_deploy_ships_the_definitions_with_the_stacks_then_writes_the_variables(
    tmp_path: Path,
) -> None:
    planned = subprocess.run(
        ["make", "-n", "--no-print-directory", "deploy", "STAGE=prod",
         "DEFINITIONS=my_definitions", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    steps = [line for line in planned
             if "cdk deploy" in line or "/bin/agentq " in line or "secrets_ready" in line]  # fmt: skip
    # The secrets stack first, then a check that its key is set (the worker refuses the
    # placeholder), then everything; the deployment's own custom resource loads the
    # definitions: no sync step after it.
    assert len(steps) == 4, steps
    assert " ".join(steps[0].split()) == (
        'npx cdk deploy agentq-prod-secrets -c stage=prod -c definitions="my_definitions"'
    )
    assert steps[1].endswith("-m infra.secrets_ready --stage prod")
    assert " ".join(steps[2].split()) == (
        'npx cdk deploy --all -c stage=prod -c definitions="my_definitions"'
    )
    assert steps[3].endswith("agentq env --stage prod --output .agentq/prod.env")
