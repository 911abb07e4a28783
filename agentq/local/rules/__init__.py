"""AWS rules the local stack enforces over moto (one module per rule, each with an
`install()` run inside the moto server process; see each module for the rule)."""

from __future__ import annotations

import importlib
from typing import Final

RULES: Final[tuple[str, ...]] = ("s3_missing_key",)


def install_all() -> None:
    """Import and install every rule, in order (each refuses a moto it does not fit)."""
    for rule in RULES:
        importlib.import_module(f"{__name__}.{rule}").install()
