"""Local AWS: moto's servers (agentq.local.moto_process), provisioned like a deployed stage.

Every resource comes from `agentq.resources`, the same definitions `infra/` deploys:
queue + DLQ (redrive after `max_receive_count`), the events table with its indexes,
the task-definitions table, the stage's bus with its rules, the artifacts bucket.
moto delivers EventBridge events to SQS targets but runs no Lambda code, so each rule
whose target is a Lambda delivers to a queue that the local Lambda host polls.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from agentq.aws import make_client, new_session
from agentq.local.moto_process import LOCAL_CREDENTIALS, LOCAL_REGION, MotoServer, free_port
from agentq.resources import (
    DEFAULT_TIER,
    DEFINITIONS_TABLE,
    EVENTS_TABLE,
    RULES,
    TASK_QUEUE,
    ResourceNames,
    TableSpec,
)

__all__ = [
    "LOCAL_CREDENTIALS",
    "LOCAL_REGION",
    "LocalResources",
    "MotoServer",
    "free_port",
    "local_session_clients",
    "provision",
    "provision_on",
    "table_definition",
]


@dataclass(frozen=True, kw_only=True)
class LocalResources:
    """What `provision` created, and the environment that points a process at it."""

    endpoint_url: str | None
    names: ResourceNames
    queue_url: str
    queue_arn: str
    dlq_url: str
    dlq_arn: str
    table_name: str
    definitions_table: str
    bus_name: str
    bucket: str
    target_queues: dict[str, str] = field(default_factory=dict)  # rule name → queue URL
    tier_queues: dict[str, str] = field(default_factory=dict)  # priority tier → queue URL
    # DynamoDB's own server (agentq.local.moto_process); None: `endpoint_url` serves it.
    dynamodb_endpoint_url: str | None = None

    def endpoint_for(self, service: str) -> str | None:
        """The endpoint a client of `service` uses."""
        if service == "dynamodb" and self.dynamodb_endpoint_url:
            return self.dynamodb_endpoint_url
        return self.endpoint_url

    def env(self) -> dict[str, str]:
        env = {
            **LOCAL_CREDENTIALS,
            "AWS_REGION": LOCAL_REGION,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AGENTQ_LOCAL": "1",
            "AGENTQ_STAGE": self.names.stage,
            "APP_NAME": self.names.app_name,
            "SQS_QUEUE_URL": self.queue_url,
            "SQS_DLQ_URL": self.dlq_url,
            "DYNAMODB_EVENTS_TABLE_NAME": self.table_name,
            "TASK_DEFINITIONS_TABLE": self.definitions_table,
            "EVENTBRIDGE_BUS_NAME": self.bus_name,
            "S3_BUCKET": self.bucket,
        }
        if self.tier_queues:
            env["SQS_QUEUE_URLS"] = ",".join(f"{t}={u}" for t, u in self.tier_queues.items())
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.dynamodb_endpoint_url and self.dynamodb_endpoint_url != self.endpoint_url:
            # boto3 prefers a service's own variable to AWS_ENDPOINT_URL.
            env["AWS_ENDPOINT_URL_DYNAMODB"] = self.dynamodb_endpoint_url
        return env

    def to_json(self) -> str:
        return json.dumps(
            {
                "endpoint_url": self.endpoint_url,
                "dynamodb_endpoint_url": self.dynamodb_endpoint_url,
                "stage": self.names.stage,
                "app_name": self.names.app_name,
                "queue_url": self.queue_url,
                "queue_arn": self.queue_arn,
                "dlq_url": self.dlq_url,
                "dlq_arn": self.dlq_arn,
                "table_name": self.table_name,
                "definitions_table": self.definitions_table,
                "bus_name": self.bus_name,
                "bucket": self.bucket,
                "target_queues": self.target_queues,
                "tier_queues": self.tier_queues,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> LocalResources:
        data = json.loads(text)
        return cls(
            endpoint_url=data["endpoint_url"],
            names=ResourceNames(stage=data["stage"], app_name=data["app_name"]),
            queue_url=data["queue_url"],
            queue_arn=data["queue_arn"],
            dlq_url=data["dlq_url"],
            dlq_arn=data["dlq_arn"],
            table_name=data["table_name"],
            definitions_table=data["definitions_table"],
            bus_name=data["bus_name"],
            bucket=data["bucket"],
            target_queues=dict(data["target_queues"]),
            tier_queues=dict(data.get("tier_queues") or {}),
            dynamodb_endpoint_url=data.get("dynamodb_endpoint_url"),
        )


def local_session_clients(
    endpoint_url: str | None, *, dynamodb_url: str | None = None
) -> dict[str, Any]:
    """Clients of the services agentq uses, at the local endpoints (`dynamodb_url` for
    DynamoDB when it has a server of its own)."""
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    return {
        name: make_client(
            session,
            name,
            endpoint_url=(dynamodb_url or endpoint_url) if name == "dynamodb" else endpoint_url,
        )
        for name in ("sqs", "dynamodb", "events", "s3")
    }


def table_definition(name: str, spec: TableSpec) -> dict[str, Any]:
    """CreateTable arguments for a TableSpec (the CDK construct reads the same spec)."""
    key_schema = [{"AttributeName": spec.partition_key, "KeyType": "HASH"}]
    if spec.sort_key:
        key_schema.append({"AttributeName": spec.sort_key, "KeyType": "RANGE"})
    definition: dict[str, Any] = {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": key_schema,
        "AttributeDefinitions": [
            {"AttributeName": attr, "AttributeType": "S"} for attr in spec.key_attributes
        ],
    }
    if spec.indexes:
        definition["GlobalSecondaryIndexes"] = [
            {
                "IndexName": index.name,
                "KeySchema": [
                    {"AttributeName": index.partition_key, "KeyType": "HASH"},
                    {"AttributeName": index.sort_key, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
            for index in spec.indexes
        ]
    return definition


def provision(
    clients: dict[str, Any],
    names: ResourceNames,
    *,
    endpoint_url: str | None = None,
    dynamodb_url: str | None = None,
) -> LocalResources:
    """Create one stage's resources. Idempotent for queues and buckets."""
    sqs, ddb, events, s3 = clients["sqs"], clients["dynamodb"], clients["events"], clients["s3"]

    dlq_url = sqs.create_queue(
        QueueName=names.dead_letter_queue,
        Attributes={"MessageRetentionPeriod": str(TASK_QUEUE.dlq_retention_days * 86_400)},
    )["QueueUrl"]
    dlq_arn = _queue_arn(sqs, dlq_url)
    tier_queues = {
        tier: sqs.create_queue(
            QueueName=name,
            Attributes={
                "VisibilityTimeout": str(TASK_QUEUE.visibility_timeout_s),
                "ReceiveMessageWaitTimeSeconds": str(TASK_QUEUE.receive_wait_s),
                "MessageRetentionPeriod": str(TASK_QUEUE.retention_days * 86_400),
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": dlq_arn,
                     "maxReceiveCount": TASK_QUEUE.max_receive_count}
                ),
            },
        )["QueueUrl"]
        for tier, name in names.tier_queues().items()
    }  # fmt: skip
    queue_url = tier_queues[DEFAULT_TIER]
    queue_arn = _queue_arn(sqs, queue_url)

    for table_name, spec in (
        (names.events_table, EVENTS_TABLE),
        (names.definitions_table, DEFINITIONS_TABLE),
    ):
        with contextlib.suppress(ddb.exceptions.ResourceInUseException):
            ddb.create_table(**table_definition(table_name, spec))
        if spec.ttl_attribute:
            ddb.update_time_to_live(
                TableName=table_name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.ttl_attribute},
            )

    with contextlib.suppress(events.exceptions.ResourceAlreadyExistsException):
        events.create_event_bus(Name=names.event_bus)
    target_queues: dict[str, str] = {}
    for rule in RULES:
        if rule.target == "task-queue":
            target_arn = queue_arn
        else:
            url = sqs.create_queue(QueueName=names.rule_target_queue(rule))["QueueUrl"]
            target_queues[rule.name] = url
            target_arn = _queue_arn(sqs, url)
        events.put_rule(
            Name=f"{names.prefix}-{rule.name}",
            EventBusName=names.event_bus,
            EventPattern=json.dumps(rule.pattern(names.app_name)),
            Description=rule.description,
        )
        target: dict[str, Any] = {"Id": rule.target, "Arn": target_arn}
        if rule.message_group_path:
            target["SqsParameters"] = {"MessageGroupId": rule.message_group_path}
        events.put_targets(
            Rule=f"{names.prefix}-{rule.name}", EventBusName=names.event_bus, Targets=[target]
        )

    bucket = names.local_bucket
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": LOCAL_REGION}
        )

    return LocalResources(
        endpoint_url=endpoint_url,
        dynamodb_endpoint_url=dynamodb_url,
        names=names,
        queue_url=queue_url,
        queue_arn=queue_arn,
        dlq_url=dlq_url,
        dlq_arn=dlq_arn,
        table_name=names.events_table,
        definitions_table=names.definitions_table,
        bus_name=names.event_bus,
        bucket=bucket,
        target_queues=target_queues,
        tier_queues=tier_queues,
    )


def provision_on(server: MotoServer, names: ResourceNames) -> tuple[dict[str, Any], LocalResources]:
    """Clients at `server`'s endpoints, and a stage provisioned there through them."""
    clients = local_session_clients(server.url, dynamodb_url=server.dynamodb_url)
    resources = provision(clients, names, endpoint_url=server.url, dynamodb_url=server.dynamodb_url)
    return clients, resources


def _queue_arn(sqs: Any, url: str) -> str:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return str(attributes["Attributes"]["QueueArn"])
