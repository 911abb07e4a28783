"""Dead letters whose task still has attempts left go back to the task queue.

SQS counts receives, not attempts (a killed worker's prefetch, a lost ReceiveMessage
answer, a refusal backed off in place each spend one), so a task can be dead-lettered
before it ran `max_message_retries` times. The processor counts a return on the STATE
item (one conditional write, agentq.store.returns) and THEN sends a fresh copy. If the
send is lost, the same dead letter comes back, finds its MessageId as the mark and
sends again, counted once; a send whose answer was lost may leave two copies (the lock
runs the task once). A dead letter of a copy sent before the last return neither
counts nor goes back: the returned copy stands for the task, so duplicates of one
message cannot spend its returns and fail a task with attempts left.
"""

from __future__ import annotations

from typing import Any, Final

from agentq.dlq.archive import DeadLetter, send_attributes
from agentq.store import TaskRecord
from agentq.store.returns import (
    attempts_left,
    count_return,
    returned_at,
    returned_letter,
    returns_of,
)

# Receives spent without attempts come in bursts (a kill, an outage), each burst at
# most one dead letter per task; three returns outlast any plausible run of them, and
# a message no worker can settle (a refusal that never clears) still ends FAILED.
MAX_DLQ_RETURNS: Final = 3
# A dead letter sent this long before the last return is a copy older than the one that
# return sent (SQS keeps a message's SentTimestamp in the DLQ); the margin covers skew
# between the processor's clock and SQS's.
OLDER_COPY_MARGIN_MS: Final = 1_000


class DlqReturner:
    """Sends dead letters with attempts left back. Clients are passed in."""

    def __init__(
        self,
        *,
        dynamodb: Any,
        table_name: str,
        sqs: Any,
        queue_url: str,
        max_returns: int = MAX_DLQ_RETURNS,
    ) -> None:
        self._ddb = dynamodb
        self._table = table_name
        self._sqs = sqs
        self._queue_url = queue_url
        self._max_returns = max_returns

    def give_back(self, record: TaskRecord, letter: DeadLetter) -> str | None:
        """Return `letter` to the task queue if its task has attempts left; the detail
        of the return, or None when the task is to be closed out as before."""
        if not attempts_left(record):
            return None
        again = returned_letter(record) == letter.message_id
        if not again and _older_than_last_return(record, letter):
            # A copy of the message from before the last return (a send-back whose
            # delete failed, a reconciler re-send): the returned copy stands for the
            # task, so this one neither counts nor ends it.
            return f"superseded by return {returns_of(record)} (attempt {record.attempt} so far)"
        if not again:
            if returns_of(record) >= self._max_returns:
                return None
            if not count_return(self._ddb, self._table, record, message_id=letter.message_id):
                return None  # the task moved on meanwhile: decide on its new state
        sent = self._sqs.send_message(
            QueueUrl=self._queue_url,
            MessageBody=letter.body,
            MessageAttributes=send_attributes(letter.attributes),
            # The tenant as MessageGroupId, like every agentq send (SQS fair queues).
            MessageGroupId=record.tenant,
        )
        count = returns_of(record) + (0 if again else 1)
        return (
            f"returned to the task queue as {sent['MessageId']} "
            f"({count} of {self._max_returns} returns; attempt {record.attempt} so far)"
        )


def _older_than_last_return(record: TaskRecord, letter: DeadLetter) -> bool:
    last = returned_at(record)
    try:
        sent = int(letter.system_attributes.get("SentTimestamp", ""))
    except ValueError:
        return False
    return last is not None and sent < last - OLDER_COPY_MARGIN_MS
