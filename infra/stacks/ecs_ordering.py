"""Creation order ECS needs and CDK does not give: a service waits for its cluster's
capacity provider association (ECS can reject a service that names a provider the
cluster is still being associated with, a known race on first create)."""

from __future__ import annotations

import aws_cdk as cdk
import jsii
from aws_cdk import aws_ecs as ecs
from constructs import IConstruct


@jsii.implements(cdk.IAspect)
class AfterCapacityProviders:
    """Makes the service wait for its cluster's capacity provider association, which the
    cluster creates only at synth (a mutating aspect of its own, which runs before this
    default-priority one), so no dependency can be added when the service is built."""

    def __init__(self, service: ecs.FargateService) -> None:
        self._service = service

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, ecs.Cluster):
            association = node.node.try_find_child(node.node.id)
            if association is not None:
                self._service.node.add_dependency(association)
