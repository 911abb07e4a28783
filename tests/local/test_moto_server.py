"""The local moto launcher's speed-ups must not change a single answer moto gives."""

from __future__ import annotations

import datetime
import time

import jsonpath_ng.ext
import moto.sqs.models as sqs_models
import pytest
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

from agentq.local.moto_server import _dispatcher, speed_up_moto

HOSTS = [
    "sqs.eu-west-1.amazonaws.com",
    "dynamodb",
    "events.eu-west-1.amazonaws.com",
    "s3.eu-west-1.amazonaws.com",
    "moto_api",
    None,
    "nowhere.example",
]


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> None:
    # Record the originals so the test leaves this process's moto as it found it.
    monkeypatch.setattr(jsonpath_ng.ext, "parse", jsonpath_ng.ext.parse)
    for name in ("unix_time", "unix_time_millis"):
        monkeypatch.setattr(sqs_models, name, getattr(sqs_models, name))
    speed_up_moto()


def test_the_remembering_dispatcher_routes_every_host_as_moto_does() -> None:
    plain = DomainDispatcherApplication(create_backend_app)
    remembering = _dispatcher(create_backend_app)
    for _ in range(2):  # the second round answers from memory
        for host in HOSTS:
            assert remembering.get_backend_for_host(host) == plain.get_backend_for_host(host)  # type: ignore[attr-defined]
    assert remembering.get_backend_for_host("sqs.eu-west-1.amazonaws.com") == "sqs"  # type: ignore[attr-defined]


@pytest.mark.usefixtures("patched")
def test_sqs_reads_the_same_clock_faster() -> None:
    before = time.time()
    seconds = sqs_models.unix_time()
    millis = sqs_models.unix_time_millis()
    after = time.time()
    assert before <= seconds <= after
    assert before * 1000 <= millis <= after * 1000
    # With a datetime, the answer is moto's own.
    moment = datetime.datetime(2026, 11, 26, 4, 30, 0, 250_000)
    assert sqs_models.unix_time(moment) == 1_795_667_400.25
    assert sqs_models.unix_time_millis(moment) == 1_795_667_400_250.0


@pytest.mark.usefixtures("patched")
def test_jsonpath_paths_are_parsed_once_and_still_find() -> None:
    parse = jsonpath_ng.ext.parse
    assert parse("$.detail") is parse("$.detail")
    event = {"detail": {"requestId": "r-1"}, "detail-type": "Task Started"}
    assert [m.value for m in parse("$.detail").find(event)] == [{"requestId": "r-1"}]
    assert [m.value for m in parse("$.detail-type").find(event)] == ["Task Started"]


@pytest.mark.usefixtures("patched")
def test_speeding_up_twice_wraps_once() -> None:
    parse, clock = jsonpath_ng.ext.parse, sqs_models.unix_time
    speed_up_moto()
    assert jsonpath_ng.ext.parse is parse
    assert sqs_models.unix_time is clock
