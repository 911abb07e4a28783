"""The fault log: one JSON line per injected fault, appended from any process.

Each line is written with a single O_APPEND write, short enough to land whole even
when several workers append to the same file.
"""

from __future__ import annotations

import json
import os


class FaultLog:
    def __init__(self, path: str | None) -> None:
        self.path = path

    def write(self, service: str, op: str, kind: str) -> None:
        if not self.path:
            return
        line = json.dumps({"pid": os.getpid(), "service": service, "op": op, "kind": kind})
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def read_counts(path: str) -> dict[str, int]:
    """Faults per `service:op:kind` in a log (the harness's tally across processes)."""
    counts: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            entry = json.loads(line)
            key = f"{entry['service']}:{entry['op']}:{entry['kind']}"
            counts[key] = counts.get(key, 0) + 1
    return counts
