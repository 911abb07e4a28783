"""The agent kind's algorithm: render → retried CLI runs → validate → leave files behind.

Whatever happens, the trace, usage and summary files are written: a failed task is
where an operator most needs to see what the model did.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, cast

import anyio
from claude_agent_sdk import ResultMessage, SessionStore
from jsonschema import Draft202012Validator

from agentq.conversation import RESUME_PROMPT
from agentq.errors import TaskError
from agentq.taxonomy import ErrorInfo, classify_exception, info
from worker.kinds import ChildContext
from worker.kinds.agent import session
from worker.kinds.agent.checkpoint import ResumePlan, plan_resume
from worker.kinds.agent.errors import classify_sdk_exception
from worker.kinds.agent.prompt import follow_up_prompt
from worker.kinds.agent.retry import Failure, RetryPolicy, with_retry
from worker.kinds.agent.spec import AgentSpec
from worker.kinds.agent.summary import CliLog, SummaryLog, describe_tools, describe_totals
from worker.kinds.agent.trace import TraceRecorder, cache_efficiency_pct

RESULT_NAME = "task-result.json"
TRACE_NAME = "session_trace.json"
MAX_SCHEMA_ERRORS = 3


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, default=str))
    os.replace(partial, path)


def validate_output(output: Any, schema: dict[str, Any]) -> None:
    """Structured output that breaks the schema is a parse failure, never a success."""
    if output is None:
        raise info("parse", "the model returned no structured output").to_exception()
    errors = sorted(Draft202012Validator(schema).iter_errors(output), key=lambda e: e.path)
    if errors:
        shown = "; ".join(
            f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in errors[:MAX_SCHEMA_ERRORS]
        )
        more = (
            f" (+{len(errors) - MAX_SCHEMA_ERRORS} more)" if len(errors) > MAX_SCHEMA_ERRORS else ""
        )
        # info() sanitizes: the offending values may be secrets echoed from the input.
        raise info("parse", f"structured output violates the schema: {shown}{more}").to_exception()


class AgentRun:
    """One task attempt of the agent kind (the worker's attempt; it may try the CLI 3x)."""

    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.started_unix = time.time()
        self.recorder = TraceRecorder()
        self.log = SummaryLog(ctx.logs_dir / "summary.log")
        self.spec: AgentSpec | None = None
        self.outcome = "failed"
        self.error: ErrorInfo | None = None
        self.resume_record: dict[str, Any] | None = None
        self.plan: ResumePlan | None = None
        self._finished = False

    def run(self) -> Any:
        ctx = self.ctx
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self.log.line(
            f"agent task {ctx.request_id} (definition {ctx.definition.name}, tenant "
            f"{ctx.tenant}, attempt {ctx.attempt}{', job ' + ctx.job_id if ctx.job_id else ''})"
        )
        try:
            spec = self.spec = AgentSpec.from_settings(ctx.definition.settings, ctx.settings)
            if ctx.follow_up is None:
                prompt = spec.template.render(ctx.input)
            else:
                # The session it continues holds the definition's prompt already.
                prompt = follow_up_prompt(ctx.follow_up, ctx.input)
            self.log.line(
                f"model {spec.model}, max_turns {spec.max_turns}, tools "
                f"{', '.join(spec.allowed_tools) or 'none'}, permission {spec.permission_mode}, "
                f"step timeout {spec.step_timeout_s:g} s"
                + (f", budget ${spec.max_budget_usd:g}" if spec.max_budget_usd else "")
            )
            result = anyio.run(self._run, spec, prompt)
            output = result.structured_output
            validate_output(output, dict(spec.output_schema))
            if self.plan is not None:
                self.plan.store.flush()  # the final answer too: a continuation starts after it
            # The child runner writes artifacts/task-result.json from the return value.
            self.outcome = "completed"
            self.log.line(f"result: artifacts/{RESULT_NAME} (valid against the output schema)")
            return output
        except BaseException as exc:
            self.error = classify_exception(exc)
            self.log.line(f"failed: {self.error.category}: {self.error.message}")
            raise
        finally:
            self._finish()

    async def _run(self, spec: AgentSpec, prompt: str) -> ResultMessage:
        workspace = self.ctx.task_dir / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        cli_log = CliLog(self.ctx.logs_dir / "cli.log")
        plan = self._plan_resume(spec)
        # TranscriptStore has the two methods a store needs; the SDK probes for the rest.
        store = cast(SessionStore, plan.store) if plan else None
        resume = plan.restored.session_id if plan and plan.restored else None
        interrupted = not (plan and plan.continued)
        opts = session.options(spec, cwd=workspace, recorder=self.recorder, stderr=cli_log,
                               store=store, resume=resume, interrupted=interrupted)  # fmt: skip
        if resume is not None and interrupted:
            # The session carries the task's prompt already: a resumed run says only why.
            prompt = RESUME_PROMPT
        policy = RetryPolicy(
            attempts=spec.retry_attempts,
            base_s=spec.retry_backoff_s,
            cap_s=spec.retry_backoff_max_s,
            attempt_timeout_s=spec.step_timeout_s,
        )

        async def attempt(number: int) -> ResultMessage:
            run_prompt, run_opts = prompt, opts
            resumed = plan.store.rewind() if plan is not None and number > 1 else None
            if plan is not None and resumed is not None:
                # A throttled or failed model call costs the turn it was in, not the
                # conversation: the retry goes on from the last checkpointed turn.
                run_prompt = RESUME_PROMPT
                run_opts = session.options(spec, cwd=workspace, recorder=self.recorder,
                                           stderr=cli_log, store=store, resume=resumed)  # fmt: skip
                self.log.line(f"try {number} resumes the session from its checkpoint "
                              f"({plan.store.turns} turns)")  # fmt: skip
            self.recorder.start_attempt(number)
            result = await session.run_once(run_prompt, run_opts, self.recorder)
            self.recorder.end_attempt("success")
            return result

        try:
            return await with_retry(
                attempt,
                policy=policy,
                classify=lambda exc: classify_sdk_exception(
                    exc, self.recorder.last_assistant_error
                ),
                on_failure=self._on_failure,
            )
        finally:
            cli_log.close()

    def _plan_resume(self, spec: AgentSpec) -> ResumePlan | None:
        """None unless the definition opts in; else the checkpoint store of this attempt
        and the earlier attempt's session it resumes, if one could be read."""
        continuing = self.ctx.follow_up is not None
        if not spec.resume and not continuing:
            return None
        offered = self.ctx.resume or {}
        if offered.get("off"):
            # The tenant stores no transcripts: no checkpoint is kept, not even here.
            self.resume_record = {"status": "off", "reason": str(offered["off"])[:300]}
            self.log.line(f"no checkpoint: {offered['off']}")
            return None
        if continuing and "unreadable" in offered:
            # Not a fresh start: the follow-up needs the conversation it follows.
            raise TaskError("server", f"cannot continue yet: {offered['unreadable']}",
                            retryable=True)  # fmt: skip
        plan = self.plan = plan_resume(self.ctx.task_dir, self.ctx.resume)
        self.resume_record = plan.record
        record = plan.record or {}
        if plan.continued:
            self.log.line(f"continuing the session of task {record['from_task']} "
                          f"({record['turns']} turns) with the follow-up")  # fmt: skip
        elif plan.restored is not None:
            self.log.line(f"resuming the session of attempt {record['from_attempt']} from its "
                          f"checkpoint ({plan.restored.turns} turns)")  # fmt: skip
        elif record:
            self.log.line(f"starting afresh: {record['reason']}")
        return plan

    def _on_failure(self, failure: Failure) -> None:
        error = failure.error
        self.recorder.end_attempt(error.category, error.to_record())
        then = (
            f"retrying in {failure.retry_in_s:.1f} s"
            if failure.retry_in_s is not None
            else ("giving up" if error.retryable else "not retryable")
        )
        self.log.line(f"attempt {failure.attempt}: {error.category}: {error.message} ({then})")

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        # The worker's timeout (or drain) stops us with SIGTERM, then SIGKILL after a
        # grace period: leave the trace and summary of a stalled run for the operator,
        # then die of the signal as if no handler were installed.
        self.outcome = "stopped"
        self.error = info("timeout", "stopped by the worker (SIGTERM) before a result")
        self.log.line(f"failed: {self.error.category}: {self.error.message}")
        self._finish()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        ctx, spec = self.ctx, self.spec
        totals = self.recorder.totals()
        trace = self.recorder.to_dict(
            request_id=ctx.request_id,
            tenant=ctx.tenant,
            job_id=ctx.job_id,
            task_attempt=ctx.attempt,
            definition=ctx.definition.name,
            model=spec.model if spec else None,
            outcome=self.outcome,
            error=self.error.to_record() if self.error else None,
            started_unix=self.started_unix,
        )
        if self.resume_record is not None:
            # Read back by the worker into the attempt's events (worker/child/files.py).
            totals["resume"] = trace["resume"] = self.resume_record
        try:
            write_json(ctx.traces_dir / "session_trace.json", trace)
            write_json(ctx.usage_file, totals)
            if self.recorder.attempts:
                for line in describe_totals(totals, cache_efficiency_pct(totals["usage"])):
                    self.log.line(line)
                self.log.line(describe_tools(trace["tool_summary"]))
                todos = trace["todos"]
                if todos:
                    done = sum(t["state"] == "completed" for t in todos)
                    self.log.line(f"todos: {len(todos)}, {done} completed")
            self.log.line(f"outcome: {self.outcome}")
        finally:
            self.log.close()
