import sys

from agentq.cli import main

sys.exit(main())
