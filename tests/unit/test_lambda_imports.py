"""What a Lambda handler module pulls in at import, checked in a fresh interpreter.

A behavioural guard for cold starts (issue 9), not a timing test: timings live in
bench/lambda_import.py (which lists the same modules). Each handler is imported under
a deployed function's environment with tracing left on, then its `warm()` runs against
an endpoint that refuses connections, which proves it builds clients without sending
a request.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from agentq.config import env_name

LAMBDAS = Path(__file__).resolve().parents[2] / "lambdas"
HANDLERS: Final = sorted(f"lambdas.{p.stem}" for p in LAMBDAS.glob("[!_]*.py"))

# Each is tens to hundreds of milliseconds and not needed by every invocation (X-Ray SDK,
# slack-sdk, YAML) or needed only once clients exist (boto3 and what it brings).
HEAVY_AT_IMPORT: Final = (
    "aws_xray_sdk",
    "slack_sdk",
    "yaml",
    "boto3",
    "botocore.session",
    "urllib3",
)
# The settings model (pydantic-settings, ~100 ms with pydantic) loads with the runtime on
# the first invocation; only the producer API's request models need pydantic at import,
# and the definitions loader (run by CloudFormation once per deployment, where a cold
# start costs nothing anyone waits on) validates definitions with their models.
SETTINGS_MODEL: Final = ("agentq.config.settings", "pydantic_settings")
PYDANTIC_AT_IMPORT: Final = frozenset({"lambdas.producer_api", "lambdas.definitions_loader"})

_PROBE: Final = """
import json, sys
import {module} as handler
imported = sorted(sys.modules)
handler.warm()
print(json.dumps({{"at_import": imported, "after_warm": sorted(sys.modules)}}))
"""


def _deployed_env() -> dict[str, str]:
    # A deployed function's variables (names only). Tracing is not disabled: Powertools'
    # Tracer imported the X-Ray SDK either way. Any request would hit the discard port.
    ours = ("AWS_", "AGENTQ_", "SLACK_", "TASK_DEFINITIONS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env.update({
        "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", env_name("local"): "false",
        env_name("table_name"): "t", env_name("definitions_table"): "d", env_name("bucket"): "b",
        env_name("bus_name"): "bus", env_name("queue_url"): "http://127.0.0.1:9/q",
    })  # fmt: skip
    return env


@functools.cache  # one fresh interpreter per handler serves every check of it
def _probe(module: str) -> dict[str, Any]:
    env = _deployed_env()
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    probe: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return probe


def _loaded(modules: list[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_every_handler_module_is_probed() -> None:
    assert set(HANDLERS) >= {
        "lambdas.save_event",
        "lambdas.dlq_processor",
        "lambdas.health_check",
        "lambdas.dispatcher",
        "lambdas.producer_api",
        "lambdas.reconciler",
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("module", HANDLERS)
def test_a_handler_imports_nothing_heavy_until_its_clients_are_built(module: str) -> None:
    probe = _probe(module)
    heavy = [name for name in HEAVY_AT_IMPORT if _loaded(probe["at_import"], name)]
    assert heavy == [], f"{module} imports {heavy} at import time"
    # warm() is what the bench's "ready" figure adds: it must really build the clients.
    assert _loaded(probe["after_warm"], "boto3")
    assert not _loaded(probe["after_warm"], "slack_sdk")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("module", HANDLERS)
def test_a_handler_loads_the_settings_model_with_its_runtime_not_at_import(module: str) -> None:
    probe = _probe(module)
    early = [name for name in SETTINGS_MODEL if _loaded(probe["at_import"], name)]
    assert early == [], f"{module} imports {early} at import time"
    if module not in PYDANTIC_AT_IMPORT:
        assert not _loaded(probe["at_import"], "pydantic"), f"{module} imports pydantic"
    # Deferred, not dropped: warm() builds the settings the first invocation reads.
    assert _loaded(probe["after_warm"], "agentq.config.settings")


@pytest.mark.timeout(120)
def test_slack_sdk_loads_when_an_alert_is_first_sent_not_with_the_notifier() -> None:
    script = """
import sys
from agentq.alerts.slack import SlackNotifier
notifier = SlackNotifier("xoxb-test", "C123", base_url="http://127.0.0.1:9/api/")
assert "slack_sdk" not in sys.modules, "slack_sdk imported with the notifier"
client = notifier.client
assert "slack_sdk" in sys.modules and notifier.client is client
assert client.base_url == "http://127.0.0.1:9/api/" and client.retry_handlers
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
