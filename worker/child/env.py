"""The child's environment: an allowlist, and never any AWS or ECS variable.

The seed's table (system, locale, terminal, Node, Claude, app variables) minus its AWS
row: the child talks to no AWS service (the worker uploads and emits), so it holds no
credentials a prompt-injected agent could leak.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

SYSTEM: Final = frozenset({"PATH", "USER", "SHELL", "TMPDIR", "PWD", "PYTHONPATH", "TZ"})
TERMINAL: Final = frozenset({"TERM", "COLORTERM", "FORCE_COLOR", "NO_COLOR", "NODE_ENV"})
CLAUDE: Final = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_MODEL",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "CLAUDE_CODE_PATH",
        "CLAUDE_CONFIG_DIR",
        "CLAUDE_MODEL",
        "CLAUDE_TIMEOUT",
        "CLAUDE_SKIP_PERMISSIONS",
        "DEFAULT_TIMEOUT",
        "MAX_CONCURRENT_CLAUDE",
    }
)
APP: Final = frozenset({"APP_NAME", "TENANT_ID", "LOG_LEVEL"})
PREFIXES: Final = ("LC_", "CLAUDE_CODE_", "AGENTQ_")


# Never inherited, whatever prefix lets them in: what reaches the task role or another
# account (the ECS credentials and metadata endpoints, web identity tokens), and any other
# secret-looking name under an allowed prefix (AGENTQ_DB_PASSWORD, CLAUDE_CODE_X_TOKEN).
DENIED_PREFIXES: Final = ("AWS_", "ECS_", "AMAZON_", "BOTO_")
_SECRET_WORDS: Final = frozenset(
    {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"}
)


def allowed(name: str) -> bool:
    if name.startswith(DENIED_PREFIXES) or "CREDENTIALS" in name:
        return False
    if name in SYSTEM or name in TERMINAL or name in CLAUDE or name in APP or name == "LANG":
        return True
    if _SECRET_WORDS & set(name.split("_")):
        return False  # only the named CLAUDE secrets above, which the CLI needs
    return name.startswith(PREFIXES)


def child_environment(parent: Mapping[str, str], *, home: str) -> dict[str, str]:
    """The environment of a task's child process; `home` is a writable per-worker dir."""
    env = {name: value for name, value in parent.items() if allowed(name)}
    env["HOME"] = home
    env["PYTHONUNBUFFERED"] = "1"
    return env
