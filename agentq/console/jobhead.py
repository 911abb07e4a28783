"""A job's item as its page reads it on each refresh: the spec once, the progress always.

The job item holds the job's spec (every task, its input and dependencies: the largest
part of the item, and the slowest to parse) beside its state and counters. The spec of
a job changes only when tasks are added to it, and that write also adds to `total`
(conditioned on the old total, agentq.jobs.store), so a job's spec is known by its
(creation time, total): the first read takes the whole item; later refreshes ask only
for the attributes that move (a ProjectionExpression) and reuse the parsed spec while
its (creation time, total) is the same, reading the whole item again otherwise.

Fault story: a read changes nothing; botocore retries it when throttled or failed, and
what still fails is the page's 502 until the next poll.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Final

from agentq.client import AgentqClient
from agentq.errors import NotFound
from agentq.jobs.store import COUNTERS, JobRecord
from agentq.store import keys
from agentq.store.codec import from_item

PROGRESS: Final = ("state", "total", *COUNTERS, "costUsd", "createdAt", "closedAt", "closedBy")
_NAMES: Final = {f"#j{i}": name for i, name in enumerate(PROGRESS)}
MAX_JOBS: Final = 256


class JobHeads:
    def __init__(self, client: AgentqClient) -> None:
        self._client = client
        self._ddb = client.dynamodb
        self._table = client.settings.required("table_name")
        self._known: OrderedDict[tuple[str, str], JobRecord] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, job_id: str) -> JobRecord:
        with self._lock:
            known = self._known.get((tenant, job_id))
        if known is None:
            return self._whole(tenant, job_id)
        item = self._ddb.get_item(
            TableName=self._table,
            Key={"PK": {"S": keys.job_pk(tenant, job_id)}, "SK": {"S": keys.JOB_SK}},
            ConsistentRead=True,
            ProjectionExpression=", ".join(_NAMES),
            ExpressionAttributeNames=_NAMES,
        ).get("Item")
        if item is None:
            with self._lock:
                self._known.pop((tenant, job_id), None)
            raise NotFound("job", job_id)
        data = from_item(item)
        if int(data["createdAt"]) != known.created_at_ms or int(data["total"]) != known.total:
            return self._whole(tenant, job_id)  # tasks were added, or the id was reused
        return replace(
            known,
            state=data["state"],
            counts={name: int(data.get(name, 0)) for name in COUNTERS},
            cost_usd=float(data.get("costUsd", 0)),
            closed_at_ms=data.get("closedAt"),
            closed_by=data.get("closedBy"),
            # Not read on a refresh, and not used by the console: its page counts from
            # the tasks' own states.
            counted=frozenset(),
            raw={**known.raw, **data},
        )

    def _whole(self, tenant: str, job_id: str) -> JobRecord:
        job = self._client.get_job(job_id, tenant=tenant)
        with self._lock:
            self._known[(tenant, job_id)] = job
            self._known.move_to_end((tenant, job_id))
            while len(self._known) > MAX_JOBS:
                self._known.popitem(last=False)
        return job
