"""Synthetic AWS error responses, in the wire format of each service's protocol.

botocore parses them exactly as it parses AWS's own, so its retry handler sees the
same error code and status it would see from AWS.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from xml.sax.saxutils import escape

from botocore.awsrequest import AWSResponse, HTTPHeaders

_JSON_TARGET_PREFIX = {
    "dynamodb": "com.amazonaws.dynamodb.v20120810#",
    "sqs": "com.amazonaws.sqs#",
    "events": "",
}


class _Body:
    """The `raw` AWSResponse reads: a urllib3-like object with `stream()`."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
        yield self._data


def error_response(
    *,
    url: str,
    protocol: str,
    service: str,
    status: int,
    code: str,
    message: str,
    extra: dict[str, Any] | None = None,
) -> AWSResponse:
    request_id = f"agentq-fault-{uuid.uuid4().hex[:16]}"
    headers = {"x-amzn-RequestId": request_id, "x-amz-request-id": request_id}
    if protocol == "rest-xml":
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
            f"<RequestId>{request_id}</RequestId></Error>"
        ).encode()
        headers["Content-Type"] = "application/xml"
    else:
        # json and rest-json both carry the code in __type.
        payload: dict[str, Any] = {
            "__type": _JSON_TARGET_PREFIX.get(service, "") + code,
            "message": message,
        }
        payload.update(extra or {})
        body = json.dumps(payload).encode()
        headers["Content-Type"] = "application/x-amz-json-1.0"
    headers["Content-Length"] = str(len(body))
    http_headers = HTTPHeaders()
    for name, value in headers.items():
        http_headers[name] = value
    return AWSResponse(url, status, http_headers, _Body(body))


def throttle_code(service: str, op: str, draw: float) -> tuple[int, str]:
    """The status and code AWS throttles this service's calls with."""
    if service == "dynamodb":
        if draw < 0.5:
            return 400, "ProvisionedThroughputExceededException"
        return 400, "ThrottlingException"
    if service == "sqs":
        return 400, "RequestThrottled"
    if service == "s3":
        return 503, "SlowDown"
    return 400, "ThrottlingException"


def server_error_code(service: str, draw: float) -> tuple[int, str]:
    if draw < 0.5:
        return 500, "InternalServerError" if service == "dynamodb" else "InternalFailure"
    return 503, "ServiceUnavailable"
