"""The infrastructure review's findings, each asserted on the synthesized templates:
alarms that can fire, stage-scoped metrics, a health check, placeholder secrets that
never block a redeploy, a DLQ on the Task Requested target, producer and operator
policies."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match
from infra_synth import SynthesizedStage, synthesized

from agentq.config import env_name
from agentq.resources import RULES, SECRET_PLACEHOLDER, TASK_REQUESTED_RULE
from infra.stacks.monitoring import DEAD_LETTER_OUTCOMES
from infra.stacks.worker import LIVENESS_FILE

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["dev", "prod"])
def stage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> SynthesizedStage:
    return synthesized(request.param, tmp_path_factory)


def _alarms(stage: SynthesizedStage) -> dict[str, dict[str, Any]]:
    return {
        alarm["Properties"]["AlarmName"].removeprefix(stage.settings.names.prefix + "-"): alarm[
            "Properties"
        ]
        for alarm in stage.resources("monitoring", "AWS::CloudWatch::Alarm").values()
    }


def _metrics_of(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    """Every metric an alarm reads: its own, or each of its metric-math inputs."""
    if "MetricName" in alarm:
        return [{"Namespace": alarm["Namespace"], "MetricName": alarm["MetricName"],
                 "Dimensions": alarm.get("Dimensions", [])}]  # fmt: skip
    return [q["MetricStat"]["Metric"] for q in alarm.get("Metrics", []) if "MetricStat" in q]


def test_infra_every_agentq_metric_an_alarm_reads_is_its_stages(stage: SynthesizedStage) -> None:
    name = stage.settings.name
    agentq_metrics = [
        metric
        for alarm in _alarms(stage).values()
        for metric in _metrics_of(alarm)
        if metric["Namespace"] == "agentq"
    ]
    assert len(agentq_metrics) >= 2 + len(DEAD_LETTER_OUTCOMES)
    for metric in agentq_metrics:
        assert {"Name": "stage", "Value": name} in metric["Dimensions"], metric
    (dashboard,) = stage.resources("monitoring", "AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    body = "".join(part for part in parts if isinstance(part, str))
    for metric_name in ("TasksStarted", "TaskDuration", "SlotsBusy", "DeadLetters_failed"):
        assert re.search(rf'"{metric_name}","service","[a-z-]+","stage","{name}"', body), (
            metric_name
        )


def test_infra_dead_lettered_tasks_alarm_reads_what_the_dlq_processor_counts(
    stage: SynthesizedStage,
) -> None:
    alarm = _alarms(stage)["dead-lettered-tasks"]
    names = {m["MetricName"] for m in _metrics_of(alarm)}
    assert names == {f"DeadLetters_{outcome}" for outcome in DEAD_LETTER_OUTCOMES}
    assert {"failed", "malformed"} <= set(DEAD_LETTER_OUTCOMES)
    assert "lease-live" not in DEAD_LETTER_OUTCOMES  # comes back until its holder ends
    assert "returned" not in DEAD_LETTER_OUTCOMES  # back on the task queue: the task goes on
    for metric in _metrics_of(alarm):
        assert {"Name": "service", "Value": "agentq-dlq-processor"} in metric["Dimensions"]
    (expression,) = [q["Expression"] for q in alarm["Metrics"] if "Expression" in q]
    assert expression.count("FILL(") == len(DEAD_LETTER_OUTCOMES)


def test_infra_alarms_for_throttles_rules_workers_and_the_api(stage: SynthesizedStage) -> None:
    settings = stage.settings
    alarms = _alarms(stage)
    # Every function with an errors alarm has a throttles alarm too.
    errors = {a["AlarmName"].removesuffix("-errors") for a in alarms.values()
              if a.get("MetricName") == "Errors"}  # fmt: skip
    throttles = {a["AlarmName"].removesuffix("-throttles") for a in alarms.values()
                 if a.get("MetricName") == "Throttles"}  # fmt: skip
    assert errors == throttles and len(errors) >= 5
    for rule in RULES:
        failed = alarms[f"{rule.name}-rule-failed-invocations"]
        assert failed["Namespace"] == "AWS/Events"
        assert failed["MetricName"] == "FailedInvocations"
        # Rules on a custom bus report with the bus as a dimension too.
        assert {"Name": "EventBusName", "Value": settings.names.event_bus} in failed["Dimensions"]
        assert {"Name": "RuleName", "Value": f"{settings.names.prefix}-{rule.name}"} in failed[
            "Dimensions"
        ]
    schedule = alarms["health-check-schedule-rule-failed-invocations"]
    assert [d["Name"] for d in schedule["Dimensions"]] == ["RuleName"]  # the default bus
    below = alarms["workers-below-desired"]
    assert below["EvaluationPeriods"] == settings.alarms.below_desired_periods
    assert {m["MetricName"] for m in _metrics_of(below)} == {"DesiredTaskCount", "RunningTaskCount"}
    api = alarms["producer-api-5xx"]
    assert (api["Namespace"], api["MetricName"]) == ("AWS/ApiGateway", "5XXError")
    undelivered = alarms["task-requested-undelivered"]
    assert undelivered["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert "TaskRequestedDeadLetters" in json.dumps(undelivered["Dimensions"])
    for alarm in alarms.values():
        assert alarm["AlarmActions"], alarm["AlarmName"]


def test_infra_task_requested_target_keeps_what_it_cannot_deliver(stage: SynthesizedStage) -> None:
    template = stage.templates["infrastructure"]
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "Name": f"{stage.settings.names.prefix}-{TASK_REQUESTED_RULE.name}",
            "Targets": [
                Match.object_like(
                    {
                        "Arn": {"Fn::GetAtt": [Match.string_like_regexp("TaskQueue"), "Arn"]},
                        "DeadLetterConfig": {
                            "Arn": {
                                "Fn::GetAtt": [
                                    Match.string_like_regexp("TaskRequestedDeadLetters"),
                                    "Arn",
                                ]
                            }
                        },
                        "RetryPolicy": Match.object_like({"MaximumRetryAttempts": 185}),
                    }
                )
            ],
        },
    )
    # EventBridge may send to the rule's DLQ (its queue policy says so).
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": "sqs:SendMessage",
                                "Principal": {"Service": "events.amazonaws.com"},
                            }
                        )
                    ]
                )
            },
            "Queues": [{"Ref": Match.string_like_regexp("TaskRequestedDeadLetters")}],
        },
    )


def test_infra_secrets_start_as_the_placeholder_and_have_no_fixed_name(
    stage: SynthesizedStage,
) -> None:
    secrets = stage.all_resources("AWS::SecretsManager::Secret")
    assert len(secrets) == 2  # the Anthropic key, the Slack token
    for _, secret in secrets:
        properties = secret["Properties"]
        assert properties["SecretString"] == SECRET_PLACEHOLDER
        assert "GenerateSecretString" not in properties
        # A fixed name would block a redeploy for the 30 days a deleted secret waits.
        assert "Name" not in properties
        removal = "Retain" if stage.settings.is_production else "Delete"
        assert secret["DeletionPolicy"] == removal
    stage.templates["secrets"].has_output(
        "ClaudeApiKeySecretArn", {"Value": {"Ref": Match.any_value()}}
    )
    stage.templates["health-check"].has_output("SlackTokenSecretArn", Match.any_value())


def test_infra_worker_health_check_reads_the_heartbeats_liveness_file(
    stage: SynthesizedStage,
) -> None:
    (definition,) = stage.resources("worker", "AWS::ECS::TaskDefinition").values()
    (container,) = definition["Properties"]["ContainerDefinitions"]
    check = container["HealthCheck"]
    assert check["Command"] == ["CMD", "python", "-m", "worker.liveness"]
    assert check["StartPeriod"] >= 60 and check["Retries"] >= 2
    variables = {v["Name"]: v["Value"] for v in container["Environment"]}
    assert variables[env_name("liveness_file")] == LIVENESS_FILE
    # The image's own HEALTHCHECK runs the same check against the same file.
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"LIVENESS_FILE={LIVENESS_FILE}" in dockerfile
    assert re.search(r'HEALTHCHECK .*\n\s*CMD \["python", "-m", "worker.liveness"\]', dockerfile)
    # The image is built for the platform the task definition runs on.
    assert definition["Properties"]["RuntimePlatform"] == {
        "CpuArchitecture": "X86_64",
        "OperatingSystemFamily": "LINUX",
    }


def _managed_policy(stage: SynthesizedStage, construct_id: str) -> dict[str, Any]:
    infrastructure = stage.stacks.infrastructure
    construct = infrastructure.node.find_child(construct_id).node.default_child
    logical_id = infrastructure.get_logical_id(construct)  # type: ignore[arg-type]
    return dict(stage.resources("infrastructure", "AWS::IAM::ManagedPolicy")[logical_id])


def test_infra_producer_policy_grants_what_a_client_does_and_nothing_else(
    stage: SynthesizedStage,
) -> None:
    policy = _managed_policy(stage, "ProducerPolicy")
    by_action: dict[str, str] = {}
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        for action in actions:
            by_action[action] = by_action.get(action, "") + json.dumps(statement["Resource"])
    assert "TaskQueue" in by_action["sqs:SendMessage"]
    assert not {a for a in by_action if a.startswith("sqs:") and a != "sqs:SendMessage"}
    assert "/task/*" in by_action["s3:GetObject"]
    assert "/events/overflow/*" in by_action["s3:PutObject"]
    assert "dynamodb:DeleteItem" not in by_action and "dynamodb:Scan" not in by_action
    # Writes reach a task's and a job's items only: a tenant's limit and seats and a
    # principal's tenant mapping are the operator's and the worker's.
    writes = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
              if {"dynamodb:PutItem", "dynamodb:UpdateItem"} & set(_listed(s["Action"]))]  # fmt: skip
    assert [s.get("Sid") for s in writes] == ["WriteTasksAndJobs"]
    assert writes[0]["Condition"] == PRODUCER_WRITES
    # No producer transaction checks an item on its own.
    assert "dynamodb:ConditionCheckItem" not in by_action
    # Listing (agentq logs / trace, AgentqClient.artifacts) only under the task prefix.
    (listing,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                  if s["Action"] == "s3:ListBucket"]  # fmt: skip
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["task/*"]}}
    assert "/" not in json.dumps(listing["Resource"])  # the bucket, not its objects
    stage.templates["infrastructure"].has_output("ProducerPolicyArn", Match.any_value())


def test_infra_operator_policy_is_the_producers_and_scoped_operator_rights(
    stage: SynthesizedStage,
) -> None:
    producer = _managed_policy(stage, "ProducerPolicy")["Properties"]["PolicyDocument"]
    operator = _managed_policy(stage, "OperatorPolicy")["Properties"]["PolicyDocument"]
    statements = operator["Statement"]
    # A producer's rights first, as the producer has them (not a copy that could drift).
    assert statements[: len(producer["Statement"])] == producer["Statement"]
    own = {s["Sid"]: s for s in statements[len(producer["Statement"]) :]}
    archive = json.dumps(own["ReadDeadLetterArchive"]["Resource"])
    assert "/dlq/archive/*" in archive
    for sid in ("MarkDeadLettersRedriven", "DiscardDeadLetters"):
        assert json.dumps(own[sid]["Resource"]) == archive, sid
    assert own["ListDeadLetterArchive"]["Condition"] == {
        "StringLike": {"s3:prefix": ["dlq/archive/*"]}
    }
    # Only the DLQ is received from; no queue is purged, deleted from or changed.
    assert own["PeekDeadLetterQueue"]["Action"] == "sqs:ReceiveMessage"
    assert "DeadLetterQueue" in json.dumps(own["PeekDeadLetterQueue"]["Resource"])
    # Puts and deletes reach tenant settings and principal mappings only, never a task's
    # items (and the producer's own writes do not reach them).
    for sid, action in (("SetTenantSettings", "PutItem"), ("RemoveTenantSettings", "DeleteItem")):
        assert own[sid]["Action"] == f"dynamodb:{action}"
        assert own[sid]["Condition"] == {
            "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TENANT#*", "PRINCIPAL#*"]}
        }
    # "*" only where AWS offers no resource-level permission.
    for sid, statement in own.items():
        if statement["Resource"] == "*":
            assert sid == "ReadQueueAgeMetrics", sid
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str)
                                               else s["Action"])}  # fmt: skip
    assert not {a for a in actions if a.endswith(("*", "PurgeQueue", "Scan", "DeleteMessage"))}
    stage.templates["infrastructure"].has_output("OperatorPolicyArn", Match.any_value())


def _role_actions(stage: SynthesizedStage, stack: str, role: Any) -> dict[str, list[Any]]:
    """Action -> the Resource of every statement granting it to the role."""
    owner = getattr(stage.stacks, stack)
    role_id = owner.get_logical_id(role.node.default_child)
    template = owner.stack_name.removeprefix(f"{stage.settings.names.prefix}-")
    found: dict[str, list[Any]] = {}
    for policy in stage.resources(template, "AWS::IAM::Policy").values():
        if {"Ref": role_id} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"]
            for action in actions if isinstance(actions, list) else [actions]:
                found.setdefault(action, []).append(statement["Resource"])
    return found


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


PRODUCER_WRITES = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TASK#*", "JOB#*"]}}


def _write_conditions(stage: SynthesizedStage, stack: str, role: Any) -> list[Any]:
    """The Condition of every statement granting the role a PutItem or UpdateItem."""
    owner = getattr(stage.stacks, stack)
    role_id = owner.get_logical_id(role.node.default_child)
    template = owner.stack_name.removeprefix(f"{stage.settings.names.prefix}-")
    return [
        statement.get("Condition")
        for policy in stage.resources(template, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if {"dynamodb:PutItem", "dynamodb:UpdateItem"} & set(_listed(statement["Action"]))
    ]


def test_infra_clients_write_tasks_and_jobs_while_the_worker_keeps_its_seats(
    stage: SynthesizedStage,
) -> None:
    stacks = stage.stacks
    # The dispatcher and the producer API are clients: the producer's scoped writes
    # (the producer API's definitions writes are on the definitions table).
    assert _write_conditions(stage, "dispatcher", stacks.dispatcher.handler.role) == [
        PRODUCER_WRITES
    ]
    api = _write_conditions(stage, "producer_api", stacks.producer_api.handler.role)
    assert PRODUCER_WRITES in api and api.count(None) == 1  # PutItem on definitions
    # The worker's lock transaction takes seats under TENANT#: its writes stay unscoped.
    assert _write_conditions(stage, "worker", stacks.worker.task_role) == [None]


def test_infra_roles_hold_no_grant_nothing_uses(stage: SynthesizedStage) -> None:
    stacks = stage.stacks
    save_event = _role_actions(stage, "events", stacks.events.save_event.role)
    assert not [a for a in save_event if a.startswith("s3:")]  # it stores the pointer as is
    health = _role_actions(stage, "health_check", stacks.health_check.handler.role)
    assert "secretsmanager:GetSecretValue" in health
    assert "secretsmanager:DescribeSecret" not in health
    worker = _role_actions(stage, "worker", stacks.worker.task_role)
    assert len(worker["sqs:SendMessage"]) == 1  # one statement, every tier's queue
    # The start-up checks are granted, each on the stage's own resource only.
    for action in ("events:DescribeEventBus", "s3:GetBucketLocation"):
        (resources,) = worker[action]
        assert "*" not in json.dumps(resources), (action, resources)


def test_infra_workers_run_on_spot_where_the_stage_says(stage: SynthesizedStage) -> None:
    worker = stage.settings.worker
    (service,) = stage.resources("worker", "AWS::ECS::Service").values()
    strategy = {s["CapacityProvider"]: s for s in service["Properties"]["CapacityProviderStrategy"]}
    assert strategy["FARGATE"]["Weight"] == 1
    assert strategy["FARGATE"].get("Base", 0) == worker.on_demand_base
    if worker.spot_weight:
        assert strategy["FARGATE_SPOT"]["Weight"] == worker.spot_weight
    else:
        assert "FARGATE_SPOT" not in strategy
    assert "LaunchType" not in service["Properties"]  # a strategy and a launch type exclude
    stage.templates["worker"].has_resource_properties(
        "AWS::ECS::ClusterCapacityProviderAssociations",
        {"CapacityProviders": Match.array_with(["FARGATE", "FARGATE_SPOT"])},
    )
    # Spot's interruption warning is a SIGTERM two minutes ahead: the drain fits inside.
    assert worker.drain_timeout_s < worker.stop_timeout_s <= 120


def test_infra_stage_settings_refuse_a_negative_spot_weight() -> None:
    from infra.stages import StageError, WorkerSettings

    with pytest.raises(StageError, match="spot_weight"):
        WorkerSettings(spot_weight=-1).check()


def test_infra_dlq_processor_may_create_the_state_item_a_producer_never_wrote(
    stage: SynthesizedStage,
) -> None:
    processor = stage.stacks.events.dlq_processor.role
    role_id = stage.stacks.events.get_logical_id(processor.node.default_child)  # type: ignore[arg-type]
    actions = {
        action
        for policy in stage.resources("events", "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        for action in (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
    }
    assert {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"} <= actions
    assert "dynamodb:DeleteItem" not in actions and "dynamodb:Query" not in actions


def test_infra_dlq_processor_may_send_back_to_the_task_queue_only(
    stage: SynthesizedStage,
) -> None:
    """A dead letter whose task has attempts left is returned to the task queue."""
    processor = stage.stacks.events.dlq_processor
    role_id = stage.stacks.events.get_logical_id(processor.role.node.default_child)  # type: ignore[arg-type]
    sends = [
        statement["Resource"]
        for policy in stage.resources("events", "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if "sqs:SendMessage" in json.dumps(statement["Action"])
    ]
    assert len(sends) == 1
    assert "TaskQueue" in json.dumps(sends[0]) and "DeadLetter" not in json.dumps(sends[0])
    function_id = stage.stacks.events.get_logical_id(processor.function.node.default_child)  # type: ignore[arg-type]
    environment = stage.resources("events", "AWS::Lambda::Function")[function_id]["Properties"][
        "Environment"
    ]["Variables"]
    assert env_name("queue_url") in environment
