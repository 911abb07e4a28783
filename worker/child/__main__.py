"""`python -m worker.child TASK_DIR | --spare [--agent]`: the task child's entry point."""

from __future__ import annotations

import os
import sys

from worker.child.runner import main

code = main()
# Everything the worker reads is written and closed; skip the interpreter's slow
# teardown (~0.8 s with the SDK imported), which only delays the task's settlement.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
