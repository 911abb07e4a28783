"""DynamoDB has a moto server of its own, and everything that is handed the stack's
environment or resources finds it there."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import Stack

from agentq.local.aws import LocalResources, MotoServer, local_session_clients


def test_the_stage_tables_live_on_dynamodbs_own_server(stack: Stack) -> None:
    resources = stack.resources
    assert resources.dynamodb_endpoint_url not in (None, resources.endpoint_url)
    env = resources.env()
    assert env["AWS_ENDPOINT_URL_DYNAMODB"] == resources.dynamodb_endpoint_url
    shared = local_session_clients(resources.endpoint_url)["dynamodb"]
    own = local_session_clients(
        resources.endpoint_url, dynamodb_url=resources.dynamodb_endpoint_url
    )["dynamodb"]
    # A describe, not a list: the session's server holds every test's tables, more
    # than one page of ListTables.
    assert own.describe_table(TableName=resources.table_name)["Table"]["TableStatus"]
    with pytest.raises(shared.exceptions.ResourceNotFoundException):
        shared.describe_table(TableName=resources.table_name)
    # The stack's own clients, and the queues, are where the env says.
    assert stack.clients["dynamodb"].meta.endpoint_url == resources.dynamodb_endpoint_url
    assert stack.clients["sqs"].meta.endpoint_url == resources.endpoint_url


def test_a_process_given_the_stage_env_reaches_both_servers(stack: Stack) -> None:
    probe = (
        "import boto3, os\n"
        "ddb = boto3.client('dynamodb'); sqs = boto3.client('sqs')\n"
        "ddb.describe_table(TableName=os.environ['DYNAMODB_EVENTS_TABLE_NAME'])\n"
        "sqs.get_queue_attributes(QueueUrl=os.environ['SQS_QUEUE_URL'])\n"
        "print(ddb.meta.endpoint_url, sqs.meta.endpoint_url)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], env=stack.resources.env(), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [
        stack.resources.dynamodb_endpoint_url,
        stack.resources.endpoint_url,
    ]


def test_the_resources_file_reads_back_whole(stack: Stack) -> None:
    # What `agentq local up` hands its Lambda processes (agentq.local.lambda_procs).
    assert LocalResources.from_json(stack.resources.to_json()) == stack.resources


def test_with_iam_enforced_one_server_serves_dynamodb_too() -> None:
    # Its users and policies live in the one process that checks them.
    server = MotoServer(iam=True)
    assert server.dynamodb_url == server.url and server.urls == (server.url,)
    split = MotoServer()
    assert split.dynamodb_url != split.url and len(split.urls) == 2
