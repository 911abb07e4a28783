"""Every Lambda metric carries its stage, so one stage's alarms never see another's."""

from __future__ import annotations

from typing import Any

import pytest
from aws_lambda_powertools.metrics import MetricUnit

from lambdas._common import powertools


def test_lambda_metrics_carry_the_functions_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTQ_STAGE", "qa")
    _, metrics = powertools("probe")
    metrics.add_metric(name="Probes", unit=MetricUnit.Count, value=1)
    payload: dict[str, Any] = dict(metrics.serialize_metric_set())
    metrics.clear_metrics()
    (dimensions,) = payload["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
    assert set(dimensions) == {"service", "stage"}
    assert payload["stage"] == "qa" and payload["service"] == "agentq-probe"
