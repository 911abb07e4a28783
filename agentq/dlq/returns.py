"""Dead letters whose task still has attempts left go back to the task queue.

SQS counts receives, not attempts: a SIGKILLed worker's prefetched messages, a lost
ReceiveMessage answer and a lock refusal backed off in place each spend a receive, so
a task can be dead-lettered before agentq ever ran it `max_message_retries` times.
Failing it then would break the promise that only exhausted attempts end a task
FAILED. The processor instead counts a return on the STATE item (one conditional
write, agentq.store.returns) and THEN sends a fresh copy of the message (same body and
attributes). Write first: if the send is lost, the Lambda's record failed and the same
dead letter comes back, finds its own MessageId as the mark and sends again, counted
once. A send whose answer was lost may leave two copies: the lock runs the task once.
"""

from __future__ import annotations

from typing import Any, Final

from agentq.dlq.archive import DeadLetter, send_attributes
from agentq.store import TaskRecord
from agentq.store.returns import attempts_left, count_return, returned_letter, returns_of

# Receives spent without attempts come in bursts (a kill, an outage), each burst at
# most one dead letter per task; three returns outlast any plausible run of them, and
# a message no worker can settle (a refusal that never clears) still ends FAILED.
MAX_DLQ_RETURNS: Final = 3


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
