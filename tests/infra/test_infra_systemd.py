"""The EC2 unit template: restarts, memory limits, and a stop timeout that covers the drain."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentq.config import Settings
from infra.stages import STAGES

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "agentq-worker@.service"


def _unit() -> configparser.ConfigParser:
    # systemd allows repeated keys (EnvironmentFile=); keep the last, it is enough here.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def _seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "min": 60}
    for suffix, factor in units.items():
        if value.endswith(suffix) and value[: -len(suffix)].isdigit():
            return int(value[: -len(suffix)]) * factor
    return float(value)


def _bytes(value: str) -> int:
    factors = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(value[:-1]) * factors[value[-1]] if value[-1] in factors else int(value)


def test_infra_unit_restarts_limits_memory_and_outlasts_the_drain() -> None:
    service = _unit()["Service"]
    assert service["ExecStart"].endswith("agentq worker")
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    # mixed: SIGTERM reaches the worker alone (it stops its own children); SIGKILL at
    # the deadline reaches the whole cgroup, so no Claude CLI survives the unit.
    assert service["KillMode"] == "mixed"
    assert _bytes(service["MemoryHigh"]) < _bytes(service["MemoryMax"])
    defaults = Settings()
    stop_s = _seconds(service["TimeoutStopSec"])
    assert stop_s * 1000 > defaults.drain_timeout_ms + defaults.kill_grace_ms
    # The same unit must also outlast the drain any stage configures for its workers.
    assert all(stop_s > stage.worker.drain_timeout_s for stage in STAGES.values())
    # The Claude CLI needs a writable HOME of its own per instance.
    assert service["Environment"] == "HOME=/var/lib/agentq/%i"
    assert service["StateDirectory"] == "agentq/%i"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_infra_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # Point ExecStart at this checkout's real console script so verify can resolve it.
    agentq = Path(sys.executable).with_name("agentq")
    text = UNIT.read_text().replace("/opt/agentq/.venv/bin/agentq", str(agentq))
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    problems = [line for line in result.stderr.splitlines() if UNIT.stem in line]
    assert result.returncode == 0 and not problems, result.stderr
