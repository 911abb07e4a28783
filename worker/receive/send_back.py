"""The one way a received message that will not run here goes back to SQS.

Every such message goes through `SendBack` with its reason and delay: draining or a
drain's give-back, forwarded to its own tier's queue, its tenant parked full here, or
passed on to the fleet. A message that ran no attempt goes back as a fresh copy
(worker.sqs.batcher `requeue`), so the receive it spent here does not count toward the
queue's maxReceiveCount: only real attempts bring a task to the DLQ.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from worker.sqs.batcher import SqsBatcher, message_log

logger = logging.getLogger(__name__)

Reason = Literal["draining", "given_back", "forwarded", "tenant_limit", "passed_on"]
# Its log line, by reason: the chaos verdict (bench.chaos_drains) and the tests read these.
LOG_LINE: Final[Mapping[Reason, str]] = {
    "draining": "message given back",
    "given_back": "message given back",
    "forwarded": "message forwarded to its tier",
    "tenant_limit": "tenant at its concurrency limit; sent back (parked full here)",
    "passed_on": "message passed on",
}
# The reasons counted among the worker's verdicts (a drain's give-backs are not).
COUNTED: Final = frozenset({"forwarded", "tenant_limit", "passed_on"})


class SendBack:
    def __init__(self, batcher: SqsBatcher, count: Callable[[str], None]) -> None:
        self._batcher = batcher
        self._count = count

    def __call__(
        self,
        message: Mapping[str, Any],
        reason: Reason,
        *,
        delay_s: float = 0.0,
        queue_url: str | None = None,
        receipt_handle: str | None = None,
    ) -> None:
        """Back to SQS, visible after `delay_s`. With `queue_url`: forwarded, unmarked,
        to its own tier's queue (its first receive there is its first). Otherwise a
        fresh copy on the queue it came from, replacing `receipt_handle` (default: the
        message's own). A message passed on skips the batch window: another worker may
        be waiting for it now."""
        logger.info(LOG_LINE[reason], extra={**message_log(message), "reason": reason,
                                             "delay_s": round(delay_s, 3)})  # fmt: skip
        if queue_url is not None:
            self._batcher.forward(message, queue_url)
        else:
            self._batcher.requeue(message, delay_s, at_once=reason == "passed_on",
                                  receipt_handle=receipt_handle or message["ReceiptHandle"])  # fmt: skip
        if reason in COUNTED:
            self._count(reason)
