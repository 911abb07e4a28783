"""`make demo`: the whole system on the embedded local stack, in one command."""

from __future__ import annotations

import sys

from agentq.local.aws import MotoServer, local_session_clients, provision
from agentq.resources import ResourceNames


def main() -> int:
    with MotoServer() as server:
        resources = provision(
            local_session_clients(server.url), ResourceNames(stage="demo"), endpoint_url=server.url
        )
        print(f"local AWS on {server.url}")
        for key, value in sorted(resources.env().items()):
            if not key.startswith("AWS_SECRET"):
                print(f"  {key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
