"""agentq's benchmarks and chaos harness: they print figures, not pass/fail."""
