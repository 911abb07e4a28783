"""The dead-letter archive as the console lists it.

The archive holds one S3 object per dead letter (written by the dlq-processor and
rewritten when redriven). A refresh lists the prefix (one request per 1,000 letters)
and fetches only the objects whose ETag changed since the last refresh, so a page left
open costs one request per refresh, not one per letter.

Only the newest `MAX_SHOWN` letters (by the object's last write) are fetched and shown,
with the archive's total beside them, and the cache keeps each one's row (its body cut
to `BODY_PREVIEW`), never the letter: an incident that dead-letters thousands of
messages of up to 256 KB each must not cost the console a fetch and the memory of each.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Final

from agentq.dlq import ArchivedMessage, DlqArchive
from agentq.errors import InvalidInput
from agentq.resources import DLQ_ARCHIVE_PREFIX

BODY_PREVIEW: Final = 2048
MAX_SHOWN: Final = 200
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
        self._known: dict[str, tuple[str, dict[str, Any]]] = {}  # key -> (ETag, row)
        self._lock = threading.Lock()

    def list(self) -> dict[str, Any]:
        """`{"letters": rows of the newest MAX_SHOWN, newest first, "total": all}`."""
        listed: list[tuple[Any, str, str]] = []  # (last modified, key, ETag)
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.archive.bucket, Prefix=DLQ_ARCHIVE_PREFIX):
            for item in page.get("Contents", []):
                listed.append((item["LastModified"], str(item["Key"]), str(item.get("ETag", ""))))
        newest = sorted(listed, reverse=True)[:MAX_SHOWN]
        with self._lock:
            known = dict(self._known)
        fresh: dict[str, tuple[str, dict[str, Any]]] = {}
        for _, key, etag in newest:
            cached = known.get(key)
            fresh[key] = (
                cached if cached and cached[0] == etag else (etag, _row(self.archive.get(key)))
            )
        with self._lock:
            self._known = fresh
        rows = sorted((row for _, row in fresh.values()), key=lambda row: -row["archivedMs"])
        return {"letters": rows, "total": len(listed)}


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
