"""The `agent` kind: a Claude Agent SDK run that must answer in a JSON schema.

Definition settings (docs/agent-tasks.md has the long form)::

    settings:
      prompt: "Summarize this document:\n\n{document}"   # {placeholders} from the input
      output_schema: {type: object, properties: {...}, required: [...]}
      model: claude-sonnet-4-5        # default CLAUDE_MODEL
      max_turns: 10
      allowed_tools: []               # empty = no tools at all
      permission_mode: dontAsk        # default | acceptEdits | plan | dontAsk
      step_timeout_s: 300             # per CLI run, clamped to 1 s .. 15 min
      max_budget_usd: 0.50            # optional

The child renders the prompt, runs the bundled Claude Code CLI through
`claude_agent_sdk.query()` with ``output_format={"type": "json_schema", ...}`` (up to
three runs, retrying only retryable failures), validates the structured output against
the schema and returns it; it also leaves `traces/session_trace.json`,
`logs/summary.log` and `usage.json` behind for the worker to upload and report.
"""

from __future__ import annotations

from typing import Any

from worker.kinds import ChildContext


def run(ctx: ChildContext) -> Any:
    # Imported here so listing kinds does not load the SDK.
    from worker.kinds.agent.runner import AgentRun

    return AgentRun(ctx).run()
