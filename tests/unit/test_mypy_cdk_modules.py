"""mypy follows only the aws_cdk modules agentq imports: each of them is on that list.

pyproject.toml skips every other aws_cdk module (mypy analyzed 679 of them through their
imports of one another); a module imported but missing from the list would be checked
as Any, so a wrong keyword to its constructs would pass unseen.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("agentq", "worker", "lambdas", "infra", "bench", "tools", "tests", "app.py")


def _followed() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    followed: set[str] = set()
    for override in config["tool"]["mypy"]["overrides"]:
        if override.get("follow_imports") == "normal":
            followed.update(override["module"])
    return followed


def _imported_cdk_modules() -> dict[str, str]:
    """Each aws_cdk module the code imports, with one file that imports it."""
    found: dict[str, str] = {}
    for source in SOURCES:
        path = ROOT / source
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            if ".venv" in file.parts or "cdk.out" in file.parts:
                continue
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names if a.name.startswith("aws_cdk")]
                elif isinstance(node, ast.ImportFrom) and node.module == "aws_cdk":
                    # Classes (Duration) are CamelCase; modules (aws_lambda) are not.
                    names = ["aws_cdk"] + [
                        f"aws_cdk.{a.name}" for a in node.names if a.name[0].islower()
                    ]
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "aws_cdk."
                ):
                    names = [str(node.module)]
                for name in names:
                    found.setdefault(name, str(file.relative_to(ROOT)))
    return found


def test_every_aws_cdk_module_agentq_imports_is_followed_by_mypy() -> None:
    imported = _imported_cdk_modules()
    assert "aws_cdk.aws_lambda" in imported  # the walk finds what infra/ imports
    missing = {name: where for name, where in imported.items() if name not in _followed()}
    assert not missing, f"add to pyproject.toml's followed aws_cdk modules: {missing}"
