"""agentq's AWS CDK stacks and constructs."""
