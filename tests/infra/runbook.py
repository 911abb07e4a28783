"""The deploy runbook (docs/deploy.md) as commands, and which of them need an AWS
account, are agentq's own, or run on any machine."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "docs" / "deploy.md"

# Needs an AWS account (not run here): CloudFormation, the AWS CLI, what reads their output.
ACCOUNT = re.compile(
    r"^(npx cdk (bootstrap|deploy|destroy)|aws |make deploy|for |[A-Z_]+=\$\(aws |source )"
)
# agentq's own commands against the account: run here without credentials.
OWN = re.compile(r"^(agentq (env|submit)|\.venv/bin/python -m infra\.secrets_ready)\b")
LOCAL = re.compile(r"^(make synth|export [A-Z_]+=\S+)")


def runbook_commands() -> list[str]:
    """The commands of the `<!-- runbook -->` blocks, in order: continuations joined, a
    `for` loop as one command, comments dropped."""
    text = RUNBOOK.read_text()
    blocks = re.findall(r"<!-- runbook -->\n```bash\n(.*?)```", text, re.S)
    commands: list[str] = []
    for block in blocks:
        lines = re.sub(r"\\\n\s*", "", block).splitlines()
        loop: list[str] = []
        for raw in lines:
            line = re.sub(r"\s+#.*$", "", raw).strip()
            if not line:
                continue
            if loop or line.startswith("for "):
                loop.append(line)
                if line == "done":
                    commands.append("; ".join(loop))
                    loop = []
                continue
            commands.append(line)
    return commands
