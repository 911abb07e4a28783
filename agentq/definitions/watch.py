"""Directories of files loaded again when their files change: how a worker finds a task
definition saved while it runs, without a restart (`DefinitionRegistry.from_sources`
gives it `agentq.definitions.load_directory`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Final, Generic, TypeVar

from agentq.errors import InvalidInput

# How often a name not found makes the directories be checked again, at most.
MISS_RECHECK_S: Final = 0.5

_log = logging.getLogger(__name__)
T = TypeVar("T")


class WatchedDirectories(Generic[T]):
    """What `load(directory)` makes of some directories (a later one wins on a name),
    loaded again when their files (those ending in `suffixes`) change: checked at most
    every `recheck_s`, and at once (at most every `MISS_RECHECK_S`) for a name not found.
    A change that does not load (a file half written, a typo) keeps the last good set;
    a directory that does not load at start is an error, as ever."""

    def __init__(
        self,
        directories: Iterable[Path],
        load: Callable[[Path], Mapping[str, T]],
        suffixes: Collection[str],
        *,
        recheck_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._directories = tuple(directories)
        self._load_one = load
        self._suffixes = suffixes
        self._recheck_s = recheck_s
        self._clock = clock
        self._lock = threading.Lock()
        self._signature = self._files_signature()
        self._found = self._load()
        self._checked = clock()

    def get(self, name: str) -> T | None:
        self._refresh(self._recheck_s)
        found = self._found.get(name)
        if found is None and self._refresh(MISS_RECHECK_S):
            found = self._found.get(name)
        return found

    def names(self) -> set[str]:
        self._refresh(self._recheck_s)
        return set(self._found)

    def _refresh(self, interval_s: float) -> bool:
        with self._lock:
            now = self._clock()
            if now - self._checked < interval_s:
                return False
            self._checked = now
            signature = self._files_signature()
            if signature == self._signature:
                return False
            self._signature = signature
            try:
                self._found = self._load()
            except (InvalidInput, OSError) as bad:
                _log.warning("definitions not reloaded (the last good ones stay): %s", bad)
                return False
            return True

    def _load(self) -> dict[str, T]:
        found: dict[str, T] = {}
        for directory in self._directories:
            found.update(self._load_one(directory))
        return found

    def _files_signature(self) -> tuple[tuple[str, int, int], ...]:
        entries: list[tuple[str, int, int]] = []
        for directory in self._directories:
            try:
                listed = list(os.scandir(directory))
            except OSError:
                entries.append((str(directory), -1, -1))
                continue
            for entry in listed:
                if Path(entry.name).suffix in self._suffixes and entry.is_file():
                    stat = entry.stat()
                    entries.append((entry.path, stat.st_mtime_ns, stat.st_size))
        return tuple(sorted(entries))
