"""What a reconciler run found and did: repairs, and the errors it left for next time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

RepairKind = Literal["pending_lost", "retrying_lost", "lease_lapsed", "job_stalled"]
REPAIR_KINDS: Final[tuple[RepairKind, ...]] = (
    "pending_lost",
    "retrying_lost",
    "lease_lapsed",
    "job_stalled",
)
# The trigger the reconciler passes to the dispatcher. Constant on purpose: the
# dispatcher finishes a half-done step (a move not sent, a close not published) only
# for the trigger that began it, so a later run must present the same one.
RECONCILER_TRIGGER: Final = "reconciler"


@dataclass(frozen=True, kw_only=True)
class Repair:
    kind: RepairKind
    tenant: str
    subject: str  # a request id, or a job id for job_stalled
    job_id: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tenant": self.tenant,
            "subject": self.subject,
            "jobId": self.job_id,
            "detail": self.detail,
        }


@dataclass
class ReconcileReport:
    checked_at_ms: int
    repairs: list[Repair] = field(default_factory=list)
    # What could not be checked or repaired this run (throttled, failed): the next run
    # finds the same situation again, since nothing was claimed for it.
    errors: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for repair in self.repairs:
            counts[repair.kind] = counts.get(repair.kind, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkedAt": self.checked_at_ms,
            "repairs": [r.to_dict() for r in self.repairs],
            "counts": self.counts(),
            "errors": self.errors,
        }
