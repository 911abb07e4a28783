"""Builds every stack of the stage named by the `stage` context value."""

from __future__ import annotations

import aws_cdk as cdk


def build_app(app: cdk.App) -> None:
    """Placeholder until the infrastructure stacks land (issue: Infrastructure)."""
    stage = str(app.node.try_get_context("stage") or "dev")
    cdk.Stack(app, f"agentq-{stage}-placeholder")
