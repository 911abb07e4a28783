"""DynamoDB rule: a TransactWriteItems retried with its ClientRequestToken is answered,
not applied again.

AWS (TransactWriteItems API reference): "Providing a ClientRequestToken makes the call
to TransactWriteItems idempotent, meaning that multiple identical calls have the same
effect as one single call"; "a client token is valid for 10 minutes after the first
request that uses it is completed. After 10 minutes, any request with the same client
token is treated as a new request"; "if you submit a request with the same client
token but a change in other parameters within the 10-minute idempotency window,
DynamoDB returns an IdempotentParameterMismatch exception"; and
TransactionInProgressException: "the transaction with the given request token is
already in progress".

moto ignores the token: a retry after an answer was lost runs the transaction again,
whose conditions then fail against its own first effect (TransactionCanceled). Here a
completed transaction's token is remembered for 10 minutes with a fingerprint of the
request; a cancelled transaction applied nothing and is not remembered.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from typing import Any, Final

from agentq.local import moto_guards
from agentq.local.rules import _dynamodb

WINDOW_S: Final = 600.0
_lock = threading.Lock()
_done: dict[str, tuple[str, float, Any]] = {}  # token -> fingerprint, completed at, answer
_in_flight: dict[str, str] = {}  # token -> fingerprint


def install() -> None:
    from moto.dynamodb.responses import DynamoHandler

    answer = getattr(DynamoHandler, "transact_write_items", None)
    if answer is None or moto_guards.parameters(answer) != ["self"]:
        raise moto_guards.refuse(
            "moto", "DynamoHandler.transact_write_items(self) changed", _dynamodb.RULES_DIR
        )
    if getattr(answer, "remembers_tokens", False):
        return
    if 'self.body["TransactItems"]' not in moto_guards.source_of(answer):
        raise moto_guards.refuse(
            "moto", "DynamoHandler.transact_write_items no longer reads self.body",
            _dynamodb.RULES_DIR,
        )  # fmt: skip
    mismatch = _dynamodb.error_class("IdempotentParameterMismatchException")
    in_progress = _dynamodb.error_class("TransactionInProgressException")

    @functools.wraps(answer)
    def transact_write_items(handler: Any) -> Any:
        body = handler.body if isinstance(handler.body, dict) else {}
        token = body.get("ClientRequestToken")
        if not isinstance(token, str) or not token:
            return answer(handler)
        fingerprint = _fingerprint(body)
        with _lock:
            _forget_expired(time.monotonic())
            if token in _in_flight:
                raise in_progress(  # type: ignore[call-arg]
                    "The transaction with the given request token is already in progress."
                )
            done = _done.get(token)
            if done is not None:
                if done[0] != fingerprint:
                    raise mismatch(  # type: ignore[call-arg]
                        "The request uses the same client token as a previous, but "
                        "non-identical request."
                    )
                return done[2]
            _in_flight[token] = fingerprint
        try:
            result = answer(handler)
        except BaseException:
            with _lock:
                _in_flight.pop(token, None)
            raise
        # Completed once its answer goes out (after any time in flight: the conflict rule).
        _dynamodb.defer(functools.partial(_complete, token, fingerprint, result))
        return result

    transact_write_items.remembers_tokens = True  # type: ignore[attr-defined]
    setattr(DynamoHandler, "transact_write_items", transact_write_items)  # noqa: B010


def _fingerprint(body: dict[str, Any]) -> str:
    rest = {k: v for k, v in body.items() if k != "ClientRequestToken"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()


def _complete(token: str, fingerprint: str, result: Any) -> None:
    with _lock:
        _in_flight.pop(token, None)
        _done[token] = (fingerprint, time.monotonic(), result)


def _forget_expired(now: float) -> None:
    for token in [t for t, (_, at, _) in _done.items() if now - at > WINDOW_S]:
        del _done[token]
