"""The dead-letter archive as the console lists it.

The archive holds one S3 object per dead letter (written by the dlq-processor and
rewritten when redriven). A refresh lists the prefix (one request per 1,000 letters)
and fetches only the objects whose ETag changed since the last refresh, so a page left
open costs one request per refresh, not one per letter.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Final

from agentq.dlq import ArchivedMessage, DlqArchive
from agentq.errors import InvalidInput
from agentq.resources import DLQ_ARCHIVE_PREFIX

BODY_PREVIEW: Final = 2048
_KEY_PATTERN: Final = re.compile(
    re.escape(DLQ_ARCHIVE_PREFIX)
    + r"[a-zA-Z0-9_.-]{1,128}/[a-zA-Z0-9_-]{1,256}/[a-zA-Z0-9_.-]{1,256}\.json"
)


def validate_archive_key(value: object) -> str:
    if not isinstance(value, str) or not _KEY_PATTERN.fullmatch(value):
        raise InvalidInput("key", "not a dead-letter archive key")
    return value


class DeadLetters:
    def __init__(self, s3: Any, archive: DlqArchive) -> None:
        self._s3 = s3
        self.archive = archive
        self._known: dict[str, tuple[str, ArchivedMessage]] = {}
        self._lock = threading.Lock()

    def list(self) -> list[dict[str, Any]]:
        listed: dict[str, str] = {}
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.archive.bucket, Prefix=DLQ_ARCHIVE_PREFIX):
            for item in page.get("Contents", []):
                listed[str(item["Key"])] = str(item.get("ETag", ""))
        with self._lock:
            known = dict(self._known)
        fresh: dict[str, tuple[str, ArchivedMessage]] = {}
        for key, etag in listed.items():
            cached = known.get(key)
            fresh[key] = cached if cached and cached[0] == etag else (etag, self.archive.get(key))
        with self._lock:
            self._known = fresh
        messages = sorted((m for _, m in fresh.values()), key=lambda m: -m.archived_at_ms)
        return [_row(m) for m in messages]


def _row(message: ArchivedMessage) -> dict[str, Any]:
    return {
        "key": message.key,
        "messageId": message.message_id,
        "requestId": message.request_id,
        "tenant": message.tenant,
        "outcome": message.outcome,
        "detail": message.detail,
        "archivedMs": message.archived_at_ms,
        "redrivenMs": message.redriven_at_ms,
        "redriveCount": message.redrive_count,
        "receives": message.system_attributes.get("ApproximateReceiveCount"),
        "body": message.body[:BODY_PREVIEW],
        "bodyTruncated": len(message.body) > BODY_PREVIEW,
    }
