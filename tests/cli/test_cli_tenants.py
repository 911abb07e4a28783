"""`agentq tenants limit|transcripts|show` against the stage's table."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Stack
from support import settle_indexes

from agentq.cli import main as cli
from agentq.cli.common import EXIT_INVALID, EXIT_OK
from agentq.envelope import TaskEnvelope
from agentq.local.aws import provision_on
from agentq.local.moto_process import MotoServer
from agentq.local.rules import dynamodb_index_lag
from agentq.resources import ResourceNames
from agentq.store import TaskStore


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = cli(list(argv))
    out, err = capsys.readouterr()
    try:
        return code, json.loads(out), err
    except json.JSONDecodeError:
        return code, out, err


def test_limits_are_set_shown_and_reset(stack: Stack, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", "3")
    code, shown, _ = _run(capsys, "tenants", "limit", "acme", "2", "--json")
    assert code == EXIT_OK and shown == {"tenant": "acme", "limit": 2, "override": True}
    assert _run(capsys, "tenants", "limit", "free-for-all", "0", "--json")[0] == EXIT_OK
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    envelope = TaskEnvelope(request_id="held-1", tenant="acme", definition="echo")
    tasks.acquire(envelope, worker_id="w1", lease_seconds=60, max_attempts=3, tenant_limit=2)

    settle_indexes(stack)  # every override is listed through the byTenant index
    code, shown, _ = _run(capsys, "tenants", "show", "--json")
    assert code == EXIT_OK and shown["default"] == 3
    assert shown["tenants"] == [
        {"tenant": "acme", "limit": 2, "override": True, "running": 1, "free": 1,
         "holders": ["held-1"], "transcripts": "on"},
        {"tenant": "free-for-all", "limit": 0, "override": True, "running": 0, "free": None,
         "holders": [], "transcripts": "on"},
    ]  # fmt: skip
    code, text, _ = _run(capsys, "tenants", "show")
    assert code == EXIT_OK and "acme" in text and "2 at once" in text and "unlimited" in text

    code, shown, _ = _run(capsys, "tenants", "limit", "acme", "default", "--json")
    assert code == EXIT_OK and shown == {"tenant": "acme", "limit": 3, "override": False}
    code, shown, _ = _run(capsys, "tenants", "show", "acme", "--json")
    assert shown["tenants"][0]["override"] is False and shown["tenants"][0]["limit"] == 3


def test_transcripts_are_turned_off_and_on_and_shown_beside_the_limit(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "tenants", "limit", "acme", "2", "--json")[0] == EXIT_OK
    code, shown, _ = _run(capsys, "tenants", "transcripts", "acme", "off", "--json")
    assert code == EXIT_OK and shown == {"tenant": "acme", "transcripts": "off"}
    assert _run(capsys, "tenants", "transcripts", "hush", "off", "--json")[0] == EXIT_OK
    code, shown, _ = _run(capsys, "tenants", "show", "acme", "--json")
    assert (shown["tenants"][0]["limit"], shown["tenants"][0]["transcripts"]) == (2, "off")
    settle_indexes(stack)
    code, shown, _ = _run(capsys, "tenants", "show", "--json")
    assert [(t["tenant"], t["override"], t["transcripts"]) for t in shown["tenants"]] == [
        ("acme", True, "off"), ("hush", False, "off"),
    ]  # fmt: skip
    code, text, _ = _run(capsys, "tenants", "transcripts", "acme", "on")
    assert code == EXIT_OK and "are stored" in text
    code, shown, _ = _run(capsys, "tenants", "show", "acme", "--json")
    assert (shown["tenants"][0]["limit"], shown["tenants"][0]["transcripts"]) == (2, "on")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (("tenants", "limit", "acme", "-1"), "N"),
        (("tenants", "limit", "acme", "lots"), "N"),
        (("tenants", "limit", "acme", "1001"), "N"),
        (("tenants", "limit", "no#hash", "2"), "tenant"),
        (("tenants", "show", "x" * 200), "tenant"),
    ],
)
def test_bad_input_is_one_line_and_exit_6(
    stack: Stack, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], field: str
) -> None:
    code, shown, err = _run(capsys, *argv, "--json")
    assert code == EXIT_INVALID
    assert shown["error"]["kind"] == "invalid" and shown["error"]["message"].startswith(field)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "x" * 50 not in err, "a long value is not quoted back"


@pytest.fixture(scope="module")
def lagging_server() -> Iterator[MotoServer]:
    """A moto server whose indexes lag a minute: longer than any test step takes."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(dynamodb_index_lag.VARIABLE, "60000")
        server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


def test_a_named_tenant_shows_the_limit_just_set_while_the_index_lags(
    lagging_server: MotoServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`show TENANT` right after `limit TENANT N` shows N: the tenant's override is read
    by its key, not from the listing index, which shows it only a moment later."""
    _, resources = provision_on(lagging_server, ResourceNames(stage="l" + uuid.uuid4().hex[:10]))
    for key, value in resources.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", "3")
    assert _run(capsys, "tenants", "limit", "initech", "2", "--json")[0] == EXIT_OK
    code, shown, _ = _run(capsys, "tenants", "show", "initech", "--json")
    assert code == EXIT_OK
    assert (shown["tenants"][0]["limit"], shown["tenants"][0]["override"]) == (2, True)

    assert _run(capsys, "tenants", "limit", "initech", "default", "--json")[0] == EXIT_OK
    code, shown, _ = _run(capsys, "tenants", "show", "initech", "--json")
    assert (shown["tenants"][0]["limit"], shown["tenants"][0]["override"]) == (3, False)
