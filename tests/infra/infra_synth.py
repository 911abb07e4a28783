"""Synthesizes a stage once per test process (no cdk-nag plugin) for assertion tests."""

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
from aws_cdk.assertions import Template

from infra.app import StageStacks, build_app

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SynthesizedStage:
    stacks: StageStacks
    templates: dict[str, Template]  # short stack name ("worker") -> template

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


@functools.cache
def synthesized(stage: str) -> SynthesizedStage:
    outdir = tempfile.mkdtemp(prefix=f"agentq-infra-{stage}-")
    atexit.register(shutil.rmtree, outdir, ignore_errors=True)
    # The context cdk.json gives the CLI, so these templates are the ones `cdk synth` makes.
    context = json.loads((REPO / "cdk.json").read_text()).get("context", {})
    app = cdk.App(outdir=outdir, context={**context, **stage_context(stage)})
    stacks = build_app(app, nag=False)
    prefix = f"{stacks.settings.names.prefix}-"
    templates = {
        stack.stack_name.removeprefix(prefix): Template.from_stack(stack) for stack in stacks.all()
    }
    return SynthesizedStage(stacks=stacks, templates=templates)
