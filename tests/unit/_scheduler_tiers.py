"""The priority tiers the scheduler, intake and tier-receiver tests use, highest first."""

from __future__ import annotations

TIERS = ("high", "normal", "low")
