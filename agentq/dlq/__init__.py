"""Dead letters of the task queue: archived, closed out, returned or redriven.

`processor` closes out each dead letter (the dlq-processor Lambda) and redrives archived
ones; `archive` keeps every dead letter in S3 first; `returns` sends a task that still
has attempts left back to the task queue; `malformed` closes out a message no worker
could parse.
"""

from __future__ import annotations

from agentq.dlq.archive import (
    ArchivedMessage,
    Attributes,
    DeadLetter,
    DlqArchive,
    DlqOutcome,
    archive_key,
    peek,
)
from agentq.dlq.processor import DLQ_REASON, DlqProcessor, DlqResult, Redriver, RedriveResult
from agentq.dlq.returns import DlqReturner

__all__ = [
    "DLQ_REASON",
    "ArchivedMessage",
    "Attributes",
    "DeadLetter",
    "DlqArchive",
    "DlqOutcome",
    "DlqProcessor",
    "DlqResult",
    "DlqReturner",
    "RedriveResult",
    "Redriver",
    "archive_key",
    "peek",
]
