"""One attempt: one `claude_agent_sdk.query()` run of the bundled CLI, to its result."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Final, cast

from claude_agent_sdk import ClaudeAgentOptions, Message, ResultMessage, SessionStore, query

from agentq.errors import TaskError
from worker.kinds.agent.checkpoint import RESUME_NOTE
from worker.kinds.agent.errors import classify_result
from worker.kinds.agent.spec import AgentSpec
from worker.kinds.agent.trace import TraceRecorder


def options(
    spec: AgentSpec,
    *,
    cwd: Path,
    recorder: TraceRecorder,
    stderr: Callable[[str], None],
    store: SessionStore | None = None,
    resume: str | None = None,
    interrupted: bool = True,
) -> ClaudeAgentOptions:
    """The SDK options of a run; with `store` the transcript is mirrored there (checkpoints),
    and `resume` (a session id the store holds) continues that session: one `interrupted`
    (the model is told), or a finished task's that a continuation goes on with."""
    env = {
        # agentq's own retry (classified, jittered, traced) replaces the CLI's ten silent
        # ones; a definition may hand some back with cli_max_retries.
        "CLAUDE_CODE_MAX_RETRIES": str(spec.cli_max_retries),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": os.environ.get(
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"
        ),
    }
    return ClaudeAgentOptions(
        model=spec.model,
        system_prompt=(
            f"{spec.system_prompt}\n\n{RESUME_NOTE}"
            if resume is not None and interrupted
            else spec.system_prompt
        ),
        max_turns=spec.max_turns,
        max_budget_usd=spec.max_budget_usd,
        # `tools` is what exists at all, `allowed_tools` what runs without asking:
        # both are the definition's list, so an empty list means no tools.
        tools=list(spec.allowed_tools),
        allowed_tools=list(spec.allowed_tools),
        permission_mode=spec.permission_mode,
        output_format={"type": "json_schema", "schema": dict(spec.output_schema)},
        hooks=recorder.hooks(),
        cwd=str(cwd),
        env=env,
        # Settings files of the machine or a repo must not change what a task may do.
        setting_sources=[],
        stderr=stderr,
        session_store=store,
        # Every frame reaches the store at once, so a turn's end is checkpointed at its end.
        session_store_flush="eager",
        resume=resume,
    )


# The tool the CLI offers the model for a structured answer (output_format json_schema).
STRUCTURED_OUTPUT_TOOL: Final = "StructuredOutput"


async def run_once(prompt: str, opts: ClaudeAgentOptions, recorder: TraceRecorder) -> ResultMessage:
    """Run the CLI to its result; an error result raises a classified `TaskError`."""
    result: ResultMessage | None = None
    # aclosing: when a timeout cancels us mid-stream, the SDK's generator is closed
    # here, which terminates the CLI process instead of leaving it to the reaper.
    stream = cast(AsyncGenerator[Message, None], query(prompt=prompt, options=opts))
    async with aclosing(stream) as messages:
        async for message in messages:
            recorder.observe(message)
            if isinstance(message, ResultMessage):
                result = message
                if result.is_error:
                    # The SDK would raise a vaguer ResultError once the CLI exits.
                    break
    if result is None:
        raise TaskError("server", "the CLI ended without a result", retryable=True)
    if result.is_error:
        # A StructuredOutput call the CLI accepted would have ended the run with a result:
        # calls made before an error result are outputs it refused (they broke the schema).
        refused = recorder.calls_named(STRUCTURED_OUTPUT_TOOL)
        raise classify_result(
            result, recorder.last_assistant_error, refused_outputs=refused
        ).to_exception()
    return result
