"""What the stack template tests share: the synthesized stages and the Lambda handlers."""

from __future__ import annotations

import pytest
from infra_synth import SynthesizedStage, synthesized

# The functions that run while the stage does; each has error and throttle alarms.
RUNTIME_HANDLERS = {
    "lambdas.save_event.handler",
    "lambdas.dlq_processor.handler",
    "lambdas.health_check.handler",
    "lambdas.dispatcher.handler",
    "lambdas.producer_api.handler",
    "lambdas.reconciler.handler",
}
# Runs only inside `cdk deploy`, which reports its failure itself (no alarm), and reads
# its table's name from the custom resource, not from its environment.
DEPLOY_HANDLERS = {"lambdas.definitions_loader.handler"}
HANDLERS = RUNTIME_HANDLERS | DEPLOY_HANDLERS
# CDK's custom-resource provider framework (Node.js, its own asset): not agentq code.
FRAMEWORK_HANDLER = "framework.onEvent"


# The fixtures are named apart from their functions: a test module imports the functions,
# and its tests' parameters (stage, dev, prod) would otherwise redefine the imports.
@pytest.fixture(scope="module", params=["dev", "prod"], name="stage")
def fixture_stage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> SynthesizedStage:
    return synthesized(request.param, tmp_path_factory)


@pytest.fixture(scope="module", name="dev")
def fixture_dev(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStage:
    return synthesized("dev", tmp_path_factory)


@pytest.fixture(scope="module", name="prod")
def fixture_prod(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStage:
    return synthesized("prod", tmp_path_factory)
