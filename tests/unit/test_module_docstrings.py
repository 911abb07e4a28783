"""Module docstrings stay short: what the module owns, in a few lines.

The long form (design, fault stories, measurements) belongs in docs/, history in git.
`LONGER_TODAY` lists the modules over the limit when the rule came in, with their
length then: it may only shrink. Trim a module and drop its entry; move or rename one
and rename its entry.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentq", "worker", "lambdas", "infra", "bench", "tools")
MAX_LINES = 12

# Over MAX_LINES when the rule came in (path: lines then). Never add to it.
LONGER_TODAY: dict[str, int] = {
    "agentq/config/settings.py": 15,
    "agentq/definitions/registry.py": 17,
    "agentq/definitions/bundle.py": 13,
    "agentq/envelope.py": 20,
    "agentq/health.py": 20,
    "agentq/local/claude_env.py": 20,
    "agentq/local/ecs_agent.py": 13,
    "agentq/local/iam.py": 23,
    "agentq/local/iam_policy.py": 18,
    "agentq/local/lambda_host.py": 18,
    "agentq/local/model_server/__init__.py": 80,
    "agentq/local/model_server/pattern.py": 16,
    "agentq/local/moto_dynamodb.py": 24,
    "agentq/local/moto_expressions.py": 28,
    "agentq/local/moto_iam.py": 27,
    "agentq/local/moto_process.py": 15,
    "agentq/local/moto_server.py": 25,
    "agentq/local/rules/dynamodb_idempotency.py": 17,
    "agentq/local/rules/dynamodb_index_lag.py": 13,
    "agentq/local/rules/dynamodb_transaction_conflict.py": 15,
    "agentq/local/rules/eventbridge_sqs_groups.py": 16,
    "agentq/local/rules/fair_queues.py": 21,
    "agentq/local/rules/s3_missing_key.py": 15,
    "agentq/local/rules/sqs_visibility_cap.py": 14,
    "agentq/principals.py": 15,
    "agentq/states.py": 13,
    "agentq/stats.py": 24,
    "agentq/taxonomy.py": 13,
    "worker/sqs/batcher.py": 15,
    "worker/child/runner.py": 17,
    "worker/receive/consumer.py": 14,
    "worker/child/forkserver.py": 23,
    "worker/heartbeat.py": 17,
    "worker/receive/placement.py": 38,
    "worker/child/isolation.py": 14,
    "worker/kinds/agent/__init__.py": 21,
    "worker/kinds/agent/retry.py": 13,
    "worker/child/leasefile.py": 19,
    "worker/child/leasetimer.py": 19,
    "worker/receive/tenant_gate.py": 15,
    "worker/settle/outcome.py": 14,
    "worker/protection.py": 16,
    "worker/receive/receivers.py": 16,
    "worker/scheduler.py": 35,
    "worker/parking.py": 33,
    "worker/settle/settler.py": 15,
    "worker/child/spares.py": 29,
    "worker/child/supervisor.py": 13,
    "worker/telemetry.py": 13,
    "worker/receive/tiers.py": 20,
    "lambdas/_common.py": 18,
    "lambdas/definitions_loader.py": 21,
    "lambdas/dlq_processor.py": 17,
    "lambdas/producer_api.py": 26,
    "bench/bench_agent.py": 18,
    "bench/chaos.py": 23,
    "bench/chaos_closeout.py": 15,
    "bench/chaos_drains.py": 20,
    "bench/chaos_faults.py": 17,
    "bench/chaos_killer.py": 20,
    "bench/priority.py": 22,
    "bench/requests_per_task.py": 21,
    "bench/tenants.py": 15,
}


def docstring_lines() -> dict[str, int]:
    """Every module of the packages: its docstring's length in lines (0 without one)."""
    lengths = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            docstring = ast.get_docstring(tree) or ""
            lengths[path.relative_to(ROOT).as_posix()] = len(docstring.splitlines())
    return lengths


def test_module_docstrings_stay_within_the_limit() -> None:
    too_long = {
        path: lines
        for path, lines in docstring_lines().items()
        if lines > MAX_LINES and path not in LONGER_TODAY
    }
    assert not too_long, (
        f"module docstrings over {MAX_LINES} lines (say what the module owns; the long "
        f"form goes to docs/): {too_long}"
    )


def test_the_exceptions_only_shrink() -> None:
    lengths = docstring_lines()
    gone = sorted(path for path in LONGER_TODAY if path not in lengths)
    assert not gone, f"listed in LONGER_TODAY but no longer there (moved? rename it): {gone}"
    within = sorted(path for path in LONGER_TODAY if lengths[path] <= MAX_LINES)
    assert not within, f"now within {MAX_LINES} lines: drop them from LONGER_TODAY: {within}"
    grown = {p: lengths[p] for p, then in LONGER_TODAY.items() if lengths[p] > then}
    assert not grown, f"longer than when the rule came in: {grown}"
