"""``python -m agentq.local.model_server``: serve until SIGINT/SIGTERM."""

from agentq.local.model_server.server import main

raise SystemExit(main())
