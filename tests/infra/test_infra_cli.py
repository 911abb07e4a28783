"""`make synth`, as the deploy runbook runs it: the real `cdk` CLI (pinned npm aws-cdk)
synthesizes both stages with cdk-nag on, cfn-lint accepts every template, and the
deploy rehearsal finds no error in either stage."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from once_per_run import once_per_run, run_directory
from runbook import LOCAL, runbook_commands

from infra.nag import ACKNOWLEDGED_METADATA
from infra.rehearsal import Severity, load_templates, rehearse

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
CDK = REPO / "node_modules" / ".bin" / "cdk"
STAGES = ("dev", "prod")


@pytest.fixture(scope="module")
def make_synth(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """The runbook's (docs/deploy.md) commands that need no account, as it gives them:
    `make synth`, with the install stamps taken as done (the test environment is
    installed already). It synthesizes both stages with cdk-nag on into cdk.out/, runs
    cfn-lint on every template and rehearses the deploy; the tests below read that.

    It runs once per test run: another xdist process needing it waits for it to finish
    (a second run would rewrite cdk.out/ under the first one's readers) and reads its
    outcome."""
    local = [c for c in runbook_commands() if LOCAL.match(c) and not c.startswith("export ")]
    assert local == ["make synth"], local
    if not CDK.exists():
        pytest.fail("node_modules/.bin/cdk is missing: run `npm ci` (the Makefile does)")
    return once_per_run(
        run_directory(tmp_path_factory), "make-synth", _run_make_synth, _save, _load
    )


def _run_make_synth() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-o", ".venv/.installed", "-o", "node_modules/.installed", "synth"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=1500,
        env={**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"},
    )  # fmt: skip


def _save(done: subprocess.CompletedProcess[str]) -> str:
    return json.dumps([done.args, done.returncode, done.stdout, done.stderr])


def _load(saved: str) -> subprocess.CompletedProcess[str]:
    args, returncode, stdout, stderr = json.loads(saved)
    return subprocess.CompletedProcess(args, returncode, stdout, stderr)


@pytest.fixture(scope="module")
def cloud_assemblies(make_synth: subprocess.CompletedProcess[str]) -> dict[str, Path]:
    assert make_synth.returncode == 0, make_synth.stdout[-4000:] + make_synth.stderr[-4000:]
    return {stage: REPO / "cdk.out" / stage for stage in STAGES}


def test_the_runbooks_make_synth_rehearses_both_stages_without_an_error(
    make_synth: subprocess.CompletedProcess[str],
) -> None:
    assert make_synth.returncode == 0, make_synth.stderr[-4000:]
    rehearsals = [line for line in make_synth.stdout.splitlines() if "rehearsal: " in line]
    assert len(rehearsals) == len(STAGES), make_synth.stdout[-4000:]
    assert all(" 0 errors" in line for line in rehearsals), rehearsals


def _templates(out: Path) -> list[Path]:
    return sorted(out.glob("*.template.json"))


def test_infra_cli_synthesizes_every_stack_of_both_stages(
    cloud_assemblies: dict[str, Path],
) -> None:
    for stage, out in cloud_assemblies.items():
        names = {p.name.removesuffix(".template.json") for p in _templates(out)}
        assert names == {
            f"agentq-{stage}-{unit}"
            for unit in (
                "secrets",
                "infrastructure",
                "events",
                "health-check",
                "dispatcher",
                "producer-api",
                "worker",
                "monitoring",
            )
        }


def test_infra_cfn_lint_passes_on_every_template(
    make_synth: subprocess.CompletedProcess[str], cloud_assemblies: dict[str, Path]
) -> None:
    # `make synth` ran cfn-lint over both stages' templates (make echoes the command) and
    # would have failed on a finding.
    (lint,) = [line for line in make_synth.stdout.splitlines() if "cfn-lint " in line]
    for stage, out in cloud_assemblies.items():
        assert _templates(out), stage
        assert f"cdk.out/{stage}/*.template.json" in lint, lint


def _nag_report(out: Path) -> dict[str, Any]:
    report = json.loads((out / "validation-report.json").read_text())
    (nag,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    return dict(nag)


def test_infra_cdk_nag_has_no_unacknowledged_findings(cloud_assemblies: dict[str, Path]) -> None:
    for stage, out in cloud_assemblies.items():
        nag = _nag_report(out)
        assert nag["conclusion"] == "success", (stage, nag["violations"])
        assert nag["violations"] == []
        suppressed = nag.get("suppressedViolations", [])
        assert suppressed, "expected the documented acknowledgments to show up"
        for finding in suppressed:
            # Each acknowledgment names one rule (and, for wildcards, one exact resource)
            # and says why, specifically.
            assert finding["acknowledgedId"] == f"AwsSolutions::{finding['ruleName']}"
            assert len(finding["reason"]) >= 40, finding
        # A blanket wildcard acknowledgment would hide new ones: none is allowed.
        assert "AwsSolutions::AwsSolutions-IAM5" not in {f["acknowledgedId"] for f in suppressed}
        # Every acknowledgment suppresses a finding: a dead one would silently cover a
        # future finding on the same construct.
        used = {("/" + f["acknowledgedAt"], f["ruleName"]) for f in suppressed}
        acknowledged = _acknowledged(out)
        assert len(acknowledged) >= len(suppressed) / 2, "acknowledgments are recorded"
        assert acknowledged <= used, (stage, sorted(acknowledged - used))


def _acknowledged(out: Path) -> set[tuple[str, str]]:
    """What infra.nag.acknowledge recorded as construct metadata (path, finding)."""
    found = set()
    for path in out.glob("*.metadata.json"):
        for construct, entries in json.loads(path.read_text()).items():
            for entry in entries:
                if entry["type"] == ACKNOWLEDGED_METADATA:
                    found.add((construct, str(entry["data"])))
    return found


def test_infra_worker_image_asset_holds_only_what_the_image_needs(
    cloud_assemblies: dict[str, Path],
) -> None:
    out = cloud_assemblies["dev"]
    manifest = json.loads((out / "agentq-dev-worker.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerFile"] == "Dockerfile"
    # Built for the task definition's x86_64 platform even on an arm64 laptop.
    assert image["source"]["platform"] == "linux/amd64"
    context = out / image["source"]["directory"]
    top = {p.name for p in context.iterdir()}
    assert {"Dockerfile", "requirements.txt", "pyproject.toml", "agentq", "worker"} <= top
    assert not top & {".venv", "node_modules", "cdk.out", "tests", ".git"}, top
    dockerfile = (context / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["agentq"]' in dockerfile
    assert 'CMD ["worker"]' in dockerfile
    assert "USER agentq" in dockerfile


def test_infra_deploy_rehearsal_passes_both_stages_as_make_synth_writes_them(
    cloud_assemblies: dict[str, Path],
) -> None:
    for stage, out in cloud_assemblies.items():
        # A dev stage may synthesize without alarm subscribers (a warning), prod may not.
        unsubscribed: Severity = "report" if stage == "dev" else "error"
        findings = rehearse(load_templates([out]), unsubscribed_alarms=unsubscribed)
        errors = [str(f) for f in findings if f.severity == "error"]
        assert not errors, (stage, errors)
