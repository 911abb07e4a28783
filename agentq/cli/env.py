"""`agentq env --stage NAME`: the variables producers and workers need for a deployed stage.

Names come from `agentq.resources.ResourceNames` (the same the stacks deploy), the queue
URLs from SQS and the bucket, which CloudFormation names, from the infrastructure
stack's resources; each is looked up, so a stage that is not deployed (or another
region or account) fails here rather than on the first submit. Read-only: safe to
rerun, and a throttled or failed look-up is retried by botocore.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, emit_json
from agentq.errors import NotFound
from agentq.resources import ResourceNames


def register(subparsers: Any) -> None:
    env = subparsers.add_parser(
        "env", help="print (or write) the variables of a deployed stage, to source"
    )
    env.add_argument("--stage", required=True, help="the stage name used at deploy (-c stage=)")
    env.add_argument("--app-name", default="agentq", help="the app name used at deploy")
    env.add_argument("--output", type=Path, help="write an env file here instead of printing")
    views.add_json_flag(env)
    env.set_defaults(func=_env)


def stage_env(
    names: ResourceNames, *, region: str, sqs: Any, cloudformation: Any
) -> dict[str, str]:
    stack = f"{names.prefix}-infrastructure"
    try:
        pages = cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack)
        resources = [r for page in pages for r in page.get("StackResourceSummaries", [])]
    except ClientError as exc:
        if "does not exist" in str(exc):
            raise NotFound("stack", f"{stack} in {region}") from None
        raise
    buckets = [r["PhysicalResourceId"] for r in resources
               if r["ResourceType"] == "AWS::S3::Bucket"
               and r["LogicalResourceId"].startswith("Artifacts")]  # fmt: skip
    if not buckets:
        raise NotFound("artifacts bucket", f"in stack {stack}")
    tiers = {}
    for tier, name in names.tier_queues().items():
        try:
            tiers[tier] = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        except ClientError:
            continue  # a stage deployed before priority tiers: its one queue serves all
    return {
        **(
            {"SQS_QUEUE_URLS": ",".join(f"{t}={u}" for t, u in tiers.items())}
            if len(tiers) > 1
            else {}
        ),
        "AWS_REGION": region,
        "AGENTQ_STAGE": names.stage,
        "APP_NAME": names.app_name,
        "SQS_QUEUE_URL": sqs.get_queue_url(QueueName=names.task_queue)["QueueUrl"],
        "SQS_DLQ_URL": sqs.get_queue_url(QueueName=names.dead_letter_queue)["QueueUrl"],
        "DYNAMODB_EVENTS_TABLE_NAME": names.events_table,
        "TASK_DEFINITIONS_TABLE": names.definitions_table,
        "EVENTBRIDGE_BUS_NAME": names.event_bus,
        "S3_BUCKET": buckets[0],
    }


def _env(args: argparse.Namespace) -> int:
    from agentq.config import Settings
    from agentq.local.stack import format_env_file

    region = Settings.from_env().region
    aws = views.aws(region)
    env = stage_env(ResourceNames(stage=args.stage, app_name=args.app_name), region=region,
                    sqs=aws.sqs, cloudformation=aws.get("cloudformation"))  # fmt: skip
    if args.json:
        emit_json(env)
    elif args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(format_env_file(env, header=_header(args.stage)))
        print(f"wrote {args.output}: source it, or `agentq --local-env {args.output} ...`")
    else:
        print(format_env_file(env, header=_header(args.stage)), end="")
    return EXIT_OK


def _header(stage: str) -> str:
    return (
        f"# agentq stage {stage}: resource names for producers and workers (`agentq env`).\n"
        "# Credentials are not in this file: they come from your AWS profile or role.\n"
    )
