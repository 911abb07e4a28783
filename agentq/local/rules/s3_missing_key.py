"""S3 answers a read of a missing key with 403 to a caller who may not list the bucket.

AWS rule (Amazon S3 API reference, GetObject and HeadObject, "Permissions"): "If the
object you request doesn't exist, the error that Amazon S3 returns depends on whether
you also have the s3:ListBucket permission. If you have the s3:ListBucket permission on
the bucket, Amazon S3 returns an HTTP status code 404 Not Found error. If you don't have
the s3:ListBucket permission, Amazon S3 returns an HTTP status code 403 Access Denied
error." moto always answers 404 (NoSuchKey).

On the IAM-enforced stack (moto only authorizes when enforcement is on), a GetObject or
HeadObject the caller is allowed, of a key that does not exist, is refused with 403
AccessDenied unless the caller's policies allow `s3:ListBucket` on the bucket. The
ListBucket check carries no `s3:prefix` (the request names none), so a grant scoped by a
prefix condition does not turn the 403 into a 404: agentq's readers treat both as "not
there" where a missing object is expected.
"""

from __future__ import annotations

from typing import Any, Final

from agentq.local.moto_guards import parameters, refuse

RULE: Final = "agentq/local/rules/s3_missing_key.py"


def _object_exists(account: str, bucket: str, key: str) -> bool:
    from moto.s3.models import FakeKey, s3_backends

    try:
        found = s3_backends[account]["aws"].buckets[bucket].keys.get(key)
    except KeyError:
        return False  # no bucket: moto's own NoSuchBucket answers
    # A delete marker as the current version reads as missing too.
    return isinstance(found, FakeKey)


def install() -> None:
    from moto.iam.access_control import IAMRequestBase, S3IAMRequest
    from moto.s3 import models

    if getattr(S3IAMRequest.__dict__.get("check_action_permitted"), "agentq_rule", False):
        return
    if parameters(IAMRequestBase.check_action_permitted) != ["self", "resource"]:
        raise refuse("moto", "IAMRequestBase.check_action_permitted(self, resource) changed", RULE)
    if not hasattr(models, "s3_backends") or not hasattr(models, "FakeKey"):
        raise refuse("moto", "moto.s3.models has no s3_backends / FakeKey", RULE)

    def check_action_permitted(self: Any, resource: str) -> None:
        from agentq.local.moto_iam import permits

        IAMRequestBase.check_action_permitted(self, resource)
        prefix = "arn:aws:s3:::"
        if self._action != "s3:GetObject" or not resource.startswith(prefix):
            return
        bucket, _, key = resource.removeprefix(prefix).partition("/")
        if not key or _object_exists(self.account_id, bucket, key):
            return
        if not permits(self, "s3:ListBucket", f"{prefix}{bucket}", {}):
            self._raise_access_denied()

    check_action_permitted.agentq_rule = True  # type: ignore[attr-defined]
    S3IAMRequest.check_action_permitted = check_action_permitted  # type: ignore[method-assign]
