"""agentq: run Claude Agent SDK tasks as queued, exactly-once background work on AWS."""

__version__ = "0.1.0"
