"""`python -m agentq.config` prints the settings reference table."""

from __future__ import annotations

import sys

from agentq.config.settings import reference_table

sys.stdout.write(reference_table())
