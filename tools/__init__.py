"""Maintainer commands that keep agentq's docs in step with its code (not shipped)."""
