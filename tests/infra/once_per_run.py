"""Costly test set-up done once per pytest run, however many xdist processes need it: the
first process to ask does it under a file lock in the directory the run's processes
share and leaves the result there; the others wait on the lock and read the result."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The directory every process of this run shares, or None for a run of one process.

    Under xdist each worker's base temp is a child of the run's own (pytest prunes old
    runs' directories); without xdist that parent is shared by every run, so unusable."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return None
    return tmp_path_factory.getbasetemp().parent


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # An flock dies with its process: a worker killed mid-way leaves no stale lock.
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def once_per_run(
    shared: Path | None,
    name: str,
    make: Callable[[], T],
    save: Callable[[T], str],
    load: Callable[[str], T],
) -> T:
    """`make()` in the first process of the run to ask, `load(saved text)` in the others.

    A `make` that raises leaves nothing behind: the next process tries again (and says
    why it fails in its own tests)."""
    if shared is None:
        return make()
    result = shared / f"{name}.json"
    with _locked(shared / f"{name}.lock"):
        if result.exists():
            return load(result.read_text())
        made = make()
        written = result.with_suffix(".tmp")
        written.write_text(save(made))
        written.replace(result)
        return made
