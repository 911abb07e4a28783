"""`agentq --local`: read the env file `agentq local up` wrote, for this process only.

The file is found in the current directory or the nearest parent that has one (so
the flag works from anywhere in a checkout), parsed as the `export KEY='value'` lines
`agentq.local.stack.format_env_file` writes, and only agentq's and AWS's variables
are taken from it: a tampered file cannot set PATH, HOME or a Claude key.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Final

from agentq.errors import ConfigError

ENV_FILE: Final = Path(".agentq") / "local.env"
_LINE: Final = re.compile(r"^export ([A-Z][A-Z0-9_]*)=(.*)$")


def allowed_variable(name: str) -> bool:
    """agentq's settings and AWS's own variables; nothing else belongs in the file."""
    from agentq.config import env_names

    return name.startswith("AWS_") or name in env_names()


def find_env_file(start: Path | None = None) -> Path | None:
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / ENV_FILE
        if candidate.is_file():
            return candidate
    return None


def parse_env_file(text: str) -> dict[str, str]:
    """KEY → value for every `export KEY=value` line; comments and blanks are skipped."""
    env: dict[str, str] = {}
    # Only "\n" ends a line: values may hold other Unicode line separators.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ConfigError(f"env file line {number}", "is not `export KEY=value`")
        key, quoted = match.groups()
        try:
            words = shlex.split(quoted)
        except ValueError as exc:
            raise ConfigError(key, f"has a badly quoted value in the env file ({exc})") from None
        if len(words) > 1:
            raise ConfigError(key, "has more than one word in the env file")
        if not allowed_variable(key):
            raise ConfigError(key, "is not an agentq or AWS variable; refusing the env file")
        env[key] = words[0] if words else ""
    return env


def apply_local_env(path: Path | None = None) -> Path:
    """Load the env file into this process's environment; returns the file used."""
    found = path or find_env_file()
    if found is None or not found.is_file():
        where = str(path) if path else f"{ENV_FILE} (here or in a parent directory)"
        raise ConfigError(
            "--local", f"found no {where}: is the local stack running (`agentq local up`)?"
        )
    os.environ.update(parse_env_file(found.read_text()))
    return found
