"""Operator actions: redrive or discard dead letters, cancel, resubmit, continue, retry a job's task.

Off unless the console was started with `--allow-actions`. Each action is done through
agentq's own client, redriver and archive, and is on record before it is done: an
`Operator Action` event (`Job Operator Action` for a job) naming the operator's AWS
identity (STS GetCallerIdentity, asked once) is stored as requested first, then its
outcome is stored and published (agentq.console.record). If the identity cannot be
had, nothing is done: no action goes unrecorded for want of a name.

Resubmitting is idempotent per form: the page carries a nonce, the new task's
idempotency key is derived from it, so a double click or a retried POST makes one task.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.client import AgentqClient
from agentq.console.deadletters import validate_archive_key
from agentq.console.record import ActionLog
from agentq.dlq import ArchivedMessage, DlqArchive, Redriver
from agentq.envelope import REQUEST_ID_PATTERN, validate_request_id
from agentq.errors import InvalidInput, NotFound
from agentq.events import Event, task_event
from agentq.jobs.spec import task_request_id, validate_job_id
from agentq.resume import override_of
from agentq.store import TaskRecord

MAX_BATCH: Final = 100
# What the page issues (secrets.token_urlsafe); anything else is refused, not hashed.
FORM_NONCE: Final = re.compile(r"[A-Za-z0-9_-]{16,64}")
TASK_KEY: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
NOT_PUBLISHED: Final = (
    "done and recorded in the events table, but EventBridge did not take its event"
)


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
        self._log = ActionLog(client.event_store, client.publisher,
                              ttl_days=client.settings.event_ttl_days)  # fmt: skip
        self._identity: dict[str, str] | None = None
        self._lock = threading.Lock()

    def identity(self) -> dict[str, str]:
        with self._lock:
            if self._identity is None:
                found = self._sts.get_caller_identity()
                self._identity = {"arn": str(found["Arn"]), "account": str(found["Account"])}
            return self._identity

    # -- dead letters ----------------------------------------------------------------
    def redrive(self, keys: list[Any]) -> dict[str, Any]:
        operator = self.identity()
        results: list[dict[str, Any]] = []
        published = True
        done: set[tuple[str, str]] = set()
        for key in _keys(keys):
            message = self._letter(key)
            if message.request_id and message.tenant:
                if (message.tenant, message.request_id) in done:
                    continue  # one replay per task: its newest letter (as `dlq redrive`)
                done.add((message.tenant, message.request_id))
            rows, sent = self._log.perform(
                self._event(operator, "redrive", tenant=message.tenant,
                            request_id=_subject(message.request_id, message.message_id),
                            archiveKey=key),
                functools.partial(self._redrive_one, message, key),
                lambda rows: {"outcome": rows[-1]["outcome"]},
            )  # fmt: skip
            results.extend(rows)
            published &= sent
        return _answer({"results": results}, published)

    def _redrive_one(self, message: ArchivedMessage, key: str) -> list[dict[str, Any]]:
        if message.request_id and message.tenant:
            outcomes = self._redriver.redrive_request(message.request_id)
        else:
            outcomes = [self._redriver.redrive(message)]
        return [{"key": o.archive_key, "requestId": o.request_id, "outcome": o.outcome,
                 "detail": o.detail} for o in outcomes] or [
            {"key": key, "requestId": message.request_id, "outcome": "skipped",
             "detail": "already redriven"}]  # fmt: skip

    def discard(self, keys: list[Any]) -> dict[str, Any]:
        operator = self.identity()
        results = []
        published = True
        for key in _keys(keys):
            message = self._letter(key)
            # The request is stored before the delete: a discarded letter is gone, its
            # events are what remains of it.
            _, sent = self._log.perform(
                self._event(operator, "discard", tenant=message.tenant,
                            request_id=_subject(message.request_id, message.message_id),
                            archiveKey=key, messageId=message.message_id),
                functools.partial(self._s3.delete_object, Bucket=self._archive.bucket, Key=key),
                lambda _: {"outcome": "discarded"},
            )  # fmt: skip
            published &= sent
            results.append({"key": key, "requestId": message.request_id, "outcome": "discarded"})
        return _answer({"results": results}, published)

    # -- tasks and jobs ----------------------------------------------------------------
    def cancel(self, tenant: str, *, request_id: Any = None, job_id: Any = None) -> dict[str, Any]:
        operator = self.identity()
        reason = f"cancelled from the console by {operator['arn']}"
        if job_id is not None:
            job = validate_job_id(job_id)
            event = Event(detail_type="Job Operator Action", request_id=f"job-{job}",
                          tenant=tenant, job_id=job,
                          payload={"action": "cancel", "operator": operator})  # fmt: skip
            cancelled, sent = self._log.perform(
                event,
                lambda: [a.request_id for a in
                         self._client.cancel(job_id=job, tenant=tenant, reason=reason)],
                lambda ids: {"cancelled": ids},
            )  # fmt: skip
            return _answer({"cancelled": cancelled}, sent)
        rid = validate_request_id(request_id)
        record = self._client.get_task(rid, tenant=tenant)
        answers, sent = self._log.perform(
            self._event(operator, "cancel", tenant=tenant, request_id=rid, job_id=record.job_id),
            lambda: self._client.cancel(rid, tenant=tenant, reason=reason),
            lambda done: {"outcome": done[0].outcome if done
                          else f"not cancelled: {record.state.value}"},
        )  # fmt: skip
        return _answer({"cancelled": [a.request_id for a in answers],
                        "outcome": answers[0].outcome if answers else None}, sent)  # fmt: skip

    def resubmit(self, tenant: str, request_id: Any, nonce: Any) -> dict[str, Any]:
        """A new task with the same definition, input and own `resume` (the old one stays
        as it was), once per form: the same nonce again answers with the same new task."""
        return self._new_task(
            "resubmit", tenant, request_id, nonce,
            lambda record, definition, key: self._client.submit(
                definition, dict((record.envelope or {}).get("input") or {}), tenant=tenant,
                idempotency_key=key, resume=override_of(record.envelope)),
        )  # fmt: skip

    def continue_task(
        self, tenant: str, request_id: Any, prompt: Any, nonce: Any
    ) -> dict[str, Any]:
        """A new task that continues a COMPLETED agent task's session with a follow-up
        (`agentq submit --continue`), once per form: the same nonce answers with the same
        new task. The client refuses what cannot be continued, and says why."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInput("prompt", "the follow-up to send: a non-empty text")
        return self._new_task(
            "continue", tenant, request_id, nonce,
            lambda record, definition, key: self._client.submit(
                definition, {}, tenant=tenant, continues=record.request_id, prompt=prompt,
                idempotency_key=key),
        )  # fmt: skip

    def _new_task(
        self,
        action: str,
        tenant: str,
        request_id: Any,
        nonce: Any,
        submit: Callable[[TaskRecord, str, str], TaskRecord],
    ) -> dict[str, Any]:
        """A new task made from `request_id`'s by `submit(record, definition, key)`, once
        per form: the idempotency key is the action, the source and the page's nonce."""
        _check_nonce(nonce)
        operator = self.identity()
        record = self._client.get_task(validate_request_id(request_id), tenant=tenant)
        definition = record.definition
        if not definition:
            raise InvalidInput("requestId", f"the task has no definition to {action}")
        key = f"console-{action}/{record.request_id}/{nonce}"
        new_id, sent = self._log.perform(
            self._event(operator, action, tenant=tenant, request_id=record.request_id,
                        job_id=record.job_id),
            lambda: submit(record, definition, key).request_id,
            lambda rid: {"newRequestId": rid},
        )  # fmt: skip
        return _answer({"requestId": new_id}, sent)

    def retry(self, tenant: str, job_id: Any, key: Any, nonce: Any) -> dict[str, Any]:
        """One FAILED or TIMEOUT task of a job again (agentq.jobs.retry), once per form:
        the page's nonce is the retry key, so a double click or a retried POST is one."""
        _check_nonce(nonce)
        job = validate_job_id(job_id)
        if not isinstance(key, str) or not TASK_KEY.fullmatch(key):
            raise InvalidInput("key", "a task key of the job")
        operator = self.identity()
        answer, sent = self._log.perform(
            self._event(operator, "retry", tenant=tenant, request_id=task_request_id(job, key),
                        job_id=job),
            lambda: self._client.retry(job, key, tenant=tenant,
                                       retry_key=f"console-retry/{nonce}"),
            lambda done: {"outcome": "retried", "jobState": done.job_state},
        )  # fmt: skip
        return _answer(answer.to_dict(), sent)

    def _letter(self, key: str) -> ArchivedMessage:
        try:
            return self._archive.get(key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise NotFound("dead letter", key) from None
            raise

    def _event(
        self,
        operator: dict[str, str],
        action: str,
        *,
        tenant: str | None,
        request_id: str,
        job_id: str | None = None,
        **detail: Any,
    ) -> Event:
        return task_event("Operator Action", request_id=request_id,
                          tenant=tenant or self._client.settings.tenant_id,
                          job_id=job_id, action=action, operator=operator, **detail)  # fmt: skip


def _check_nonce(nonce: Any) -> None:
    if not isinstance(nonce, str) or not FORM_NONCE.fullmatch(nonce):
        raise InvalidInput("nonce", "the page's form nonce (reload the page)")


def _answer(body: dict[str, Any], published: bool) -> dict[str, Any]:
    return body if published else body | {"notice": NOT_PUBLISHED}


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
