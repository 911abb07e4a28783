"""What each pre-send kind does to one HTTP attempt.

Each returns a synthetic response (botocore parses it and its retry handler decides),
raises botocore's own connection error (retried as a transient failure), or returns
None to let the attempt go to the endpoint untouched.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

from agentq.faults.config import FaultRule, Kind
from agentq.faults.responses import error_response, server_error_code, throttle_code

DYNAMODB_WRITES = frozenset({"UpdateItem", "PutItem", "DeleteItem", "TransactWriteItems"})
BATCH_OPS = frozenset(
    {
        ("events", "PutEvents"),
        ("sqs", "SendMessageBatch"),
        ("sqs", "DeleteMessageBatch"),
        ("sqs", "ChangeMessageVisibilityBatch"),
    }
)


def applies(kind: Kind, service: str, op: str) -> bool:
    """Whether AWS can fail this operation this way (a `*` rule skips the rest)."""
    if kind is Kind.TRANSACTION_CONFLICT:
        return service == "dynamodb" and op in DYNAMODB_WRITES
    if kind is Kind.PARTIAL_BATCH:
        return (service, op) in BATCH_OPS
    return True


@dataclass
class Attempt:
    service: str
    op: str
    protocol: str
    request: AWSPreparedRequest
    rule: FaultRule
    rng: random.Random
    send: Callable[[AWSPreparedRequest], AWSResponse]

    def error(self, status: int, code: str, message: str, **extra: Any) -> AWSResponse:
        return error_response(
            url=self.request.url or "",
            protocol=self.protocol,
            service=self.service,
            status=status,
            code=code,
            message=message,
            extra=extra,
        )


def _throttle(attempt: Attempt) -> AWSResponse:
    status, code = throttle_code(attempt.service, attempt.op, attempt.rng.random())
    return attempt.error(status, code, "Rate exceeded (injected fault)")


def _server_error(attempt: Attempt) -> AWSResponse:
    status, code = server_error_code(attempt.service, attempt.rng.random())
    return attempt.error(status, code, "We encountered an internal error (injected fault)")


def _connection_reset(attempt: Attempt) -> AWSResponse:
    raise ConnectionClosedError(endpoint_url=attempt.request.url)


def _read_timeout(attempt: Attempt) -> AWSResponse:
    raise ReadTimeoutError(endpoint_url=attempt.request.url)


def _latency(attempt: Attempt) -> None:
    time.sleep(attempt.rule.delay)


def _applied_then_failed(attempt: Attempt) -> AWSResponse:
    """The request really reaches the endpoint and takes effect; its answer is lost."""
    real = attempt.send(attempt.request)
    _ = real.content  # read it so the pooled connection is released
    if real.status_code >= 300:
        # The call failed for real (a failed condition, say): nothing was applied,
        # so the caller sees the true answer.
        return real
    if attempt.rng.random() < 0.5:
        status, code = server_error_code(attempt.service, 0.0)
        return attempt.error(status, code, "We encountered an internal error (injected fault)")
    raise ReadTimeoutError(endpoint_url=attempt.request.url)


def _transaction_conflict(attempt: Attempt) -> AWSResponse:
    if attempt.op != "TransactWriteItems":
        return attempt.error(
            400, "TransactionConflictException", "Transaction is ongoing for the item"
        )
    items = _transact_items(attempt.request)
    conflicted = attempt.rng.randrange(items)
    reasons = [
        {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
        if index == conflicted
        else {"Code": "None"}
        for index in range(items)
    ]
    listed = ", ".join(reason["Code"] for reason in reasons)
    return attempt.error(
        400,
        "TransactionCanceledException",
        f"Transaction cancelled, please refer cancellation reasons for specific reasons [{listed}]",
        CancellationReasons=reasons,
    )


def _transact_items(request: AWSPreparedRequest) -> int:
    try:
        raw = request.body
        body = json.loads(raw if isinstance(raw, (bytes, str)) else b"{}")
        return max(1, len(body.get("TransactItems", [])))
    except (ValueError, TypeError, AttributeError):
        return 1


PRE_SEND: dict[Kind, Callable[[Attempt], AWSResponse | None]] = {
    Kind.THROTTLE: _throttle,
    Kind.SERVER_ERROR: _server_error,
    Kind.CONNECTION_RESET: _connection_reset,
    Kind.READ_TIMEOUT: _read_timeout,
    Kind.LATENCY: _latency,
    Kind.APPLIED_THEN_FAILED: _applied_then_failed,
    Kind.TRANSACTION_CONFLICT: _transaction_conflict,
}
