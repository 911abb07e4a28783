"""Partial failures of batch calls (PutEvents, SQS *Batch).

AWS answers such a call with success for some entries and failure for others; botocore
does not retry it, the caller must. The failed entries are taken out of the request
(so they are really not applied) and put back into the answer as failed.
"""

from __future__ import annotations

import random
from typing import Any

_FAILED_MESSAGE = "Internal failure (injected partial batch failure)"


def choose_failed(count: int, rng: random.Random) -> list[int]:
    """A non-empty set of entry indices to fail; all of them only for a single entry."""
    if count <= 1:
        return list(range(count))
    failed = [index for index in range(count) if rng.random() < 0.5]
    return failed or [rng.randrange(count)]


def answer(
    service: str, original: list[Any], failed: list[int], real: dict[str, Any] | None
) -> dict[str, Any]:
    """The caller's answer: the real one for the sent entries, merged with the failures."""
    failed_set = set(failed)
    if service == "events":
        sent = iter((real or {}).get("Entries", []))
        entries = [
            {"ErrorCode": "InternalFailure", "ErrorMessage": _FAILED_MESSAGE}
            if index in failed_set
            else next(sent, {"ErrorCode": "InternalFailure", "ErrorMessage": _FAILED_MESSAGE})
            for index in range(len(original))
        ]
        merged = dict(real or {"ResponseMetadata": {"HTTPStatusCode": 200}})
        merged["Entries"] = entries
        merged["FailedEntryCount"] = sum(1 for entry in entries if "ErrorCode" in entry)
        return merged
    merged = dict(real or {"ResponseMetadata": {"HTTPStatusCode": 200}})
    merged.setdefault("Successful", [])
    merged["Failed"] = list(merged.get("Failed", [])) + [
        {
            "Id": original[index].get("Id", str(index)),
            "SenderFault": False,
            "Code": "InternalError",
            "Message": _FAILED_MESSAGE,
        }
        for index in sorted(failed_set)
    ]
    return merged
