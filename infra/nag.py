"""Acknowledging cdk-nag findings: one rule, one scope, one specific reason.

cdk-nag 3.x runs as a validation plugin: every finding fails `app.synth()` unless it
is acknowledged on the construct (or an ancestor) that caused it. The reason is part
of the template's audit trail, so vague reasons are refused here; each acknowledgment
is also recorded as construct metadata, so tests can refuse one that suppresses nothing.
"""

from __future__ import annotations

from typing import Final

import aws_cdk as cdk
from constructs import IConstruct

PLUGIN: Final = "AwsSolutions"
_MIN_REASON: Final = 40
ACKNOWLEDGED_METADATA: Final = "agentq:nag-acknowledged"


def acknowledge(
    scope: IConstruct, rule: str, reason: str, *, applies_to: str | None = None
) -> None:
    """Acknowledge `AwsSolutions-<rule>` (optionally one `[applies_to]` finding) on scope."""
    if len(reason) < _MIN_REASON:
        raise ValueError(f"acknowledgment of {rule} needs a specific reason, got {reason!r}")
    finding = f"{PLUGIN}-{rule}" + (f"[{applies_to}]" if applies_to else "")
    cdk.Validations.of(scope).acknowledge(
        cdk.Acknowledgment(id=f"{PLUGIN}::{finding}", reason=reason)
    )
    # Recorded in the cloud assembly, so a test can find acknowledgments that no longer
    # suppress anything (a dead one would silently cover a future finding).
    scope.node.add_metadata(ACKNOWLEDGED_METADATA, finding)
