"""The worker image's hashed lock is resolved for the image's Python, not the one that
runs `make image-lock`: a requirement's environment markers (`python_version < "3.13"`)
decide what the image needs, so a lock resolved on another Python can miss or carry a
package."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
MACHINES = ("x86_64", "aarch64")  # the image is built for amd64 and arm64


def _image_python() -> str:
    found = re.search(r"^FROM python:(\d+\.\d+)-", (REPO / "Dockerfile").read_text(), re.M)
    assert found, "the Dockerfile's base is python:X.Y-..."
    return found.group(1)


def _lock() -> str:
    return (REPO / "requirements-image.lock").read_text()


def _pins(lock: str) -> dict[str, str]:
    return {canonicalize_name(name): version
            for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock, re.M)}  # fmt: skip


def _image_environment(python: str, machine: str) -> dict[str, str]:
    environment = {key: str(value) for key, value in default_environment().items()}
    environment.update(python_version=python, python_full_version=f"{python}.0",
                       implementation_name="cpython", platform_python_implementation="CPython",
                       sys_platform="linux", platform_system="Linux", os_name="posix",
                       platform_machine=machine)  # fmt: skip
    return environment


def test_the_lock_says_it_was_resolved_for_the_images_python() -> None:
    python = _image_python()
    assert f"# Resolved for Python {python} on Linux (amd64 and arm64)" in _lock()
    makefile = (REPO / "Makefile").read_text()
    assert "--python-version $(IMAGE_PYTHON)" in makefile
    assert "IMAGE_PYTHON = $(shell sed -n 's/^FROM python:" in makefile, "read from the Dockerfile"


def test_the_locks_markers_hold_on_the_images_python() -> None:
    """A requirement the lock keeps under a marker must apply in the image."""
    for machine in MACHINES:
        environment = _image_environment(_image_python(), machine)
        for line in _lock().splitlines():
            if re.match(r"[A-Za-z0-9]", line) and ";" in line:
                requirement = Requirement(line.rstrip(" \\"))
                assert requirement.marker is None or requirement.marker.evaluate(environment), (
                    f"{requirement} does not apply to the image on {machine}"
                )


def test_the_lock_holds_exactly_what_requirements_txt_needs_on_the_images_python() -> None:
    """Walk requirements.txt's dependencies with the image's markers (from the installed
    distributions' metadata, at the locked versions): nothing missing, nothing that only
    another Python needs."""
    pins = _pins(_lock())
    roots = [Requirement(line) for line in (REPO / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]  # fmt: skip
    for machine in MACHINES:
        environment = _image_environment(_image_python(), machine)
        needed: set[str] = set()
        todo: list[tuple[Requirement, frozenset[str]]] = [(r, frozenset(r.extras)) for r in roots]
        while todo:
            requirement, extras = todo.pop()
            name = canonicalize_name(requirement.name)
            if name in needed:
                continue
            needed.add(name)
            if name not in pins:
                continue  # missing from the lock: the assertion names it
            try:
                distribution = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                pytest.skip(f"{name} is not installed here: its dependencies are unknown")
            if distribution.version != pins.get(name):
                pytest.skip(f"{name} {distribution.version} is installed, the lock pins another")
            for dependency in map(Requirement, distribution.requires or []):
                applies = dependency.marker is None or any(
                    dependency.marker.evaluate({**environment, "extra": extra})
                    for extra in extras or {""}
                )
                if applies:
                    todo.append((dependency, frozenset(dependency.extras)))
        assert needed == set(pins), (
            f"missing on {machine}: {sorted(needed - set(pins))}; "
            f"locked but not needed: {sorted(set(pins) - needed)}"
        )
