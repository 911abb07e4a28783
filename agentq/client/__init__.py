"""The producer client: `AgentqClient` submits tasks, creates jobs, reads them back,
waits and cancels.

`producer` holds the client and submitting; it is composed of `parts` (the stores and
reading one task or job), `jobs` (creating jobs) and `control` (wait, cancel).
"""

from __future__ import annotations

from agentq.client.control import CancelAnswer, WaitTimeout
from agentq.client.producer import AgentqClient, default_registry

__all__ = ["AgentqClient", "CancelAnswer", "WaitTimeout", "default_registry"]
