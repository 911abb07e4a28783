"""Each stage synthesized (no cdk-nag plugin) for assertion tests, once per test run:
under xdist the first process to need a stage synthesizes it and shares its templates
(tests/infra/once_per_run.py). A stage's constructs (`stacks`) are built only in a
process whose tests read them, from the same sources and context."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Before jsii starts (first aws_cdk import): Node 20's end-of-life banner is noise here.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template
from once_per_run import once_per_run, run_directory

from infra.app import StageStacks, build_app, list_context
from infra.stages import StageSettings, stage_settings

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SynthesizedStage:
    name: str
    settings: StageSettings
    templates: dict[str, Template]  # short stack name ("worker") -> template

    @functools.cached_property
    def stacks(self) -> StageStacks:
        """The stage's constructs (built in this process on first use), synthesized:
        cross-stack references become stack dependencies only then, and a process that
        read another's templates (`_load`) had built them without."""
        stacks = _build(self.name)
        assert stacks.settings == self.settings, (stacks.settings, self.settings)
        app = cdk.Stage.of(stacks.worker)
        assert app is not None
        app.synth()
        return stacks

    def json(self, name: str) -> dict[str, Any]:
        return dict(self.templates[name].to_json())

    def resources(self, name: str, resource_type: str) -> dict[str, Any]:
        return {
            logical_id: resource
            for logical_id, resource in self.json(name)["Resources"].items()
            if resource["Type"] == resource_type
        }

    def all_resources(self, resource_type: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (stack, resource)
            for stack in self.templates
            for resource in self.resources(stack, resource_type).values()
        ]


# A production stage refuses to synthesize without an alarm subscriber (infra/stages.py);
# prod's test synth has both kinds, dev none (it only warns).
ALARM_EMAIL = "alarms@example.com"
ALARM_SLACK = "T0AGENTQ1/C0ALARMS1"


def stage_context(stage: str) -> dict[str, str]:
    """The `-c` values a test synth of `stage` passes."""
    if stage == "prod":
        return {"stage": stage, "alarm_emails": ALARM_EMAIL, "alarm_slack": ALARM_SLACK}
    return {"stage": stage}


def _settings(stage: str) -> StageSettings:
    """The settings build_app makes of `stage_context(stage)`."""
    context = stage_context(stage)
    return stage_settings(
        stage,
        alarm_emails=list_context(context.get("alarm_emails")),
        alarm_slack=list_context(context.get("alarm_slack")),
    )


@functools.cache
def _build(stage: str) -> StageStacks:
    outdir = tempfile.mkdtemp(prefix=f"agentq-infra-{stage}-")
    atexit.register(shutil.rmtree, outdir, ignore_errors=True)
    # The context cdk.json gives the CLI, so these templates are the ones `cdk synth` makes.
    context = json.loads((REPO / "cdk.json").read_text()).get("context", {})
    app = cdk.App(outdir=outdir, context={**context, **stage_context(stage)})
    return build_app(app, nag=False)


def _synthesize(stage: str) -> SynthesizedStage:
    stacks = _build(stage)
    prefix = f"{stacks.settings.names.prefix}-"
    templates = {
        stack.stack_name.removeprefix(prefix): Template.from_stack(stack) for stack in stacks.all()
    }
    return SynthesizedStage(name=stage, settings=stacks.settings, templates=templates)


def _save(synthesized: SynthesizedStage) -> str:
    templates = {name: template.to_json() for name, template in synthesized.templates.items()}
    return json.dumps({"settings": repr(synthesized.settings), "templates": templates})


def _load(stage: str, saved: str) -> SynthesizedStage:
    shared = json.loads(saved)
    settings = _settings(stage)
    # The settings this process's tests compare the templates with are those that made them.
    assert repr(settings) == shared["settings"], (settings, shared["settings"])
    templates = {name: Template.from_json(t) for name, t in shared["templates"].items()}
    return SynthesizedStage(name=stage, settings=settings, templates=templates)


@functools.cache
def _synthesized(stage: str, shared: Path | None) -> SynthesizedStage:
    return once_per_run(
        shared, f"synth-{stage}", lambda: _synthesize(stage), _save, lambda s: _load(stage, s)
    )


def synthesized(stage: str, tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStage:
    """The stage as synthesized in this test run (once, whatever the number of processes)."""
    return _synthesized(stage, run_directory(tmp_path_factory))
