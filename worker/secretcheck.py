"""Refuse to start with a secret that was never set.

The stacks create the Anthropic key's secret holding `SECRET_PLACEHOLDER` (a value no
one could take for a key) rather than generated junk: a worker started before an
operator put the real key in would otherwise run every agent task into an
authentication error. It stops at start-up instead, naming the variable and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from agentq.errors import ConfigError
from agentq.resources import SECRET_PLACEHOLDER

# Injected from Secrets Manager by the task definition (infra/stacks/worker.py).
SECRET_VARIABLES: Final = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN")


def refuse_placeholder_secrets(environ: Mapping[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    for name in SECRET_VARIABLES:
        if env.get(name, "").strip() == SECRET_PLACEHOLDER:
            raise ConfigError(
                name,
                "still holds the placeholder the stack deployed: put the real value in the "
                "stage's secret (docs/operations.md, 'Secrets'), then restart the worker "
                "service (aws ecs update-service --force-new-deployment)",
            )
