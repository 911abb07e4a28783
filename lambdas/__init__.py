"""Thin Lambda handlers: parse, call agentq, side effects. One module per function."""
