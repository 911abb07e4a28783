"""`agentq console`: a loopback web page to see and steer agentq work.

Jobs, a job's DAG and timeline, tasks submitted on their own, a task's input, result,
attempts, agent trace and logs, the dead-letter archive, queues and workers. It reads
the configured stage with the operator's own credentials and deploys nothing.
docs/console.md describes the pages and what each module of this package does.
"""

from agentq.console.server import ConsoleOptions, ConsoleServer, serving

__all__ = ["ConsoleOptions", "ConsoleServer", "serving"]
