"""The CDK app: builds the stacks of one stage (`cdk synth -c stage=prod`)."""

from __future__ import annotations

import aws_cdk as cdk

from infra.app import build_app

app = cdk.App()
build_app(app)
app.synth()
