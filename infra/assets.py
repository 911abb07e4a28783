"""Code assets built without Docker.

The Lambda asset is a directory holding `agentq/`, `lambdas/` and the pure-Python
wheels of requirements-lambdas.txt for the Lambda platform (manylinux, CPython of the
runtime), installed by pip with `--only-binary` so nothing is compiled here. pip runs
once per requirements hash; the source is re-staged only when it changes. Both live
under `cdk.out/.lambda-build/`, so repeated synths (tests synth several times) cost a
directory copy of hard links, not a download.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from aws_cdk import AssetHashType
from aws_cdk import aws_lambda as lambda_

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
LAMBDA_RUNTIME: Final = lambda_.Runtime.PYTHON_3_14
LAMBDA_ARCHITECTURE: Final = lambda_.Architecture.X86_64
_PLATFORM: Final = "manylinux2014_x86_64"
_PYTHON_VERSION: Final = "3.14"
_SOURCE_PACKAGES: Final = ("agentq", "lambdas")
_IGNORED: Final = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache")


class AssetBuildError(RuntimeError):
    """The Lambda dependencies could not be installed (pip's output is attached)."""


def build_cache_dir(repo_root: Path = REPO_ROOT) -> Path:
    return repo_root / "cdk.out" / ".lambda-build"


def lambda_requirements(repo_root: Path = REPO_ROOT) -> list[str]:
    """requirements-lambdas.txt plus boto3 pinned as the worker pins it.

    The runtime ships its own boto3, which may lag or lead the one the tests run;
    bundling the pinned boto3 makes the Lambdas run the same version as everything else.
    """
    lines = (repo_root / "requirements-lambdas.txt").read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    runtime = (repo_root / "requirements.txt").read_text().splitlines()
    pins += [line.strip() for line in runtime if line.startswith("boto3==")]
    return pins


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:20]


def _source_digest(repo_root: Path) -> str:
    parts: list[bytes] = []
    for package in _SOURCE_PACKAGES:
        for path in sorted((repo_root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts += [str(path.relative_to(repo_root)).encode(), path.read_bytes()]
    return _digest(*parts)


def _install_dependencies(requirements: list[str], cache: Path) -> Path:
    key = _digest(_PLATFORM.encode(), _PYTHON_VERSION.encode(), *(r.encode() for r in requirements))
    target = cache / f"deps-{key}"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent synths never see half a directory.
    scratch = Path(tempfile.mkdtemp(prefix="deps-", dir=cache))
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-compile", "--target", str(scratch), "--platform", _PLATFORM,
        "--implementation", "cp", "--python-version", _PYTHON_VERSION,
        "--only-binary=:all:", *requirements,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise AssetBuildError(f"pip could not install the Lambda dependencies:\n{result.stderr}")
    shutil.rmtree(scratch / "bin", ignore_errors=True)
    try:
        scratch.rename(target)
    except OSError:  # another synth finished first; its copy is identical
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def lambda_asset_dir(repo_root: Path = REPO_ROOT) -> tuple[Path, str]:
    """The staged asset directory and its content hash (dependencies + source)."""
    cache = build_cache_dir(repo_root)
    deps = _install_dependencies(lambda_requirements(repo_root), cache)
    key = _digest(deps.name.encode(), _source_digest(repo_root).encode())
    asset = cache / f"asset-{key}"
    if asset.is_dir():
        return asset, key
    scratch = Path(tempfile.mkdtemp(prefix="asset-", dir=cache))
    shutil.copytree(deps, scratch, dirs_exist_ok=True, copy_function=_link_or_copy)
    for package in _SOURCE_PACKAGES:
        shutil.copytree(repo_root / package, scratch / package, ignore=_IGNORED)
    try:
        scratch.rename(asset)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
    _prune(cache, keep=asset)
    return asset, key


def _prune(cache: Path, *, keep: Path, spare: int = 3, min_age_s: float = 3600.0) -> None:
    """Drop staged assets of old sources (each edit of agentq/ or lambdas/ makes one).

    The newest few and anything touched in the last hour stay: a synth running in
    parallel on an older checkout may still be copying one.
    """
    ages: dict[Path, float] = {}
    now = time.time()
    for path in cache.glob("asset-*"):
        try:
            ages[path] = now - path.stat().st_mtime
        except OSError:  # pruned by a parallel synth
            continue
    for old in sorted(ages, key=ages.__getitem__)[spare:]:
        if old != keep and ages[old] > min_age_s:
            shutil.rmtree(old, ignore_errors=True)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def lambda_code(repo_root: Path = REPO_ROOT) -> lambda_.Code:
    """One code asset shared by every agentq Lambda (the handler picks the module)."""
    directory, key = lambda_asset_dir(repo_root)
    # The key already covers every input, so CDK need not fingerprint ~70 MB again.
    return lambda_.Code.from_asset(
        str(directory), asset_hash=key, asset_hash_type=AssetHashType.CUSTOM
    )
