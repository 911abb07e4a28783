"""AWS rules the local stack enforces over moto: one module per rule, each with an
`install()` that applies it inside the moto server process (docs/aws-fidelity.md)."""

from __future__ import annotations

import importlib
from typing import Final

RULES: Final[tuple[str, ...]] = (
    "fair_queues",
    "eventbridge_sqs_groups",
)


def install_all() -> None:
    """Install every rule, in order; a rule whose moto internal moved refuses to start."""
    for rule in RULES:
        importlib.import_module(f"{__name__}.{rule}").install()
