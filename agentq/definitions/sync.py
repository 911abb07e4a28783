"""Making the task-definitions table hold a set of definitions.

One implementation for both ways definitions reach a deployed stage: `agentq
definitions sync DIR...` (quick updates from a shell) and the deployment's definitions
loader (lambdas/definitions_loader.py, run by CloudFormation on every `cdk deploy`).

Every definition is read and validated before the first write, so a bad file stops the
sync with the file's name and leaves the table as it was. Each write puts a whole item
and each delete names one key: a retried call (botocore's, after an answer was lost) or
a rerun after a crash writes the same thing again, so any number of runs converge on the
same table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentq.definitions.registry import DefinitionsTable, TaskDefinition, load_directory
from agentq.errors import InvalidInput, OutOfTime


@dataclass(frozen=True)
class DefinitionSource:
    """A directory of definition files, and how errors name it."""

    directory: Path
    label: str


def load_sources(sources: Iterable[DefinitionSource]) -> dict[str, TaskDefinition]:
    """Every definition of the directories, validated; a name defined twice is refused."""
    wanted: dict[str, TaskDefinition] = {}
    for source in sources:
        if not source.directory.is_dir():
            raise InvalidInput(source.label, "no such directory")
        for name, definition in load_directory(source.directory, label=source.label).items():
            if name in wanted:
                raise InvalidInput(source.label, f"defines {name!r} again")
            wanted[name] = definition
    return wanted


@dataclass
class SyncReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "deleted": self.deleted,
        }

    @property
    def writes(self) -> int:
        return len(self.added) + len(self.updated) + len(self.deleted)


def sync_definitions(
    table: DefinitionsTable,
    wanted: Mapping[str, TaskDefinition],
    *,
    prune: bool = False,
    remove: Sequence[str] = (),
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> SyncReport:
    """Write what differs from `wanted`, then delete `remove` (or, with `prune`, every
    other name) unless wanted.

    An item that is no valid definition counts as different and is replaced. With a
    `deadline` (on `clock`), `OutOfTime` is raised before a write that would start past
    it, so a caller bounded by a timeout can still report what happened.
    """
    stored = table.stored()
    report = SyncReport()

    def differs(name: str) -> bool:
        current = stored.get(name)  # None: not there, or no valid definition
        return current is None or current.to_dict() != wanted[name].to_dict()

    writes = [name for name in sorted(wanted) if differs(name)]
    doomed = set(stored) - set(wanted) if prune else (set(remove) & set(stored)) - set(wanted)
    total = len(writes) + len(doomed)
    report.unchanged = [name for name in sorted(wanted) if name not in writes]

    def check() -> None:
        if deadline is not None and clock() >= deadline:
            raise OutOfTime("definitions sync", report.writes, total)

    for name in writes:
        check()
        table.put(wanted[name])
        (report.updated if name in stored else report.added).append(name)
    for name in sorted(doomed):
        check()
        table.delete(name)
        report.deleted.append(name)
    return report
