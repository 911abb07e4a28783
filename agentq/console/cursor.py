"""Page cursors of the jobs list: DynamoDB's LastEvaluatedKey as an opaque URL token.

The cursor comes back from the browser, so it is untrusted: decoding accepts only the
four string attributes of a byTenant index key, for the tenant being listed, and
anything else is an `InvalidInput` (a 400 page), never a DynamoDB error.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

from agentq.errors import InvalidInput
from agentq.json_text import decode_json
from agentq.store import keys

KEY_NAMES: Final = frozenset({"PK", "SK", "tenantPK", "tenantSK"})
MAX_CURSOR_CHARS: Final = 4096
_MAX_VALUE_CHARS: Final = 1024


def encode_cursor(last_key: Mapping[str, Any]) -> str:
    flat = {name: value["S"] for name, value in sorted(last_key.items())}
    raw = json.dumps(flat, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, tenant: str) -> dict[str, Any]:
    """The ExclusiveStartKey a cursor stands for; `InvalidInput` unless well-formed."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidInput("cursor", "too long")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        # decode_json, not json.loads: 3,000 brackets fit in a cursor under the length
        # limit and make json's decoder raise RecursionError (a 500, not this 400).
        data = decode_json(raw.decode(), name="cursor")
    except (binascii.Error, ValueError, InvalidInput):
        raise InvalidInput("cursor", "not a cursor this console made") from None
    if not isinstance(data, dict) or set(data) != KEY_NAMES:
        raise InvalidInput("cursor", "not a cursor this console made")
    for value in data.values():
        if not isinstance(value, str) or not value or len(value) > _MAX_VALUE_CHARS:
            raise InvalidInput("cursor", "not a cursor this console made")
    if data["tenantPK"] != keys.tenant_jobs_pk(tenant):
        raise InvalidInput("cursor", "belongs to another tenant's list")
    return {name: {"S": value} for name, value in data.items()}
