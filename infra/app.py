"""Builds every stack of the stage named by the `stage` context value.

`cdk synth -c stage=prod` (optionally `-c app_name=...`, `-c definitions="DIR ..."` for
definition directories to ship beyond the stage's own, and `-c alarm_emails=...` /
`-c alarm_slack=TEAM/CHANNEL` for who the alarms reach) selects the stage; its typed
settings live in infra/stages.py. cdk-nag's AwsSolutions checks run as a validation
plugin on every synth, so a finding without an acknowledgment fails the build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from agentq.resources import RULES
from infra.assets import lambda_code
from infra.definitions import DefinitionsLoader
from infra.stacks.dispatcher import DispatcherStack
from infra.stacks.events import EventsStack
from infra.stacks.health_check import HealthCheckStack
from infra.stacks.infrastructure import InfrastructureStack
from infra.stacks.monitoring import MonitoringStack
from infra.stacks.producer_api import ProducerApiStack
from infra.stacks.secrets import SecretsStack
from infra.stacks.worker import WorkerStack
from infra.stages import StageSettings, stage_settings


@dataclass(frozen=True)
class StageStacks:
    settings: StageSettings
    secrets: SecretsStack
    infrastructure: InfrastructureStack
    events: EventsStack
    health_check: HealthCheckStack
    dispatcher: DispatcherStack
    producer_api: ProducerApiStack
    worker: WorkerStack
    monitoring: MonitoringStack
    definitions: DefinitionsLoader

    def all(self) -> list[cdk.Stack]:
        return [
            self.secrets,
            self.infrastructure,
            self.events,
            self.health_check,
            self.dispatcher,
            self.producer_api,
            self.worker,
            self.monitoring,
        ]


def build_stage(app: cdk.App, settings: StageSettings) -> StageStacks:
    """The stacks of one stage; fails (StageError) for a production stage whose alarms
    reach nobody."""
    settings.check_alarm_subscribers()
    prefix = settings.names.prefix
    # Deployed, and filled by the operator, before the worker stack (docs/deploy.md).
    secrets = SecretsStack(app, f"{prefix}-secrets", settings=settings)
    core = InfrastructureStack(app, f"{prefix}-infrastructure", settings=settings)
    # Beside the table it fills: `cdk deploy` of the core stack loads the definitions
    # before any worker could ask for one.
    definitions = DefinitionsLoader(
        core,
        "DefinitionsLoader",
        settings=settings,
        table=core.definitions_table,
        code=lambda_code(),
    )
    events = EventsStack(app, f"{prefix}-events", settings=settings, core=core, code=lambda_code())
    health = HealthCheckStack(
        app, f"{prefix}-health-check", settings=settings, core=core, code=lambda_code()
    )
    dispatcher = DispatcherStack(
        app, f"{prefix}-dispatcher", settings=settings, core=core, code=lambda_code()
    )
    api = ProducerApiStack(
        app, f"{prefix}-producer-api", settings=settings, core=core, code=lambda_code()
    )
    worker = WorkerStack(
        app,
        f"{prefix}-worker",
        settings=settings,
        core=core,
        claude_secret=secrets.claude_secret,
    )
    monitoring = MonitoringStack(
        app,
        f"{prefix}-monitoring",
        core=core,
        worker=worker,
        functions={
            **events.functions,
            **health.functions,
            **dispatcher.functions,
            **api.functions,
        },
        failed_events={
            name: queue
            for name, queue in (
                ("save-event", events.save_event.failed_events),
                ("dispatcher", dispatcher.handler.failed_events),
            )
            if queue is not None
        },
        rules={
            **{rule.name: (f"{prefix}-{rule.name}", settings.names.event_bus) for rule in RULES},
            "health-check-schedule": (health.schedule.rule_name, None),
            "reconciler-schedule": (health.reconciler.schedule.rule_name, None),
        },
        api=api.api,
        settings=settings,
    )
    stacks = StageStacks(
        settings, secrets, core, events, health, dispatcher, api, worker, monitoring, definitions
    )
    for stack in stacks.all():
        cdk.Tags.of(stack).add("app", settings.app_name)
        cdk.Tags.of(stack).add("stage", settings.name)
    return stacks


# Behaviour switches that must hold before any construct exists (cdk.json may not set them).
FEATURE_FLAGS: Final = {
    # Access logs are delivered under a bucket policy instead of the legacy ACL.
    "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True,
    # An import keeps its exporting resource alive (the current default, made explicit).
    "@aws-cdk/core:defaultCrossStackReferences": "strong",
}


def list_context(value: object) -> list[str]:
    """A context value naming several things, separated by spaces or commas."""
    if value is None:
        return []
    items = value if isinstance(value, list) else str(value).replace(",", " ").split()
    return [str(item).strip() for item in items if str(item).strip()]


def definitions_context(value: object) -> list[Path]:
    """`-c definitions="a b"` (the Makefile's DEFINITIONS): more directories to ship."""
    return [Path(item) for item in list_context(value)]


def build_app(app: cdk.App, *, nag: bool = True) -> StageStacks:
    """Every stack of the context's stage, checked by cdk-nag unless `nag` is False."""
    for flag, value in FEATURE_FLAGS.items():
        if app.node.try_get_context(flag) is None:
            app.node.set_context(flag, value)
    stage = str(app.node.try_get_context("stage") or "dev")
    app_name = app.node.try_get_context("app_name")
    settings = stage_settings(
        stage,
        app_name=str(app_name) if app_name else None,
        definitions=definitions_context(app.node.try_get_context("definitions")),
        alarm_emails=list_context(app.node.try_get_context("alarm_emails")),
        alarm_slack=list_context(app.node.try_get_context("alarm_slack")),
    )
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return build_stage(app, settings)
