"""AWS rules the local stack enforces over moto, each in its own module.

Every module here names one AWS rule moto does not keep and has an `install()` that
applies it inside the moto server process (guarded: a moto whose internals moved is
refused with `IncompatibleDependency`). The moto server launcher calls `install_all()`
once at start, so `make test`, `agentq local up` and the chaos bench all run under them
(docs/aws-fidelity.md lists each with its test). `_dynamodb` holds what the DynamoDB
rules share.
"""

from __future__ import annotations

import importlib
from typing import Final

RULES: Final[tuple[str, ...]] = (
    "sqs_visibility_cap",
    "sqs_message_attributes",
    "fair_queues",
    "eventbridge_sqs_groups",
    "dynamodb_idempotency",
    "dynamodb_transaction_conflict",
    "dynamodb_index_lag",
    "dynamodb_reversed_between",
    "s3_missing_key",
)


def install_all() -> None:
    """Install every rule of `RULES`, in order (each is idempotent); a rule whose moto
    internal moved refuses to start."""
    for rule in RULES:
        importlib.import_module(f"{__name__}.{rule}").install()
