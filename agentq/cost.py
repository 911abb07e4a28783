"""What a month of agentq costs: AWS per task, each stage's fixed cost, and the model.

Pure arithmetic over list prices (`PRICES`, with the date they were read) and request
counts per task. The worker's counts are the ones `bench/requests_per_task.py`
measures (docs/benchmarks.md); the producer's and the Lambdas' follow from the code
(one STATE write, one event and one message per submit; one save-event invocation and
one item per event). docs/cost.md explains every line; `agentq cost estimate` prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

PRICES_AS_OF: Final = "2025-11"
PRICE_REGION: Final = "us-east-1"

# USD list prices, on-demand, no free tier.
PRICES: Final[dict[str, float]] = {
    "sqs_per_million": 0.40,  # standard queue requests (64 KB chunks)
    "dynamodb_write_per_million": 0.625,  # on-demand write request units
    "dynamodb_read_per_million": 0.125,  # on-demand read request units
    "eventbridge_per_million": 1.00,  # custom events published
    "lambda_request_per_million": 0.20,
    "lambda_gb_second": 0.0000166667,  # x86
    "s3_put_per_thousand": 0.005,  # PUT, COPY, POST, LIST
    "stepfunctions_transition_per_thousand": 0.025,  # Standard workflows
    "fargate_vcpu_hour": 0.04048,
    "fargate_gb_hour": 0.004445,
    "nat_gateway_hour": 0.045,
    "nat_gateway_gb": 0.045,
    "kms_key_month": 1.00,
    "secret_month": 0.40,
    "dashboard_month": 3.00,
    "alarm_month": 0.10,
    "logs_ingest_gb": 0.50,
}

# Claude list prices, USD per million tokens (input, output).
MODEL_PRICES: Final[dict[str, tuple[float, float]]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
}

HOURS_PER_MONTH: Final = 730.0
HEARTBEAT_INTERVAL_S: Final = 20.0
# Measured (docs/benchmarks.md, "requests per task"): the worker's own requests per task
# without S3, and per task per heartbeat interval with 10 tasks in flight.
WORKER_REQUESTS_PER_TASK: Final = 2.52
WORKER_REQUESTS_PER_HEARTBEAT: Final = 0.231
LAMBDA_GB: Final = 0.5  # the stages' Lambda memory (512 MiB)
LAMBDA_SECONDS: Final = 0.05  # a warm save-event invocation


@dataclass(frozen=True)
class StageCost:
    """What one stage runs whether or not tasks arrive (infra/stages.py)."""

    nat_gateways: int
    always_on_workers: int
    worker_vcpu: float = 1.0
    worker_gb: float = 2.0
    slots: int = 3
    kms_keys: int = 1  # the alarm topic's key
    secrets: int = 2  # Anthropic key, Slack token
    dashboards: int = 1
    alarms: int = 9
    flow_log_gb: float = 1.0


STAGES: Final[dict[str, StageCost]] = {
    "dev": StageCost(nat_gateways=1, always_on_workers=0, slots=2),
    "prod": StageCost(nat_gateways=2, always_on_workers=1, slots=3),
}


@dataclass(frozen=True)
class Usage:
    """Requests per task by service, for tasks lasting `task_seconds`."""

    sqs: float
    dynamodb_writes: float
    dynamodb_reads: float
    events: float
    lambda_invocations: float
    s3_puts: float
    transitions: float = 0.0


def heartbeats(task_seconds: float) -> float:
    return math.floor(task_seconds / HEARTBEAT_INTERVAL_S)


def agentq_usage(task_seconds: float, *, agent: bool = True) -> Usage:
    """agentq as built. Per heartbeat: a tenth of a visibility batch, one lease renewal
    (a transaction: 2 write units) and one heartbeat event (delivered to save-event,
    which does not store it by default)."""
    beats = heartbeats(task_seconds)
    events = 3 + beats  # Pending, Started, Completed + heartbeats
    # The worker's measured requests: 2 are the lock and the finalize (DynamoDB), the
    # rest the batched receive/delete (SQS) and event batches (billed per event below).
    worker_sqs = WORKER_REQUESTS_PER_TASK - 2.0
    return Usage(
        sqs=1 + worker_sqs + 0.1 * beats,
        dynamodb_writes=1 + 2 + 3 + 2 * beats,  # submit; lock + finalize; 3 stored events
        dynamodb_reads=0.0,
        events=events,
        lambda_invocations=events,
        s3_puts=5 if agent else 2,  # result, logs, trace, usage (agent); result, log
    )


def seed_usage(task_seconds: float, *, agent: bool = True) -> Usage:
    """A hand-rolled SQS consumer, the design agentq started from (docs/benchmarks.md calls
    it the seed): per task receive, GSI query + conditional put
    for the lock, one PutEvents per event, one delete; per heartbeat one
    ChangeMessageVisibility and one PutEvents."""
    beats = heartbeats(task_seconds)
    events = 3 + beats
    return Usage(
        sqs=1 + 2 + beats,
        dynamodb_writes=1 + 2 + 3,
        dynamodb_reads=1.0,
        events=events,
        lambda_invocations=events,
        s3_puts=5 if agent else 2,
    )


def step_functions_usage(task_seconds: float, *, agent: bool = True) -> Usage:
    """The same steps as a Step Functions Standard workflow per task: start, lock, run
    (an activity the worker polls, heartbeating through SendTaskHeartbeat, not a
    transition), finalize, emit, succeed = 6 transitions; no SQS, no lease writes."""
    return Usage(
        sqs=0.0,
        dynamodb_writes=1 + 2 + 3,
        dynamodb_reads=0.0,
        events=3,
        lambda_invocations=3,
        s3_puts=5 if agent else 2,
        transitions=6,
    )


def aws_cost(usage: Usage, tasks: float) -> dict[str, float]:
    p = PRICES
    lambda_compute = usage.lambda_invocations * LAMBDA_GB * LAMBDA_SECONDS * p["lambda_gb_second"]
    per_task = {
        "SQS": usage.sqs * p["sqs_per_million"] / 1e6,
        "DynamoDB": (
            usage.dynamodb_writes * p["dynamodb_write_per_million"]
            + usage.dynamodb_reads * p["dynamodb_read_per_million"]
        )
        / 1e6,
        "EventBridge": usage.events * p["eventbridge_per_million"] / 1e6,
        "Lambda": usage.lambda_invocations * p["lambda_request_per_million"] / 1e6 + lambda_compute,
        "S3": usage.s3_puts * p["s3_put_per_thousand"] / 1e3,
        "Step Functions": usage.transitions * p["stepfunctions_transition_per_thousand"] / 1e3,
    }
    return {name: value * tasks for name, value in per_task.items() if value}


def worker_compute(tasks: float, task_seconds: float, stage: StageCost) -> float:
    """Fargate time to run the tasks beyond the always-on workers (slots share a task)."""
    hours = tasks * task_seconds / 3600 / stage.slots
    rate = (
        stage.worker_vcpu * PRICES["fargate_vcpu_hour"]
        + stage.worker_gb * PRICES["fargate_gb_hour"]
    )
    return hours * rate


def fixed_monthly(stage: StageCost) -> dict[str, float]:
    p = PRICES
    worker_rate = (
        stage.worker_vcpu * p["fargate_vcpu_hour"] + stage.worker_gb * p["fargate_gb_hour"]
    )
    return {
        "NAT gateways": stage.nat_gateways * p["nat_gateway_hour"] * HOURS_PER_MONTH,
        "always-on workers": stage.always_on_workers * worker_rate * HOURS_PER_MONTH,
        "KMS keys": stage.kms_keys * p["kms_key_month"],
        "Secrets Manager": stage.secrets * p["secret_month"],
        "dashboard": stage.dashboards * p["dashboard_month"],
        "alarms": stage.alarms * p["alarm_month"],
        "VPC flow logs": stage.flow_log_gb * p["logs_ingest_gb"],
    }


def model_cost(model: str, tasks: float, input_tokens: float, output_tokens: float) -> float:
    price_in, price_out = MODEL_PRICES[model]
    return tasks * (input_tokens * price_in + output_tokens * price_out) / 1e6


@dataclass
class Estimate:
    tasks: float
    task_seconds: float
    stage: str
    model: str
    aws_per_task_design: dict[str, dict[str, float]] = field(default_factory=dict)
    compute: float = 0.0
    fixed: dict[str, float] = field(default_factory=dict)
    model_usd: float = 0.0

    @property
    def total(self) -> float:
        return (sum(self.aws_per_task_design["agentq"].values()) + self.compute
                + sum(self.fixed.values()) + self.model_usd)  # fmt: skip


def estimate(
    *,
    tasks: float,
    task_seconds: float,
    stage: str,
    model: str,
    input_tokens: float,
    output_tokens: float,
    agent: bool = True,
) -> Estimate:
    cost = STAGES[stage]
    designs = {
        "agentq": agentq_usage(task_seconds, agent=agent),
        "a hand-rolled SQS consumer": seed_usage(task_seconds, agent=agent),
        "Step Functions Standard": step_functions_usage(task_seconds, agent=agent),
    }
    return Estimate(
        tasks=tasks,
        task_seconds=task_seconds,
        stage=stage,
        model=model,
        aws_per_task_design={name: aws_cost(u, tasks) for name, u in designs.items()},
        compute=worker_compute(tasks, task_seconds, cost),
        fixed=fixed_monthly(cost),
        model_usd=model_cost(model, tasks, input_tokens, output_tokens) if agent else 0.0,
    )
