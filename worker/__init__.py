"""The long-running consumer: receiving, leases, locks, child supervision, drain."""
