"""A local stack gives the process its environment back even when a part fails to stop."""

from __future__ import annotations

import os

import pytest

from agentq.local.stack import LocalStack, LocalStackOptions


def test_a_part_that_fails_to_stop_still_leaves_the_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = LocalStack(LocalStackOptions(workers=0))
    # As `start` leaves it: a variable of the stack's set, the one it replaced saved.
    monkeypatch.setenv("AGENTQ_LOCAL_IAM", "off")
    stack._saved_environ["AGENTQ_LOCAL_IAM"] = "off"
    os.environ["AGENTQ_LOCAL_IAM"] = "enforce"

    def fails() -> None:
        raise RuntimeError("the moto server did not stop")

    monkeypatch.setattr(stack, "_stop_parts", fails)
    with pytest.raises(RuntimeError):
        stack.stop()
    assert os.environ["AGENTQ_LOCAL_IAM"] == "off"
