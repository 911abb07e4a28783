"""AWS fault injection for agentq's local stack and tests.

Switched on only by `AGENTQ_FAULTS` (see agentq/faults/config.py and docs/faults.md).
`install_from_env` is called on every client agentq builds (agentq/aws.py); with the
variable unset it returns at once and imports nothing, so a production process never
loads the injector.
"""

from __future__ import annotations

import os
from typing import Any

SPEC_VAR = "AGENTQ_FAULTS"
SEED_VAR = "AGENTQ_FAULTS_SEED"
LOG_VAR = "AGENTQ_FAULTS_LOG"


def install_from_env(client: Any) -> Any:
    """Installs the environment's faults on `client`; a no-op when none are configured."""
    key = tuple(os.environ.get(name, "") for name in (SPEC_VAR, SEED_VAR, LOG_VAR))
    if not key[0].strip():
        return client
    from agentq.faults.config import FaultSettings
    from agentq.faults.injector import install, process_injector

    settings = FaultSettings.from_env()
    if settings is None:
        return client
    return install(client, process_injector(settings, key))
