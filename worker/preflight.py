"""Start-up checks: the queue, table, bus and bucket a worker needs exist and answer.

One cheap call each, before the first receive. Without them a worker pointed at a queue
that does not exist logs an error every few seconds forever; with them it exits at once
(exit code CONFIG) with one line naming the variable and what to do.

The queue is probed with GetQueueAttributes, the table with a GetItem of a key no task
has, the bus with DescribeEventBus and the bucket with GetBucketLocation. The worker's
role holds each on its stage's resource only (the last two for this check alone: both
read metadata, where HeadBucket would need s3:ListBucket, which would let the worker
list every tenant's objects), so a denial means a wrong name (another stage's bus,
say) and stops the worker like a missing resource.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from agentq.config import Settings, env_name
from agentq.errors import ConfigError

# Error codes that mean "no such resource" (the rest mean "cannot reach or not allowed").
_MISSING: Final = frozenset({
    "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist",
    "ResourceNotFoundException", "NoSuchBucket", "404", "NotFound",
})  # fmt: skip
_DENIED: Final = frozenset({"AccessDenied", "AccessDeniedException", "403", "Forbidden",
                            "UnrecognizedClientException", "InvalidClientTokenId"})  # fmt: skip
_PROBE_KEY: Final = {"PK": {"S": "AGENTQ#PREFLIGHT"}, "SK": {"S": "PREFLIGHT"}}


def check(settings: Settings, clients: Any) -> None:
    """Raise `ConfigError` naming the first setting whose resource is missing or unreachable."""
    queue_url = settings.required("queue_url")
    table = settings.required("table_name")
    bus = settings.required("bus_name")
    bucket = settings.required("bucket")
    # (setting, its value, what it should name, the call)
    probes: list[tuple[str, str, str, Callable[[], object]]] = [
        ("queue_url", queue_url, "the URL of the stage's task queue",
         lambda: clients.sqs.get_queue_attributes(QueueUrl=queue_url,
                                                  AttributeNames=["QueueArn"])),
        ("table_name", table, "the name of the stage's events table",
         lambda: clients.dynamodb.get_item(TableName=table, Key=_PROBE_KEY,
                                           ProjectionExpression="PK")),
        ("bus_name", bus, "the name of the stage's event bus",
         lambda: clients.events.describe_event_bus(Name=bus)),
        ("bucket", bucket, "the name of the stage's artifacts bucket",
         lambda: clients.s3.get_bucket_location(Bucket=bucket)),
    ]  # fmt: skip
    for attribute, value, meaning, probe in probes:
        try:
            probe()
        except Exception as exc:  # boto3's errors are not importable without it loaded
            raise ConfigError(env_name(attribute), _problem(value, meaning, exc)) from None


def _problem(value: str, meaning: str, exc: Exception) -> str:
    code = _error_code(exc)
    shown = value if len(value) <= 200 else value[:197] + "..."
    if code in _MISSING:
        return f"= {shown!r} names nothing that exists ({code}): set it to {meaning}"
    if code in _DENIED:
        return (f"= {shown!r} is not allowed for these credentials ({code}): give the "
                f"worker's role access to it, or set it to {meaning}")  # fmt: skip
    if code is not None:
        return f"= {shown!r} was refused ({code}): check it is {meaning}"
    # No AWS answer at all: a wrong endpoint or region, no network, no credentials.
    said = " ".join(str(exc).split())[:200]
    return (f"= {shown!r} could not be checked ({type(exc).__name__}: {said}): "
            "check AWS_REGION, AWS_ENDPOINT_URL and the credentials")  # fmt: skip


def _error_code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error")
        if isinstance(error, dict) and error.get("Code"):
            return str(error["Code"])
    return None
