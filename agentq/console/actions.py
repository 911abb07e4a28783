"""Operator actions: redrive or discard dead letters, cancel, resubmit.

Off unless the console was started with `--allow-actions`. Each action is done through
agentq's own client, redriver and archive, then recorded as an `Operator Action` event
(`Job Operator Action` for a job) naming the operator's AWS identity (STS
GetCallerIdentity, asked once) and what came of it. If the identity cannot be had,
nothing is done: no action goes unrecorded for want of a name.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.client import AgentqClient
from agentq.console.deadletters import validate_archive_key
from agentq.dlq import ArchivedMessage, DlqArchive, Redriver
from agentq.envelope import REQUEST_ID_PATTERN, validate_request_id
from agentq.errors import InvalidInput, NotFound
from agentq.events import Event, task_event
from agentq.jobs.spec import validate_job_id

MAX_BATCH: Final = 100


class Actions:
    def __init__(
        self,
        client: AgentqClient,
        *,
        sts: Any,
        redriver: Redriver,
        archive: DlqArchive,
        s3: Any,
        enabled: bool,
    ) -> None:
        self.enabled = enabled
        self._client = client
        self._sts = sts
        self._redriver = redriver
        self._archive = archive
        self._s3 = s3
        self._identity: dict[str, str] | None = None
        self._lock = threading.Lock()

    def identity(self) -> dict[str, str]:
        with self._lock:
            if self._identity is None:
                found = self._sts.get_caller_identity()
                self._identity = {"arn": str(found["Arn"]), "account": str(found["Account"])}
            return self._identity

    # -- dead letters ----------------------------------------------------------------
    def redrive(self, keys: list[Any]) -> list[dict[str, Any]]:
        operator = self.identity()
        results = []
        done: set[tuple[str, str]] = set()
        for key in _keys(keys):
            message = self._letter(key)
            if message.request_id and message.tenant:
                if (message.tenant, message.request_id) in done:
                    continue  # one replay per task: its newest letter (as `dlq redrive`)
                done.add((message.tenant, message.request_id))
                outcomes = self._redriver.redrive_request(message.request_id)
            else:
                outcomes = [self._redriver.redrive(message)]
            rows = [{"key": o.archive_key, "requestId": o.request_id, "outcome": o.outcome,
                     "detail": o.detail} for o in outcomes] or [
                {"key": key, "requestId": message.request_id, "outcome": "skipped",
                 "detail": "already redriven"}]  # fmt: skip
            results.extend(rows)
            self._record(operator, "redrive", tenant=message.tenant,
                         request_id=_subject(message.request_id, message.message_id),
                         archiveKey=key, outcome=rows[-1]["outcome"])  # fmt: skip
        return results

    def discard(self, keys: list[Any]) -> list[dict[str, Any]]:
        operator = self.identity()
        results = []
        for key in _keys(keys):
            message = self._letter(key)
            # Recorded first: a discarded letter is gone, its event is what remains.
            self._record(operator, "discard", tenant=message.tenant,
                         request_id=_subject(message.request_id, message.message_id),
                         archiveKey=key, messageId=message.message_id)  # fmt: skip
            self._s3.delete_object(Bucket=self._archive.bucket, Key=key)
            results.append({"key": key, "requestId": message.request_id, "outcome": "discarded"})
        return results

    # -- tasks and jobs ----------------------------------------------------------------
    def cancel(self, tenant: str, *, request_id: Any = None, job_id: Any = None) -> list[str]:
        operator = self.identity()
        if job_id is not None:
            job = validate_job_id(job_id)
            cancelled = self._client.cancel(job_id=job, tenant=tenant,
                                            reason=f"cancelled from the console by {operator['arn']}")  # fmt: skip
            self._publish(Event(detail_type="Job Operator Action", request_id=f"job-{job}",
                                tenant=tenant, job_id=job,
                                payload={"action": "cancel", "operator": operator,
                                         "cancelled": cancelled}))  # fmt: skip
            return cancelled
        rid = validate_request_id(request_id)
        record = self._client.get_task(rid, tenant=tenant)
        cancelled = self._client.cancel(rid, tenant=tenant,
                                        reason=f"cancelled from the console by {operator['arn']}")  # fmt: skip
        self._record(operator, "cancel", tenant=tenant, request_id=rid, job_id=record.job_id,
                     outcome="cancelled" if cancelled else f"not cancelled: {record.state.value}")  # fmt: skip
        return cancelled

    def resubmit(self, tenant: str, request_id: Any) -> str:
        """A new task with the same definition and input (the old one stays as it was)."""
        operator = self.identity()
        record = self._client.get_task(validate_request_id(request_id), tenant=tenant)
        envelope = record.envelope or {}
        if not record.definition:
            raise InvalidInput("requestId", "the task has no definition to run again")
        task = self._client.submit(record.definition, dict(envelope.get("input") or {}),
                                   tenant=tenant)  # fmt: skip
        self._record(operator, "resubmit", tenant=tenant, request_id=record.request_id,
                     job_id=record.job_id, newRequestId=task.request_id)  # fmt: skip
        return task.request_id

    def _letter(self, key: str) -> ArchivedMessage:
        try:
            return self._archive.get(key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise NotFound("dead letter", key) from None
            raise

    # -- recording ----------------------------------------------------------------------
    def _record(
        self,
        operator: dict[str, str],
        action: str,
        *,
        tenant: str | None,
        request_id: str,
        job_id: str | None = None,
        **detail: Any,
    ) -> None:
        self._publish(task_event("Operator Action", request_id=request_id,
                                 tenant=tenant or self._client.settings.tenant_id,
                                 job_id=job_id, action=action, operator=operator, **detail))  # fmt: skip

    def _publish(self, event: Event) -> None:
        self._client.publisher.publish(event)


def _keys(keys: list[Any]) -> list[str]:
    if not isinstance(keys, list) or not keys or len(keys) > MAX_BATCH:
        raise InvalidInput("keys", f"a list of 1 to {MAX_BATCH} archive keys")
    return list(dict.fromkeys(validate_archive_key(k) for k in keys))


def _subject(request_id: str | None, message_id: str) -> str:
    # A malformed letter has no request id; its event is filed under the message id.
    if request_id:
        return request_id
    candidate = "dlq-" + "".join(c for c in message_id if c.isalnum() or c in "-_")[:200]
    return candidate if REQUEST_ID_PATTERN.fullmatch(candidate) else "dlq-unknown"
