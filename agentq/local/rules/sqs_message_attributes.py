"""SQS takes at most 10 message attributes per message (SendMessage, and each entry of
SendMessageBatch): AWS refuses more with `InvalidParameterValue`, moto stores them.
agentq marks its requeued copies within that limit (worker/sqs/copies.py); a local stack
that took an eleventh attribute would hide a copy SQS refuses.

The patch wraps the attribute validator moto's SQS responses call for both operations,
after checking it is still there with the shape it was written for (the launcher then
refuses to start rather than run without the rule).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

from agentq.local.moto_guards import parameters, refuse, source_of

MAX_MESSAGE_ATTRIBUTES: Final = 10
RULES: Final = "agentq/local/rules/sqs_message_attributes.py"


def _validator() -> tuple[Any, Callable[..., None], type[Exception]]:
    """moto.sqs.responses, its `validate_message_attributes(message_attributes)` and
    the `InvalidParameterValue(message)` error, checked."""
    import moto.sqs.exceptions as sqs_exceptions
    import moto.sqs.responses as sqs_responses

    validate = getattr(sqs_responses, "validate_message_attributes", None)
    error = getattr(sqs_exceptions, "InvalidParameterValue", None)
    if validate is None or not isinstance(error, type):
        raise refuse("moto", "moto.sqs.responses.validate_message_attributes is gone", RULES)
    if getattr(validate, "limits_attribute_count", False):
        return sqs_responses, validate, error
    if parameters(validate) != ["message_attributes"]:
        raise refuse("moto", "validate_message_attributes(message_attributes) changed", RULES)
    responses_source = source_of(sqs_responses)
    if responses_source.count("validate_message_attributes(") < 3:
        # SendMessage (attributes and system attributes) and each batch entry.
        raise refuse("moto", "SQS responses no longer validate every message's attributes",
                     RULES)  # fmt: skip
    return sqs_responses, validate, error


def install() -> None:
    """Refuse a message with more than 10 attributes, as SQS does. Idempotent."""
    responses, validate, error = _validator()
    if getattr(validate, "limits_attribute_count", False):
        return

    @functools.wraps(validate)
    def limited(message_attributes: Any) -> None:
        count = len(message_attributes or {})
        if count > MAX_MESSAGE_ATTRIBUTES:
            raise error(
                f"Number of message attributes [{count}] exceeds the allowed maximum "
                f"[{MAX_MESSAGE_ATTRIBUTES}]."
            )
        validate(message_attributes)

    limited.limits_attribute_count = True  # type: ignore[attr-defined]
    responses.validate_message_attributes = limited
