"""AWS rules the local stack enforces over moto (each module names its rule).

`install_all()` runs once in the moto server process (agentq/local/moto_server.py), so
`make test`, `agentq local up` and the chaos bench all meet them.
"""

from __future__ import annotations

import importlib

RULES: tuple[str, ...] = (
    "dynamodb_idempotency",
    "dynamodb_transaction_conflict",
    "dynamodb_index_lag",
)


def install_all() -> None:
    for name in RULES:
        importlib.import_module(f"{__name__}.{name}").install()
