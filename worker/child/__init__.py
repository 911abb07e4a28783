"""The task child and everything around it on the worker's side.

`runner` is the child itself (`python -m worker.child`); `env` and `files` prepare what
it is given; `spares`, `forkserver` and `forkclient` (the fork server's client) start
children ahead of their tasks; `supervisor` runs one to its end, `isolation` and
`proctree` confine and stop it; `leasefile` and `leasetimer` fence it by its lease.

Kept empty: the child imports this package, and what it imports is on every task's latency.
"""
